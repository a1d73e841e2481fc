"""Building blocks the synthetic-text workloads share: pseudo-words and a bidirectional encoder block."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def spell(i: int) -> str:
    """A unique pronounceable pseudo-word per id (base-70 syllables), so samples are real text."""
    word = ""
    while True:
        word += _SYLLABLES[i % len(_SYLLABLES)]
        i //= len(_SYLLABLES)
        if i == 0:
            return word


class EncoderBlock(nn.Module):
    """Pre-LN bidirectional transformer block; padding is masked out of attention."""

    def __init__(self, d_model: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Linear(ff, d_model), nn.Dropout(dropout))

    def forward(self, x, mask):  # x: (B, T, d); mask: (B, T) bool, True = real token
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :],
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))
