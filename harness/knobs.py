"""The knobs bench searches over: one registry, no torch (the parent validates specs, writes reports
and edits config files with it; the trial child applies the knobs through harness.transforms).

Each knob says what it is, which values it takes, what a run gets when nobody sets it, what only a
CUDA GPU can honour, how a narrow terminal spells it, and the key a plain config file names it by.
A workload adds knobs of its own (seq_len, channels_last, ...); those live with the workload.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping


LIMITS = {"batch_size": 2**24, "accumulation": 2**20, "nproc": 4096, "num_workers": 1024}
"""Highest value of an integer knob; any other searched number must be finite and fit in 32 bits."""


@dataclass(frozen=True)
class Knob:
    """One training knob bench knows how to apply to any workload."""

    name: str
    """The knob's name in a spec's `search:`, a trial config and the report."""
    kind: type
    """int, bool or str: what a value must be."""
    default: object
    """What a trial gets when neither the search nor the user's config says (torch's own default)."""
    choices: tuple = ()
    """The closed set of values, in the order a report lists them; () for an open int or bool."""
    positive: bool = False
    """An int that must be >= 1 (batch size, accumulation, process count); else >= 0 for an int."""
    cuda_only: bool = False
    """True means something only on a CUDA GPU; on a CPU it would run and change nothing."""
    cuda_only_values: Mapping[str, str] = field(default_factory=dict)
    """Values only a CUDA GPU can honour -> why, said when a CPU search drops them."""
    core: bool = False
    """One of the five knobs every view shows first, in registry order."""
    short: str | None = None
    """Header a narrow terminal shows instead of the name."""
    plain_key: str | None = None
    """Top-level key a plain (preset-less) config file stores it under; None: never guessed."""
    doc: str = ""


KNOBS: tuple[Knob, ...] = (
    Knob("batch_size", int, None, positive=True, core=True, short="batch", plain_key="batch_size",
         doc="samples per optimizer micro-step on one process"),
    Knob("accumulation", int, 1, positive=True, core=True, short="acc", plain_key="accumulation",
         doc="micro-steps whose gradients one optimizer step sums"),
    Knob("precision", str, "fp32", ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-true"), core=True,
         short="prec", plain_key="precision",
         cuda_only_values={"tf32": "TF32 is a tensor-core mode of NVIDIA GPUs; on CPU it would run plain fp32"},
         doc="fp32 is torch's defaults; -mixed autocasts with fp32 weights; bf16-true casts the weights"),
    Knob("checkpointing", str, "none", ("none", "full", "selective"), core=True, short="ckpt",
         plain_key="checkpointing", doc="recompute activations of every (full) or every other (selective) block"),
    Knob("compile", str, "off", ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
         core=True, plain_key="compile",
         cuda_only_values={"reduce-overhead": "reduce-overhead only adds CUDA graphs; on CPU it would be compile: default"},
         doc="torch.compile mode over model and loss; off is eager"),
    Knob("num_workers", int, 0, short="workers", doc="DataLoader worker processes"),
    Knob("pin_memory", bool, False, cuda_only=True, doc="page-locked host batches for faster copies to the GPU"),
    Knob("optimizer", str, "default", ("default", "foreach", "fused"), short="opt",
         doc="AdamW implementation: torch's choice, multi-tensor, or one fused kernel"),
    Knob("cudnn_benchmark", bool, False, cuda_only=True, doc="let cuDNN time its convolution algorithms"),
    Knob("expandable_segments", bool, False, cuda_only=True,
         doc="CUDA caching allocator's expandable segments: less fragmentation"),
    Knob("nproc", int, 1, positive=True, plain_key="nproc_per_node",  # torchrun's name for it
         doc="processes that train one model together, one device (or CPU core) each"),
    Knob("parallel", str, "none", ("none", "ddp", "fsdp"), doc="how several processes share the model"),
    Knob("reshard_after_forward", bool, True, doc="FSDP frees gathered weights after forward (less memory, more traffic)"),
)

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
UNIVERSAL = frozenset(BY_NAME)
"""Knobs the trial runner applies to any workload."""
CORE = tuple(k.name for k in KNOBS if k.core)
"""The five knobs every view shows first, in this order."""
CHOICES = {k.name: k.choices for k in KNOBS if k.choices}
"""Knob -> its closed set of values: what a spec may search and what apply may read back from a file."""
DEFAULTS = {k.name: k.default for k in KNOBS if k.default is not None}
CUDA_ONLY = tuple(k.name for k in KNOBS if k.cuda_only)
CUDA_ONLY_VALUES = {(k.name, v): why for k in KNOBS for v, why in k.cuda_only_values.items()}
SHORT = {k.name: k.short for k in KNOBS if k.short}


def rank(name: str) -> int:
    """Sort key for showing a config: the core knobs first in registry order, then any other."""
    return CORE.index(name) if name in CORE else len(CORE)
