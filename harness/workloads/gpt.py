"""gpt: a decoder-only language model for pretraining, nanoGPT-style.

Token + learned position embeddings, pre-LN blocks of causal self-attention (SDPA, so the flash /
memory-efficient kernels are used where the device has them) and a 4x GELU MLP, a final LayerNorm
and an LM head tied to the token embedding. Synthetic data: documents drawn from a fixed random
bigram grammar (each word has `branching` possible successors), written out as text, tokenised on
the fly and packed into `seq_len + 1` windows the way a streaming pretraining loader does. The
next-token loss can fall from ln(vocab) to ln(branching), so a real model learns something real.
"""
from __future__ import annotations

import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.workloads import Workload
from harness.workloads._text import spell

EOS = 0  # token 0 ends a document; every other id is a word


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        assert d_model % heads == 0, "d_model must be a multiple of heads"
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.proj = nn.Linear(4 * d_model, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: the unit activation checkpointing wraps."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, block_size: int, d_model: int, layers: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying: one vocab x d matrix, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by 1/sqrt(2 * layers)
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx):  # idx: (B, T) token ids -> logits (B, T, vocab)
        t = idx.shape[1]
        assert t <= self.block_size, f"sequence of {t} tokens is longer than block_size {self.block_size}"
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class PackedText(torch.utils.data.Dataset):
    """Deterministic synthetic corpus: sample i is built from seed (seed, i) on the CPU.

    Each sample writes documents as text, tokenises them (whitespace split + vocabulary lookup)
    and crops a `seq_len + 1` window at a random offset: ~0.8 ms of Python per 1024 tokens, so the
    loader costs what a real one does and num_workers / pin_memory matter.
    """

    def __init__(self, samples: int, seq_len: int, vocab: int, seed: int = 0, branching: int = 4):
        self.samples, self.seq_len, self.vocab, self.seed = samples, seq_len, vocab, seed
        self.words = vocab - 1  # ids 1..vocab-1
        self.successors = random.Random(seed).sample(range(1, 1 << 30), branching)  # word w -> hash(w, offset)
        self._lexicon = None  # built lazily, once per worker process: cheap to pickle

    def __len__(self):
        return self.samples

    def _vocabulary(self):
        if self._lexicon is None:
            words = ["<eos>"] + [spell(i) for i in range(1, self.vocab)]
            self._lexicon = (words, {w: i for i, w in enumerate(words)})
        return self._lexicon

    def _document(self, rng: random.Random, length: int) -> list[int]:
        w, n, doc = rng.randrange(self.words) + 1, self.words, []
        for branch in rng.choices(self.successors, k=length):
            doc.append(w)
            w = (w * 2654435761 + branch) % n + 1  # the grammar: a fixed hash of (word, branch)
        return doc

    def __getitem__(self, i):
        if not 0 <= i < self.samples:
            raise IndexError(i)
        rng = random.Random(self.seed * 1_000_003 + i)
        words, lookup = self._vocabulary()
        need, docs, n = self.seq_len + 1, [], 0
        start = None
        while start is None or n < start + need:  # pack whole documents; the window starts mid-document
            doc = self._document(rng, max(8, int(rng.expovariate(2.0 / need))))
            docs.append(" ".join([words[w] for w in doc]) + " <eos>")
            start = rng.randrange(len(doc)) if start is None else start
            n += len(doc) + 1
        ids = [lookup[tok] for tok in " ".join(docs).split()]  # the tokeniser
        window = torch.tensor(ids[start:start + need], dtype=torch.long)
        return window[:-1], window[1:]


def lm_loss(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def build(params: dict) -> Workload:
    p = dict(params)
    seq_len = p.pop("seq_len")                     # knob: tokens per sample (must fit block_size)
    samples = p.pop("samples", 8192)               # dataset length; samples are generated, not stored
    lr = p.pop("lr", 3e-4)
    p.setdefault("block_size", seq_len)            # context the position table holds; >= every seq_len swept
    if seq_len > p["block_size"]:
        raise ValueError(f"seq_len {seq_len} is longer than block_size {p['block_size']}")
    model = GPT(**p)
    data = PackedText(samples, seq_len, p["vocab"])
    return Workload(model=model, dataset=data, loss=lm_loss, blocks=(Block,), tokens_per_sample=seq_len, lr=lr)
