"""A small U-Net as a user has it: a model class, a loss function and a batch function.

Nothing here knows about bench: `sweep.yaml` names these three, and bench builds the model from the
`model:` section of `config.yaml`, draws batches from `random_batch` and trains on `dice_bce`.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class DoubleConv(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class UNet(nn.Module):
    def __init__(self, in_channels: int = 3, width: int = 16, depth: int = 3):
        super().__init__()
        widths = [width * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList(DoubleConv(a, b) for a, b in zip([in_channels] + widths[:-2], widths[:-1]))
        self.bottom = DoubleConv(widths[-2], widths[-1])
        self.up = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in zip(widths[:-1], widths[1:]))
        self.merge = nn.ModuleList(DoubleConv(2 * a, a) for a in widths[:-1])
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, x):
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for i in reversed(range(len(self.up))):
            x = self.merge[i](torch.cat([self.up[i](x), skips[i]], dim=1))
        return self.head(x)


def dice_bce(logits, mask):
    prob = logits.sigmoid()
    dice = 1 - (2 * (prob * mask).sum() + 1) / (prob.sum() + mask.sum() + 1)
    return F.binary_cross_entropy_with_logits(logits, mask) + dice


def random_batch(batch_size: int, image_size: int = 64, in_channels: int = 3):
    """Images with a bright square and its mask: a whole batch at once, no Dataset."""
    images = torch.randn(batch_size, in_channels, image_size, image_size) * 0.3
    masks = torch.zeros(batch_size, 1, image_size, image_size)
    q = image_size // 4
    masks[:, :, q:3 * q, q:3 * q] = 1.0
    return images + masks, masks
