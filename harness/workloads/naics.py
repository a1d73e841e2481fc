"""naics: a multi-channel industry-code embedder (NAICS-style), LoRA-tuned and trained contrastively.

A business record has four text channels (title, description, keywords, activities). Each channel
has its own small transformer encoder whose base weights are frozen (as if pretrained) with LoRA
adapters on every attention and MLP projection; a mixture-of-experts fusion gates over experts that
each combine the four channel embeddings, and a projection head maps the result to a unit vector.
Training is contrastive with `n_positives` / `n_negatives` per anchor (a curriculum raises them and
the share of hard, same-sector negatives stage by stage). Synthetic data: 1,012 six-digit codes in
20 sectors, each with its own words per channel, so records of one code really are alike.
"""
from __future__ import annotations

import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.workloads import Workload
from harness.workloads._text import spell

CHANNELS = ("title", "description", "keywords", "activities")
PAD, CLS, SPECIALS = 0, 1, 2  # ids below SPECIALS are special tokens; words follow
MAX_WORDS = 65536              # words the synthetic text uses; a larger vocabulary keeps its full size
SECTORS = 20                   # NAICS 2022 has 20 two-digit sectors


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update: W x + (alpha / r) B A x, B starting at 0."""

    def __init__(self, d_in: int, d_out: int, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.base = nn.Linear(d_in, d_out).requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, d_in))
        self.lora_b = nn.Parameter(torch.zeros(d_out, rank))  # zero: training starts from the base model exactly
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(self.drop(x), self.lora_a), self.lora_b) * self.scale


class EncoderBlock(nn.Module):
    """Pre-LN bidirectional transformer block with LoRA on q/k/v, output and both MLP projections."""

    def __init__(self, d_model: int, heads: int, ff: int, lora: dict):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = LoRALinear(d_model, 3 * d_model, **lora)
        self.proj = LoRALinear(d_model, d_model, **lora)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = LoRALinear(d_model, ff, **lora)
        self.fc2 = LoRALinear(ff, d_model, **lora)

    def forward(self, x, mask):  # x: (N, T, d); mask: (N, T) bool, True = real token
        n, t, c = x.shape
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        x = x + self.proj(y.transpose(1, 2).reshape(n, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ChannelEncoder(nn.Module):
    """One text channel: frozen embeddings and norms, LoRA'd blocks, masked mean pooling -> (N, d)."""

    def __init__(self, vocab, max_len, d_model, layers, heads, ff, lora):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(EncoderBlock(d_model, heads, ff, lora) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        for name, p in self.named_parameters():  # the "pretrained" base stays fixed; only the adapters learn
            p.requires_grad = name.rpartition(".")[2].startswith("lora_")

    def forward(self, ids, mask):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x, mask)
        m = mask.unsqueeze(-1).to(x.dtype)
        return (self.ln(x) * m).sum(1) / m.sum(1).clamp_min(1.0)


class MoEFusion(nn.Module):
    """A gate picks top_k of `experts` MLPs, each reading all channel embeddings concatenated.

    The experts are small, so all run densely as two batched matmuls and the gate masks them:
    faster than token dispatch at this size, and static shapes suit torch.compile.
    """

    def __init__(self, d_in: int, hidden: int, d_out: int, experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(d_in, experts)
        self.w1 = nn.Parameter(torch.randn(experts, d_in, hidden) * d_in ** -0.5)
        self.b1 = nn.Parameter(torch.zeros(experts, hidden))
        self.w2 = nn.Parameter(torch.randn(experts, hidden, d_out) * hidden ** -0.5)
        self.b2 = nn.Parameter(torch.zeros(experts, d_out))

    def forward(self, x):  # x: (N, d_in) -> (N, d_out), load-balancing loss
        probs = self.gate(x).float().softmax(-1)                                  # (N, E)
        top, idx = probs.topk(self.top_k, dim=-1)
        weights = torch.zeros_like(probs).scatter(-1, idx, top / top.sum(-1, keepdim=True))
        h = F.gelu(torch.einsum("ni,eih->neh", x, self.w1) + self.b1)
        y = torch.einsum("neh,eho->neo", h, self.w2) + self.b2                    # (N, E, d_out)
        out = (weights.to(y.dtype).unsqueeze(-1) * y).sum(1)
        routed = (weights > 0).float().mean(0) / self.top_k                       # share of picks per expert
        balance = probs.shape[-1] * (routed * probs.mean(0)).sum()                # Switch Transformer aux: 1 when even
        return out, balance


class NaicsEmbedder(nn.Module):
    def __init__(self, vocab, lengths, d_model, layers, heads, ff, lora_rank=16, lora_alpha=32, lora_dropout=0.05,
                 experts=8, top_k=2, expert_hidden=None, embed_dim=256):
        super().__init__()
        lora = dict(rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout)
        self.encoders = nn.ModuleDict({ch: ChannelEncoder(vocab, lengths[ch], d_model, layers, heads, ff, lora)
                                       for ch in CHANNELS})
        self.fusion = MoEFusion(len(CHANNELS) * d_model, expert_hidden or 2 * d_model, d_model, experts, top_k)
        self.head = nn.Sequential(nn.Linear(d_model, d_model), nn.GELU(), nn.Linear(d_model, embed_dim))

    def forward(self, *channels):  # ids, mask per channel, each (B, R, L): R records per sample -> (B, R, dim), aux
        b, r = channels[0].shape[:2]
        pooled = [enc(ids.flatten(0, 1), mask.flatten(0, 1))
                  for enc, ids, mask in zip(self.encoders.values(), channels[0::2], channels[1::2])]
        fused, balance = self.fusion(torch.cat(pooled, dim=-1))
        return F.normalize(self.head(fused), dim=-1).view(b, r, -1), balance


def contrastive_loss(n_positives: int, temperature: float, aux_weight: float):
    """Multi-positive InfoNCE: each anchor vs its own candidates and every other anchor's (in-batch)."""

    def loss(model, batch):
        emb, balance = model(*batch)                                   # record 0 of each sample is the anchor
        anchors, cands = emb[:, 0].float(), emb[:, 1:].float()         # cands: positives first, then negatives
        b, k = cands.shape[:2]
        logp = (anchors @ cands.flatten(0, 1).T / temperature).log_softmax(-1).view(b, b, k)
        own = logp[torch.arange(b, device=emb.device), torch.arange(b, device=emb.device)]  # (B, K)
        return -own[:, :n_positives].mean() + aux_weight * balance

    return loss


class CodeGroups(torch.utils.data.Dataset):
    """Deterministic synthetic (anchor, positives, negatives) record groups; sample i comes from seed (seed, i).

    Every record's four channels are written as text and tokenised on the fly, so a sample costs
    real CPU time (~0.5 us per token: 1.5 ms for the 11 records of a `base` sample) and num_workers /
    pin_memory matter. A negative is "hard" (a different
    code of the same sector, sharing the sector's words) with probability `hard_fraction`.
    """

    def __init__(self, samples, vocab, lengths, codes, n_positives, n_negatives, hard_fraction, seed=0):
        self.samples, self.lengths, self.codes, self.seed = samples, lengths, codes, seed
        self.n_positives, self.n_negatives, self.hard_fraction = n_positives, n_negatives, hard_fraction
        self.words = min(vocab - SPECIALS, MAX_WORDS)
        self._lexicon = None  # built lazily, once per worker process

    def __len__(self):
        return self.samples

    def _vocabulary(self):  # (spelling of word w, spelling -> token id)
        if self._lexicon is None:
            words = [spell(i) for i in range(self.words)]
            self._lexicon = (words, {w: i + SPECIALS for i, w in enumerate(words)})
        return self._lexicon

    def _text(self, rng, code, channel, length):
        """One channel of one record: the code's own words, its sector's words, and common words."""
        sector, k = code * SECTORS // self.codes, CHANNELS.index(channel)
        words = []
        for _ in range(rng.randrange(max(1, length // 2), length + length // 4)):  # long ones get truncated
            u = rng.random()
            if u < 0.5:
                words.append((code * 7919 + k * 15485863 + rng.randrange(16) * 104729) % self.words)
            elif u < 0.7:
                words.append((sector * 6007 + k * 32452843 + rng.randrange(64) * 1299709) % self.words)
            else:
                words.append(int(self.words * rng.random() ** 3))
        spelling = self._vocabulary()[0]
        return " ".join([spelling[w] for w in words])

    def _encode(self, text, max_len):  # the tokeniser: [CLS] + words, truncated, padded
        lookup = self._vocabulary()[1]
        ids = [CLS] + [lookup[w] for w in text.split()][:max_len - 1]
        pad = max_len - len(ids)
        return ids + [PAD] * pad, [True] * len(ids) + [False] * pad

    def _negative(self, rng, code):
        if rng.random() < self.hard_fraction:  # same sector, different code
            sector = code * SECTORS // self.codes
            other = rng.randrange(-(-sector * self.codes // SECTORS), -(-(sector + 1) * self.codes // SECTORS))
        else:
            other = rng.randrange(self.codes)
        return other if other != code else (code + 1) % self.codes

    def __getitem__(self, i):
        if not 0 <= i < self.samples:
            raise IndexError(i)
        rng = random.Random(self.seed * 1_000_003 + i)
        code = rng.randrange(self.codes)
        group = [code] * (1 + self.n_positives) + [self._negative(rng, code) for _ in range(self.n_negatives)]
        out = []
        for ch in CHANNELS:
            encoded = [self._encode(self._text(rng, c, ch, self.lengths[ch]), self.lengths[ch]) for c in group]
            out += [torch.tensor([e[0] for e in encoded]), torch.tensor([e[1] for e in encoded])]
        return tuple(out)  # ids, mask for each channel in CHANNELS order, each (1 + P + N, length)


def build(params: dict) -> Workload:
    p = dict(params)
    if set(p["lengths"]) != set(CHANNELS):
        raise ValueError(f"lengths must give tokens for exactly the channels {list(CHANNELS)}, "
                         f"got {list(p['lengths'])}")
    lengths = p["lengths"] = {ch: int(p["lengths"][ch]) for ch in CHANNELS}  # tokens per channel
    data = dict(samples=p.pop("samples", 8192),         # dataset length; samples are generated, not stored
                codes=p.pop("codes", 1012),             # six-digit industry codes (NAICS 2022 has 1,012)
                n_positives=p.pop("n_positives"),       # records of the anchor's own code per sample
                n_negatives=p.pop("n_negatives"),       # knob: records of other codes per sample
                hard_fraction=p.pop("hard_fraction", 0.5))  # curriculum: share of same-sector negatives
    loss = contrastive_loss(data["n_positives"], p.pop("temperature", 0.05), p.pop("aux_weight", 0.01))
    lr = p.pop("lr", 2e-4)
    model = NaicsEmbedder(**p)
    dataset = CodeGroups(vocab=p["vocab"], lengths=lengths, **data)
    tokens = (1 + data["n_positives"] + data["n_negatives"]) * sum(lengths.values())
    return Workload(model=model, dataset=dataset, loss=loss, blocks=(EncoderBlock,), tokens_per_sample=tokens, lr=lr)
