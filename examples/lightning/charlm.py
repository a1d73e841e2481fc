"""A character-level transformer LM as a Lightning user writes it, trained with
`python -m lightning fit --config config.yaml` (LightningCLI). Nothing here imports bench.

It leans on the Trainer the way Lightning code does: configure_optimizers builds a warm-up + cosine
schedule from self.trainer.estimated_stepping_batches, training_step logs to the progress bar and
returns a dict, and the datamodule's setup() builds the vocabulary.
"""
import math
from pathlib import Path

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class CharLM(L.LightningModule):
    def __init__(self, vocab_size: int = 128, block_size: int = 64, dim: int = 64, layers: int = 2, heads: int = 2,
                 lr: float = 3e-3, warmup: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss, prog_bar=True)
        return {"loss": loss}

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.1)
        total = self.trainer.estimated_stepping_batches
        warmup = max(1, int(self.hparams.warmup * total))

        def schedule(step):  # linear warm-up, then cosine to zero over the run
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, schedule), "interval": "step"}}


class CharData(L.LightningDataModule):
    """Characters of a text file (this module's own source when none is given), in blocks."""

    def __init__(self, path: str | None = None, block_size: int = 64, batch_size: int = 16, num_workers: int = 0):
        super().__init__()
        self.path, self.block_size, self.batch_size, self.num_workers = path, block_size, batch_size, num_workers

    def setup(self, stage=None):
        text = Path(self.path or __file__).read_text()
        self.vocab = sorted(set(text))  # the vocabulary: every character the text holds
        stoi = {c: i for i, c in enumerate(self.vocab)}
        data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
        n = (len(data) - 1) // self.block_size
        self.x = data[: n * self.block_size].view(n, self.block_size)
        self.y = data[1: n * self.block_size + 1].view(n, self.block_size)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(self.x, self.y), batch_size=self.batch_size,
                                           shuffle=True, drop_last=True, num_workers=self.num_workers)
