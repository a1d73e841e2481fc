"""Every registered workload is a real, learnable model: its tiny preset trains on the CPU.

Big presets are built on the meta device (shapes only, no memory), so every preset in the
registry is checked against its build function without allocating a 512M-parameter model.
"""
from __future__ import annotations

import importlib.util
import math
import pickle

import pytest
import torch

from harness.workloads import WORKLOADS, Workload, build

NAMES = sorted(WORKLOADS)
PRESETS = [(name, preset) for name in NAMES for preset in WORKLOADS[name].presets]
REAL_PRESETS = ("tiny", "cpu")  # small enough to build for real; the rest are built on meta

# A value different from the tiny preset's for every workload-specific knob: the sweep may set it.
KNOB_VALUES = {"seq_len": 16, "freeze_encoder": True, "hard_negatives": 2, "n_negatives": 3, "channels_last": True}

# tokens_per_sample from the params, and the token ids a sample really holds.
TOKENS = {
    "gpt": (lambda p: p["seq_len"], lambda s: s[0].numel()),
    "retrieval": (lambda p: p["query_len"] + (1 + p["hard_negatives"]) * p["doc_len"],
                  lambda s: s[0].numel() + s[2].numel()),
    "nli-encoder": (lambda p: p["seq_len"], lambda s: s[0].numel()),
    "naics": (lambda p: (1 + p["n_positives"] + p["n_negatives"]) * sum(p["lengths"].values()),
              lambda s: sum(t.numel() for t in s[0::2])),
}


def make(name: str, preset: str = "tiny", **overrides) -> Workload:
    info = WORKLOADS[name]
    if importlib.util.find_spec(info.module) is None:
        pytest.skip(f"{info.module} is registered but not written yet")
    return build({"name": name, "params": {**info.presets[preset], **overrides}})


def fixed_batch(wl: Workload, batch_size: int = 8):
    loader = torch.utils.data.DataLoader(wl.dataset, batch_size=batch_size, collate_fn=wl.collate)
    return next(iter(loader))


def trainable(wl: Workload) -> list:
    return wl.trainable(wl.model) if wl.trainable else [p for p in wl.model.parameters() if p.requires_grad]


def train(wl: Workload, batch, steps: int) -> list[float]:
    wl.model.train()
    opt = torch.optim.AdamW(trainable(wl), lr=wl.lr)
    losses = []
    for _ in range(steps):
        loss = wl.loss(wl.model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def leaves(x) -> list:
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in leaves(v)]
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in leaves(v)]
    return [x]


def to_meta(x):
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    if isinstance(x, dict):
        return {k: to_meta(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_meta(v) for v in x)
    return x


def same(a, b) -> bool:
    la, lb = leaves(a), leaves(b)
    return len(la) == len(lb) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(la, lb))


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights count once


@pytest.mark.parametrize("name", NAMES)
def test_tiny_preset_learns_a_fixed_batch(name):
    torch.manual_seed(0)
    wl = make(name)
    losses = train(wl, fixed_batch(wl), steps=25)
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < 0.7 * losses[0], f"{name} did not learn: {losses[0]:.3f} -> {losses[-1]:.3f}"


@pytest.mark.parametrize("name", NAMES)
def test_blocks_are_repeated_modules_of_the_model(name):
    wl = make(name)
    assert wl.blocks, "activation checkpointing needs the repeated block classes"
    for cls in wl.blocks:
        assert any(isinstance(m, cls) for m in wl.model.modules()), f"{cls.__name__} not found in the model"


@pytest.mark.parametrize("name", NAMES)
def test_dataset_is_deterministic_per_index_and_picklable(name):
    data = make(name).dataset
    assert same(data[3], data[3])
    assert not same(data[3], data[4])
    assert same(pickle.loads(pickle.dumps(data))[3], data[3])  # what a spawned DataLoader worker gets


@pytest.mark.parametrize("name", NAMES)
def test_tokens_per_sample_is_set_where_samples_have_a_length(name):
    wl = make(name)
    if name not in TOKENS:
        assert wl.tokens_per_sample is None  # no length: no tokens/s, rather than a made-up one
        return
    expected, count = TOKENS[name]
    for preset, params in WORKLOADS[name].presets.items():
        with torch.device("meta"):
            assert make(name, preset).tokens_per_sample == expected(params), preset
    assert wl.tokens_per_sample == count(wl.dataset[0])


@pytest.mark.parametrize("name,preset", PRESETS)
def test_every_preset_builds(name, preset):
    info = WORKLOADS[name]
    assert {"tiny", info.gpu_preset, info.cpu_preset} <= set(info.presets)
    if preset in REAL_PRESETS:
        wl = make(name, preset)
        assert isinstance(wl, Workload) and len(wl.dataset) > 0
        fixed_batch(wl, batch_size=2)
    else:
        with torch.device("meta"):
            wl = make(name, preset)
        assert isinstance(wl, Workload) and n_params(wl.model) > 0


@pytest.mark.parametrize("name", NAMES)
def test_loss_runs_on_the_meta_device(name):
    """The trial counts FLOPs on a meta-device copy: forward and backward must work there."""
    with torch.device("meta"):
        wl = make(name)
    batch = fixed_batch(wl, batch_size=2)  # samples are made on the CPU, then moved
    batch = to_meta(batch)
    loss = wl.loss(wl.model, batch)
    assert loss.device.type == "meta" and loss.dim() == 0
    loss.backward()


@pytest.mark.parametrize("name", NAMES)
def test_workload_knobs_are_params_build_accepts(name):
    for knob in WORKLOADS[name].knobs:
        assert knob in KNOB_VALUES, f"add a test value for knob {knob!r}"
        wl = make(name, **{knob: KNOB_VALUES[knob]})
        wl.loss(wl.model, fixed_batch(wl, batch_size=2)).backward()


def test_gpt_seq_len_knob_sets_the_sample_length():
    wl = make("gpt", seq_len=16)
    x, y = wl.dataset[0]
    assert wl.tokens_per_sample == 16 and x.shape == y.shape == (16,)
    assert torch.equal(x[1:], y[:-1])  # targets are the inputs shifted by one


def test_gpt_seq_len_longer_than_block_size_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        make("gpt", seq_len=64, block_size=32)


def test_gsa_512m_has_512m_parameters():
    with torch.device("meta"):
        wl = make("gpt", "gsa-512m")
    n = n_params(wl.model)
    assert abs(n - 512e6) / 512e6 < 0.10, f"{n / 1e6:.1f}M"


def test_nli_freeze_encoder_trains_only_the_head():
    wl = make("nli-encoder", freeze_encoder=True)
    model = wl.model.train()
    assert {id(p) for p in wl.trainable(model)} == {id(p) for p in model.head.parameters()}
    assert not any(p.requires_grad for p in model.encoder.parameters())
    assert not model.encoder.training  # a frozen feature extractor runs without dropout
    wl.loss(model, fixed_batch(wl)).backward()
    assert all(p.grad is None for p in model.encoder.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())


def test_nli_unfrozen_encoder_gets_gradients():
    wl = make("nli-encoder", freeze_encoder=False)
    wl.loss(wl.model, fixed_batch(wl)).backward()
    assert all(p.grad is not None for p in wl.model.encoder.blocks.parameters())


def test_naics_trains_lora_adapters_not_base_weights():
    wl = make("naics")
    names = {n for n, p in wl.model.named_parameters() if p.requires_grad}
    assert names and all(("lora_" in n) or not n.startswith("encoders.") for n in names)
    assert any(n.startswith("fusion.") for n in names) and any(n.startswith("head.") for n in names)
    wl.loss(wl.model, fixed_batch(wl)).backward()
    for n, p in wl.model.named_parameters():
        if n.startswith("encoders.") and "lora_" not in n:
            assert p.grad is None, n
    assert all(p.grad is not None for n, p in wl.model.named_parameters() if n.endswith("lora_b"))


@pytest.mark.parametrize("name", [n for n in NAMES if "vocab" in WORKLOADS[n].presets["tiny"]])
def test_the_smallest_vocab_the_rules_allow_trains_and_every_preset_passes_them(name):
    """The rules refuse at load what fails inside torch (or hangs: nli's vocab 1); they must not refuse
    what would train, nor any shipped preset."""
    info = WORKLOADS[name]
    tiny = info.presets["tiny"]
    least = next(v for v in range(1, 64) if not info.problems({**tiny, "vocab": v}))
    assert least > 1 and info.problems({**tiny, "vocab": least - 1})
    w = make(name, vocab=least)
    batch = (w.collate or torch.utils.data.default_collate)([w.dataset[i] for i in range(2)])
    assert math.isfinite(w.loss(w.model, batch).item())
    assert all(not info.problems(preset) for preset in info.presets.values())
