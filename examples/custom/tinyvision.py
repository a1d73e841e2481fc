"""A user's own model, trained by bench through the workload protocol (see README, "Bring your own model").

bench imports this module only inside its trial child processes: `build(params)` is called once
per trial with the spec's `workload.params` (plus any searched workload knob) and returns the
model, a dataset of samples, and the loss. Nothing here knows about bench's knobs: precision,
checkpointing, compile, batch size and accumulation are applied by bench around it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.workloads import Workload


class ResBlock(nn.Module):
    """The repeated block: bench's activation checkpointing wraps every (or every other) one."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class TinyVision(nn.Module):
    def __init__(self, width: int, depth: int, classes: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(*(ResBlock(width) for _ in range(depth)))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class Shapes(torch.utils.data.Dataset):
    """Synthetic images whose class is the quadrant holding a bright blob: learnable, no download."""

    def __init__(self, size: int, classes: int, samples: int = 4096):
        self.size, self.classes, self.samples = size, classes, samples

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        label = i % self.classes
        image = torch.randn(3, self.size, self.size, generator=g) * 0.3
        half = self.size // 2
        row, col = divmod(label % 4, 2)
        image[:, row * half:(row + 1) * half, col * half:(col + 1) * half] += 1.0
        return image, label


def cross_entropy(model, batch):
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def build(params: dict) -> Workload:
    width, depth = params.get("width", 32), params.get("depth", 4)
    size, classes = params.get("image_size", 32), params.get("classes", 4)
    return Workload(
        model=TinyVision(width, depth, classes),
        dataset=Shapes(size, classes),
        loss=cross_entropy,
        blocks=(ResBlock,),            # what activation checkpointing may wrap
        lr=params.get("lr", 1e-3),
    )
