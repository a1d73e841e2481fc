"""Choosing "best": feasibility under a memory budget, the Pareto front, noise-aware ties, tiers.

Throughput is samples/s, or tokens/s for a study whose `objective` is tokens (the fair measure when
a searched knob such as seq_len changes what one sample is). Best is the highest-throughput
feasible config on the front whose peak memory leaves the requested
headroom of the capacity (the budget, else the device's memory). Throughput differences smaller
than the measured noise of the two configs are ties, and a tie goes to the config with more
headroom where headroom is scarce (one of them above 75% of the capacity), else to the faster.
Tiers pick the same way under stricter headroom: the guides' "safe / medium /
aggressive" settings, measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field

TIERS = {"safe": 0.25, "balanced": 0.15, "aggressive": 0.05}
MIN_NOISE = 0.01  # below 1% nobody should care which config is faster
MAX_NOISE = 0.10  # a very noisy trial (a loaded machine) must not tie with one 2x faster


@dataclass
class Choice:
    best: dict | None
    baseline: dict | None
    front: list[dict]
    tiers: dict[str, dict | None] = field(default_factory=dict)
    capacity: float | None = None


def capacity(rows: list[dict], budget: int | None) -> float | None:
    """Memory the configs must fit in: the budget, else the device total the trials measured."""
    if budget:
        return float(budget)
    totals = [r.get("memory", {}).get("device_total") for r in rows if r.get("memory")]
    totals = [t for t in totals if t]
    return float(min(totals)) if totals else None


def speed(row: dict, objective: str = "samples") -> float | None:
    """The throughput a study optimizes: samples/s, or tokens/s; the median over the trial and its
    confirmation runs where it was confirmed."""
    runs = runs_of(row, objective)
    return sorted(runs)[len(runs) // 2] if len(runs) > 2 else (runs[0] if runs else None)


def single(row: dict, objective: str) -> float | None:
    if objective == "tokens":
        return (row.get("tokens_per_s") or {}).get("median")
    return row.get("throughput")


def runs_of(row: dict, objective: str = "samples") -> list[float]:
    """Every measured throughput of a config: its trial, then its confirmation runs."""
    values = [single(row, objective)] + [single(r, objective) for r in row.get("repeats") or []
                                         if r.get("status") == "ok"]
    return [v for v in values if v]


def speedup(best: dict, base: dict, objective: str = "samples") -> tuple[float, float] | None:
    """best/baseline throughput and its spread (std of the ratios of runs made side by side), or None."""
    a, b = runs_of(best, objective), runs_of(base, objective)
    ratios = [x / y for x, y in zip(a, b)]
    if not ratios:
        return None
    mean = sum(ratios) / len(ratios)
    spread = (sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1)) ** 0.5 if len(ratios) > 1 else None
    return speed(best, objective) / speed(base, objective), spread


def measured(rows: list[dict], objective: str = "samples") -> list[dict]:
    return [r for r in rows if r.get("status") == "ok" and speed(r, objective) and r.get("peak_memory") is not None]


def pareto_front(rows: list[dict], objective: str = "samples") -> list[dict]:
    """Rows no other row beats on both throughput (higher) and peak memory (lower)."""
    front = []
    for r in rows:
        dominated = any(speed(o, objective) >= speed(r, objective) and o["peak_memory"] <= r["peak_memory"]
                        and (speed(o, objective) > speed(r, objective) or o["peak_memory"] < r["peak_memory"])
                        for o in rows)
        if not dominated:
            front.append(r)
    return sorted(front, key=lambda r: r["peak_memory"])


def noise(row: dict) -> float:
    """Relative noise of a row's throughput: twice its step-time CV, or twice the spread of its
    confirmation runs when it has them, within [MIN_NOISE, MAX_NOISE]."""
    cv = (row.get("timing") or {}).get("step_s", {}).get("cv") or 0.0
    runs = runs_of(row)
    if len(runs) > 2:
        mean = sum(runs) / len(runs)
        cv = (sum((r - mean) ** 2 for r in runs) / (len(runs) - 1)) ** 0.5 / mean
    return min(max(2 * cv, MIN_NOISE), MAX_NOISE)


def confirmed(row: dict) -> bool:
    return len(runs_of(row)) > 2


def pick(candidates: list[dict], objective: str = "samples", capacity: float | None = None) -> dict | None:
    """Fastest candidate; among those tied with it within noise, the one using least memory, unless
    every tied one leaves the safe tier's headroom of `capacity` free: then memory is not scarce, and
    the faster median wins (0.23 against 0.28 GiB of a 24 GiB budget is no reason to give up 10%)."""
    if any(confirmed(r) for r in candidates):  # once leaders were re-measured, best is decided on the repeats
        candidates = [r for r in candidates if confirmed(r)]
    return prefer(candidates, objective, capacity)


def prefer(candidates: list[dict], objective: str = "samples", capacity: float | None = None) -> dict | None:
    """pick's rule on the figures as they stand, confirmed or not."""
    if not candidates:
        return None
    top = max(candidates, key=lambda r: speed(r, objective))
    tied = [r for r in candidates if not faster(top, r, objective)]
    if roomy(tied, capacity):
        return top
    return min(tied, key=lambda r: (r["peak_memory"], -speed(r, objective)))


def roomy(rows: list[dict], capacity: float | None) -> bool:
    """Every row leaves the safe tier's headroom of `capacity` free: memory is no reason to choose."""
    return bool(capacity) and all(r["peak_memory"] <= capacity * (1 - TIERS["safe"]) for r in rows)


def faster(a: dict, b: dict, objective: str = "samples") -> bool:
    """Is `a` faster than `b` by more than the noise of either?"""
    sa, sb = speed(a, objective), speed(b, objective)
    return sa is not None and sb is not None and sa - sb > max(noise(a), noise(b)) * sa


def choose(rows: list[dict], budget: int | None, headroom: float, objective: str = "samples") -> Choice:
    """Mark rows with `pareto`, `best` and `tier`; return the choice."""
    cap = capacity(rows, budget)
    candidates = measured(rows, objective)
    front = pareto_front(candidates, objective)
    fits = (lambda r, h: r["peak_memory"] <= cap * (1 - h)) if cap else (lambda r, h: True)
    # From every fitting row, not the front alone: a confirmed median can fall below an unconfirmed
    # single run that then "dominates" it, and best must still be decided on the confirmed runs.
    best = pick([r for r in candidates if fits(r, headroom)], objective, cap)
    tiers = {name: pick([r for r in candidates if fits(r, h)], objective, cap) for name, h in TIERS.items()}
    front_ids = {id(r) for r in front}
    for r in rows:
        r["pareto"] = id(r) in front_ids
        r["best"] = r is best
        r["tier"] = next((name for name, t in tiers.items() if t is r), None)
        r.setdefault("baseline", False)
    baseline = next((r for r in rows if r.get("baseline")), None)
    return Choice(best=best, baseline=baseline, front=front, tiers=tiers, capacity=cap)


def feasible_under(rows: list[dict], budget: int, headroom: float, objective: str = "samples") -> dict | None:
    """Best config that fits a smaller card (`bench apply --budget`), from the same measurements."""
    front = pareto_front(measured(rows, objective), objective)
    return pick([r for r in front if r["peak_memory"] <= budget * (1 - headroom)], objective, budget)
