"""Training knobs, applied to a freshly built workload in one documented order.

Order (each step sees the model the previous one produced):
  1. numerics   matmul/conv precision flags and cuDNN autotuning, process-wide, through one API
  2. placement  model to the device; `bf16-true` casts the weights themselves
  3. checkpointing  wrap the workload's repeated blocks (full: all, selective: every other one)
  4. compile    torch.compile over the checkpointed model, so recompute is compiled too
The per-step knobs (autocast, GradScaler, optimizer implementation, DataLoader) are built here too,
so the trial loop only composes them.
"""
from __future__ import annotations

import contextlib
import functools

import torch



def set_numerics(precision: str, cudnn_benchmark: bool) -> None:
    """TF32 on only for `tf32` (fp32 means IEEE fp32). One API per process: mixing raises on read."""
    mode = "tf32" if precision == "tf32" else "ieee"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
    else:  # torch < 2.9: only the legacy switches exist
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.benchmark = bool(cudnn_benchmark)


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


def apply_compile(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    if mode == "off":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode)


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


def to_device(batch, device: torch.device, non_blocking: bool):
    """Move a batch (tensor, or tuples/lists/dicts of them) to the device."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch
