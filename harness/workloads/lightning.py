"""A LightningModule (and LightningDataModule) as it is, trained inside a real `lightning.Trainer`.

    workload:
      lightning: true          # the classes of the LightningCLI config's model: and data: class_path
      # or {model: "unet:LitUNet", data: "unet:ShapesData"}; `loop: bench` trains in bench's loop

The module, datamodule and Trainer are built from the apply target's `model:`, `data:` and
`trainer:` sections as LightningCLI would (`class_path` + `init_args`, or the arguments themselves;
harness.spec_own reads them). bench's knobs become the Trainer's own arguments (precision,
accumulate_grad_batches, benchmark) and the datamodule's (batch_size, num_workers, pin_memory);
checkpointing wraps the module's repeated blocks and compile is `module.compile()`: its forward
compiled in place, training_step around it eager (dynamo cannot trace Lightning's self.log; a
`torch.compile(module)` handed to fit compiles training_step and fails there with torch 2.13).
The user's other trainer settings stay
(gradient_clip_val, callbacks, ...); logging, checkpoint saving, validation and the progress bar
are off, and the trial (harness.trainer), not max_epochs, ends fit. So self.trainer, self.log,
schedulers and estimated_stepping_batches work because they are Lightning's own.

`loop: bench` keeps the older path: bench's own loop calls training_step(batch, 0) and the first
optimizer of configure_optimizers, with the datamodule's dataset (no Trainer: self.trainer fails).
"""
from __future__ import annotations

import contextlib
import inspect
import tempfile

import torch

from harness import transforms
from harness.workloads import Workload, load_factory
from harness.workloads.own import BatchDataset, find_blocks, first_item

PRECISIONS = {"fp32": "32-true", "tf32": "32-true", "bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed",
              "bf16-true": "bf16-true"}
# Trainer arguments the trial sets itself; the user's values for these are left out (and said in the record).
BENCH_OWNS = ("precision", "accumulate_grad_batches", "benchmark", "accelerator", "devices", "strategy", "num_nodes",
              "max_epochs", "min_epochs", "max_steps", "min_steps", "max_time", "limit_train_batches",
              "limit_val_batches", "num_sanity_val_steps", "val_check_interval", "check_val_every_n_epoch",
              "logger", "enable_checkpointing", "enable_progress_bar", "enable_model_summary", "default_root_dir",
              "fast_dev_run", "overfit_batches", "profiler", "barebones", "detect_anomaly")
TRIAL_DROPS = ("ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "DeviceStatsMonitor")
"""Callbacks a trial leaves out: checkpoints and logging are off (`enable_checkpointing`, `logger`), and
validation is (`limit_val_batches: 0`), which EarlyStopping watches."""
# Far beyond any trial, so a schedule built from estimated_stepping_batches is finite; the trial stops fit.
TRIAL_MAX_STEPS = 1_000_000


def mistake(message: str) -> Exception:
    """A mistake in the user's module or data that no knob value changes: the sweep stops at its first trial."""
    from harness.trial import UserFacingError  # the child's refusal type; trial imports this module
    return UserFacingError(message, every_config=True)


def adapter(section: dict):
    refs = section["lightning"]
    module_cls = load_factory(refs["model"])
    data_cls = load_factory(refs["data"]) if refs.get("data") else None
    batch_fn = load_factory(section["batch"]) if section.get("batch") else None
    in_trainer = section.get("loop", "trainer") == "trainer"
    data_params = dict(section.get("data_params") or {})
    trainer_args = dict(section.get("trainer_args") or {})

    def build(params: dict) -> Workload:
        module = module_cls(**params)
        check_automatic(module)
        blocks, about = find_blocks(module)
        on_meta = torch.get_default_device().type == "meta"  # the FLOP count's copy: it needs a sample batch
        dataset, collate = (data(module, data_cls, data_params, batch_fn, params) if on_meta or not in_trainer
                            else (None, None))
        if on_meta or not in_trainer:  # no Trainer to log to: self.log is a no-op, not a warning per step
            module.log = module.log_dict = lambda *args, **kwargs: None
        if in_trainer:
            about["loop"] = "lightning.Trainer"

        def trainer(config, trial):
            fit(module, data_cls, data_params, batch_fn, params, trainer_args, blocks, about, config, trial)
        return Workload(model=module, dataset=dataset, collate=collate, blocks=blocks, about=about,
                        loss=lambda model, batch: step_loss(module_cls, model, batch),
                        optimizer=first_optimizer, trainer=trainer if in_trainer else None)
    return build


# ---- inside lightning.Trainer ----------------------------------------------------------------------

def fit(module, data_cls, data_params, batch_fn, params, user_args, blocks, about, config, trial) -> None:
    """Trainer.fit of the user's module and datamodule with the trial's knobs, until the trial stops it."""
    import lightning as L

    datamodule = make_datamodule(data_cls, data_params, config) if data_cls else None
    loaders = {} if datamodule else {"train_dataloaders": fallback_loader(batch_fn, params, config)}
    mode = config.get("checkpointing", "none")
    transforms.apply_checkpointing(module, blocks, mode)
    if mode != "none":
        about["checkpointing"] = f"bench wraps {'every' if mode == 'full' else 'every other'} {about['blocks']}"
    compile_mode = config.get("compile", "off")
    if compile_mode != "off":  # the module's forward, in place: training_step (self.log) stays eager
        module.compile(mode=None if compile_mode == "default" else compile_mode)
    args, dropped = trainer_arguments(user_args, config, trial.device)
    if dropped:
        about["trainer_args_set_by_bench"] = dropped
    about["trainer"] = {**args, "logger": "one that logs nothing (Lightning's DummyLogger)"}
    del about["trainer"]["callbacks"]
    with tempfile.TemporaryDirectory(prefix="bench-lightning-") as root:
        trainer = L.Trainer(**args, logger=quiet_logger(root), default_root_dir=root)
        trainer.callbacks.append(meter_callback(L, trial, trainer.accumulate_grad_batches))
        trainer.fit(module, datamodule=datamodule, **loaders)


def quiet_logger(root: str):
    """A logger that logs nothing (Lightning's own DummyLogger, which the tuner uses), in place of the
    user's: a module that reads self.logger (log_hyperparams, experiment.add_image) runs as it would,
    and every folder it names (self.logger.log_dir, trainer.log_dir) is the trial's."""
    from lightning.pytorch.loggers.logger import DummyLogger

    class QuietLogger(DummyLogger):
        save_dir = root_dir = log_dir = property(lambda self: root)
    return QuietLogger()


def make_datamodule(data_cls, data_params: dict, config: dict):
    """The user's datamodule with the trial's batch size (and loader knobs, where it takes them)."""
    takes = inspect.signature(data_cls).parameters
    if "batch_size" not in takes:
        raise mistake(f"{data_cls.__name__} takes no batch_size argument; bench sets the batch size through it "
                      "(add batch_size to its __init__, or use `loop: bench`)")
    knob_args = {"batch_size": int(config["batch_size"])}
    for knob in ("num_workers", "pin_memory"):
        if knob in config:
            if knob not in takes:
                raise ValueError(f"{data_cls.__name__} takes no {knob} argument; drop {knob} from search or add it "
                                 "to the datamodule's __init__ and its DataLoader")
            knob_args[knob] = config[knob]
    return data_cls(**{**data_params, **knob_args})


def fallback_loader(batch_fn, params, config):
    """No datamodule: the spec's batch function (harness.spec_own refuses a Trainer with neither at load:
    a module's own train_dataloader sets its own batch size)."""
    return transforms.loader(BatchDataset(batch_fn, params, 1 << 16), config, first_item, torch.device("cpu"))


def trainer_arguments(user_args: dict, config: dict, device: torch.device) -> tuple[dict, list[str]]:
    """The user's trainer settings, with bench's knobs and a trial's limits in place of the ones it owns."""
    kept = {k: instantiate(v) for k, v in user_args.items() if k not in BENCH_OWNS}
    callbacks = listed(kept.get("callbacks"))
    kept["callbacks"] = [c for c in callbacks if not left_out(c)]
    args = {**kept,
            "precision": PRECISIONS[config.get("precision", "fp32")],
            "accumulate_grad_batches": int(config.get("accumulation", 1)),
            "benchmark": bool(config.get("cudnn_benchmark", False)),
            "accelerator": "gpu" if device.type == "cuda" else "cpu",
            **processes(config, device),
            "max_epochs": -1, "max_steps": max(int(user_args.get("max_steps") or -1), TRIAL_MAX_STEPS),
            "limit_val_batches": 0, "num_sanity_val_steps": 0,
            "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
    dropped = sorted(k for k in user_args if k in BENCH_OWNS)
    dropped += [f"callbacks: {type(c).__name__}" for c in callbacks if left_out(c)]
    return args, dropped


def left_out(callback) -> bool:
    """A callback of a kind a trial has turned off the need for (a subclass too, from either package): it
    would refuse the Trainer (no checkpointing, no logger, no validation) or stop it mid-measurement."""
    return any(cls.__name__ in TRIAL_DROPS for cls in type(callback).__mro__)


def processes(config: dict, device: torch.device) -> dict:
    """One process on the trial's device; or `nproc` ranks that harness.distributed launched, which the
    Trainer finds in torch's elastic environment and joins with its own DDP strategy."""
    nproc = int(config.get("nproc", 1))
    if nproc > 1:
        return {"devices": nproc, "num_nodes": 1, "strategy": "ddp"}
    return {"devices": [device.index or 0] if device.type == "cuda" else 1, "strategy": "auto"}


def instantiate(value):
    """LightningCLI's {class_path, init_args} (alone or in a list) as the object it names."""
    if isinstance(value, list):
        return [instantiate(v) for v in value]
    if isinstance(value, dict) and isinstance(value.get("class_path"), str):
        module, _, name = value["class_path"].rpartition(".")
        return load_factory(f"{module}:{name}")(**(value.get("init_args") or {}))
    return value


def listed(value) -> list:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def meter_callback(L, trial, accumulate: int):
    """bench's meter inside the Trainer: the gate at each optimizer step, the losses, the reference."""

    class BenchMeter(L.Callback):
        def __init__(self):
            self.step_open = False

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.step_open:
                return  # a later micro-batch of the same optimizer step
            if trainer.global_step == 0 and not trial.meter.losses and not trial.meter.pending:
                taken = trial.fp32_reference(lambda: reference_loss(pl_module, batch, batch_idx))
                trial.started(pl_module, trainer.optimizers[0], taken)
            self.step_open, self.step = True, trainer.global_step
            trial.gate.step_start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None:  # None: training_step skipped the batch, as Lightning allows; the step goes on
                trial.meter.pending.append(loss.detach().float() * accumulate)  # Lightning hands it divided by accumulation
            if trainer.global_step != self.step:  # the optimizer stepped: the step is done
                self.step_open = False
                trial.gate.step_end()

    return BenchMeter()


def reference_loss(module, batch, batch_idx: int) -> float | None:
    """fp32 loss of training_step on the first batch, before any step: no autocast, logging muted,
    the eager forward of a compiled module, weights upcast when the precision is a `-true` one."""
    dtype = next(module.parameters()).dtype
    buffers = {k: v.clone() for k, v in module.named_buffers()}  # keep BatchNorm stats as they were
    compiled = module._compiled_call_impl  # what nn.Module.compile() set; calls go through it when set
    module._compiled_call_impl = None
    module.log = module.log_dict = lambda *args, **kwargs: None
    try:
        if dtype != torch.float32:
            module.float()
        with torch.no_grad(), torch.autocast(batch_device(batch), enabled=False):
            out = module.training_step(batch, batch_idx)
        loss = out.get("loss") if isinstance(out, dict) else out
        return None if loss is None else float(loss.float())  # a skipped first batch: no reference to check against
    finally:
        del module.log, module.log_dict
        module._compiled_call_impl = compiled
        if dtype != torch.float32:
            module.to(dtype)
        module.load_state_dict(buffers, strict=False)


def batch_device(batch) -> str:
    tensors = [batch] if isinstance(batch, torch.Tensor) else (
        list(batch.values()) if isinstance(batch, dict) else list(batch) if isinstance(batch, (list, tuple)) else [])
    return next((t.device.type for t in tensors if isinstance(t, torch.Tensor)), "cpu")


# ---- in bench's own loop (`loop: bench`) -------------------------------------------------------------

def check_automatic(module) -> None:
    if not getattr(module, "automatic_optimization", True):
        raise mistake(f"{type(module).__name__} uses manual optimization; bench needs training_step to return "
                      "the loss and configure_optimizers one optimizer")


@contextlib.contextmanager
def trainerless(module_cls):
    """A module that reads self.trainer (a scheduler sized by estimated_stepping_batches) cannot run here."""
    try:
        yield
    except RuntimeError as e:
        if "is not attached to a `Trainer`" not in str(e):
            raise
        raise mistake(f"{module_cls.__name__} reads self.trainer, which bench's own loop (loop: bench) does not have; "
                      "leave out loop: bench to measure it in your Trainer") from None


def step_loss(module_cls, model, batch):
    """training_step with `self` being what the trial built around the module (compiled or not):
    attribute reads fall through to the module, and `self(x)` goes through the compiled forward."""
    with trainerless(module_cls):
        out = module_cls.training_step(model, batch, 0)
    return out["loss"] if isinstance(out, dict) else out


def first_optimizer(module):
    """The optimizer of configure_optimizers, in any of the shapes Lightning accepts."""
    with trainerless(type(module)):
        out = module.configure_optimizers()
    if isinstance(out, dict):
        out = out["optimizer"]
    if isinstance(out, (list, tuple)):
        first = out[0]
        optimizers = first if isinstance(first, (list, tuple)) else [o for o in out if isinstance(o, torch.optim.Optimizer)]
        if len(optimizers) != 1:
            raise mistake(f"configure_optimizers returned {len(optimizers)} optimizers; bench trains with one")
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
    raise mistake(f"{type(module).__name__} has no train_dataloader; name a datamodule "
                  "(workload.lightning.data) or a batch function (workload.batch)")


def is_overridden(module, name: str) -> bool:
    from lightning.pytorch.core.hooks import DataHooks
    return getattr(type(module), name) is not getattr(DataHooks, name)


def loader_parts(loader, owner: str):
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise mistake(f"{owner}.train_dataloader() yields an IterableDataset; bench needs a map-style dataset "
                      "to set the batch size (or give a batch function, workload.batch)")
    return dataset, loader.collate_fn
