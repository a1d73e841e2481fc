"""The search policy, free of Optuna and torch: ordinal knobs, memory families, skips, frontiers.

Peak memory grows with batch size when every other memory-affecting knob is held: a *family* is
a config without its batch size (and without the accumulation an effective batch derives from
it). Within a family a batch at or above one that ran out of memory cannot fit (accumulation
counted: it holds the gradients, so an OOM with it says nothing of the same batch without), and
neither can one whose peak a straight-line fit of the family's measured peaks puts clearly over the
usable budget; such configs are recorded as `skipped` instead of being run.

The search: each family's memory frontier (`next_probe`), then hill climbing from the best config
(`next_neighbour`); the sampler's proposals after that.
"""
from __future__ import annotations

from harness import pareto

FIT_MARGIN = 0.25
"""A fitted peak must exceed the usable budget by this fraction before a config is skipped:
activation memory is close to linear in batch size, allocator rounding and noise are not."""


def is_ordinal(choices: tuple) -> bool:
    """Numeric choices (batch sizes, sequence lengths) are ordered: the sampler sees their index."""
    return bool(choices) and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices)


def ordered(choices: tuple) -> list:
    return sorted(choices) if is_ordinal(choices) else list(choices)


PRECISION_PRIOR = {
    # Which precision to try first when nothing is measured yet; measurements decide after that.
    # CUDA: tensor cores make mixed precision fastest as a rule, fp32 matmuls slowest.
    "cuda": ("bf16-mixed", "fp16-mixed", "tf32", "fp32", "bf16-true"),
    # CPU: fp16 autocast has no fast kernels there (about 14x slower than fp32 on the quickstart).
    "cpu": ("bf16-mixed", "fp32", "bf16-true", "fp16-mixed"),
}
SIBLING_WITHIN = 0.8
"""An accumulation sibling is measured at its family's frontier only when the accumulation-1
config there is within this fraction of the fastest so far: accumulation saves optimizer steps,
worth a few percent at the frontier, not a slow family's gap."""
MEMORY_SAVERS = {"checkpointing": "none"}
"""Knobs that trade speed for memory, with the value that saves nothing: worth trying only at
batches the same config without them cannot fit."""


def memory_family(config: dict) -> tuple:
    """Configs whose peak memory differs only through batch size and accumulation (see holds_gradients)."""
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k not in ("batch_size", "accumulation")))


def speed_family(config: dict, derived_accumulation: bool) -> tuple:
    """Configs that differ only in batch size (and the accumulation an effective batch derives from it)."""
    drop = {"batch_size"} | ({"accumulation"} if derived_accumulation else set())
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k not in drop))


def rank(config: dict, device: str) -> tuple:
    """The order families are explored in: no memory savers, no accumulation, the precision prior."""
    prior = PRECISION_PRIOR["cuda" if device.startswith("cuda") else "cpu"]
    savers = sum(config.get(k, off) != off for k, off in MEMORY_SAVERS.items())
    precision = config.get("precision")
    return savers, config.get("accumulation", 1), prior.index(precision) if precision in prior else len(prior)


def fits(r: dict, usable: float | None) -> bool:
    return bool(r.get("peak_memory")) and r["status"] in ("ok", "diverged") and (not usable or r["peak_memory"] <= usable)


def holds_gradients(config: dict) -> bool:
    """With accumulation the gradients stay alive through the next micro-batch's forward and backward,
    so at the same batch its peak is higher than without (by about the gradients' size)."""
    return config.get("accumulation", 1) > 1


def walled(r: dict, usable: float | None) -> bool:
    return r["status"] in ("oom", "skipped") or bool(r["status"] == "ok" and usable and r["peak_memory"] > usable)


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


def next_probe(space: list[dict], rows: list[dict], usable: float | None, derived_accumulation: bool,
               device: str, objective: str = "samples", savers: bool = True, families: int | None = None) -> dict | None:
    """The structured search's next config: per family, in `rank` order, the largest batch that may fit.

    Throughput grows with batch size until memory runs out, so each family's answer is at its memory
    frontier: found top-down (one OOM is cheap), then by a line through the family's measured peaks
    or by bisection. None once every family's frontier is known and measured (`savers=False`: every
    family without a memory saver; `families=N`: the first N families in `rank` order).
    """
    rows = [r for r in rows if r.get("config") and "batch_size" in r["config"]]
    measured = {key(r["config"]) for r in rows}
    by_family: dict[tuple, list[dict]] = {}
    for config in space:
        if "batch_size" in config:
            by_family.setdefault(speed_family(config, derived_accumulation), []).append(config)
    fastest = max((pareto.single(r, objective) or 0 for r in rows if fits(r, usable)), default=0)
    for configs in sorted(by_family.values(), key=lambda cs: rank(cs[0], device))[:families]:
        if not savers and rank(configs[0], device)[0]:
            continue
        configs = sorted(configs, key=lambda c: c["batch_size"])
        floor = saver_floor(configs[0], rows, usable)
        probe = family_probe(configs, rows, usable, measured, floor, SIBLING_WITHIN * fastest, objective)
        if probe is not None:
            return probe
    return None


def next_neighbour(space: list[dict], rows: list[dict], usable: float | None, derived_accumulation: bool,
                   device: str, objective: str = "samples") -> dict | None:
    """Hill climbing once the frontiers are known: the fastest config that fits, then its unmeasured
    neighbours (one knob one step away) until none is left or one of them leads.

    The frontier is where throughput should peak. On a plateau (a CPU, a saturated GPU, a fixed
    global batch where a smaller micro-batch keeps in cache) a neighbour below it can be faster, and
    only a measurement says so; the neighbours are few, so they are measured before the sampler's
    proposals.
    """
    rows = [r for r in rows if r.get("config") and "batch_size" in r["config"]]
    leaders = [r for r in rows if r.get("status") == "ok" and fits(r, usable) and pareto.single(r, objective)]
    if not leaders:
        return None
    best = max(leaders, key=lambda r: pareto.single(r, objective))
    leader, worth = best["config"], SIBLING_WITHIN * pareto.single(best, objective)
    seen = {key(r["config"]) for r in rows}  # measured or skipped
    for config in neighbours(leader, space, derived_accumulation, device):
        kin_speeds = [pareto.single(r, objective) or 0 for r in rows
                      if memory_family(r["config"]) == memory_family(config) and fits(r, usable)]
        if kin_speeds and max(kin_speeds) < worth:  # a family measured slow (fp16 on a CPU) stays slow here
            continue
        if (key(config) not in seen and skip_reason(config, rows, usable) is None
                and config["batch_size"] > saver_floor(config, rows, usable)
                and not above_wall(config, rows, usable)):
            return config
    return None


def neighbours(config: dict, space: list[dict], derived_accumulation: bool, device: str) -> list[dict]:
    """The configs one step from `config`: the next smaller then larger batch of its family, then one
    other knob changed at the same batch, in the families' `rank` order."""
    family = speed_family(config, derived_accumulation)
    kin = sorted((c for c in space if "batch_size" in c and speed_family(c, derived_accumulation) == family),
                 key=lambda c: c["batch_size"])
    at = [c["batch_size"] for c in kin].index(config["batch_size"]) if config in kin else None
    batch_steps = [] if at is None else [c for i, c in enumerate(kin) if i in (at - 1, at + 1)]
    ignore = {"batch_size"} | ({"accumulation"} if derived_accumulation else set())
    one_knob = [c for c in space if c.get("batch_size") == config["batch_size"]
                and sum(c.get(k) != v for k, v in config.items() if k not in ignore) == 1]
    return batch_steps + sorted(one_knob, key=lambda c: rank(c, device))


def above_wall(config: dict, rows: list[dict], usable: float | None) -> bool:
    """At or above a batch of its memory family measured over the usable memory (it ran, but does not fit)."""
    _, wall = frontier([r for r in rows if memory_family(r["config"]) == memory_family(config)], usable, config)
    return wall is not None and config["batch_size"] >= wall


def family_probe(configs: list[dict], rows: list[dict], usable, measured: set, floor: int, worth: float,
                 objective: str) -> dict | None:
    kin = [r for r in rows if memory_family(r["config"]) == memory_family(configs[0])]
    fit, _ = frontier(kin, usable)
    _, wall = frontier(kin, usable, configs[0])
    tried = {r["config"]["batch_size"] for r in kin}
    open_ = [c for c in configs if c["batch_size"] > max(fit or 0, floor) and (wall is None or c["batch_size"] < wall)
             and c["batch_size"] not in tried]
    if open_:
        return choose(open_, kin, usable, wall)
    # The frontier is known from a sibling (accumulation 1 at the same batches): measure this family
    # once there, or below its own wall, when the memory family is fast enough to matter.
    at = next((c for c in reversed(configs) if floor < c["batch_size"] <= (fit or 0)
               and (wall is None or c["batch_size"] < wall)), None)
    if at is None or key(at) in measured:
        return None
    fastest_kin = max((pareto.single(r, objective) or 0 for r in kin if fits(r, usable)), default=0)
    return at if fastest_kin >= worth else None


def choose(open_: list[dict], kin: list[dict], usable, wall) -> dict:
    """Among the undecided batches of a family: the largest a line through its peaks says fits,
    else the largest (nothing measured yet), else the middle (bisect towards the wall)."""
    if usable:
        line = peak_line(kin)
        if line is not None:
            fitting = [c for c in open_ if line(c["batch_size"]) <= usable]
            return fitting[-1] if fitting else open_[0]
    if wall is None:
        return open_[-1]
    return open_[len(open_) // 2]


def saver_floor(config: dict, rows: list[dict], usable) -> int:
    """A config with a memory saver on is worth measuring only above the batches its twin without
    the saver fits (at those, the twin is as large and faster)."""
    if all(config.get(k, off) == off for k, off in MEMORY_SAVERS.items()):
        return 0
    twin = {**config, **{k: off for k, off in MEMORY_SAVERS.items() if k in config}}
    fit, _ = frontier([r for r in rows if memory_family(r["config"]) == memory_family(twin)], usable)
    return fit or 0


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
