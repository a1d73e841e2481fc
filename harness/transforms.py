"""Training knobs (registry: harness.knobs), applied to a freshly built workload in one documented order.

Order (each step sees the model the previous one produced):
  1. numerics   matmul/conv precision flags (fp32: torch's defaults) and cuDNN autotuning, process-wide
  2. placement  model to the device; `bf16-true` casts the weights themselves (and, per step, the
                floating-point inputs: see `to_device`)
  3. checkpointing  wrap the workload's repeated blocks (full: all, selective: every other one)
  4. sharding   over several processes, DDP or FSDP2 fully_shard per block and root (harness.distributed)
  5. compile    torch.compile over the loss of the checkpointed (and sharded) model, model and loss in
                one graph, so recompute and the loss are compiled too
Checkpointing, then sharding, then compile: the order torchtitan applies them in.
The per-step knobs (autocast, GradScaler, optimizer implementation, DataLoader) are built here too,
so the trial loop only composes them.
"""
from __future__ import annotations

import contextlib
import functools

import torch


# torch's own numerics in this process, read before any trial sets them: fp32 means these.
TORCH_DEFAULTS = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
                  "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}


def set_numerics(precision: str, cudnn_benchmark: bool) -> None:
    """fp32 is torch's defaults, what a user's fp32 run gets: matmuls in IEEE fp32 ("highest"), cuDNN
    convolutions allowed TF32 (torch.backends.cudnn.allow_tf32 is True by default; turning it off
    would make bench's fp32 baseline slower than the user's and inflate every speedup on a conv
    model). tf32 also lets matmuls use TF32 ("high").

    Through the legacy API only: torch >= 2.9 also has `fp32_precision`, but a process that sets only
    the new API raises when anything reads the legacy flags, and inductor and user code still read
    them (pytorch#166387). The legacy setters keep both old and new reads consistent.
    """
    matmul = "high" if precision == "tf32" else TORCH_DEFAULTS["float32_matmul_precision"]
    torch.set_float32_matmul_precision(matmul)  # sets cuda.matmul.allow_tf32 too
    torch.backends.cudnn.allow_tf32 = TORCH_DEFAULTS["cudnn_allow_tf32"]
    torch.backends.cudnn.benchmark = bool(cudnn_benchmark)


def tf32_mode() -> dict:
    """The TF32 switches as torch reports them now (read through the legacy getters), and torch's
    defaults beside them: the record shows that fp32 ran as torch leaves it."""
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "torch_defaults": dict(TORCH_DEFAULTS)}


def input_dtype(precision: str) -> torch.dtype | None:
    """`bf16-true` weights need bf16 inputs; every other precision keeps the batch as it is."""
    return torch.bfloat16 if precision == "bf16-true" else None


def place(model: torch.nn.Module, device: torch.device, precision: str) -> torch.nn.Module:
    model = model.to(device)
    return model.to(torch.bfloat16) if precision == "bf16-true" else model


def autocast(precision: str, device: torch.device):
    """The forward's autocast context; fp32/tf32/bf16-true run without one."""
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16 gradients underflow without loss scaling; every other precision gets a no-op scaler."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16-mixed")


def apply_checkpointing(model: torch.nn.Module, blocks: tuple, mode: str) -> torch.nn.Module:
    """Recompute the activations of the repeated blocks in backward instead of storing them."""
    if mode == "none":
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

    targets = [m for m in model.modules() if isinstance(m, blocks)]
    chosen = set(map(id, targets if mode == "full" else targets[::2]))  # selective: every other block
    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: id(m) in chosen)
    return model


def compiled_loss(loss, model: torch.nn.Module, mode: str):
    """`loss(model, batch)` as one function of the batch, compiled whole when compile is on: the
    model and its loss in one graph, as nanoGPT compiles its model with the loss inside, so a
    language model's vocabulary-sized cross-entropy is fused too. Python in a loss that dynamo cannot
    trace graph-breaks and runs as it is (torch.compiler.disable keeps bookkeeping out of the graph)."""
    def loss_of(batch):
        return loss(model, batch)
    if mode == "off":
        return loss_of
    return torch.compile(loss_of, mode=None if mode == "default" else mode)


def uses_cuda_graphs(mode: str, device: torch.device) -> bool:
    """Whether inductor will try CUDA graphs for this compile mode (its own mode table says)."""
    if mode == "off" or device.type != "cuda":
        return False
    import torch._inductor
    options = torch._inductor.list_mode_options(None if mode == "default" else mode)
    return bool(options.get("triton.cudagraphs", False))


def cuda_graph_skips() -> int:
    """How many compiled graphs inductor ran without CUDA graphs (it logs why at WARNING)."""
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["cudagraph_skips"])


def own_gradients(params) -> None:
    """Allocate every .grad now, so backward accumulates into them in place.

    Under CUDA graphs, a backward whose .grad is None installs the graph's static output buffer as
    the .grad; the next replay (the next micro-batch) overwrites it, so accumulated gradients are
    silently wrong or raise (pytorch#169545, #96693). Owned buffers are only ever added to.
    """
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def optimizer(params, lr: float, impl: str, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; `fused` and `foreach` pick the kernel implementation, `default` lets torch choose."""
    kwargs = {"fused": True} if impl == "fused" else {"foreach": True} if impl == "foreach" else {}
    return torch.optim.AdamW(params, lr=lr, **kwargs)


def loader(dataset, config: dict, collate, device: torch.device) -> torch.utils.data.DataLoader:
    workers = int(config.get("num_workers", 0))
    return torch.utils.data.DataLoader(
        dataset, batch_size=int(config["batch_size"]), shuffle=False, drop_last=True,
        num_workers=workers, persistent_workers=workers > 0, collate_fn=collate,
        pin_memory=bool(config.get("pin_memory", False)) and device.type == "cuda",
    )


def to_device(batch, device: torch.device, non_blocking: bool, float_dtype: torch.dtype | None = None):
    """Move a batch (tensor, or tuples/lists/dicts of them) to the device.

    With `float_dtype`, floating-point tensors (images, features, float targets) are cast to it;
    integer tensors (token ids, labels) keep their dtype.
    """
    if isinstance(batch, torch.Tensor):
        batch = batch.to(device, non_blocking=non_blocking)
        return batch.to(float_dtype) if float_dtype is not None and batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking, float_dtype) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple takes its fields one by one
        return type(batch)(*(to_device(v, device, non_blocking, float_dtype) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking, float_dtype) for v in batch)
    return batch
