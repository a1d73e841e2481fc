"""nli-encoder: a transformer encoder with a classification head for natural language inference.

BERT-style input ([CLS] premise [SEP] hypothesis [SEP] with segment embeddings), pre-LN encoder
blocks with padding masked out of attention, and a pooler + linear head over [CLS] that predicts
entailment / neutral / contradiction. `freeze_encoder` turns the encoder into a fixed feature
extractor: only the head trains, no gradients or optimizer state exist for the encoder and
autograd keeps none of its activations, which is what lets a big encoder fit a small card.
Synthetic data: the hypothesis is a span of the premise (entailment), the span with half its
words replaced (neutral) or the span with a negation inserted (contradiction), so it is learnable.
"""
from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.workloads import Workload
from harness.workloads._text import EncoderBlock, spell

PAD, CLS, SEP, SPECIALS = 0, 1, 2, 3  # ids below SPECIALS are special tokens; words follow
NEGATIONS = ["not", "never", "nobody", "nothing"]  # words 0-3; spell() never makes an odd-length word
MAX_WORDS = 65536                    # words the synthetic text uses; a larger vocabulary keeps its full size


class Encoder(nn.Module):
    """Token + position + segment embeddings, then the blocks: (B, T) ids -> (B, T, d) states."""

    def __init__(self, vocab, max_len, d_model, layers, heads, ff, dropout):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d_model)
        self.seg = nn.Embedding(2, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(EncoderBlock(d_model, heads, ff, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)

    def forward(self, ids, segments, mask):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)) + self.seg(segments)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln(x)


class ClassificationHead(nn.Module):
    """BERT's pooler (dense + tanh over [CLS]) and a linear classifier."""

    def __init__(self, d_model: int, labels: int, dropout: float):
        super().__init__()
        self.pool = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, labels)

    def forward(self, cls):
        return self.out(self.drop(torch.tanh(self.pool(cls))))


class NLIClassifier(nn.Module):
    def __init__(self, vocab, seq_len, d_model, layers, heads, ff, max_len=512, labels=3, dropout=0.1,
                 freeze_encoder=False):
        super().__init__()
        if seq_len > max_len:
            raise ValueError(f"seq_len {seq_len} is longer than max_len {max_len}")
        self.freeze_encoder = freeze_encoder
        self.encoder = Encoder(vocab, max_len, d_model, layers, heads, ff, dropout)
        self.head = ClassificationHead(d_model, labels, dropout)
        self.encoder.requires_grad_(not freeze_encoder)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.freeze_encoder:
            self.encoder.eval()  # a frozen feature extractor runs without dropout
        return self

    def forward(self, ids, segments, mask):  # -> (B, labels) logits
        return self.head(self.encoder(ids, segments, mask)[:, 0])


def nli_loss(model, batch):
    ids, segments, mask, labels = batch
    return F.cross_entropy(model(ids, segments, mask), labels)


class SentencePairs(torch.utils.data.Dataset):
    """Deterministic synthetic premise/hypothesis pairs; sample i comes from seed (seed, i).

    Pairs are written as text and tokenised on the fly into [CLS] p [SEP] h [SEP] with segments,
    truncation and padding, ~0.1-0.3 ms per sample, as a real NLI loader does.
    """

    def __init__(self, samples, vocab, seq_len, seed=0):
        self.samples, self.vocab, self.seq_len, self.seed = samples, vocab, seq_len, seed
        self.words = min(vocab - SPECIALS, MAX_WORDS)
        self._lexicon = None  # built lazily, once per worker process

    def __len__(self):
        return self.samples

    def _vocabulary(self):
        if self._lexicon is None:
            words = NEGATIONS + [spell(i) for i in range(len(NEGATIONS), self.words)]
            self._lexicon = {w: i + SPECIALS for i, w in enumerate(words)}
        return self._lexicon

    def _text(self, rng, n):  # Zipf-like content words; never a negation
        return [spell(len(NEGATIONS) + int((self.words - len(NEGATIONS)) * rng.random() ** 2)) for _ in range(n)]

    def _pair(self, rng):
        label = rng.randrange(3)  # 0 entailment, 1 neutral, 2 contradiction
        premise = self._text(rng, rng.randrange(self.seq_len // 4, self.seq_len * 2 // 3))
        n = rng.randrange(max(2, len(premise) // 4), max(3, len(premise) // 2))
        start = rng.randrange(len(premise) - n + 1)
        hypothesis = premise[start:start + n]
        if label == 1:  # neutral: half the words are new, so the premise says nothing about them
            fresh = self._text(rng, n)
            hypothesis = [f if rng.random() < 0.5 else h for f, h in zip(fresh, hypothesis)]
        elif label == 2:
            hypothesis.insert(rng.randrange(n + 1), rng.choice(NEGATIONS))
        return " ".join(premise), " ".join(hypothesis), label

    def __getitem__(self, i):
        if not 0 <= i < self.samples:
            raise IndexError(i)
        premise, hypothesis, label = self._pair(random.Random(self.seed * 1_000_003 + i))
        lookup = self._vocabulary()
        p, h = [lookup[w] for w in premise.split()], [lookup[w] for w in hypothesis.split()]
        h = h[:self.seq_len // 2 - 2]
        p = p[:self.seq_len - len(h) - 3]  # truncate the premise first, as tokenizers' "longest_first" mostly does
        ids = [CLS] + p + [SEP] + h + [SEP]
        segments = [0] * (len(p) + 2) + [1] * (len(h) + 1)
        pad = self.seq_len - len(ids)
        return (torch.tensor(ids + [PAD] * pad), torch.tensor(segments + [0] * pad),
                torch.tensor([True] * len(ids) + [False] * pad), torch.tensor(label))


def build(params: dict) -> Workload:
    p = dict(params)
    samples = p.pop("samples", 8192)                  # dataset length; samples are generated, not stored
    freeze = p.setdefault("freeze_encoder", False)    # knob: train only the head on a frozen encoder
    lr = p.pop("lr", 1e-3 if freeze else 2e-5)        # fine-tuning rate, or a probe's rate for a lone head
    model = NLIClassifier(**p)
    data = SentencePairs(samples, p["vocab"], p["seq_len"])
    trainable = (lambda m: list(m.head.parameters())) if freeze else None
    return Workload(model=model, dataset=data, loss=nli_loss, blocks=(EncoderBlock,),
                    tokens_per_sample=p["seq_len"], trainable=trainable, lr=lr)
