"""Was the machine busy while a trial ran? Load average against cores, and CPU steal, read by the parent.

A trial measured while other processes compete for the cores (or the hypervisor steals them)
is slower than the config is: such a trial is flagged and measured again.
"""
from __future__ import annotations

import os

import psutil

LOAD_PER_CORE = 1.5
"""One-minute load average above this many runnable tasks per core: others are competing."""
MAX_STEAL = 0.10
"""Fraction of CPU time the hypervisor gave to other guests."""


def snapshot() -> dict:
    times = psutil.cpu_times()
    return {"steal": getattr(times, "steal", 0.0), "total": sum(times)}


def verdict(before: dict, after: dict) -> dict | None:
    """None when the machine was quiet; else what made it busy, in measured numbers."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    span = after["total"] - before["total"]
    steal = (after["steal"] - before["steal"]) / span if span > 0 else 0.0
    if load <= LOAD_PER_CORE * cores and steal <= MAX_STEAL:
        return None
    return {"load1": round(load, 2), "cores": cores, "steal": round(steal, 3)}


def describe(flag: dict) -> str:
    return f"load {flag['load1']:.1f} on {flag['cores']} cores, CPU steal {flag['steal']:.0%}"
