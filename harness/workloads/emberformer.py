"""emberformer: wildfire spread segmentation from a short sequence of multi-channel rasters.

A temporal transformer attends over the patch tokens of every frame (space and time jointly),
the fused tokens of the last frame form a feature map, and a SegFormer-style decoder (a small
hierarchical encoder of overlapping patch-merging stages with Mix-FFN blocks, then an all-MLP
head over every scale) predicts a per-pixel fire mask. Synthetic data: smooth random fields with
a fire front that moves with the wind channel, so the task is learnable.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.workloads import Workload


class TemporalBlock(nn.Module):
    """Pre-LN transformer block over (batch, tokens, d_model)."""

    def __init__(self, d_model: int, heads: int, ff: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Linear(ff, d_model))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class MixFFNStage(nn.Module):
    """SegFormer stage: overlapping patch merging (stride-2 conv) then a Mix-FFN block."""

    def __init__(self, dim_in: int, dim: int):
        super().__init__()
        self.merge = nn.Conv2d(dim_in, dim, kernel_size=3, stride=2, padding=1)
        self.norm = nn.GroupNorm(1, dim)  # LayerNorm over channels, layout-agnostic (channels_last safe)
        self.mix = nn.Sequential(
            nn.Conv2d(dim, 4 * dim, 1),
            nn.Conv2d(4 * dim, 4 * dim, 3, padding=1, groups=4 * dim),  # depthwise: positional info, as in Mix-FFN
            nn.GELU(),
            nn.Conv2d(4 * dim, dim, 1),
        )

    def forward(self, x):
        x = self.merge(x)
        return x + self.mix(self.norm(x))


class EmberFormer(nn.Module):
    def __init__(self, frames, image, channels, patch, d_model, layers, heads, ff, stage_dims, decoder_dim):
        super().__init__()
        self.patch, self.grid = patch, image // patch
        tokens = frames * self.grid * self.grid
        self.embed = nn.Conv2d(channels, d_model, kernel_size=patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(1, tokens, d_model) * 0.02)
        self.blocks = nn.ModuleList(TemporalBlock(d_model, heads, ff) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        dims = [d_model, *stage_dims]
        self.stages = nn.ModuleList(MixFFNStage(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.proj = nn.ModuleList(nn.Conv2d(d, decoder_dim, 1) for d in dims)  # all-MLP head: 1x1 per scale
        self.fuse = nn.Sequential(nn.Conv2d(decoder_dim * len(dims), decoder_dim, 1), nn.BatchNorm2d(decoder_dim), nn.ReLU())
        self.head = nn.Conv2d(decoder_dim, 1, 1)

    def forward(self, x):  # x: (B, T, C, H, W) -> logits (B, 1, H, W)
        b, t, c, h, w = x.shape
        tok = self.embed(x.flatten(0, 1)).flatten(2).transpose(1, 2)  # (B*T, P, d)
        tok = tok.reshape(b, t * tok.shape[1], -1) + self.pos
        for block in self.blocks:
            tok = block(tok)
        last = self.ln(tok)[:, -self.grid * self.grid:]  # the newest frame's tokens carry the fused history
        feat = last.transpose(1, 2).reshape(b, -1, self.grid, self.grid)
        scales = [feat]
        for stage in self.stages:
            scales.append(stage(scales[-1]))
        size = scales[0].shape[-2:]
        fused = torch.cat([F.interpolate(p(s), size=size, mode="bilinear", align_corners=False)
                           for p, s in zip(self.proj, scales)], dim=1)
        logits = self.head(self.fuse(fused))
        return F.interpolate(logits, size=(h, w), mode="bilinear", align_corners=False)


class FireSequences(torch.utils.data.Dataset):
    """Deterministic synthetic fire sequences: sample i is generated from seed i on the CPU."""

    def __init__(self, samples, frames, image, channels):
        self.samples, self.frames, self.image, self.channels = samples, frames, image, channels

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        n, t, c = self.image, self.frames, self.channels
        coarse = torch.randn(t, c, max(n // 8, 2), max(n // 8, 2), generator=g)
        x = F.interpolate(coarse, size=(n, n), mode="bicubic", align_corners=False)  # smooth fields, like weather rasters
        yy, xx = torch.meshgrid(torch.linspace(-1, 1, n), torch.linspace(-1, 1, n), indexing="ij")
        angle = torch.rand((), generator=g) * 2 * math.pi
        cx, cy = torch.rand(2, generator=g) * 1.2 - 0.6
        wind = torch.stack([torch.cos(angle), torch.sin(angle)])
        fronts = []
        for k in range(t + 1):  # the fire front moves downwind one step per frame; frame t is the target
            r = 0.15 + 0.08 * k
            ox, oy = cx + 0.1 * k * wind[0], cy + 0.1 * k * wind[1]
            fronts.append((((xx - ox) ** 2 + (yy - oy) ** 2) < r * r).float())
        x[:, 0] = torch.stack(fronts[:t])               # channel 0: burned area so far
        x[:, 1 % c] += wind[0]                          # channels 1-2: wind field
        x[:, 2 % c] += wind[1]
        return x.contiguous(), fronts[t].unsqueeze(0)


def bce_loss(model, batch):
    x, mask = batch
    return F.binary_cross_entropy_with_logits(model(x), mask)


def build(params: dict) -> Workload:
    p = dict(params)
    samples = p.pop("samples", 4096)
    channels_last = p.pop("channels_last", False)
    model = EmberFormer(**p)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    data = FireSequences(samples, p["frames"], p["image"], p["channels"])
    return Workload(model=model, dataset=data, loss=bce_loss, blocks=(TemporalBlock, MixFFNStage), lr=1e-3)
