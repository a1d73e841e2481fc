"""The fp32 reference loss a trial's first loss is held to, and the random numbers the two share.

The reference is the loss of the untouched model, fp32 and eager, on the first step's own batch. A
loss that draws random numbers (a diffusion model's noise level and noise, dropout) draws the same
ones in the reference as in the first step: both start from one seed of torch's, numpy's and
Python's generators (`seed_all`). Taken again at other seeds (`take`), the reference says how far
those draws move the loss, and whether it draws from a generator no seed reaches; `unchecked` says
when the first loss cannot be held to it, and why. Child side: imports torch.
"""
from __future__ import annotations

import math
import random

import numpy
import torch

MOVES = 1e-4
"""Relative change under which two losses are the same loss (a GPU's reductions may differ in the last bits)."""
REDRAWS = 3
"""Other seeds a loss that draws random numbers is taken at: one redraw that lands close to the first
(1 seed in 40 for an audit's diffusion model) would pass its draws off as harmless."""


def seed_all(seed: int) -> None:
    """torch's generators (every device's), numpy's and Python's."""
    torch.manual_seed(seed)
    numpy.random.seed(seed % 2**32)
    random.seed(seed)


def at_seed(fn, seed: int, device: torch.device):
    """`fn()` with every generator at `seed`; they are left as they were."""
    states = random.getstate(), numpy.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            seed_all(seed)
            return fn()
    finally:
        random.setstate(states[0])
        numpy.random.set_state(states[1])


def take(loss, seed: int, device: torch.device) -> dict:
    """`loss()` (a float, or None where there is none) at the first forward's `seed`, and at others.

    reference: at `seed`; redrawn: at `seed + 1` and, when that moved it, on to `seed + REDRAWS`;
    repeatable: False when `loss()` twice at `seed` differs, so it draws from a generator no seed reaches.
    """
    first = at_seed(loss, seed, device)
    if first is None:
        return {"reference": None, "redrawn": [], "repeatable": True}
    redrawn = [at_seed(loss, seed + 1, device)]
    if moved(redrawn[0], first) <= MOVES:
        return {"reference": first, "redrawn": redrawn, "repeatable": True}
    if moved(at_seed(loss, seed, device), first) > MOVES:
        return {"reference": first, "redrawn": redrawn, "repeatable": False}
    redrawn += [at_seed(loss, seed + k, device) for k in range(2, REDRAWS + 1)]
    return {"reference": first, "redrawn": redrawn, "repeatable": True}


def missing() -> dict:
    """No reference: it could not be taken (the trial's log says why)."""
    return {"reference": math.nan, "redrawn": [], "repeatable": True}


def moved(value: float, reference: float) -> float:
    return abs(value - reference) / max(abs(reference), 1e-3)


def unchecked(taken: dict, compiled: bool, tolerance: float) -> str | None:
    """Why the first loss is not held to the reference `take` gave; None when it is."""
    reference = taken.get("reference")
    if reference is None:
        return "the first batch gave no loss to take a reference from (training_step returned None)"
    if not math.isfinite(reference):
        return "the fp32 reference loss could not be taken (the trial's log says why)"
    if not taken.get("repeatable", True):
        return ("the loss draws random numbers from a generator bench does not seed (it seeds torch's, numpy's and "
                "Python's): two fp32 passes at one seed differ; non-finite and growing losses are still caught")
    spread = max((moved(v, reference) for v in taken.get("redrawn") or []), default=0.0)
    if compiled and spread > tolerance / 4:
        return (f"the loss draws random numbers (other draws move the fp32 reference up to {spread:.0%}) and compiled "
                "kernels draw their own; non-finite and growing losses are still caught")
    return None
