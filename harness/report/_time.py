"""Where a sweep's time went: every trial's wall time split into phases, summed over the sweep.

A trial's phases, from its record's `timing` (seconds, measured by the parent and the child):

    start-up    launch to the trial's own code running: process start (fork or interpreter), imports
    build       device, memory wall, the model, fp32 reference loss (on a GPU), knobs, optimizer, data
    compile     the first step of a compiled config (`compile_s`)
    warm-up     the first step of an eager config, and the untimed warm-up steps
    measuring   the timed windows
    teardown    the rest of the trial's wall time: memory breakdown, fp32 reference loss (on a CPU), FLOP
                count, record, process exit

A trial that ended before it measured (OOM, crash, timeout, error) keeps the phases it reported;
the rest of its wall time is "ended early", never guessed into a phase; the rest of one the sweep killed
(timeout, stall) goes to the phase its last heartbeat named (`timing.killed_in`).
"""
from __future__ import annotations

from harness.record import Record
from harness.report._format import esc
from harness.units import count

PHASES = ("start-up", "build", "compile", "warm-up", "measuring", "teardown", "ended early")
REUSED = {"flops": "FLOP count", "reference": "reference loss", "breakdown": "memory breakdown"}


def trial_phases(timing: dict) -> dict[str, float]:
    """One trial's wall time by phase (seconds); empty when the trial has no wall time (never launched)."""
    wall = timing.get("trial_wall_s")
    if wall is None:
        return {}
    first = timing.get("first_step_s")
    compile_s = timing.get("compile_s") or 0.0
    known = {"start-up": timing.get("startup_s"), "build": timing.get("setup_s"),
             "compile": compile_s if first is not None else None,
             "warm-up": first - compile_s + (timing.get("warmup_s") or 0.0) if first is not None else None,
             "measuring": timing.get("measure_s")}
    out = {name: max(v, 0.0) for name, v in known.items() if v is not None}
    killed_in = timing.get("killed_in")
    rest = "teardown" if "measuring" in out else killed_in if killed_in in PHASES else "ended early"
    out[rest] = out.get(rest, 0.0) + max(wall - sum(out.values()), 0.0)
    return out


def sweep_phases(rows: list[Record]) -> dict[str, float]:
    totals = dict.fromkeys(PHASES, 0.0)
    for row in rows:
        for name, seconds in trial_phases(row.timing).items():
            totals[name] += seconds
    return totals


def reuse_counts(rows: list[Record]) -> dict[str, int]:
    """How many trials took each figure from an earlier trial instead of measuring it."""
    return {name: sum(1 for r in rows if name in (r.reused or {})) for name in REUSED}


def duration(seconds: float) -> str:
    if seconds >= 59.95:  # round once, then split: 239.7 s is 4m 00s, not 3m 60s
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes}m {rest:02d}s"
    return f"{seconds:.1f}s"


def lines(rows: list[Record]) -> list[str]:
    """The terminal summary's lines on time: the split, and what trials reused."""
    totals = sweep_phases(rows)
    wall = sum(totals.values())
    if not wall:
        return []
    launched = sum(1 for r in rows if r.timing.get("trial_wall_s") is not None)
    parts = [f"{name} {duration(s)} ({s / wall:.0%})" for name, s in totals.items()
             if s or name != "ended early"]
    on_top = f" (their own runs; {words})" if (words := not_counted(rows)) else ""
    out = [f"time in {count(launched, 'trial')}, {duration(wall)}{on_top}: " + ", ".join(parts)]
    counts = {REUSED[k]: n for k, n in reuse_counts(rows).items() if n}
    if counts:
        out.append("reused from an earlier trial (same build and shape, not measured again): "
                   + ", ".join(f"{what} in {n}" for what, n in counts.items()))
    starts = {}
    for r in rows:
        method = (r.start or {}).get("method")
        if method:
            starts[method] = starts.get(method, 0) + 1
    if starts:
        out.append("trial start: " + ", ".join(f"{n} {m}" for m, n in sorted(starts.items())))
    return out


def not_counted(rows: list[Record]) -> str | None:
    """The sweep's time outside the trials' own runs, whose length is not recorded: said, so that the split's
    sum is not read as the sweep's wall time."""
    confirmations = sum(len(r.repeats) for r in rows)
    if confirmations:
        return (f"{count(confirmations, 'confirmation run')} and any waits for a quiet "
                "machine come on top")
    return "any waits for a quiet machine come on top" if any(r.busy for r in rows) else None


def html(rows: list[Record]) -> str:
    """The HTML card's body: the split as a table with shares and a bar per phase."""
    totals = sweep_phases(rows)
    wall = sum(totals.values())
    if not wall:
        return '<p class="empty">No trial recorded its wall time.</p>'
    body = "".join(
        f'<tr><td>{esc(name)}</td><td style="text-align:right">{seconds:.1f}</td><td style="text-align:right">{seconds / wall:.0%}</td>'
        f'<td><div style="background:#4c78a8;height:0.8em;width:{100 * seconds / wall:.1f}%"></div></td></tr>'
        for name, seconds in totals.items() if seconds or name != "ended early")
    words = not_counted(rows)
    notes = [esc(line) for line in ([f"The trials' own runs; {words}."] if words else []) + lines(rows)[1:]]
    return ('<table><thead><tr><th>phase</th><th>seconds</th><th>share</th><th></th></tr></thead>'
            f'<tbody>{body}</tbody><tfoot><tr><td>all trials</td><td style="text-align:right">{wall:.1f}</td><td></td><td></td>'
            f'</tr></tfoot></table>' + "".join(f"<p>{n}</p>" for n in notes))
