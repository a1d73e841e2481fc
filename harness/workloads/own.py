"""A user's model as it is: a model class, a loss function and a batch function, no wrapper code.

    workload:
      model: "unet:UNet"                      # an nn.Module class, built with the params it names
      loss: "torch.nn.functional:mse_loss"    # loss(model(x), y)
      batch: "unet:random_batch"              # batch(batch_size, ...) -> (x, y)
      params_from: model                      # its arguments: the apply target's `model:` section

Also the pieces the other adapters share (child only, torch imported): calling a user function with
the params its signature names, a Dataset made from a batch function, and finding the repeated
blocks activation checkpointing wraps.
"""
from __future__ import annotations

import inspect
from collections import Counter

import torch

from harness.workloads import Workload, load_factory


def adapter(section: dict):
    """The build(params) function for the spec's `model` / `loss` / `batch` form."""
    model_cls, loss_fn, batch_fn = (load_factory(section[k]) for k in ("model", "loss", "batch"))

    def build(params: dict) -> Workload:
        check_used(params, section.get("strict", ()), [model_cls, batch_fn])
        model = call_with(model_cls, params)
        blocks, about = find_blocks(model)
        return Workload(model=model, dataset=BatchDataset(batch_fn, params), collate=first_item,
                        loss=lambda m, batch: loss_fn(forward(m, inputs_and_targets(batch, section)[0]), batch[1]),
                        blocks=blocks, about=about, lr=float(params.get("lr", 1e-3)))
    return build


def inputs_and_targets(batch, section: dict) -> tuple:
    """The batch function's (inputs, targets); anything else is said in its terms, not as the loss's
    complaint about a tensor it was handed in their place."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch
    from harness.trial import UserFacingError  # the child's refusal type; trial imports this module
    got = f"a {type(batch).__name__}" + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    raise UserFacingError(f"workload.batch {section['batch']} returned {got}; it must return (inputs, targets)")


def forward(model, inputs):
    """model(x), or model(**x) when the batch function gives its inputs as a mapping."""
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def call_with(fn, params: dict, *args):
    """fn(*args, **the params its signature names); everything when it takes **kwargs."""
    return fn(*args, **accepted(fn, params))


def accepted(fn, params: dict) -> dict:
    signature = inspect.signature(fn)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return dict(params)
    return {k: v for k, v in params.items() if k in signature.parameters}


def check_used(params: dict, strict, functions) -> None:
    """A param the user wrote (or searched) that no function takes would be silently ignored: refuse it."""
    unused = [k for k in strict if k in params and not any(k in accepted(fn, {k: 0}) for fn in functions)]
    if unused:
        from harness.trial import UserFacingError  # the child's refusal type; trial imports this module
        names = ", ".join(getattr(fn, "__qualname__", str(fn)) for fn in functions)
        raise UserFacingError(f"workload params {', '.join(unused)}: taken by none of {names}; "
                              "remove them or add the argument", every_config=True)


class BatchDataset(torch.utils.data.Dataset):
    """A batch function as a Dataset: item i is its index, and `first_item` turns a list of n indices
    into batch_fn(n) drawn with the first index as seed, so the same indices give the same batch
    (the fp32 reference loss and the first step see one batch) and DataLoader workers still work."""

    def __init__(self, batch_fn, params: dict, length: int = 1 << 30):
        self.batch_fn, self.params, self.length = batch_fn, params, length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return (self, i)


def first_item(items):
    dataset, seed = items[0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return call_with(dataset.batch_fn, dataset.params, len(items))


def find_blocks(model) -> tuple[tuple, dict]:
    """The repeated blocks to checkpoint: the class with the most same-class children of one
    nn.ModuleList / nn.Sequential (ties: the larger block). Blocks built of layers come before bare
    layers (a Sequential of Conv2d), which are only chosen when nothing else repeats; where no container
    repeats anything, blocks held as attributes (`self.b1, self.b2 = Block(), Block()`).
    Returns (classes, what was chosen)."""
    best = None
    for name, container in model.named_modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        counts = Counter(type(child) for child in container.children())
        for cls, n in counts.items():
            if n < 2 or _never_called(cls):
                continue
            same = [c for c in container.children() if type(c) is cls]
            rank = (any(True for _ in same[0].children()), n, sum(p.numel() for c in same for p in c.parameters()))
            if best is None or rank > best[0]:
                best = (rank, cls, name)
    if best is None:
        best = _attribute_blocks(model)
    if best is None:
        return (), {"blocks": None, "blocks_reason": "no nn.ModuleList/Sequential holds two blocks of one class, "
                                                     "and no module has two of one class built of layers"}
    cls, name = best[1], best[2]
    return (cls,), {"blocks": f"{cls.__module__}.{cls.__qualname__}",
                    "blocks_count": sum(isinstance(m, cls) for m in model.modules()),
                    "blocks_found_in": name or "(the model itself)"}


_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)


def _never_called(cls) -> bool:
    """A ModuleList or ModuleDict is looped over, never called: wrapping it would recompute nothing."""
    return cls.forward is torch.nn.Module.forward


def _attribute_blocks(model):
    """(rank, class, parent's name) of the most same-class children of one module, blocks built of layers
    only (an MLP's fc1 and fc2 are two Linear layers, not blocks) and not containers (two halves held as
    nn.ModuleList are looped over, not called; as nn.Sequential, the class would be every Sequential in
    the model); None where no module has two."""
    best = None
    for name, parent in model.named_modules():
        counts = Counter(type(child) for child in parent.children()
                         if any(True for _ in child.children()) and not isinstance(child, _CONTAINERS))
        for cls, n in counts.items():
            same = [c for c in parent.children() if type(c) is cls]
            rank = (n, sum(p.numel() for c in same for p in c.parameters()))
            if n >= 2 and (best is None or rank > best[0]):
                best = (rank, cls, name)
    return best
