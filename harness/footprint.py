"""A trial's memory as the device sees it: the wall it trains under, and the peak it is judged on.

One probe per kind of device; a trial asks either the same five things, in this order:

    start()          before the workload is built: the baseline, and the wall (the memory budget)
    peak()           the footprint so far, as harness.record defines it
    steady_window()  close the first steps' window (its peak kept as `first_step_peak`), give back
                     what their one-off work left cached, and start the steady state's peak
    live()           bytes the steps hold between them (the C heap on a CPU, the allocator on a GPU),
                     after each measured window: what `leak` reads
    read()           the record's footprint, after the last measured step
    over_budget(p)   why a trial that ran to the end still went over the budget (None: it did not)

`memory` is the record's `memory` section, filled in as the trial goes (the trial adds the weights,
the optimizer state and the breakdown). The clocks and raw probes are harness.measure's.
"""
from __future__ import annotations

import psutil
import torch

from harness import measure
from harness.units import size

LEAK_MIN_BYTES = 256 << 10
"""A leak must have kept at least this much over the measured steps to be named, ..."""
LEAK_MIN_PER_STEP = 1024
"""... and this many bytes a step: bench's own bookkeeping keeps a few hundred (its list of losses), ..."""
LEAK_STEADY = 0.5
"""... and grown in the second half of the windows at least this share of what it grew in the first: a
leak grows with every step, a cache that fills (oneDNN's primitives, one per batch shape) slows down."""


def value_at(values: list, position: float) -> float:
    """`values` read at a fractional index, between its neighbours."""
    low = int(position)
    return values[low] + (position - low) * (values[min(low + 1, len(values) - 1)] - values[low])


def leak(memory: dict, window_steps: int) -> dict | None:
    """Memory the training steps keep, when they keep some: what stays live after each measured window
    (`live_by_window`) grew in every window, by enough to matter, and as fast at the end (LEAK_*). A
    steady state frees at the end of each step what the step made; a training loop that appends a tensor
    to a list, or keeps a loss with its graph, grows by it every step, and a long run needs more than the
    trial's peak says.

    The live bytes, not the resident peak: on a CPU the peak creeps up to 20% over a trial as glibc's
    heap fragments (recorded landscapes), with nothing kept."""
    live = memory.get("live_by_window") or []
    if len(live) < 3 or None in live:
        return None
    grown = live[-1] - live[0]
    steps = window_steps * (len(live) - 1)
    if any(b <= a for a, b in zip(live, live[1:])) or grown < max(LEAK_MIN_BYTES, LEAK_MIN_PER_STEP * steps):
        return None
    half = (len(live) - 1) / 2  # intervals in each half
    early, late = value_at(live, half) - live[0], live[-1] - value_at(live, half)
    if late < LEAK_STEADY * early:
        return None
    return {"bytes": grown, "steps": steps, "bytes_per_step": grown / steps}


class CpuFootprint:
    """Peak resident memory above what the process held before the workload was built, under an
    RLIMIT_DATA wall. glibc's allocator keeps its own policy, as in the user's training process: the
    heap it keeps for reuse counts, and a step's activations are not page-faulted in afresh each time
    (forcing every 1 MiB+ block into its own mapping made the quickstart's steps 17-30% slower and
    moved its best batch from 32 to 224)."""

    def __init__(self, device: torch.device, budget: int | None):
        self.device, self.budget = device, budget
        self.memory: dict = {"kind": "cpu", "budget": budget}

    def start(self) -> None:
        torch.ones(512, 512) @ torch.ones(512, 512)  # start the OpenMP pool now: its thread stacks are baseline
        self.memory["baseline_rss"] = measure.rss_bytes()
        if self.budget:
            measure.limit_cpu_memory(self.budget)

    def peak(self) -> int:
        return measure.peak_rss_bytes() - self.memory["baseline_rss"]

    def live(self) -> int | None:
        return measure.heap_bytes()

    def steady_window(self) -> None:
        self.memory["first_step_peak"] = self.peak()
        measure.release_cached(self.device)
        measure.reset_peak(self.device)

    def read(self) -> int:
        """The peak as of the last measured step: the process's peak RSS only grows, and the
        bookkeeping after the steps (losses to floats, the spread) once added a 128 KiB page run
        that no training step touched."""
        peak = self.memory["peak_by_window"][-1]
        self.memory.update(peak_rss=peak + self.memory["baseline_rss"], device_total=psutil.virtual_memory().total)
        return peak

    def over_budget(self, peak: int) -> str | None:
        """Why a trial that ran to the end did not fit, or None: RLIMIT_DATA fails new private mappings
        past the budget, but shared memory and pages mapped before the wall fill in under it (a 4 MiB
        budget let a 26 MiB peak through)."""
        if not self.budget or peak <= self.budget:
            return None
        return (f"its peak, {size(peak)} resident above the baseline, went over the {size(self.budget)} budget "
                "(the CPU wall fails new private mappings; shared or earlier-mapped memory filled in under it)")


class CudaFootprint:
    """The caching allocator's reserved peak plus what the process holds outside it (CUDA context,
    library handles, NCCL buffers), under a wall on the allocator less that outside share."""

    def __init__(self, device: torch.device, budget: int | None, nvml_used_at_start: int | None = None):
        self.device, self.budget, self.nvml_used_at_start = device, budget, nvml_used_at_start
        self.memory: dict = {"kind": "cuda", "budget": budget}

    def start(self) -> None:
        torch.ones(512, 512) @ torch.ones(512, 512)  # the OpenMP pool's thread stacks, as on a CPU
        self.memory["baseline_rss"] = measure.rss_bytes()
        self.memory.update(measure.start_cuda(self.device, self.nvml_used_at_start))
        if self.budget:
            measure.limit_cuda_memory(self.device, self.budget, self.memory["context_bytes"])

    def peak(self) -> int:
        return torch.cuda.max_memory_reserved(self.device) + (self.memory.get("context_bytes") or 0)

    def live(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def steady_window(self) -> None:
        """As on a CPU; and the wall now also makes room for what the first steps loaded outside the
        allocator (NCCL, lazily loaded kernels)."""
        self.memory["first_step_peak"] = self.peak()
        # the count is the process's (the reference pass, the first steps and warm-up hit the wall first):
        # the record's retries are the measured steps' alone
        self.memory["alloc_retries_before"] = measure.alloc_retries(self.device)
        measure.release_cached(self.device)
        if self.budget:
            grown = measure.context_reading(self.device, self.memory.get("nvml_used_at_start"))["bytes"]
            if grown is not None and grown > (self.memory.get("context_bytes") or 0):
                self.memory["context_after_first_steps"] = grown
                measure.limit_cuda_memory(self.device, self.budget, grown)
        measure.reset_peak(self.device)

    def read(self) -> int:
        self.memory.update(measure.cuda_memory(self.device, self.memory))
        return self.peak()

    def over_budget(self, peak: int) -> None:
        """Never: the allocator's cap holds the reserved peak under the budget (an allocation past it raises)."""
        return None


def probe(device: torch.device, budget: int | None, nvml_used_at_start: int | None = None):
    """The footprint probe for `device`."""
    if device.type == "cuda":
        return CudaFootprint(device, budget, nvml_used_at_start)
    return CpuFootprint(device, budget)
