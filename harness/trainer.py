"""A trial whose steps are the user's own Trainer's (Lightning, transformers): bench's meter rides along.

The Trainer owns the loop (precision plugin, accumulation, clipping, schedulers, callbacks), so it
runs `fit` in the main thread, and bench's meter, the same warm-up and measured windows a trial of
bench's own loop runs (harness.trial.Trial), runs in a second thread. A `Gate` hands the Trainer's
optimizer steps to the meter one at a time: a callback in the Trainer waits at the start of each
step until the meter asks for one and says when it has ended. A step as the meter times it runs
from one step's start to the next's, so whatever the Trainer does between steps (fetching batches,
logging, the scheduler) is in it, and the clock reads synchronize the device as in bench's loop.
When the meter has measured enough, it asks for one more step, which hooks count as it runs (its
gradients and its first micro-batch's saved activations: the memory breakdown, `TrainerTrial.filed_breakdown`),
and the step after that raises `Stop` at its start, which ends `fit`.

Over several processes (`nproc` > 1, `parallel: ddp`) each rank is a `TrainerRank`: harness.distributed
launches the ranks and joins their process group, the Trainer finds them (torch's elastic
environment) and runs its own DDP strategy, and the meters of the ranks agree on every window.
"""
from __future__ import annotations

import threading
import time

from harness import measure, reference, transforms
from harness.distributed import Ranked
from harness.trial import Trial, UserFacingError


class Stop(Exception):
    """Raised in the Trainer at a step's start once the meter has measured enough: it ends fit()."""


class TrainerGone(Exception):
    """The Trainer stopped (an error in the user's code, or its own end) while the meter waited."""


class Gate:
    """One optimizer step at a time, from the Trainer's thread to the meter's (three semaphores)."""

    def __init__(self):
        self.arrived, self.go, self.finished = (threading.Semaphore(0) for _ in range(3))
        self.stopping = False
        self.gone = False
        self.inspection: StepBreakdown | None = None
        """What the next step carries along, set by the meter: the step that takes the memory apart."""

    # -- the Trainer's side (its callback) ----------------------------------------------------------
    def step_start(self) -> None:
        self.arrived.release()
        self.go.acquire()
        if self.stopping:
            raise Stop
        if self.inspection:
            self.inspection.start()

    def step_end(self) -> None:
        if self.inspection:
            self.inspection.stop()
        self.finished.release()

    def trainer_gone(self) -> None:
        self.gone = True
        self.arrived.release()
        self.finished.release()

    # -- the meter's side ---------------------------------------------------------------------------
    def ready(self) -> None:
        """Wait until the Trainer is set up and at its first step."""
        self._take(self.arrived)

    def step(self) -> None:
        self.go.release()
        self._take(self.finished)
        self._take(self.arrived)

    def stop(self) -> None:
        self.stopping = True
        self.go.release()

    def _take(self, semaphore) -> None:
        if self.gone:
            raise TrainerGone
        semaphore.acquire()
        if self.gone:
            raise TrainerGone


class StepBreakdown:
    """The gradients and the first micro-batch's saved activations of one of the Trainer's steps, counted
    in the Trainer's thread as the step runs (saved-tensor hooks are per thread), holding no tensor."""

    def __init__(self, params: list):
        self.params = params
        self.saved: measure.SavedActivations | None = None
        self.grads: measure.Gradients | None = None
        self.gradients = self.activations = None

    def start(self) -> None:
        self.saved = measure.SavedActivations(self.params).__enter__()
        self.grads = measure.Gradients(self.params)

    def stop(self) -> None:
        self.saved.__exit__(None, None, None)
        self.gradients, self.activations = self.grads.close(), self.saved.bytes


class TrainerTrial(Trial):
    """A Trial whose steps are the user's Trainer's; everything else (meter, memory, record) is Trial's.

    The workload's `trainer(config, trial)` runs the user's Trainer and calls, from its callback:
    `started(model, optimizer, reference)` once, at the first step's start; `gate.step_start()` and
    `gate.step_end()` around every optimizer step; `meter.pending.append(loss)` for each micro-batch.
    """

    def check_knobs(self) -> None:
        if self.config.get("parallel", "none") == "fsdp":
            raise UserFacingError("a trial inside the Trainer shares the model with DDP only for now; search "
                                  "parallel: ddp, or set workload.loop: bench for fsdp")
        if self.config.get("optimizer", "default") != "default":
            raise UserFacingError("the optimizer knob picks AdamW's kernels; the Trainer builds its own optimizer "
                                  "(configure_optimizers, TrainingArguments.optim): search optimizer: default only")
        super().check_knobs()

    def build_training(self) -> None:
        transforms.set_numerics(self.precision, self.config.get("cudnn_benchmark", False))
        self.cuda_graphs = transforms.uses_cuda_graphs(self.config.get("compile", "off"), self.device)
        self.gate = Gate()
        self.reference = reference.missing()
        self.meter_error: BaseException | None = None
        self.per_step: list[float] = []
        self.peak: int | None = None

    def started(self, model, optimizer, taken: dict) -> None:
        """The Trainer placed the model and built its optimizer; the reference loss was taken (`fp32_loss`,
        harness.reference). Called right before the first micro-batch's forward, which it seeds."""
        self.reference = taken
        self.seed_first_forward()
        self.opt = optimizer
        self.params = list(model.parameters())
        self.memory["weights"] = measure.tensor_bytes(list(model.parameters()) + list(model.buffers()))
        measure.reset_peak(self.device)  # the reference pass is not part of the trial's footprint
        self.timing["setup_s"] = time.perf_counter() - self.t_setup

    def step(self) -> None:
        self.gate.step()

    def run(self) -> dict:
        t_start = time.perf_counter()
        self.prepare()
        self.build_training()
        meter = threading.Thread(target=self.run_meter, name="bench-meter", daemon=True)
        meter.start()
        self.hb.beat("trainer_setup")  # the Trainer's set-up (datamodule, placement, optimizers) comes next
        try:
            self.wl.trainer(self.config, self)
        except Stop:
            pass
        finally:
            self.gate.trainer_gone()  # a meter still waiting (the user's code raised) wakes and ends
            meter.join()
        if self.meter_error is not None:
            raise self.meter_error
        if not self.per_step:
            raise UserFacingError(f"the Trainer ended after {len(self.meter.losses)} micro-batches, before bench had "
                                  "measured its steps")
        self.hb.beat("teardown")
        self.memory.setdefault("breakdown", None)  # the Trainer ended on its own right after the measured steps
        return self.record(self.per_step, self.peak, self.meter.losses, self.reference, time.perf_counter() - t_start)

    def filed_breakdown(self) -> dict | None:
        """Not for a compiled config (the hooks would make the compiler trace its graph again); over several
        processes every rank counts its own, since a rank that took the filed figure would skip a step the
        others take."""
        if self.config.get("compile", "off") != "off":
            return None
        if self.world > 1 and not self.timing.get("cut_short"):
            return self.breakdown()
        return super().filed_breakdown()

    def breakdown(self) -> dict:
        """Weights, gradients, optimizer state and one micro-batch's saved activations, in bytes: counted
        over one more of the Trainer's steps, after the measured ones."""
        inspection = StepBreakdown(self.params)
        self.gate.inspection = inspection
        try:
            self.gate.step()
        finally:
            self.gate.inspection = None
        return self.breakdown_parts(inspection.gradients, inspection.activations)

    def run_meter(self) -> None:
        """The meter's thread: bench's own warm-up and measured windows, each step the Trainer's."""
        try:
            self.gate.ready()
            self.warm_up()
            self.per_step = self.meter.windows(self.samples_per_step())
            self.peak = self.footprint.read()  # before the step that takes the memory apart
            self.take_breakdown()
        except TrainerGone:
            pass  # the main thread raises the Trainer's error
        except BaseException as exc:  # a bug in the meter: the main thread raises it, with its traceback
            self.meter_error = exc
        finally:
            self.gate.stop()


class TrainerRank(Ranked, TrainerTrial):
    """One rank of a trial inside the user's Trainer: the Trainer's DDP strategy shares the model."""
