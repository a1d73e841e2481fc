"""What measurements prove, free of Optuna and torch: ordinal knobs, memory families, frontiers, skips.

Peak memory grows with batch size when every other memory-affecting knob is held: a *family* is
a config without its batch size (and without the accumulation an effective batch derives from
it). Within a family a batch at or above one that ran out of memory cannot fit (accumulation
counted: it holds the gradients, so an OOM with it says nothing of the same batch without), and
neither can one whose peak a straight-line fit of the family's measured peaks puts clearly over the
usable budget; such configs are recorded as `skipped` instead of being run. What to measure next
is harness.planner's decision; these are the facts it never overrules.
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


MEMORY_SAVERS = {"checkpointing": "none"}
"""Knobs that trade speed for memory, with the value that saves nothing: worth trying only at
batches the same config without them cannot fit (harness.planner)."""


def memory_family(config: dict) -> tuple:
    """Configs whose peak memory differs only through batch size and accumulation (see holds_gradients)."""
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k not in ("batch_size", "accumulation")))


def speed_family(config: dict) -> tuple:
    """Configs that differ only in batch size."""
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k != "batch_size"))


def describe(config: dict) -> str:
    """`batch_size=32 precision=fp32 ...`, as every view and message names a config."""
    return " ".join(f"{k}={v}" for k, v in config.items())


def fits(r: dict, usable: float | None) -> bool:
    return bool(r.get("peak_memory")) and r["status"] in ("ok", "diverged") and (not usable or r["peak_memory"] <= usable)


def holds_gradients(config: dict) -> bool:
    """With accumulation the gradients stay alive through the next micro-batch's forward and backward,
    so at the same batch its peak is higher than without (by about the gradients' size)."""
    return config.get("accumulation", 1) > 1


def walled(r: dict, usable: float | None) -> bool:
    """Known not to fit: out of memory, skipped as sure to be, or ran (a diverged run too) over the usable memory."""
    return r["status"] in ("oom", "skipped") or bool(r["status"] in ("ok", "diverged") and usable
                                                     and (r.get("peak_memory") or 0) > usable)


def frontier(kin: list[dict], usable: float | None, config: dict | None = None) -> tuple[int | None, int | None]:
    """The largest batch of a memory family measured to fit, and the smallest one known not to.

    Given `config`, only what holds for it: a fit of a config holding as much gradient memory or
    more (accumulation), a wall of one holding as much or less.
    """
    level = holds_gradients(config) if config else None
    return (max((r["config"]["batch_size"] for r in kin if fits(r, usable)
                 and (level is None or holds_gradients(r["config"]) >= level)), default=None),
            min((r["config"]["batch_size"] for r in kin if walled(r, usable)
                 and (level is None or holds_gradients(r["config"]) <= level)), default=None))


def above_wall(config: dict, rows: list[dict], usable: float | None) -> bool:
    """At or above a batch of its memory family measured over the usable memory (it ran, but does not fit)."""
    _, wall = frontier([r for r in rows if memory_family(r["config"]) == memory_family(config)], usable, config)
    return wall is not None and config["batch_size"] >= wall


def skip_reason(config: dict, rows: list[dict], usable: float | None) -> dict | None:
    """Why `config` must exceed the usable memory, from rows of its family; None if it may fit."""
    if "batch_size" not in config:
        return None
    mine, batch = memory_family(config), config["batch_size"]
    kin = [r for r in rows if r.get("config") and "batch_size" in r["config"] and memory_family(r["config"]) == mine]
    ooms = [r for r in kin if r.get("status") == "oom" and r["config"]["batch_size"] <= batch
            and holds_gradients(r["config"]) <= holds_gradients(config)]
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
    """The family's peak line at `batch`, above its measured batches only (below, measurements rule)."""
    points = ok_points(kin)
    line = peak_line(kin)
    if line is None or batch <= max(b for b, _, _ in points):
        return None, []
    return line(batch), sorted(num for _, _, num in points)


def ok_points(kin: list[dict]) -> list[tuple]:
    return [(r["config"]["batch_size"], r["peak_memory"], r["number"]) for r in kin
            if r.get("status") == "ok" and r.get("peak_memory")]


def peak_line(kin: list[dict]):
    """Least-squares line through (batch, peak) of the family's measured trials; None without two batches."""
    points = ok_points(kin)
    if len({b for b, _, _ in points}) < 2:
        return None
    n = len(points)
    mean_b, mean_p = sum(b for b, _, _ in points) / n, sum(p for _, p, _ in points) / n
    slope = (sum((b - mean_b) * (p - mean_p) for b, p, _ in points)
             / sum((b - mean_b) ** 2 for b, _, _ in points))
    if slope <= 0:
        return None
    return lambda batch: mean_p + slope * (batch - mean_b)


def key(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))
