"""The trial child: `python -m harness.trial JOB.json RESULT.json`.

Builds the workload fresh, applies the knobs, warms up (compile included), then times optimizer
steps in windows until the spread is small or a cap is reached, and writes one record (see
harness.record). Runs in its own process group; it dies with its parent, and reports progress
through a heartbeat file so the parent can tell a slow trial from a stuck one.

A trial's jobs, each in its own place, in the order `Trial.run` reads:
    build       the workload, its FLOPs, the fp32 reference, the knobs (harness.transforms): `Trial`
    memory      the wall and the peak, per kind of device (harness.footprint)
    meter       first step and warm-up apart, then the timed windows (harness.meter)
    record      the measured figures and the loss check, as one record (`Trial.record`)
A trial over several processes is `harness.distributed.RankTrial` (its hooks: shard, sync, across
ranks); one inside the user's Trainer is `harness.trainer.TrainerTrial` (the Trainer takes the steps).
"""
from __future__ import annotations

import ctypes
import importlib
import itertools
import json
import math
import os
import pickle
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch

from harness import __version__, errors, failures, footprint, knobs, measure, record, reference, reuse, transforms, workloads, zygote
from harness.meter import Meter


class Heartbeat:
    """Progress the parent can read: the phase and the step count, rewritten on every step."""

    def __init__(self, path: str | None):
        self.path = path

    def beat(self, phase: str, step: int = 0) -> None:
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"phase": phase, "step": step, "time": time.time(), "pid": os.getpid()}, f)
            os.replace(tmp, self.path)


def die_with_parent() -> None:
    """No orphan may keep a GPU busy: when the parent goes, take the whole process group down.

    The parent-death signal is SIGTERM with a handler, not SIGKILL: SIGKILL would end this process
    alone and leave its grandchildren (DataLoader workers, compile pools) running.
    """
    me, parent = os.getpid(), int(os.environ.get(zygote.PARENT_ENV) or os.getppid())

    def on_sigterm(signum, frame):
        if os.getpid() != me:  # a forked DataLoader worker inherits this handler: it just ends, as by default
            os._exit(128 + signum)
        try:  # so the parent says SIGTERM, not the SIGKILL below; a dead parent's pipe is no reason to stay
            os.write(2, f"\n{record.TERMINATED}\n".encode())
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:  # Linux: the kernel signals us the moment the parent dies
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def is_oom(exc: BaseException) -> bool:
    """An allocation failure, by any library's word for it (harness.errors), the vaguer ones only at the wall."""
    return errors.is_oom(exc, at_wall=measure.refused_memory())


def bf16_speedup() -> float | None:
    """measure.cpu_bf16_speedup, or None where a trial that ran at its memory wall has no room left
    for the layer (not filed: the study's next trial measures it)."""
    try:
        return measure.cpu_bf16_speedup()
    except (RuntimeError, MemoryError) as exc:
        if is_oom(exc):
            return None
        raise


def one_number(loss):
    """The loss, which must be one number: a per-sample loss failed in backward() as torch's own complaint,
    and a (loss, metrics) tuple or a dict in bench's own `loss / accumulation`."""
    if not isinstance(loss, torch.Tensor):
        raise UserFacingError(f"the loss returned a {type(loss).__name__}, not a tensor: return one scalar tensor "
                              "(e.g. the `loss` of a (loss, metrics) pair, or out['loss'])")
    if loss.numel() != 1:
        raise UserFacingError(f"the loss returned a tensor of shape {tuple(loss.shape)}, not one number: "
                              "reduce it (e.g. reduction='mean', or .mean())")
    return loss


BREAKDOWN_REVISION = 2
"""How a breakdown is counted; one filed under another is measured again (2: autocast's weight copies left out of
the activations, the optimizer state read after the measured steps)."""


class Trial:
    """One config, measured: `run` builds it, warms it up, meters it and returns its record."""

    def __init__(self, job: dict, heartbeat: Heartbeat):
        self.job, self.hb = job, heartbeat
        self.config = job["config"]
        self.device = torch.device(job["device"])
        self.accum = int(self.config.get("accumulation", 1))
        self.precision = self.config.get("precision", "fp32")
        self.footprint = footprint.probe(self.device, job.get("memory_budget"), job.get("nvml_used_at_start"))
        self.memory = self.footprint.memory  # the record's memory section; the probe and the phases fill it
        self.timing: dict = {}
        self.figures = reuse.Figures(job.get("reuse_dir"), job.get("trial"))
        self.world = 1  # processes training together (harness.distributed)
        self.untouched = None  # on a CPU, the untouched weights' file until the reference is taken (reference_pass)
        self.first_forward_seed = int(job.get("seed", 0)) + 1  # not the build's: its draws would echo the weights' init
        self.meter = Meter(self.step, self.device, heartbeat, job["measure"], self.footprint, self.timing,
                           self.across_ranks)

    # -- setup --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Device, memory wall and workload: everything before the first step."""
        t_setup = time.perf_counter()
        self.footprint.start()
        torch.manual_seed(self.job.get("seed", 0))
        for ref in workloads.user_refs(self.job["workload"]):
            import_factory(ref)
        t0 = time.perf_counter()
        try:
            self.wl = self.build_workload()
        except workloads.NotAWorkload as exc:
            traceback.print_exc()  # the log the parent's one line points at
            raise FactoryImportError(str(exc)) from exc
        except ModuleNotFoundError as exc:  # the hf and lightning forms import their library here
            if not missing_extra(exc):
                raise
            traceback.print_exc()
            raise FactoryImportError(f"{exc}{missing_extra(exc)}") from exc
        self.timing["build_s"] = time.perf_counter() - t0
        self.check_knobs()
        self.t_setup = t_setup

    def build_workload(self):
        """The workload, its model on the CPU (harness.distributed's FSDP ranks: on the meta device)."""
        return workloads.build(self.job["workload"])

    def figure_key(self, *knobs_used) -> dict:
        """What a figure filed for reuse depends on (harness.reuse): the build, the batch's shape, the
        versions, and how the model is shared across processes (a DDP or FSDP rank's breakdown is not
        one process's)."""
        return {"workload": self.job["workload"], "device": self.device.type, "seed": self.job.get("seed", 0),
                "torch": torch.__version__, "bench": __version__,
                **{k: self.config.get(k) for k in ("batch_size", "nproc", "parallel", *knobs_used)}}

    def check_knobs(self) -> None:
        if int(self.config.get("nproc", 1)) != self.world:
            raise UserFacingError(f"nproc {self.config['nproc']} needs parallel: ddp or fsdp to share the model")
        if "reshard_after_forward" in self.config and self.config.get("parallel") != "fsdp":
            raise UserFacingError("reshard_after_forward only means something with parallel: fsdp")
        if self.wl.optimizer and self.config.get("optimizer", "default") != "default":
            raise UserFacingError("the optimizer knob picks AdamW's kernels; this workload brings its own "
                                  "optimizer (configure_optimizers): search optimizer: default only")
        if self.config.get("checkpointing", "none") != "none" and not (self.wl.blocks or self.wl.checkpoint):
            why = self.wl.about.get("blocks_reason")  # the model form: what bench looked for in your model
            raise UserFacingError("checkpointing needs repeated blocks to wrap" + (f", and your model has none ({why})"
                                  if why else " (Workload.blocks)") + "; search checkpointing: none only"
                                  + ("" if why else ", or name the blocks in the factory's Workload"))

    def count_flops(self):
        """FLOPs of one micro-batch, counted once on a meta-device copy: no memory, no recompute."""
        try:
            with torch.device("meta"):
                meta = workloads.build(self.job["workload"])
            batch = self.sample_batch(meta.dataset, meta.collate)
            batch = transforms.to_device(batch, torch.device("meta"), False)
            return [measure.count_flops(lambda: meta.loss(meta.model, batch).backward()), None]
        except Exception as exc:  # a model that cannot run on meta still trains; it just has no MFU
            return [None, f"{type(exc).__name__}: {exc}"[:300]]

    def sample_batch(self, dataset, collate):
        n = int(self.config["batch_size"])
        if hasattr(dataset, "__len__") and n > len(dataset):  # a synthetic dataset answers any index, slowly
            raise BatchOverDataset(n, dataset)
        items = [dataset[i] for i in range(n)]
        return (collate or torch.utils.data.default_collate)(items)

    def build_training(self) -> None:
        """The reference loss on the first step's batch, then the model as it trains and what drives its steps."""
        self.loader = transforms.loader(self.wl.dataset, self.config, self.wl.collate, self.device)
        batches = self.cycle()
        first = next(batches)
        self.batches = itertools.chain([first], batches)  # the first step's batch, whatever the dataset drew
        transforms.set_numerics("fp32", False)  # the reference runs as torch leaves numerics (fp32)
        t0 = time.perf_counter()
        self.reference = self.reference_pass(first)
        del first  # the chain holds it until the first step takes it
        self.timing["reference_s"] = time.perf_counter() - t0
        measure.reset_peak(self.device)  # the first steps' window starts here: the reference pass is not in it
        transforms.set_numerics(self.precision, self.config.get("cudnn_benchmark", False))
        model = self.training_model()
        self.params = self.wl.trainable(model) if self.wl.trainable else [p for p in model.parameters() if p.requires_grad]
        self.loss_of = transforms.compiled_loss(self.wl.loss, self.eager, self.config.get("compile", "off"))
        self.training_parts(model)
        self.timing["setup_s"] = time.perf_counter() - self.t_setup

    def reference_pass(self, batch) -> dict | None:
        """The fp32 reference loss on `batch`, the untouched model placed on the device (harness.distributed's
        FSDP ranks take it from their sharded model instead: the whole model never fits one rank).

        On a CPU one not filed yet is taken after the measured steps (None here; `deferred_reference`):
        the peak is the process's resident high-water mark, and a pass here changed it for good (glibc's
        heap and the kernels it first used: +3 MiB on a tiny bf16 trial, which one reusing the figure
        did not have). Its weights and batch wait on disk, where they take no resident memory."""
        model = self.wl.model.to(self.device)
        if self.device.type != "cpu" or self.world > 1:
            return self.reference_loss(model, batch)
        filed = self.reference_loss(model, batch, filed_only=True)
        if filed is None:
            # in the trial's folder, which the sweep removes even when it kills the trial
            folder = Path(self.job["heartbeat"]).parent if self.job.get("heartbeat") else None
            self.untouched = tempfile.NamedTemporaryFile(prefix="bench-untouched-", suffix=".pt", dir=folder)
            try:
                torch.save({"weights": model.state_dict(), "batch": batch}, self.untouched.name)
            except (pickle.PicklingError, TypeError, AttributeError):  # unpicklable: the dataset's first items instead
                torch.save({"weights": model.state_dict(), "batch": None}, self.untouched.name)
        return filed

    def deferred_reference(self) -> dict:
        """The reference loss reference_pass left for after the measured steps: the untouched weights in
        a model built again, on the first step's batch, the memory wall down (the trained model is still held)."""
        t0 = time.perf_counter()
        measure.lift_cpu_memory_limit()
        transforms.set_numerics("fp32", False)
        try:
            with self.untouched:
                model = self.build_workload().model
                saved = torch.load(self.untouched.name, weights_only=False)  # its own file; a batch may be any object
                model.load_state_dict(saved["weights"])
            return self.reference_loss(model, saved["batch"])
        except Exception:  # the measurement stands; only the check against the reference is lost
            print("bench: the fp32 reference loss could not be taken after the measured steps; the first loss is "
                  "not checked against it:\n" + traceback.format_exc(), file=sys.stderr, flush=True)
            return reference.missing()
        finally:
            self.untouched = None
            self.timing["reference_s"] = self.timing.get("reference_s", 0.0) + time.perf_counter() - t0

    def training_model(self) -> torch.nn.Module:
        """Placed (bf16-true: cast), checkpointed, sharded; sets `eager` (what the loss calls) and the
        weights' bytes. Returns the module whose parameters train."""
        model = transforms.place(self.wl.model, self.device, self.precision)
        self.memory["weights"] = measure.tensor_bytes(list(model.parameters()) + list(model.buffers()))
        self.eager = self.shard(self.checkpointed(model))  # after checkpointing, before compile (see harness.transforms)
        return model

    def checkpointed(self, model):
        mode = self.config.get("checkpointing", "none")
        return (self.wl.checkpoint(model, mode) if self.wl.checkpoint and mode != "none"
                else transforms.apply_checkpointing(model, self.wl.blocks, mode))

    def training_parts(self, model) -> None:
        """Optimizer, loss scaler, autocast, data: what each step composes."""
        self.cuda_graphs = transforms.uses_cuda_graphs(self.config.get("compile", "off"), self.device)
        if self.cuda_graphs:
            transforms.own_gradients(self.params)
        self.opt = (self.wl.optimizer(model) if self.wl.optimizer
                    else transforms.optimizer(self.params, self.wl.lr, self.config.get("optimizer", "default"), self.device))
        self.scaler = transforms.grad_scaler(self.precision, self.device)
        self.autocast = self.precision_context()
        self.non_blocking = bool(self.config.get("pin_memory")) and self.device.type == "cuda"
        self.input_dtype = transforms.input_dtype(self.precision)

    def precision_context(self):
        """The forward's autocast (harness.distributed's FSDP ranks: none, FSDP2 casts the weights)."""
        return transforms.autocast(self.precision, self.device)

    def cycle(self):
        while True:
            empty = True
            for batch in self.loader:
                empty = False
                yield batch
            if empty:  # else the first step would loop here until the trial's timeout
                raise BatchOverDataset(self.config["batch_size"], self.wl.dataset)

    # -- hooks a trial over several processes fills in (harness.distributed) -------------------------
    def shard(self, model):
        """The model as it trains across processes (DDP, FSDP); one process trains it as it is."""
        return model

    def sync_gradients(self, last: bool) -> None:
        """Called before each micro-batch's forward; `last`: the optimizer step's last micro-batch."""

    def across_ranks(self, value: float) -> float:
        """The largest `value` over the processes: the slowest window, any rank's wish to stop."""
        return value

    # -- steps --------------------------------------------------------------------------------
    def step(self) -> None:
        """One optimizer step over `accumulation` micro-batches."""
        for i in range(self.accum):
            batch = transforms.to_device(next(self.batches), self.device, self.non_blocking, self.input_dtype)
            if self.cuda_graphs:  # each micro-batch is a new graph replay; its backward already ran
                torch.compiler.cudagraph_mark_step_begin()
            self.sync_gradients(i == self.accum - 1)
            with self.autocast:
                loss = one_number(self.loss_of(batch))
            self.scaler.scale(loss / self.accum).backward()
            self.meter.pending.append(loss.detach().clone())  # a CUDA-graph output would be overwritten next step
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=not self.cuda_graphs)  # graphs: keep owned .grad (transforms.own_gradients)

    def reference_loss(self, model, batch=None, filed_only: bool = False) -> dict | None:
        """fp32 eager loss of the untouched model on the first step's batch (a dataset's first items where
        no step drew one): what every precision must match (harness.reference).

        Reused from an earlier trial only for the same weights and batch (their sums are in the key),
        so a factory that builds differently each time, or a dataset that augments at random, still gets
        its own reference. `filed_only`: the filed one, or None (nothing measured).
        """
        if batch is None:
            batch = self.sample_batch(self.wl.dataset, self.wl.collate)
        batch = transforms.to_device(batch, self.device, False)
        key = {**self.figure_key(), "weights_and_batch": fingerprint([*model.parameters(), *model.buffers(), batch]),
               "drawn_at": self.first_forward_seed, "redraws": reference.REDRAWS}  # how its draws were taken
        return self.figures.get("reference", key, (lambda: None) if filed_only else lambda: self.fp32_loss(model, batch))

    def fp32_loss(self, model, batch) -> dict:
        buffers = [(b, b.clone()) for b in model.buffers()]  # keep BatchNorm stats as they were

        def loss() -> float:
            with torch.no_grad():
                value = float(one_number(self.wl.loss(model, batch)))
                for b, saved in buffers:
                    b.copy_(saved)
            return value
        return self.fp32_reference(loss)

    def fp32_reference(self, loss) -> dict:
        """`loss()` at the random draws the first step's forward gets, and at others (harness.reference)."""
        return reference.take(loss, self.first_forward_seed, self.device)

    def seed_first_forward(self) -> None:
        """Right before the first step, its batch already drawn (build_training; a DataLoader draws a seed
        as it starts), so that a loss that draws random numbers draws the reference's."""
        reference.seed_all(self.first_forward_seed)

    def warn_if_cold_autotune(self) -> None:
        """max-autotune benchmarks every GEMM/conv candidate on its first compile: minutes where the
        inductor cache is cold, which can pass the trial's time limit. Said in the trial's log first."""
        mode = self.config.get("compile", "off")
        cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or "")
        if mode.startswith("max-autotune") and not (cache.is_dir() and any(cache.iterdir())):
            print(f"bench: compile {mode} with a cold inductor cache ({cache or 'default'}): the first step "
                  "autotunes every matmul and convolution and can take minutes, past a short trial.timeout; "
                  "a repeat of this config reuses the cache", file=sys.stderr, flush=True)

    def warm_up(self) -> None:
        """The first step and the warm-up steps, timed apart from the measured windows (harness.meter).

        The memory they take is their own window: placement, the first step and the warm-up steps
        hold one-off work (cuDNN benchmark workspaces, max-autotune's benchmarking buffers, CUDA-graph
        recording, bf16-true's freed fp32 weights, cached blocks of the reference pass). Its peak is
        recorded as `memory.first_step_peak`; it had to fit under the memory wall (the cap is set
        before the first step, and going over it is this config's OOM), so a config that reaches the
        measured steps is feasible at the wall. Then what that work left cached is given back and the
        window restarts, before the last warm-up step, which regrows the cache untimed: `peak_memory`
        is the steady state's peak, what the config keeps needing step after step (harness.footprint).
        """
        self.warn_if_cold_autotune()
        self.seed_first_forward()
        self.meter.first_step(compiled=self.config.get("compile", "off") != "off")
        self.meter.warm_up(self.samples_per_step())

    def leak(self) -> dict | None:
        """Memory the measured steps kept (harness.footprint.leak). Not judged on a CPU trial of several
        processes: a rank's C heap also holds the process group's buffers, which grow as it settles (a
        rank of a 2-process FSDP trial that kept nothing grew 32 KiB a step; a plain DDP loop 1.1 MB from
        its 50th step to its 200th, then nothing). The same code's one-process trials are judged."""
        if self.device.type == "cpu" and self.world > 1:
            return None
        return footprint.leak(self.memory, self.timing.get("window_steps", 0))

    def samples_per_step(self) -> int:
        """The global batch: every process's micro-batches of one optimizer step."""
        return int(self.config["batch_size"]) * self.accum * self.world

    def breakdown(self) -> dict | None:
        """Weights, gradients, optimizer state and saved activations of one micro-batch, in bytes.

        Taken after the peak was read, on the eager (uncompiled) model, so it cannot raise the peak.
        """
        try:
            batch = transforms.to_device(next(self.batches), self.device, False, self.input_dtype)
            with self.autocast:
                loss = self.wl.loss(self.eager, batch)
            self.scaler.scale(loss / self.accum).backward()
            grads = measure.tensor_bytes(p.grad for p in self.params if p.grad is not None)
            self.opt.zero_grad(set_to_none=True)

            def forward():
                with self.autocast:
                    return self.wl.loss(self.eager, batch)
            acts = measure.saved_activation_bytes(forward, list(self.eager.parameters()))
        except Exception as exc:
            if is_oom(exc):
                return None
            raise
        return self.breakdown_parts(grads, acts)

    def breakdown_parts(self, gradients: int, activations: int) -> dict:
        # the optimizer's state read now, after the measured steps: AdamW makes it in its first step(), which
        # fp16-mixed's GradScaler skips when the first gradients overflow (it read 0 after the first step)
        optimizer = measure.tensor_bytes(t for state in self.opt.state.values() for t in state.values())
        return {"weights": self.memory["weights"], "gradients": gradients, "optimizer": optimizer,
                "activations": activations}

    def filed_breakdown(self) -> dict | None:
        """`breakdown`, measured once per study, build and shape (harness.reuse)."""
        if self.timing.get("cut_short"):  # out of the race: it cannot be the best, whose memory the report breaks down
            return None  # (a 20 s bf16 step on a CPU would cost another 13 s here)
        return self.figures.get("breakdown", {**self.figure_key("precision", "checkpointing", "optimizer"),
                                              "revision": BREAKDOWN_REVISION}, self.breakdown,
                                found_by_all=lambda found: not self.across_ranks(float(not found)))

    def take_breakdown(self) -> None:
        t0 = time.perf_counter()
        self.memory["breakdown"] = self.filed_breakdown()
        self.timing["breakdown_s"] = time.perf_counter() - t0

    # -- the whole trial ------------------------------------------------------------------------
    def run(self) -> dict:
        t_start = time.perf_counter()
        self.prepare()
        self.build_training()
        self.warm_up()
        per_step = self.meter.windows(self.samples_per_step())
        self.hb.beat("teardown")  # a trial killed from here on was past its steps (harness.launch.killed_phase)
        peak = self.footprint.read()
        losses = self.meter.losses
        self.take_breakdown()
        if self.untouched is not None:
            self.reference = self.deferred_reference()
        return self.record(per_step, peak, losses, self.reference, time.perf_counter() - t_start)

    def count_flops_once(self) -> None:
        """FLOPs of a micro-batch (filed once per build and shape), counted after the measured steps: the
        meta-device build and the counter's dispatch left ~5 MiB resident that the CPU peak counted."""
        t0 = time.perf_counter()
        self.flops_per_micro, self.flops_error = self.figures.get("flops", self.figure_key(), self.count_flops)
        self.timing["flops_s"] = time.perf_counter() - t0

    def record(self, per_step, peak, losses, taken: dict | None, wall) -> dict:
        self.count_flops_once()
        eff_batch = self.samples_per_step()
        step = measure.spread(per_step)
        samples = {"median": eff_batch / step["median"], "p10": eff_batch / step["p90"],
                   "p90": eff_batch / step["p10"]}
        tokens = self.wl.tokens_per_sample
        self.timing.update(step_s=step, wall_s=wall)
        taken = taken or {"reference": None}
        unchecked = reference.unchecked(taken, self.config.get("compile", "off") != "off", self.loss_tolerance())
        status, reason = self.numerics(losses, None if unchecked else taken["reference"])
        error = {"type": "diverged", "message": reason} if reason else None
        self.memory["leak"] = self.leak()
        over = self.footprint.over_budget(peak)
        if over:
            status, error = record.OOM, {"type": "OverBudget", "message": over}
        env = measure.env_stamp(self.device, transforms.tf32_mode())
        if self.device.type == "cpu":  # the planner's bf16 prior on this CPU: measured once per study
            env["cpu_bf16_speedup"] = self.figures.get(
                "cpu_bf16_speedup", {"cpu": env["cpu"], "torch": env["torch"], "threads": torch.get_num_threads()},
                bf16_speedup)
        rec = {
            "status": status, "config": self.config, "throughput": samples["median"], "samples_per_s": samples,
            "tokens_per_s": {k: v * tokens for k, v in samples.items()} if tokens else None,
            "peak_memory": peak, "memory": self.memory, "timing": self.timing, "cuda_graphs": self.graphs_used(),
            "flops": self.flops(step["median"], env), "env": env, "workload": self.job["workload"],
            "adapter": self.wl.about or None,
            "loss": {"reference": taken["reference"], "redrawn": taken.get("redrawn"), "unchecked": unchecked,
                     "first": losses[0] if losses else None,
                     "last": losses[-1] if losses else None, "finite": all(map(math.isfinite, losses)),
                     "steps": len(losses), "scatter": loss_scatter(losses)},
            "error": error,
            "reused": self.figures.reused or None,
        }
        if unread := workloads.unread_params():  # a factory's misspelt param: its default ran instead
            rec["unread_params"] = unread
        return rec

    def graphs_used(self) -> dict:
        """Whether the compiled model ran under CUDA graphs: wanted by the mode, and not skipped."""
        skips = transforms.cuda_graph_skips() if self.cuda_graphs else 0
        return {"wanted": self.cuda_graphs, "used": self.cuda_graphs and skips == 0, "skipped_graphs": skips}

    def loss_tolerance(self) -> float:
        return float(self.job["measure"].get("loss_tolerance", 0.25))

    def numerics(self, losses, fp32: float | None) -> tuple[str, str | None]:
        """A config whose loss is non-finite, or far from the fp32 reference at step 0, is broken."""
        if not all(map(math.isfinite, losses)):
            bad = next(i for i, x in enumerate(losses) if not math.isfinite(x))
            return record.DIVERGED, f"loss became {losses[bad]} at micro-step {bad}"
        tol = self.loss_tolerance()
        if fp32 is not None and abs(losses[0] - fp32) > tol * max(abs(fp32), 1e-3):
            return record.DIVERGED, f"first loss {losses[0]:.4g} departs from the fp32 reference {fp32:.4g}"
        if losses[-1] > 10 * max(losses[0], 1e-3):
            return record.DIVERGED, f"loss grew from {losses[0]:.4g} to {losses[-1]:.4g}"
        return record.OK, None

    def flops(self, step_s: float, env: dict) -> dict | None:
        if self.flops_per_micro is None:
            return {"per_step": None, "tflops": None, "mfu": None, "error": self.flops_error}
        counted = self.flops_per_micro  # a bare count: filed by a bench before convolutions were counted apart
        counted = counted if isinstance(counted, dict) else {"total": counted, "conv": 0}
        per_step = counted["total"] * self.accum * self.world
        tflops = per_step / step_s / 1e12
        conv_share = counted["conv"] / max(counted["total"], 1)
        peak = measure.peak_tflops(env["device"], self.precision, conv_share, env["tf32"]["cudnn_allow_tf32"]) \
            if self.device.type == "cuda" else None
        return {"per_step": per_step, "tflops": tflops, "peak_tflops": peak, "conv_share": conv_share,
                "mfu": tflops / (peak * self.world) if peak else None}


def loss_scatter(losses: list[float]) -> float | None:
    """The median change from one micro-batch's loss to the next: how far apart two batches' losses sit
    by chance, the yardstick for "its loss rose" (harness.pareto). None under two changes."""
    steps = [abs(b - a) for a, b in zip(losses, losses[1:])]
    return statistics.median(steps) if len(steps) >= 2 and all(map(math.isfinite, steps)) else None


def fingerprint(tensors) -> float:
    """The float64 sum of every tensor in a (nested) list, tuple or dict: equal sums, equal content
    as far as a reused reference loss is concerned."""
    sums = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            sums.append(x.detach().sum(dtype=torch.float64))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(tensors)
    return float(torch.stack(sums).sum()) if sums else 0.0


class UserFacingError(Exception):
    """A config the workload cannot honour: the parent shows it as one line. `every_config`: a mistake in
    the workload that no knob value changes (a param no function takes, no datamodule), so the record
    says so and the sweep stops at the first trial that raised it rather than the third."""

    def __init__(self, message: str, every_config: bool = False):
        super().__init__(message)
        self.every_config = every_config


class BatchOverDataset(UserFacingError):
    """A batch larger than the dataset: the loader drops the partial batch, so no batch comes at all."""

    def __init__(self, batch_size: int, dataset):
        self.samples = len(dataset) if hasattr(dataset, "__len__") else None  # the search's bound on batch sizes
        size = f"{self.samples} samples" if self.samples is not None else "samples"
        super().__init__(f"batch_size {batch_size} is more than the dataset's {size}: the loader yields no full "
                         f"batch; give the workload more samples, or search smaller batches")


class FactoryImportError(UserFacingError):
    """The workload factory cannot be imported, or returns no Workload: no config can run, so the parent
    stops the sweep."""


def import_factory(factory: str) -> None:
    """Import the user's factory before calling it: a failure here is the same for every config."""
    try:
        workloads.load_factory(factory)
    except Exception as exc:
        traceback.print_exc()  # the whole traceback goes to the trial's log; the message keeps its tail
        last = traceback.extract_tb(exc.__traceback__)[-1]
        machinery = last.filename.startswith("<") or last.filename.startswith(str(Path(__file__).parent))
        at = "" if machinery else f" ({last.filename}:{last.lineno})"
        first_line = (str(exc).splitlines() or [""])[0]
        raise FactoryImportError(f"cannot import {factory}: {type(exc).__name__}: {first_line}{at}"
                                 f"{missing_extra(exc)}") from exc


EXTRAS = {"lightning": "lightning", "transformers": "hf"}
"""Libraries a model brought as it is may import, and the extra of pyproject.toml that installs each."""


def missing_extra(exc: BaseException) -> str:
    """'; bench's extra installs it: pip install -e ".[hf]"' where `exc` is one of EXTRAS not installed, else ''."""
    extra = EXTRAS.get((getattr(exc, "name", None) or "").partition(".")[0]) \
        if isinstance(exc, ModuleNotFoundError) else None
    return f"; bench's extra installs it: pip install -e \".[{extra}]\"" if extra else ""


def failure_record(job: dict, status: str, exc: BaseException) -> dict:
    tb = traceback.format_exc()[-4000:]
    error = {"type": type(exc).__name__, "message": message_of(exc, tb), "traceback": tb}
    if hint := dtype_hint(job, str(exc)) or whole_number_hint(job, str(exc)) or collate_hint(tb, str(exc)):
        error["hint"] = hint
    if isinstance(exc, BatchOverDataset) and exc.samples is not None:  # no batch above it can run
        error["dataset_samples"] = exc.samples
    if getattr(exc, "every_config", False):
        error["every_config"] = True
    return {"status": status, "config": job.get("config"), "throughput": None, "peak_memory": None, "error": error}


def message_of(exc: BaseException, tb: str) -> str:
    """What the trial says it failed with: the exception's text (its type where it has none: MemoryError()),
    and where sys.exit(3) was called, not "3"."""
    if isinstance(exc, SystemExit) and not isinstance(exc.code, str):
        at = failures.users_frame({"traceback": tb})
        return f"your code called sys.exit({exc.code!r})" + (f" at {at}" if at else "") + "; a trial cannot exit"
    return str(exc)[:2000] or type(exc).__name__


def dtype_hint(job: dict, message: str) -> str:
    """What to do when bf16-true's weights meet a float32 tensor the user's code made (`torch.rand(n)`
    with no dtype): torch names the two dtypes and the line, not the knob that made them differ."""
    if (job.get("config") or {}).get("precision") != "bf16-true":
        return ""
    # "got Float and BFloat16", "Input type (torch.FloatTensor) and weight type (torch.BFloat16Tensor)", "float32"
    if "bfloat16" not in message.lower() or not re.search(r"\bfloat(?:32|tensor)?\b", message, re.IGNORECASE):
        return ""
    return ("bf16-true casts the weights and the batch to bf16, and a tensor your code makes in float32 meets "
            "them: make it with its input's dtype (torch.rand(n, dtype=x.dtype)), or leave bf16-true out of "
            "the spec's precision")


def whole_number_hint(job: dict, message: str) -> str:
    """`layers: 2.5` where your model builds range(layers): torch names the float, not the param."""
    if "cannot be interpreted as an integer" not in message:
        return ""
    odd = [f"{k}={v}" for k, v in (job.get("config") or {}).items() if k not in knobs.UNIVERSAL and isinstance(v, float)]
    if len(odd) == 1:
        return f"{odd[0]} is not a whole number, and your code takes one there: give it whole numbers (4, not 4.0)"
    return (f"one of {', '.join(odd)} is not a whole number where your code takes one: give whole numbers (4, not 4.0) "
            "to the one your code counts with") if odd else ""


def collate_hint(tb: str, message: str) -> str:
    """Samples of different sizes meet the DataLoader's default collate, deep inside torch."""
    if "default_collate" not in tb or "equal size" not in message:
        return ""
    return ("your dataset's samples differ in size and the DataLoader's default collate stacks them: give your "
            "Workload a collate (its `collate` field, the DataLoader's collate_fn) that pads them")


def failed(job: dict, exc: BaseException) -> tuple[dict, int]:
    """The record and exit code of a trial that raised `exc`."""
    if is_oom(exc):
        if job["device"] == "cpu":
            measure.lift_cpu_memory_limit()
        return failure_record(job, record.OOM, exc), record.EXIT_OOM
    if isinstance(exc, UserFacingError):
        return failure_record(job, record.ERROR, exc), record.EXIT_USER_ERROR
    traceback.print_exc()
    return failure_record(job, record.ERROR, exc), 1


def trial_class(job: dict) -> type:
    """bench's own loop, or the user's Trainer running the steps (harness.trainer) for a Lightning or
    Hugging Face workload that trains in it."""
    if job["workload"].get("loop") == "trainer":
        from harness.trainer import TrainerTrial
        return TrainerTrial
    return Trial


def main(argv: list[str]) -> int:
    # a fresh start imports what the warm server did (a no-op in a forked trial) before the peak's
    # baseline: torch._dynamo alone is ~70 MiB resident, which a fresh trial's CPU peak counted (126
    # MiB against 65 forked) and a resume with trial.start: fresh ranked against forked trials' peaks
    for module in zygote.PRELOAD:
        importlib.import_module(module)
    started_at = time.time()  # the parent's start-up figure ends here: process start and imports are done
    job_path, result_path = Path(argv[0]), Path(argv[1])
    job = json.loads(job_path.read_text())
    die_with_parent()
    hb = Heartbeat(job.get("heartbeat"))
    hb.beat("start")
    trial = None
    try:
        trial = trial_class(job)(job, hb)
        result = trial.run()
        code = record.EXIT_OK
    except (Exception, SystemExit) as exc:  # sys.exit() in the user's code is their error, with its message
        result, code = failed(job, exc)
        leaked = (trial and result["status"] == record.OOM  # a leak that ran into the wall: said as one
                  and trial.leak())
        if leaked:
            result["memory"] = {"leak": leaked}
    # a failed trial keeps the phases it got through, so a sweep's time breakdown can count them
    result["timing"] = {**(trial.timing if trial else {}), **(result.get("timing") or {}), "started_at": started_at}
    record.write_atomic(result_path, result)
    hb.beat("done")
    sys.stdout.flush()
    os._exit(code)  # skip interpreter teardown: DataLoader workers and compile pools die with the group


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
