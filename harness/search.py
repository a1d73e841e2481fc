"""The search policy, free of Optuna and torch: ordinal knobs, memory families, skips, frontiers.

Peak memory grows with batch size when every other memory-affecting knob is held: a *family* is
a config without its batch size (and without the accumulation an effective batch derives from
it). Within a family a batch at or above one that ran out of memory cannot fit, and neither can
one whose peak a straight-line fit of the family's measured peaks puts clearly over the usable
budget; such configs are recorded as `skipped` instead of being run.
"""
from __future__ import annotations

FIT_MARGIN = 0.25
"""A fitted peak must exceed the usable budget by this fraction before a config is skipped:
activation memory is close to linear in batch size, allocator rounding and noise are not."""


def is_ordinal(choices: tuple) -> bool:
    """Numeric choices (batch sizes, sequence lengths) are ordered: the sampler sees their index."""
    return bool(choices) and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices)


def ordered(choices: tuple) -> list:
    return sorted(choices) if is_ordinal(choices) else list(choices)


def family(config: dict, derived_accumulation: bool) -> tuple:
    drop = {"batch_size"} | ({"accumulation"} if derived_accumulation else set())
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k not in drop))


def skip_reason(config: dict, rows: list[dict], usable: float | None, derived_accumulation: bool) -> dict | None:
    """Why `config` must exceed the usable memory, from rows of its family; None if it may fit."""
    if "batch_size" not in config:
        return None
    mine, batch = family(config, derived_accumulation), config["batch_size"]
    kin = [r for r in rows if r.get("config") and family(r["config"], derived_accumulation) == mine]
    ooms = [r for r in kin if r.get("status") == "oom" and r["config"]["batch_size"] <= batch]
    if ooms:
        smallest = min(ooms, key=lambda r: r["config"]["batch_size"])
        return {"reason": f"batch {smallest['config']['batch_size']} of the same family ran out of memory",
                "from": sorted(r["number"] for r in ooms)}
    if not usable:
        return None
    predicted, used = fitted_peak(kin, batch)
    if predicted is not None and predicted > usable * (1 + FIT_MARGIN):
        return {"reason": f"the family's measured peaks fit a line predicting {predicted / 2**30:.2f} GiB at "
                          f"batch {batch}, over the usable {usable / 2**30:.2f} GiB by more than {FIT_MARGIN:.0%}",
                "from": used, "predicted_peak": predicted}
    return None


def fitted_peak(kin: list[dict], batch: int) -> tuple[float | None, list[int]]:
    """Least-squares line through (batch, peak) of the family's measured trials, at `batch`."""
    points = [(r["config"]["batch_size"], r["peak_memory"], r["number"]) for r in kin
              if r.get("status") == "ok" and r.get("peak_memory")]
    if len({b for b, _, _ in points}) < 2 or batch <= max(b for b, _, _ in points):
        return None, []  # extrapolate upward only: below a measured batch the measurement rules
    n = len(points)
    mean_b, mean_p = sum(b for b, _, _ in points) / n, sum(p for _, p, _ in points) / n
    slope = (sum((b - mean_b) * (p - mean_p) for b, p, _ in points)
             / sum((b - mean_b) ** 2 for b, _, _ in points))
    if slope <= 0:
        return None, []
    return mean_p + slope * (batch - mean_b), sorted(num for _, _, num in points)


def frontier_probes(rows: list[dict], batches: list, known: set, derived_accumulation: bool, to_config) -> list[dict]:
    """Per family that has run: the next batch above its largest fitting one, if nothing decided it yet.

    `known` holds config keys already measured or skipped; `to_config` rebuilds a config with a new batch.
    """
    probes, seen = [], set()
    ok = [r for r in rows if r.get("status") == "ok" and r.get("config")]
    for r in sorted(ok, key=lambda r: -r["config"]["batch_size"]):
        fam = family(r["config"], derived_accumulation)
        if fam in seen:
            continue
        seen.add(fam)
        larger = [b for b in batches if b > r["config"]["batch_size"]]
        if larger:
            probe = to_config(r["config"], min(larger))
            if key(probe) not in known:
                probes.append(probe)
    return probes


def key(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))
