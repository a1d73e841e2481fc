"""retrieval: a contrastive dual encoder (DPR-style retriever) trained with hard negatives.

Two transformer encoders, one for queries and one for documents, mean-pool their tokens into
unit vectors. Each sample is a query, its positive document and `hard_negatives` documents from
the same topic; the InfoNCE loss scores every query against every document in the batch (its own
positive, its hard negatives and all the other queries' documents), so activation memory grows
with batch x (1 + hard_negatives) x doc_len. Synthetic data: topics with their own vocabulary; a
query is a noisy handful of words taken from its positive document, so the retriever has to match
the document's specific words, not just its topic, and the task is learnable.
"""
from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.workloads import Workload
from harness.workloads._text import EncoderBlock, spell

PAD, CLS, SPECIALS = 0, 1, 2  # ids below SPECIALS are special tokens; words follow
MAX_WORDS = 65536              # words the synthetic text uses; larger vocabularies keep their size (and cost)


class TextEncoder(nn.Module):
    """Token ids -> one unit vector: embeddings, encoder blocks, masked mean pooling, projection."""

    def __init__(self, vocab, max_len, d_model, layers, heads, ff, dim, dropout):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(EncoderBlock(d_model, heads, ff, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, dim)

    def forward(self, ids, mask):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x, mask)
        m = mask.unsqueeze(-1).to(x.dtype)
        pooled = (self.ln(x) * m).sum(1) / m.sum(1).clamp_min(1.0)  # mean over real tokens only
        return F.normalize(self.head(pooled), dim=-1)


class DualEncoder(nn.Module):
    """Separate query and document towers (asymmetric, as in DPR); forward returns the score matrix."""

    def __init__(self, vocab, query_len, doc_len, d_model, layers, heads, ff, dim, dropout=0.1, temperature=0.05):
        super().__init__()
        self.temperature = temperature  # InfoNCE temperature: sharper softmax over candidates
        self.query = TextEncoder(vocab, query_len, d_model, layers, heads, ff, dim, dropout)
        self.doc = TextEncoder(vocab, doc_len, d_model, layers, heads, ff, dim, dropout)

    def forward(self, query, query_mask, docs, docs_mask):  # docs: (B, 1 + negatives, doc_len)
        q = self.query(query, query_mask)                                   # (B, dim)
        d = self.doc(docs.flatten(0, 1), docs_mask.flatten(0, 1))           # (B * (1 + negatives), dim)
        return q.float() @ d.float().T / self.temperature                   # every query vs every document


def info_nce(model, batch):
    scores = model(*batch)
    group = scores.shape[1] // scores.shape[0]  # documents per query: the positive comes first in each group
    labels = torch.arange(scores.shape[0], device=scores.device) * group
    return F.cross_entropy(scores, labels)


class RetrievalTriples(torch.utils.data.Dataset):
    """Deterministic synthetic (query, positive, hard negatives) groups; sample i comes from seed (seed, i).

    Documents are written as text and tokenised on the fly (split, lookup, truncate, pad): ~1 ms
    per sample at the `base` sizes (1 query + 8 documents, 2,080 tokens), as a real loader costs.
    """

    def __init__(self, samples, vocab, query_len, doc_len, hard_negatives, topics=1024, seed=0):
        self.samples, self.vocab, self.query_len, self.doc_len = samples, vocab, query_len, doc_len
        self.hard_negatives, self.topics, self.seed = hard_negatives, topics, seed
        self.words = min(vocab - SPECIALS, MAX_WORDS)
        self._lexicon = None  # built lazily, once per worker process

    def __len__(self):
        return self.samples

    def _vocabulary(self):  # (spelling of word w, spelling -> token id)
        if self._lexicon is None:
            words = [spell(i) for i in range(self.words)]
            self._lexicon = (words, {w: i + SPECIALS for i, w in enumerate(words)})
        return self._lexicon

    def _document(self, rng, topic):
        n = rng.randrange(self.doc_len // 2, self.doc_len + self.doc_len // 4)  # some get truncated, as in life
        topical = [(topic * 7919 + j * 104729) % self.words for j in range(32)]  # shared by the topic's documents
        return [rng.choice(topical) if rng.random() < 0.4 else int(self.words * rng.random() ** 3)  # Zipf-like rest
                for _ in range(n)]

    def _query(self, rng, positive):
        """A handful of the positive's words (only ones its encoder sees), 20% swapped for noise."""
        seen = positive[:self.doc_len - 1]
        picked = rng.sample(seen, min(len(seen), rng.randrange(self.query_len // 2, self.query_len)))
        return [w if rng.random() > 0.2 else int(self.words * rng.random()) for w in picked]

    def _encode(self, words, max_len):  # write the text, then the tokeniser: [CLS] + words, truncated, padded
        spelling, lookup = self._vocabulary()
        text = " ".join([spelling[w] for w in words])
        ids = [CLS] + [lookup[w] for w in text.split()][:max_len - 1]
        pad = max_len - len(ids)
        return ids + [PAD] * pad, [True] * len(ids) + [False] * pad

    def __getitem__(self, i):
        if not 0 <= i < self.samples:
            raise IndexError(i)
        rng = random.Random(self.seed * 1_000_003 + i)
        topic = rng.randrange(self.topics)
        docs = [self._document(rng, topic) for _ in range(1 + self.hard_negatives)]  # docs[0] is the positive
        q_ids, q_mask = self._encode(self._query(rng, docs[0]), self.query_len)
        encoded = [self._encode(d, self.doc_len) for d in docs]
        return (torch.tensor(q_ids), torch.tensor(q_mask),
                torch.tensor([e[0] for e in encoded]), torch.tensor([e[1] for e in encoded]))


def build(params: dict) -> Workload:
    p = dict(params)
    data = dict(samples=p.pop("samples", 8192),         # dataset length; samples are generated, not stored
                hard_negatives=p.pop("hard_negatives"), # knob: documents per query beyond the positive
                topics=p.pop("topics", 1024))
    lr = p.pop("lr", 2e-5)
    model = DualEncoder(**p)
    dataset = RetrievalTriples(vocab=p["vocab"], query_len=p["query_len"], doc_len=p["doc_len"], **data)
    tokens = p["query_len"] + (1 + data["hard_negatives"]) * p["doc_len"]
    return Workload(model=model, dataset=dataset, loss=info_nce, blocks=(EncoderBlock,),
                    tokens_per_sample=tokens, lr=lr)
