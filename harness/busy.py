"""Was the machine busy while a trial ran? Load average against cores, CPU steal, and other
processes on the trial's GPU, read by the parent.

A trial measured while other processes compete for the cores or the GPU (or the hypervisor steals
the cores) is slower than the config is: such a trial is flagged and measured again.
"""
from __future__ import annotations

import os

import psutil

LOAD_PER_CORE = 1.5
"""One-minute load average above this many runnable tasks per core: others are competing."""
MAX_STEAL = 0.10
"""Fraction of CPU time the hypervisor gave to other guests."""


def snapshot(device: str = "cpu") -> dict:
    """Taken before a trial starts and after it ends, when none of the GPU's processes is the trial."""
    times = psutil.cpu_times()
    return {"steal": getattr(times, "steal", 0.0), "total": sum(times), "gpu_processes": gpu_processes(device)}


def gpu_processes(device: str) -> int:
    """Processes computing on the trial's GPU (NVML); 0 on CPU or where NVML cannot tell."""
    if not device.startswith("cuda"):
        return 0
    try:
        import pynvml

        from harness import nvml
        return len(pynvml.nvmlDeviceGetComputeRunningProcesses(nvml.handle(int(device.partition(":")[2] or 0))))
    except Exception:  # no NVML (driver, container): the load and steal still count
        return 0


def verdict(before: dict, after: dict) -> dict | None:
    """None when the machine was quiet; else what made it busy, in measured numbers."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    span = after["total"] - before["total"]
    steal = (after["steal"] - before["steal"]) / span if span > 0 else 0.0
    others = max(before.get("gpu_processes", 0), after.get("gpu_processes", 0))
    if load <= LOAD_PER_CORE * cores and steal <= MAX_STEAL and not others:
        return None
    return {"load1": round(load, 2), "cores": cores, "steal": round(steal, 3), "gpu_processes": others}


def describe(flag: dict) -> str:
    gpu = f", {flag['gpu_processes']} other process(es) on the GPU" if flag.get("gpu_processes") else ""
    return f"load {flag['load1']:.1f} on {flag['cores']} cores, CPU steal {flag['steal']:.0%}{gpu}"
