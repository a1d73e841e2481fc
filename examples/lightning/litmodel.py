"""A LightningModule and LightningDataModule as a Lightning user has them; bench trains them as they
are: `training_step` for the loss, `configure_optimizers` for the optimizer, the datamodule's
train dataset for the data. Nothing here imports bench."""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.ff = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class LitClassifier(L.LightningModule):
    def __init__(self, features: int = 32, dim: int = 64, layers: int = 4, classes: int = 4, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Linear(features, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100)}


class Clusters(L.LightningDataModule):
    def __init__(self, features: int = 32, classes: int = 4, samples: int = 2048, batch_size: int = 32):
        super().__init__()
        self.features, self.classes, self.samples, self.batch_size = features, classes, samples, batch_size

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        labels = torch.randint(0, self.classes, (self.samples,), generator=g)
        centers = torch.randn(self.classes, self.features, generator=g) * 2
        self.train = torch.utils.data.TensorDataset(centers[labels] + torch.randn(self.samples, self.features, generator=g), labels)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train, batch_size=self.batch_size, shuffle=True)
