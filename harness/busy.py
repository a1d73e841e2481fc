"""Is the machine busy? Measured by the parent before a sweep and before each trial (when no trial of
ours is running: CPU time other processes take, CPU steal, other processes on the trial's GPU), and
over each trial (CPU time other processes took while it measured, load average against cores, steal,
GPU processes).

A trial measured while others compete for the cores or the GPU is slower than the config is, and
running it again into the same load measures the same noise. So before a trial the sweep waits for
quiet, up to a bound it says out loud (`Quiet`); when the machine stays busy it measures anyway and
says plainly that the figures will be noise. The trial keeps the verdict in its record (`busy`),
and a trial whose windows disagree is `noisy` and never ranked (harness.pareto).
"""
from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

import psutil

from harness import nvml, units

LOAD_PER_CORE = 1.5
"""One-minute load average above this many runnable tasks per core (over a trial): others competing."""
MAX_STEAL = 0.10
"""Fraction of CPU time the hypervisor gave to other guests."""
OTHERS_CORES = 0.5
"""Before a trial, other processes using more than this many cores: busy (ours is idle then)."""
SAMPLE_S = 0.25
"""How long one look at the CPU lasts."""
WAIT_ENV = "BENCH_QUIET_WAIT"
"""Seconds a sweep may spend in all waiting for quiet (default DEFAULT_WAIT_S); 0 never waits."""
DEFAULT_WAIT_S = 120.0
EACH_WAIT_S = 30.0
"""At most this long before any one trial (the sweep's start may take twice that)."""
POLL_S = 2.0
LOOK_EVERY_S = 0.5
"""While a trial measures, the parent looks at the CPU this often (a look reads every process's times)."""


def snapshot(device: str = "cpu") -> dict:
    """Taken before a trial starts and after it ends, when none of the GPU's processes is the trial."""
    times = psutil.cpu_times()
    return {"steal": getattr(times, "steal", 0.0), "total": sum(times), "gpu_processes": gpu_processes(device)}


def gpu_processes(device: str) -> int:
    """Processes computing on the trial's GPU (NVML); 0 on CPU or where NVML cannot tell."""
    return nvml.compute_processes(device)


def verdict(before: dict, after: dict, others_cores: float = 0.0) -> dict | None:
    """Over a trial: None when the machine was quiet; else what made it busy, in measured numbers.
    `others_cores`: what other processes took while it measured (OthersWhileMeasuring)."""
    load = os.getloadavg()[0]  # the whole machine's, so judged against all of its cores
    span = after["total"] - before["total"]
    steal = (after["steal"] - before["steal"]) / span if span > 0 else 0.0
    others = max(before.get("gpu_processes", 0), after.get("gpu_processes", 0))
    if load <= LOAD_PER_CORE * machine_cores() and steal <= MAX_STEAL and not others and others_cores <= OTHERS_CORES:
        return None
    return flag(load, others_cores, steal, others)


def flag(load: float, others_cores: float, steal: float, gpu_processes: int) -> dict:
    """A busy verdict: `cores` are the sweep's own (my_cores), `machine_cores` all that the load average is over."""
    return {"load1": round(load, 2), "cores": len(my_cores()), "machine_cores": machine_cores(),
            "busy_cores": round(others_cores, 2), "steal": round(steal, 3), "gpu_processes": gpu_processes}


def machine_cores() -> int:
    return os.cpu_count() or 1


class OthersWhileMeasuring:
    """The cores other processes keep busy while a trial measures, from looks the parent takes as it polls
    the trial's heartbeat. The load average lags a minute behind: a 2 s run slowed 50x by another process
    on one of two cores read quiet, and replaced its config's figure."""

    def __init__(self):
        self.last: tuple[float, Look] | None = None
        self.others_s = self.span_s = 0.0

    def beat(self, heartbeat: dict | None) -> None:
        """Called on every poll: looks (at most every LOOK_EVERY_S) while the heartbeat says `measure`."""
        if (heartbeat or {}).get("phase") != "measure":
            self.last = None  # a pause between measuring phases is no part of a measurement
            return
        if self.last is not None and time.monotonic() - self.last[0] < LOOK_EVERY_S:
            return
        current = (time.monotonic(), look())
        if self.last is not None:
            others_s, span_s, _ = between(self.last[1], current[1])
            self.others_s, self.span_s = self.others_s + others_s, self.span_s + span_s
        self.last = current

    def cores(self) -> float:
        return others_cores(self.others_s, 0.0, self.span_s, len(my_cores()))


def now(device: str = "cpu", sample_s: float = SAMPLE_S) -> dict | None:
    """Right now, with no trial of ours running: None when quiet; else the cores other processes keep
    busy (over `sample_s`), the steal and the GPU's other processes. Our own processes are not others:
    the warm trial server importing torch as the sweep starts is the sweep itself."""
    before = look()
    time.sleep(sample_s)
    others_s, span_s, steal = between(before, look())
    used = others_cores(others_s, 0.0, span_s, len(my_cores()))
    gpu = gpu_processes(device)
    if used <= OTHERS_CORES and steal <= MAX_STEAL and not gpu:
        return None
    return flag(os.getloadavg()[0], used, steal, gpu)


class Look(NamedTuple):
    cpu: tuple
    """psutil's CPU times, summed over my_cores()."""
    ours: dict[int, float]
    """own_cpu_s()."""


def look() -> Look:
    return Look(my_cpu_times(), own_cpu_s())


def between(before: Look, after: Look) -> tuple[float, float, float]:
    """From one look to the next: CPU seconds other processes used on my cores, the CPU seconds those
    cores had, and the share the hypervisor stole. A process of ours that ended between the two takes
    its last share with it: counted as others'."""
    span = sum(after.cpu) - sum(before.cpu)
    idle = (after.cpu.idle - before.cpu.idle) + (getattr(after.cpu, "iowait", 0.0) - getattr(before.cpu, "iowait", 0.0))
    ours = sum(max(t - before.ours.get(pid, 0.0), 0.0) for pid, t in after.ours.items())
    steal = (getattr(after.cpu, "steal", 0.0) - getattr(before.cpu, "steal", 0.0)) / span if span > 0 else 0.0
    return max(span - idle - ours, 0.0), max(span, 0.0), steal


def my_cores() -> list[int]:
    """The cores this process, and so its trials, may run on: a sweep pinned by taskset or a cgroup (and
    each of the test suite's workers) is not slowed by load on the others."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform: every core
        return list(range(os.cpu_count() or 1))


def my_cpu_times():
    """psutil.cpu_times() over my_cores() alone (all of them where psutil numbers the cores otherwise)."""
    per_core, mine = psutil.cpu_times(percpu=True), my_cores()
    if not mine or max(mine) >= len(per_core):
        return psutil.cpu_times()
    picked = [per_core[i] for i in mine]
    return type(picked[0])(*(sum(field) for field in zip(*picked)))


def others_cores(used_s: float, ours_s: float, span_s: float, cores: int) -> float:
    """Cores in use by other processes: CPU seconds used on all cores, less ours, over `span_s` CPU
    seconds of all cores."""
    return max(used_s - ours_s, 0.0) / span_s * cores if span_s > 0 else 0.0


def own_cpu_s() -> dict[int, float]:
    """CPU seconds so far of this process and every process under it, by pid."""
    me = psutil.Process()
    seconds = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:  # ended between the listing and the look
            continue
        seconds[proc.pid] = times.user + times.system
    return seconds


def describe(flag: dict) -> str:
    used = (f"{flag['busy_cores']:.1f} of {units.count(flag['cores'], 'core')} in use by others, "
            if "busy_cores" in flag else "")
    machine = flag.get("machine_cores", flag["cores"])  # records before 2026-12-08 lack it
    load_over = f"the machine's {machine} cores" if machine != flag["cores"] else units.count(machine, "core")
    gpu = f", {flag['gpu_processes']} other process(es) on the GPU" if flag.get("gpu_processes") else ""
    return f"{used}load {flag['load1']:.1f} on {load_over}, CPU steal {flag['steal']:.0%}{gpu}"


def wait_budget() -> float:
    """Seconds a sweep may wait for quiet in all: BENCH_QUIET_WAIT, else DEFAULT_WAIT_S."""
    return units.env_seconds(WAIT_ENV, DEFAULT_WAIT_S)


def shown_seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


class Quiet:
    """A sweep's waits for a quiet machine, bounded in all by `budget_s` (BENCH_QUIET_WAIT)."""

    def __init__(self, device: str, say=print, budget_s: float | None = None, deadline: float | None = None):
        if budget_s is None:
            budget_s = wait_budget()
        self.device, self.say, self.left, self.budget = device, say, budget_s, budget_s
        self.deadline = deadline  # time.monotonic() at the sweep's --timeout: no wait runs past it
        self.busy_runs = 0

    def spent_words(self) -> str:
        if self.budget <= 0:
            return f"{WAIT_ENV}=0: no waiting"
        more = max(2 * self.budget, 600.0)
        return (f"the sweep's {shown_seconds(self.budget)}s of waiting for quiet are spent; "
                f"{WAIT_ENV}={more / 60:.0f}m gives more")

    def wait(self, what: str, longest: float = EACH_WAIT_S) -> dict | None:
        """Look at the machine before `what`; while it is busy, wait (at most `longest`, only what is left
        of the sweep's budget, and never past the sweep's deadline). The verdict that stands: None when quiet."""
        flag = now(self.device)
        if flag is None:
            return None
        to_deadline = math.inf if self.deadline is None else self.deadline - time.monotonic()
        bound = min(longest, self.left, to_deadline)
        if bound <= 0:
            why = "the sweep's time limit" if to_deadline <= 0 < self.left else self.spent_words()
            self.say(f"machine busy before {what} ({describe(flag)}); no waiting left ({why}): "
                     "measuring anyway, its figures will be noise")
            return flag
        shown = shown_seconds(bound)
        self.say(f"machine busy before {what} ({describe(flag)}): waiting up to {shown}s for quiet"
                 + (" (the sweep's time limit)" if bound == to_deadline else ""))
        start = time.monotonic()
        while flag is not None and time.monotonic() - start < bound:
            time.sleep(min(POLL_S, max(bound - (time.monotonic() - start), 0.0)))
            flag = now(self.device)
        waited = time.monotonic() - start
        self.left -= waited
        if flag is None:
            self.say(f"quiet after {waited:.0f}s: measuring")
            return None
        if self.deadline is not None and time.monotonic() >= self.deadline:  # the sweep ends: nothing to measure
            self.say(f"still busy after {waited:.0f}s ({describe(flag)}): the sweep's time limit is reached")
        else:
            self.say(f"still busy after {waited:.0f}s ({describe(flag)}): measuring anyway; "
                     "its figures will be noise, not the config's speed")
        return flag

    def measured(self, verdict: dict | None) -> None:
        """A run ended with this verdict (busy before it or during it, or None): what `closing` counts."""
        self.busy_runs += verdict is not None

    def closing(self) -> str | None:
        """The sweep's last word on load, when any run was measured on a busy machine (the runs the live
        output marks busy)."""
        if not self.busy_runs:
            return None
        return (f"{units.count(self.busy_runs, 'run')} measured on a busy machine: the answer is noise where their figures "
                "decide it; run the same command again when the machine is quiet")
