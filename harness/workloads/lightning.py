"""A LightningModule (and optional LightningDataModule) as it is, trained in bench's own loop.

    workload:
      lightning: {model: "unet:LitUNet", data: "unet:ShapesData"}   # classes ("module:Class")

The classes are built from the apply target's `model:` and `data:` sections, as LightningCLI would
(a section may be the arguments themselves or `class_path` + `init_args`; the spec resolves that,
see harness.spec). No Trainer: bench's trial loop owns the steps, precision, checkpointing and
compile. A micro-step is the module's `training_step(batch, 0)` (its loss, or the "loss" of the
dict it returns) and the optimizer is the first one `configure_optimizers` returns; schedulers
are not stepped (a trial is seconds long, and a scheduler does not change a step's cost).
Data: the datamodule's `train_dataloader()` dataset and collate_fn (bench sets the batch size),
else the module's own `train_dataloader()`, else the spec's `batch:` function.
"""
from __future__ import annotations

import torch

from harness.workloads import Workload, load_factory
from harness.workloads.own import BatchDataset, find_blocks, first_item


def adapter(section: dict):
    refs = section["lightning"]
    module_cls = load_factory(refs["model"])
    data_cls = load_factory(refs["data"]) if refs.get("data") else None
    batch_fn = load_factory(section["batch"]) if section.get("batch") else None

    def build(params: dict) -> Workload:
        module = module_cls(**params)
        check_automatic(module)
        dataset, collate = data(module, data_cls, dict(section.get("data_params") or {}), batch_fn, params)
        blocks, about = find_blocks(module)
        return Workload(model=module, dataset=dataset, collate=collate, blocks=blocks, about=about,
                        loss=lambda model, batch: step_loss(module_cls, model, batch),
                        optimizer=first_optimizer)
    return build


def check_automatic(module) -> None:
    if not getattr(module, "automatic_optimization", True):
        raise ValueError(f"{type(module).__name__} uses manual optimization; bench needs training_step to "
                         "return the loss and configure_optimizers one optimizer")


def step_loss(module_cls, model, batch):
    """training_step with `self` being what the trial built around the module (compiled or not):
    attribute reads fall through to the module, and `self(x)` goes through the compiled forward."""
    out = module_cls.training_step(model, batch, 0)
    return out["loss"] if isinstance(out, dict) else out


def first_optimizer(module):
    """The optimizer of configure_optimizers, in any of the shapes Lightning accepts."""
    out = module.configure_optimizers()
    if isinstance(out, dict):
        out = out["optimizer"]
    if isinstance(out, (list, tuple)):
        first = out[0]
        optimizers = first if isinstance(first, (list, tuple)) else [o for o in out if isinstance(o, torch.optim.Optimizer)]
        if len(optimizers) != 1:
            raise ValueError(f"configure_optimizers returned {len(optimizers)} optimizers; bench trains with one")
        out = optimizers[0]
        if isinstance(out, dict):
            out = out["optimizer"]
    if not isinstance(out, torch.optim.Optimizer):
        raise ValueError(f"configure_optimizers returned {type(out).__name__}, not a torch optimizer")
    return out


def data(module, data_cls, data_params: dict, batch_fn, params: dict):
    """(map-style dataset, collate_fn) for the trial's own DataLoader."""
    if data_cls is not None:
        dm = data_cls(**data_params)
        dm.setup("fit")
        return loader_parts(dm.train_dataloader(), data_cls.__name__)
    if batch_fn is not None:
        return BatchDataset(batch_fn, params), first_item
    if is_overridden(module, "train_dataloader"):
        return loader_parts(module.train_dataloader(), type(module).__name__)
    raise ValueError(f"{type(module).__name__} has no train_dataloader; name a datamodule "
                     "(workload.lightning.data) or a batch function (workload.batch)")


def is_overridden(module, name: str) -> bool:
    from lightning.pytorch.core.hooks import DataHooks
    return getattr(type(module), name) is not getattr(DataHooks, name)


def loader_parts(loader, owner: str):
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise ValueError(f"{owner}.train_dataloader() yields an IterableDataset; bench needs a map-style "
                         "dataset to set the batch size (or give a batch function, workload.batch)")
    return dataset, loader.collate_fn
