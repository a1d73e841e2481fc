"""A trial's clock: the first step (where torch.compile compiles) and the warm-up steps timed apart,
then windows of steps timed until they agree, as nanoGPT times its iterations: burn-in apart, the
device synchronized at every clock read (harness.measure.now).

The meter calls `step` (one optimizer step, however the trial or the user's Trainer takes it) and
never looks inside it; the step appends each micro-batch's loss tensor to `pending`, and the meter
reads them back only after a clock read has synchronized the device.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from harness import measure


WARM_OVER_FIRST = 1.2
"""A first warm-up step this much slower than the trial's first step (which did the one-off work) is not
cut on: in 667 recorded eager trials a longer one ran its windows at 0.46-0.91 of that step's time, and
a quickstart trial whose warm-up step ran 1.34x its first (4.0 s; 1.3 s once quiet) was cut at a third of
its speed, its family never measured again."""


class Meter:
    def __init__(self, step: Callable[[], None], device: torch.device, heartbeat, settings: dict, footprint,
                 timing: dict, across_ranks: Callable[[float], float] = lambda value: value):
        self.step, self.device, self.hb, self.settings = step, device, heartbeat, settings
        self.footprint = footprint  # harness.footprint: its steady window starts before the last warm-up step
        self.timing = timing  # the record's timing section, shared with the trial
        self.across_ranks = across_ranks  # the slowest rank's figure, any rank's wish to stop
        self.losses: list[float] = []
        self.pending: list = []  # this window's loss tensors, not yet read back
        self.warm_step_s = 0.0
        self.cut_step_s: float | None = None  # set when the warm-up cut the trial short

    def first_step(self, compiled: bool) -> None:
        """The first step alone: compile, autotuning, the allocator's growth."""
        self.hb.beat("first_step")
        t0 = measure.now(self.device)
        self.step()
        # the slowest rank's: each rank's clock starts after its own setup, and the warm-up's cut reads this
        # figure, so ranks that read their own could disagree on the cut and run different collectives
        first = self.across_ranks(measure.now(self.device) - t0)
        self.flush_losses()
        self.timing["compile_s"] = first if compiled else 0.0
        self.timing["first_step_s"] = first
        self.warm_step_s = first

    def warm_up(self, samples_per_step: int) -> None:
        """The untimed warm-up steps; the footprint's steady window starts before the last of them,
        which regrows what the first steps' window gave back.

        With `warm_slow_below` (samples/s), a first warm-up step under it ends the trial's timing
        there: a 20 s bf16 step on a CPU without bf16 kernels would otherwise run three more times
        before two windows could cut it (not where that step ran slower than the first: WARM_OVER_FIRST).
        Where `warm_slow_below` is set, a step of `long_warm_step_s`
        or more is judged against the higher `long_warm_slow_below` instead. That step (the second of
        the trial, past the first step's one-off work) is then its only timing, and the first steps'
        peak its peak."""
        steps = int(self.settings.get("warmup_steps", 2))
        cut = float(self.settings.get("warm_slow_below") or 0)
        long_cut = float(self.settings.get("long_warm_slow_below") or 0)
        long_s = self.settings.get("long_warm_step_s")
        long_s = math.inf if long_s is None else float(long_s)  # 0 is a bar: every step is long
        t0 = measure.now(self.device)
        for i in range(steps):
            if i == steps - 1:
                self.footprint.steady_window()
            t_step = measure.now(self.device)
            self.step()
            self.hb.beat("warmup", i + 1)
            if i == 0 and steps > 1 and cut:
                step_s = self.across_ranks(measure.now(self.device) - t_step)
                long = step_s >= long_s and long_cut > cut
                bar = long_cut if long else cut
                # a warm step slower than the cold first one says something else took the cores, not the config
                disturbed = step_s > WARM_OVER_FIRST * self.timing["first_step_s"]
                if samples_per_step / step_s < bar and not disturbed:
                    self.cut_step_s, steps = step_s, 1
                    self.timing.update(cut_at="1 long warm-up step" if long else "1 warm-up step", cut_short=(
                        f"{samples_per_step / step_s:.1f} samples/s in its first warm-up step ({step_s:.1f} s), "
                        f"under the sweep's cut of {bar:.1f}: not timed further; its peak is its first steps'"))
                    break
        self.timing["warmup_steps"] = steps
        self.timing["warmup_s"] = measure.now(self.device) - t0
        self.flush_losses()
        self.warm_step_s = self.across_ranks(self.timing["warmup_s"] / steps)

    def windows(self, samples_per_step: int) -> list[float]:
        """Seconds per step of each window, timed until their CV is under target or a cap is reached
        (adaptive: stable configs cost little, noisy ones get more samples)."""
        if self.cut_step_s is not None:  # the warm-up's step is the only timing
            self.timing.update(window_steps=0, windows=0, measured_steps=0, window_step_s=[self.cut_step_s],
                               measure_s=0.0)
            self.footprint.memory["peak_by_window"] = [self.footprint.peak()]
            return [self.cut_step_s]
        m = self.settings
        window_steps = max(1, math.ceil(m.get("window_s", 0.5) / max(self.warm_step_s, 1e-6)))
        min_w, max_w = int(m.get("min_windows", 3)), int(m.get("max_windows", 12))
        target_cv, max_s = float(m.get("target_cv", 0.02)), float(m.get("max_seconds", 20))
        slow_below = float(m.get("slow_below") or 0)  # samples/s under which the config is out of the race
        per_step, peaks, live, start, done = [], [], [], time.perf_counter(), 0
        self.timing["window_steps"] = window_steps
        self.hb.beat("measure", 0)  # the display says measuring from its start, not from the first window's end
        self.footprint.memory["live_by_window"] = live  # filled as it goes: a leak that ends in an OOM shows before it
        while True:
            t0 = measure.now(self.device)
            for _ in range(window_steps):
                self.step()
            per_step.append(self.across_ranks((measure.now(self.device) - t0) / window_steps))
            peaks.append(self.footprint.peak())
            live.append(self.footprint.live())
            done += window_steps
            self.hb.beat("measure", done)
            diverged = not all(map(math.isfinite, self.flush_losses()))  # no use timing it further
            enough = len(per_step) >= min_w
            hopeless = len(per_step) == 2 and samples_per_step / min(per_step) < slow_below  # even its faster window
            if hopeless:
                self.timing["cut_at"] = "2 windows"
                self.timing["cut_short"] = (f"{samples_per_step / min(per_step):.1f} samples/s at best over 2 windows, "
                                            f"under the sweep's cut of {slow_below:.1f}: not timed further")
            stop = (diverged or hopeless or len(per_step) >= max_w
                    or (enough and measure.spread(per_step)["cv"] < target_cv)
                    or (enough and time.perf_counter() - start > max_s))
            if self.across_ranks(float(stop)):  # every process runs the same number of steps
                break
        self.timing.update(window_steps=window_steps, windows=len(per_step), measured_steps=done,
                           window_step_s=per_step, measure_s=time.perf_counter() - start)
        self.footprint.memory["peak_by_window"] = peaks  # a peak still growing at the end would show here
        return per_step

    def flush_losses(self) -> list[float]:
        """The losses since the last flush, as floats; called after a clock read has synced the device.

        Holding every step's loss tensor until the end fragments glibc's heap: a CPU run's peak RSS
        grew 35% over 600 steps, so a short trial's peak was not the long run's.
        """
        new = torch.stack(self.pending).float().tolist() if self.pending else []
        self.pending.clear()
        self.losses.extend(new)
        return new
