"""Reference workloads and the protocol a workload follows, including the user's own.

This module never imports torch: the parent validates specs against the registry below, and only
the trial child calls `build`.

A workload is a function `build(params: dict) -> Workload`. Built-in ones live one file each in
this folder and are listed in WORKLOADS; a user's own is named in a spec as
`workload: {factory: "package.module:function", params: {...}}` and follows the same protocol.
A user's model as it is (a model class with a loss and a batch function, a LightningModule, a
Hugging Face config) is adapted to the same protocol by `own`, `lightning` and `hf` in this folder;
a Lightning or Hugging Face workload also brings its Trainer (`Workload.trainer`), whose steps the
trial then measures (harness.trainer).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from harness.knobs import UNIVERSAL

@dataclass
class Workload:
    """What a trial needs to train a model: built fresh in the child, on the CPU, from `params`."""

    model: Any
    """torch.nn.Module on the CPU; the runner moves it to the device and applies the knobs."""
    dataset: Any
    """Map-style torch Dataset of synthetic samples; the runner wraps it in a DataLoader."""
    loss: Callable[[Any, Any], Any]
    """loss(model, batch) -> scalar tensor; the batch is already on the device."""
    blocks: tuple = ()
    """Module classes of the repeated blocks that activation checkpointing wraps."""
    collate: Callable | None = None
    """DataLoader collate_fn, when the default one does not fit the samples."""
    tokens_per_sample: int | None = None
    """Tokens in one sample, for tokens/s; None when samples have no length."""
    trainable: Callable[[Any], list] | None = None
    """Parameters the optimizer updates; default: every parameter with requires_grad."""
    lr: float = 1e-3
    """AdamW learning rate for the trial's optimizer steps."""
    optimizer: Callable[[Any], Any] | None = None
    """optimizer(model) -> the model's own torch optimizer, built after placement (e.g. a
    LightningModule's configure_optimizers); default: AdamW(lr) as the `optimizer` knob says."""
    checkpoint: Callable[[Any, str], Any] | None = None
    """checkpoint(model, mode) -> model: the model's own activation checkpointing (e.g. Hugging
    Face's gradient_checkpointing_enable) used instead of wrapping `blocks`."""
    trainer: Callable[[dict, Any], None] | None = None
    """trainer(config, trial): run the user's own Trainer (Lightning, transformers) with the config's
    knobs as its arguments, bench's meter in its callback (harness.trainer); the trial's steps are then
    the Trainer's, and `loss`, `dataset` and `optimizer` serve only the FLOP count and the knob checks."""
    about: dict = field(default_factory=dict)
    """What bench chose when adapting the user's model (e.g. which blocks it checkpoints); kept in
    the trial record as `adapter`."""


@dataclass(frozen=True)
class WorkloadInfo:
    """A built-in workload as the parent sees it, without importing torch."""

    module: str
    description: str
    presets: dict[str, dict]
    """Preset name -> params. 'tiny' is for CPU tests; 'auto' picks `gpu_preset` or `cpu_preset`."""
    gpu_preset: str
    cpu_preset: str
    knobs: frozenset = field(default_factory=frozenset)
    """Workload-specific knobs: params the search space may vary (e.g. seq_len, channels_last)."""
    flags: frozenset = field(default_factory=frozenset)
    """Those of `knobs` that take true or false: a spec's value is checked at load, like a universal knob's."""
    extra_params: frozenset = field(default_factory=frozenset)
    """Params `build` takes beyond its presets' keys (it has defaults for them): a spec may set these too."""
    rules: tuple = ()
    """rule(params) -> what is wrong, or None: shapes the params must agree on, checked at load, since
    in a trial they fail inside torch (or, for the nli text's vocabulary, hang until the timeout)."""

    def supported_knobs(self) -> frozenset:
        return UNIVERSAL | self.knobs

    def params(self) -> frozenset:
        """Every param `workload.params` may set: the presets' keys, the extra ones and the knobs."""
        return frozenset(k for preset in self.presets.values() for k in preset) | self.extra_params | self.knobs

    def problems(self, params: dict) -> list[str]:
        """What is wrong with the shapes of `params` (a preset merged with the spec's), by `rules`."""
        return [problem for rule in self.rules if (problem := rule(params))]

    def example(self, param: str):
        """A preset's value of `param` (None for an extra param or a flag): what its type must be."""
        return next((preset[param] for preset in self.presets.values() if param in preset), None)


def heads_divide_d_model(p: dict) -> str | None:
    if p["d_model"] % p["heads"]:
        fits = [h for h in range(1, min(p["d_model"], 64) + 1) if p["d_model"] % h == 0]
        return (f"heads {p['heads']} does not divide d_model {p['d_model']} (each head takes d_model / heads "
                f"features); pick heads from {', '.join(map(str, fits))}")
    return None


def vocab_of_at_least(least: int):
    """The synthetic text's special tokens and words need `least` token ids."""
    def rule(p: dict) -> str | None:
        if p["vocab"] < least:
            return f"vocab {p['vocab']} is too small: the synthetic text needs at least {least} tokens"
        return None
    return rule


def seq_len_within(limit: str, default: int | None):
    """seq_len fits the position table of `limit` tokens (default: `default`; None: seq_len itself)."""
    def rule(p: dict) -> str | None:
        longest = p.get(limit, default)
        if longest is not None and p["seq_len"] > longest:
            return f"seq_len {p['seq_len']} is longer than {limit} {longest}; raise {limit} to at least {p['seq_len']}"
        return None
    return rule


def top_k_within_experts(p: dict) -> str | None:
    if p.get("top_k", 2) > p["experts"]:
        return f"top_k {p.get('top_k', 2)} picks more than the {p['experts']} experts; lower top_k or raise experts"
    return None


WORKLOADS: dict[str, WorkloadInfo] = {
    "emberformer": WorkloadInfo(
        module="harness.workloads.emberformer",
        description="temporal transformer over image-patch tokens + SegFormer-style segmentation decoder",
        presets={
            "tiny": dict(frames=2, image=32, channels=4, patch=8, d_model=32, layers=1, heads=2, ff=64,
                         stage_dims=[16, 32], decoder_dim=32, samples=512),
            "cpu": dict(frames=4, image=64, channels=8, patch=8, d_model=64, layers=2, heads=4, ff=256,
                        stage_dims=[32, 64, 160], decoder_dim=128, samples=4096),
            "small": dict(frames=6, image=128, channels=12, patch=8, d_model=64, layers=3, heads=4, ff=256,
                          stage_dims=[32, 64, 160, 256], decoder_dim=256, samples=16384),
            "large": dict(frames=6, image=128, channels=12, patch=8, d_model=128, layers=6, heads=8, ff=512,
                          stage_dims=[64, 128, 320, 512], decoder_dim=768, samples=16384),
        },
        gpu_preset="large",
        cpu_preset="cpu",
        knobs=frozenset({"channels_last"}),
        flags=frozenset({"channels_last"}),
        rules=(heads_divide_d_model,),
    ),
    "retrieval": WorkloadInfo(
        module="harness.workloads.retrieval",
        description="contrastive dual encoder (query + document transformers), InfoNCE with hard and in-batch negatives",
        presets={
            "tiny": dict(vocab=512, query_len=8, doc_len=16, hard_negatives=1, d_model=32, layers=1, heads=2, ff=64,
                         dim=32, dropout=0.0, samples=256, lr=3e-3),
            "cpu": dict(vocab=8192, query_len=16, doc_len=64, hard_negatives=3, d_model=128, layers=2, heads=4, ff=512,
                        dim=128, samples=4096, lr=1e-3),
            # MiniLM-L6-sized towers (2 x 22.7M)
            "minilm": dict(vocab=30522, query_len=32, doc_len=256, hard_negatives=7, d_model=384, layers=6, heads=12,
                           ff=1536, dim=384),
            # BERT-base towers as in DPR (2 x 109M), 7 hard negatives per query
            "base": dict(vocab=30522, query_len=32, doc_len=256, hard_negatives=7, d_model=768, layers=12, heads=12,
                         ff=3072, dim=768),
        },
        gpu_preset="base",
        cpu_preset="cpu",
        knobs=frozenset({"hard_negatives"}),
        extra_params=frozenset({"topics", "temperature"}),
        rules=(heads_divide_d_model, vocab_of_at_least(3)),  # 2 special tokens and a word
    ),
    "gpt": WorkloadInfo(
        module="harness.workloads.gpt",
        description="decoder-only LM, nanoGPT-style (causal SDPA, pre-LN, tied embeddings), packed synthetic text",
        presets={
            "tiny": dict(vocab=256, seq_len=32, d_model=32, layers=2, heads=2, samples=256, lr=1e-2),
            "cpu": dict(vocab=2048, seq_len=256, block_size=1024, d_model=128, layers=4, heads=4, samples=4096, lr=1e-3),
            # GPT-2 small (124M)
            "gpt2-124m": dict(vocab=50304, seq_len=1024, d_model=768, layers=12, heads=12, lr=6e-4),
            # the 512M pretraining guide's model: 24 x 1280, 32k vocab; block_size 2048 so seq_len can be swept up to it
            "gsa-512m": dict(vocab=32000, seq_len=1024, block_size=2048, d_model=1280, layers=24, heads=20, lr=3e-4),
        },
        gpu_preset="gsa-512m",
        cpu_preset="cpu",
        knobs=frozenset({"seq_len"}),
        extra_params=frozenset({"block_size", "dropout"}),
        rules=(heads_divide_d_model, vocab_of_at_least(2), seq_len_within("block_size", None)),
    ),
    "nli-encoder": WorkloadInfo(
        module="harness.workloads.nli_encoder",
        description="transformer encoder + classification head for 3-way sentence-pair NLI; optional frozen encoder",
        presets={
            "tiny": dict(vocab=512, seq_len=32, d_model=32, layers=1, heads=2, ff=64, dropout=0.0, samples=256, lr=1e-2),
            "cpu": dict(vocab=8192, seq_len=128, d_model=128, layers=4, heads=4, ff=512, samples=4096),
            # BERT-base (110M)
            "base": dict(vocab=30522, seq_len=128, d_model=768, layers=12, heads=12, ff=3072),
            # EmbeddingGemma-sized (300M, two thirds of it the 262k-token embedding table)
            "gemma-300m": dict(vocab=262144, seq_len=256, max_len=2048, d_model=768, layers=24, heads=12, ff=1152),
        },
        gpu_preset="gemma-300m",
        cpu_preset="cpu",
        knobs=frozenset({"freeze_encoder"}),
        extra_params=frozenset({"labels", "dropout", "lr", "max_len"}),
        flags=frozenset({"freeze_encoder"}),
        rules=(heads_divide_d_model, vocab_of_at_least(8), seq_len_within("max_len", 512)),  # 3 special, 4 negations, a word
    ),
    "naics": WorkloadInfo(
        module="harness.workloads.naics",
        description="4-channel text encoders with LoRA, mixture-of-experts fusion, multi-positive contrastive loss",
        presets={
            "tiny": dict(vocab=512, lengths=dict(title=4, description=12, keywords=6, activities=8), d_model=32,
                         layers=1, heads=2, ff=64, lora_rank=4, experts=4, embed_dim=32, n_positives=1, n_negatives=2,
                         codes=64, samples=256, lr=3e-3),
            "cpu": dict(vocab=8192, lengths=dict(title=8, description=32, keywords=12, activities=16), d_model=128,
                        layers=2, heads=4, ff=512, lora_rank=8, experts=4, embed_dim=128, n_positives=1, n_negatives=3,
                        samples=4096, lr=1e-3),
            # MiniLM-L6-sized channel encoders (4 x 22.7M frozen), LoRA r=16
            "base": dict(vocab=30522, lengths=dict(title=16, description=128, keywords=32, activities=64), d_model=384,
                         layers=6, heads=12, ff=1536, lora_rank=16, experts=8, embed_dim=256, n_positives=2,
                         n_negatives=8),
            # BERT-base-sized channel encoders (4 x 109M frozen)
            "large": dict(vocab=30522, lengths=dict(title=16, description=128, keywords=32, activities=64), d_model=768,
                          layers=12, heads=12, ff=3072, lora_rank=16, experts=8, embed_dim=256, n_positives=2,
                          n_negatives=8),
        },
        gpu_preset="base",
        cpu_preset="cpu",
        knobs=frozenset({"n_negatives"}),
        extra_params=frozenset({"hard_fraction", "temperature", "aux_weight", "lora_alpha", "lora_dropout", "top_k", "expert_hidden"}),
        rules=(heads_divide_d_model, vocab_of_at_least(3), top_k_within_experts),  # 2 special tokens and a word
    ),
}


def resolve_preset(info: WorkloadInfo, preset: str, device: str) -> str:
    """'auto' -> the preset sized for the device; other names pass through."""
    if preset == "auto":
        return info.gpu_preset if device.startswith("cuda") else info.cpu_preset
    return preset


# Spec forms of a user's model as it is: the workload-section key -> the adapter module (child only).
ADAPTERS = {"model": "harness.workloads.own", "lightning": "harness.workloads.lightning",
            "hf": "harness.workloads.hf"}


def build(workload: dict) -> Workload:
    """Build a workload from a job's `workload` section: {name|factory|model|lightning|hf, params}. Child only."""
    form = next((key for key in ADAPTERS if workload.get(key)), None)
    if form:
        fn = importlib.import_module(ADAPTERS[form]).adapter(workload)
    elif workload.get("factory"):
        fn = load_factory(workload["factory"])
        if not callable(fn):  # "'int' object is not callable" named neither the factory nor the fix
            raise NotAWorkload(f"workload.factory {workload['factory']} is {type(fn).__name__}, not a function; "
                               "name a function (or class) that takes the params dict and returns a Workload")
    else:
        fn = importlib.import_module(WORKLOADS[workload["name"]].module).build
    params = dict(workload.get("params") or {})
    if workload.get("factory") and not form:
        params = ReadParams(params)
        _handed.append(params)
    built = fn(params)
    if isinstance(built, Workload):
        import torch  # the child's: the parent never builds a workload
        if workload.get("factory") and not form and not isinstance(built.model, torch.nn.Module):
            raise NotAWorkload(f"{workload['factory']} returned a Workload whose model is {type(built.model).__name__}, "
                               "not a torch.nn.Module; set Workload(model=...) to the module to train")
        return built
    if form or not workload.get("factory"):  # bench's own adapter or built-in workload: bench's bug
        raise TypeError(f"{form or workload.get('name')} built {type(built).__name__}, not a Workload")
    raise NotAWorkload(f"{workload['factory']} returned {type(built).__name__}, not a harness.workloads.Workload; "
                       "return Workload(model=..., dataset=..., loss=...) (the README's `Workload` protocol)")


class ReadParams(dict):
    """The params a factory is handed, remembering which names its code asked for: a misspelt one (`widht`)
    is read by nothing, and the factory's own default ran in its place. Looking at every name (iterating,
    `**params`, `dict(params)`) counts as reading each."""

    def __init__(self, params: dict):
        super().__init__(params)
        self.read: set = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def pop(self, key, *default):
        self.read.add(key)
        return super().pop(key, *default)

    def setdefault(self, key, default=None):
        self.read.add(key)
        return super().setdefault(key, default)

    def __iter__(self):  # overriding it also sends `**params` and dict(params) through keys() and __getitem__
        self.read.update(super().keys())
        return super().__iter__()

    def keys(self):
        self.read.update(super().keys())
        return super().keys()

    def items(self):
        self.read.update(super().keys())
        return super().items()

    def values(self):
        self.read.update(super().keys())
        return super().values()

    def copy(self):
        self.read.update(super().keys())
        return dict(super().items())


_handed: list[ReadParams] = []
"""Every params dict this process handed a factory (a trial builds its workload more than once)."""


def unread_params() -> list[str]:
    """The names of `workload.params` that no build of this process read, as the trial ends (a factory that
    keeps its params and reads them in its loss or dataset has read them by then)."""
    names = set().union(*(dict.keys(p) for p in _handed))  # dict's own: p.keys() would count as a read
    return sorted(str(name) for name in names if not any(name in p.read for p in _handed))


class NotAWorkload(TypeError):
    """A factory that returns something else: the same for every config, so the sweep stops on it."""


def load_factory(path: str) -> Callable[[dict], Workload]:
    """'package.module:function' -> the function (or class). The one place bench runs the user's code."""
    module_name, _, attr = path.partition(":")
    module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):  # "module:Class.method" and nested names too
        obj = getattr(obj, part)
    return obj


def user_refs(workload: dict) -> list[str]:
    """Every "module:name" of the user's code a workload section names, to import before building."""
    refs = [workload.get(key) for key in ("factory", "model", "loss", "batch")]
    refs += list((workload.get("lightning") or {}).values()) if isinstance(workload.get("lightning"), dict) else []
    return [r for r in refs if isinstance(r, str)]
