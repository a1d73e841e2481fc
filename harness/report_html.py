"""The HTML report: one self-contained page a person can open anywhere, offline.

Everything is inline (CSS, SVG drawn here in Python, a few lines of JS for sorting the table), so
the file can be mailed, attached to a ticket or opened years later without a network. Every string
that came from the user (config values, names, environment, error messages) goes through `_e`.

Input is what the report module hands over; this module decides nothing, it only draws:

    rows   one dict per trial: number, status, config, throughput, peak_memory, pareto, best,
           baseline, tier, timing, memory, flops, tokens_per_s, env, error (see harness.record)
    study  name, budget, headroom, device_total, env, created, and optionally counts by status
"""
from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from harness.units import size

GiB = 1024**3

PRECISION_COLOURS = {
    "fp32": "#4e79a7",
    "tf32": "#76b7b2",
    "bf16-mixed": "#f28e2b",
    "fp16-mixed": "#59a14f",
    "bf16-true": "#b07aa1",
}
OTHER_COLOUR = "#9c755f"
OOM_COLOUR = "#d62728"
FRONT_COLOUR = "#2f3b52"
BREAKDOWN_COLOURS = {
    "weights": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer": "#59a14f",
    "activations": "#b07aa1",
    "other": "#bab0ac",
}
# Statuses that carry a measured throughput; the rest have no place on a throughput axis.
MEASURED = ("ok", "diverged")
NO_CHECKPOINTING = ("none", "None", "False")
TIER_ORDER = {"safe": 0, "balanced": 1, "aggressive": 2}
# A budget more than this many times the largest measurement (a 24 GiB plan measured on a small
# CPU model) would squeeze every point against the axis: it is named off the scale instead.
OFF_SCALE = 4
# Config keys shown first in the table, in the order people think about them.
KNOB_ORDER = ("batch_size", "accumulation", "precision", "checkpointing", "compile")


def _e(value: object) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def render_html(rows: list[dict], study: dict) -> str:
    """The whole report page for `rows` (one per trial) of `study`."""
    best = _flagged(rows, "best")
    baseline = _flagged(rows, "baseline")
    budget = study.get("budget") or study.get("device_total")
    sections = [
        _header(rows, study),
        _summary(best, baseline, budget),
        _tiers(rows),
        _card("Throughput vs peak memory", _frontier_plot(rows, study),
              note="up and left is better; the staircase is the most throughput measured within each memory"),
        '<div class="two">'
        + _card("Throughput vs batch size", _batch_plot(rows))
        + _card("Where the best config's memory goes", _breakdown(best, budget))
        + "</div>",
        _card(f"All trials ({len(rows)})", _table(rows), note="click a column header to sort"),
        _card("Environment", _environment(study, rows)),
    ]
    title = f"bench report: {study.get('name', 'study')}"
    return _PAGE.format(title=_e(title), css=_CSS, body="\n".join(sections), js=_JS)


# ---- page sections ------------------------------------------------------------------------------

def _flagged(rows: list[dict], flag: str) -> dict | None:
    return next((r for r in rows if r.get(flag)), None)


def _header(rows: list[dict], study: dict) -> str:
    counts = study.get("counts") or Counter(r.get("status") for r in rows)
    chips = "".join(
        f'<span class="chip st-{_e(status)}">{_e(status)} {_e(n)}</span>'
        for status, n in counts.items() if n
    )
    workload = study.get("workload")
    workload = workload.get("name") if isinstance(workload, dict) else workload
    device = _env(study, rows).get("device")
    meta = " · ".join(_e(x) for x in (workload, device, study.get("created")) if x)
    return (
        f'<header><h1>bench report <span class="name">{_e(study.get("name", "study"))}</span></h1>'
        f'<div class="meta">{meta}</div><div class="chips">{chips}</div></header>'
    )


def _summary(best: dict | None, baseline: dict | None, budget: int | None) -> str:
    if best is None:
        return '<section class="hero bad"><p>No configuration finished inside the budget.</p></section>'
    cards = [
        _stat("speedup", *_speedup(best, baseline)),
        _stat("best throughput", f"{_rate(best.get('throughput'))}/s",
              f"baseline {_rate((baseline or {}).get('throughput'))}/s"),
        _stat("peak memory", size(best.get("peak_memory")), _memory_change(best, baseline)),
        _stat("headroom left", *_headroom(best, budget)),
    ]
    return (
        f'<section class="hero"><p class="lead">Best: trial #{_e(best.get("number"))} '
        f'{_config_chips(best.get("config") or {})}</p><div class="stats">{"".join(cards)}</div></section>'
    )


def _stat(label: str, value: str, detail: str) -> str:
    return (
        f'<div class="stat"><div class="label">{_e(label)}</div>'
        f'<div class="value">{_e(value)}</div><div class="detail">{_e(detail)}</div></div>'
    )


def _speedup(best: dict, baseline: dict | None) -> tuple[str, str]:
    if not baseline or not baseline.get("throughput") or best.get("throughput") is None:
        return "-", "no baseline measured"
    speedup = best["throughput"] / baseline["throughput"]
    return f"{speedup:.2f}×", f"over the baseline, trial #{baseline.get('number')}"


def _memory_change(best: dict, baseline: dict | None) -> str:
    if not baseline or best.get("peak_memory") is None or baseline.get("peak_memory") is None:
        return "no baseline memory"
    delta = best["peak_memory"] - baseline["peak_memory"]
    sign = "+" if delta >= 0 else "−"
    return f"{sign}{size(abs(delta))} vs baseline ({size(baseline['peak_memory'])})"


def _headroom(best: dict, budget: int | None) -> tuple[str, str]:
    if not budget or best.get("peak_memory") is None:
        return "-", "no memory budget"
    left = budget - best["peak_memory"]
    return size(left), f"{left / budget:.0%} of the {size(budget)} budget"


def _config_chips(config: dict) -> str:
    return "".join(f'<span class="kv"><b>{_e(k)}</b> {_e(v)}</span>' for k, v in _ordered(config))


def _ordered(config: dict) -> list[tuple[str, object]]:
    return sorted(config.items(), key=lambda kv: (_knob_rank(kv[0]), kv[0]))


def _knob_rank(key: str) -> int:
    return KNOB_ORDER.index(key) if key in KNOB_ORDER else len(KNOB_ORDER)


def _tiers(rows: list[dict]) -> str:
    tiered = sorted((r for r in rows if r.get("tier")), key=lambda r: TIER_ORDER.get(r["tier"], len(TIER_ORDER)))
    if not tiered:
        return ""
    cards = "".join(
        f'<div class="tier"><div class="label">{_e(r["tier"])} · #{_e(r.get("number"))}</div>'
        f'<div class="value">{_e(_rate(r.get("throughput")))}/s · {_e(size(r.get("peak_memory")))}</div>'
        f'<div>{_config_chips(r.get("config") or {})}</div></div>'
        for r in tiered
    )
    return f'<section class="tiers">{cards}</section>'


def _card(title: str, body: str, note: str = "") -> str:
    note_html = f'<span class="note">{_e(note)}</span>' if note else ""
    return f'<section class="card"><h2>{_e(title)}{note_html}</h2>{body}</section>'


# ---- numbers for people -------------------------------------------------------------------------

def _rate(value: float | None) -> str:
    """Three significant digits or so, whatever the magnitude: 12,345 / 123 / 12.3 / 1.23 / 0.0123."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return f"{value:.3g}"


def _tick_label(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:g}"


def _nice_step(span: float, count: int) -> float:
    """A 1/2/2.5/5 x 10^k step that cuts `span` into at most `count` pieces."""
    magnitude = 10 ** math.floor(math.log10(span / count))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if span / (m * magnitude) <= count)


def _nice_axis(top: float, count: int = 5) -> tuple[float, list[float]]:
    """An axis from 0 to a round number at or above `top`, and its ticks."""
    top = top if top > 0 else 1.0
    step = _nice_step(top, count)
    n = math.ceil(top / step - 1e-9)
    return n * step, [i * step for i in range(n + 1)]


# ---- SVG plotting -------------------------------------------------------------------------------

@dataclass
class _Scale:
    """Maps data values onto pixels, linearly or on a log2 axis."""
    lo: float
    hi: float
    px_lo: float
    px_hi: float
    log2: bool = False

    def __call__(self, value: float) -> float:
        f = math.log2 if self.log2 else float
        t = (f(value) - f(self.lo)) / (f(self.hi) - f(self.lo))
        return round(self.px_lo + t * (self.px_hi - self.px_lo), 1)


@dataclass
class _Frame:
    width: int
    height: int
    left: int = 70
    right: int = 24
    top: int = 22
    bottom: int = 52

    def x(self, lo: float, hi: float, log2: bool = False) -> _Scale:
        return _Scale(lo, hi, self.left, self.width - self.right, log2)

    def y(self, lo: float, hi: float) -> _Scale:
        return _Scale(lo, hi, self.height - self.bottom, self.top)


def _axes(frame: _Frame, x: _Scale, y: _Scale, xticks: list[tuple[float, str]],
          yticks: list[tuple[float, str]], xlabel: str, ylabel: str) -> str:
    """Grid lines, tick labels and axis titles."""
    x0, x1, y0, y1 = frame.left, frame.width - frame.right, frame.height - frame.bottom, frame.top
    parts = []
    for value, label in yticks:
        py = y(value)
        parts.append(f'<line class="grid" x1="{x0}" x2="{x1}" y1="{py}" y2="{py}"/>'
                     f'<text class="tick" x="{x0 - 8}" y="{py + 4}" text-anchor="end">{_e(label)}</text>')
    for value, label in xticks:
        px = x(value)
        parts.append(f'<line class="grid" x1="{px}" x2="{px}" y1="{y1}" y2="{y0}"/>'
                     f'<text class="tick" x="{px}" y="{y0 + 18}" text-anchor="middle">{_e(label)}</text>')
    parts.append(f'<line class="axis" x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}"/>'
                 f'<line class="axis" x1="{x0}" x2="{x0}" y1="{y1}" y2="{y0}"/>')
    parts.append(f'<text class="axis-title" x="{(x0 + x1) / 2}" y="{frame.height - 10}" '
                 f'text-anchor="middle">{_e(xlabel)}</text>')
    parts.append(f'<text class="axis-title" transform="translate(16 {(y0 + y1) / 2}) rotate(-90)" '
                 f'text-anchor="middle">{_e(ylabel)}</text>')
    return "".join(parts)


def _svg(frame: _Frame, cls: str, body: str, label: str) -> str:
    return (f'<svg class="plot {cls}" viewBox="0 0 {frame.width} {frame.height}" role="img" '
            f'aria-label="{_e(label)}">{body}</svg>')


def _precision(row: dict) -> str:
    return str((row.get("config") or {}).get("precision", "default"))


def _colour(row: dict) -> str:
    return PRECISION_COLOURS.get(_precision(row), OTHER_COLOUR)


def _compiled(row: dict) -> bool:
    return str((row.get("config") or {}).get("compile", "off")) not in ("off", "False", "None")


def _checkpointing(row: dict) -> str:
    return str((row.get("config") or {}).get("checkpointing", "none"))


def _marker(cx: float, cy: float, colour: str, compiled: bool, checkpointing: str,
            hollow: bool = False) -> str:
    """Colour = precision; diamond = compiled, circle = eager; ring = activation checkpointing."""
    fill = "#fff" if hollow else colour
    if compiled:
        shape = (f'<path class="shape" d="M{cx} {cy - 8}L{cx + 8} {cy}L{cx} {cy + 8}L{cx - 8} {cy}Z" '
                 f'fill="{fill}" stroke="{colour}"/>')
    else:
        shape = f'<circle class="shape" cx="{cx}" cy="{cy}" r="6.5" fill="{fill}" stroke="{colour}"/>'
    ring = ""
    if checkpointing not in NO_CHECKPOINTING:
        dash = ' stroke-dasharray="3 2"' if checkpointing == "selective" else ""
        ring = f'<circle class="ring" cx="{cx}" cy="{cy}" r="11.5" stroke="{colour}"{dash}/>'
    return ring + shape


def _cross(cx: float, cy: float, size: float = 6) -> str:
    return (f'<path d="M{cx - size} {cy - size}L{cx + size} {cy + size}M{cx - size} {cy + size}'
            f'L{cx + size} {cy - size}"/>')


def _tooltip(row: dict) -> str:
    config = ", ".join(f"{k}={v}" for k, v in _ordered(row.get("config") or {}))
    what = f"{_rate(row.get('throughput'))}/s, {size(row.get('peak_memory'))}"
    return f"<title>#{_e(row.get('number'))} {_e(row.get('status'))}: {_e(what)}\n{_e(config)}</title>"


# ---- plot 1: throughput vs peak memory ----------------------------------------------------------

def _frontier_plot(rows: list[dict], study: dict) -> str:
    points = [r for r in rows if r.get("status") in MEASURED and _has_xy(r)]
    ooms = [r for r in rows if r.get("status") == "oom"]
    budget = study.get("budget") or study.get("device_total")
    if not points and not ooms:
        return '<p class="empty">No trial measured both throughput and memory yet.</p>'
    frame = _Frame(960, 440)
    x_hi, x_ticks = _nice_axis(_memory_extent(points, ooms, budget) * 1.04 / GiB, 8)
    y_hi, y_ticks = _nice_axis(max([r["throughput"] for r in points] + [0]) * 1.12)
    x, y = frame.x(0, x_hi), frame.y(0, y_hi)
    body = [
        _axes(frame, x, y, [(t, _tick_label(t)) for t in x_ticks], [(t, _tick_label(t)) for t in y_ticks],
              "peak memory (GiB)", "throughput (samples/s)"),
        _budget_lines(frame, x, budget, study.get("headroom") or 0),
        _front(frame, x, y, [r for r in points if r.get("pareto")]),
        *(_point(r, x, y) for r in points),
        _oom_marks(frame, x, ooms, budget),
        _labels(frame, x, y, points),
    ]
    plot = _svg(frame, "frontier", "".join(body), "throughput against peak memory per trial")
    return plot + _frontier_legend(points, ooms)


def _has_xy(row: dict) -> bool:
    return row.get("throughput") is not None and row.get("peak_memory") is not None


def _on_scale(budget: int | None, measured: float) -> bool:
    """Whether the budget belongs on a memory axis that must show `measured` bytes legibly."""
    return bool(budget) and (not measured or budget <= OFF_SCALE * measured)


def _offscale_note(frame: _Frame, text: str) -> str:
    return (f'<text class="offscale" x="{frame.width - frame.right}" y="{frame.top - 7}" '
            f'text-anchor="end">{_e(text)}</text>')


def _memory_extent(points: list[dict], ooms: list[dict], budget: int | None) -> float:
    """The memory axis covers the points and the budget when it is on scale; an OOM that asked
    for far more is drawn at the right edge rather than squeezing everything else to the left."""
    measured = max((r["peak_memory"] for r in points), default=0)
    reference = max(measured, budget if _on_scale(budget, measured) else 0)
    attempts = [r["peak_memory"] for r in ooms if r.get("peak_memory")]
    if not reference:
        return max(attempts, default=GiB)
    return max([reference] + [min(a, 1.5 * reference) for a in attempts])


def _budget_lines(frame: _Frame, x: _Scale, budget: int | None, headroom: float) -> str:
    """The budget and the budget less headroom, labelled along the lines so no point is covered;
    a line beyond the axis is named above the plot instead."""
    if not budget:
        return ""
    lines = [(budget, "budget", f"budget {size(budget)}")]
    if headroom > 0:
        usable = budget * (1 - headroom)
        lines.append((usable, "usable", f"{headroom:.0%} headroom: {size(usable)}"))
    top, bottom = frame.top, frame.height - frame.bottom
    svg = [
        f'<g class="limit {cls}"><line x1="{x(value / GiB)}" x2="{x(value / GiB)}" y1="{top}" y2="{bottom}"/>'
        f'<text transform="translate({x(value / GiB) - 5} {top + 4}) rotate(-90)" text-anchor="end">'
        f'{_e(label)}</text></g>'
        for value, cls, label in lines if value / GiB <= x.hi
    ]
    beyond = [label for value, _, label in lines if value / GiB > x.hi]
    if beyond:
        svg.append(_offscale_note(frame, " · ".join(reversed(beyond)) + ": off the scale →"))
    return "".join(svg)


def _front(frame: _Frame, x: _Scale, y: _Scale, front: list[dict]) -> str:
    """The Pareto front as a staircase: the most throughput reachable within each amount of memory."""
    if not front:
        return ""
    front = sorted(front, key=lambda r: (r["peak_memory"], r["throughput"]))
    steps = [f"M{x(front[0]['peak_memory'] / GiB)} {y(front[0]['throughput'])}"]
    for row in front[1:]:
        steps.append(f"H{x(row['peak_memory'] / GiB)}V{y(row['throughput'])}")
    right, bottom = frame.width - frame.right, frame.height - frame.bottom
    line = "".join(steps) + f"H{right}"
    area = line + f"V{bottom}H{x(front[0]['peak_memory'] / GiB)}Z"
    return f'<path class="front-area" d="{area}"/><path class="pareto-front" d="{line}"/>'


def _point(row: dict, x: _Scale, y: _Scale) -> str:
    cx, cy = x(row["peak_memory"] / GiB), y(row["throughput"])
    classes = " ".join(["pt"] + [flag for flag in ("pareto", "best", "baseline") if row.get(flag)]
                       + (["diverged"] if row["status"] == "diverged" else []))
    marker = _marker(cx, cy, _colour(row), _compiled(row), _checkpointing(row),
                     hollow=row["status"] == "diverged")
    return f'<g class="{classes}" data-trial="{_e(row.get("number"))}">{_tooltip(row)}{marker}</g>'


def _oom_marks(frame: _Frame, x: _Scale, ooms: list[dict], budget: int | None) -> str:
    """OOMs have no throughput: a red cross on the floor, at the memory where they failed.

    Without a recorded size an OOM sits at the budget (or the right edge without one); crosses that
    would overlap are stacked upwards so each one stays countable.
    """
    floor, taken, parts = frame.height - frame.bottom - 10, Counter(), []
    for row in sorted(ooms, key=lambda r: r.get("number") or 0):
        mem = row.get("peak_memory") or budget
        cx = x(min(mem / GiB, x.hi)) if mem else x(x.hi)
        slot = round(cx / 14)
        cy = floor - 16 * taken[slot]
        taken[slot] += 1
        parts.append(f'<g class="oom" data-trial="{_e(row.get("number"))}">{_tooltip(row)}'
                     f'{_cross(cx, cy)}</g>')
    return "".join(parts)


def _labels(frame: _Frame, x: _Scale, y: _Scale, points: list[dict]) -> str:
    """Name the best and the baseline points right on the plot, with an arrow between them."""
    best = _flagged(points, "best")
    baseline = _flagged(points, "baseline")
    parts = []
    if best and baseline and best is not baseline:
        parts.append(_speedup_arrow(x, y, baseline, best))
    for row, text, dy in ((best, "best", -16), (baseline, "baseline", 24)):
        if row is None:
            continue
        cx, cy = x(row["peak_memory"] / GiB), y(row["throughput"])
        flip = cx > frame.width * 0.8
        anchor, dx = ("end", -14) if flip else ("start", 14)
        parts.append(f'<text class="callout {text}" x="{cx + dx}" y="{cy + dy}" text-anchor="{anchor}">'
                     f'{_e(text)} #{_e(row.get("number"))}</text>')
    return "".join(parts)


def _speedup_arrow(x: _Scale, y: _Scale, baseline: dict, best: dict) -> str:
    x0, y0 = x(baseline["peak_memory"] / GiB), y(baseline["throughput"])
    x1, y1 = x(best["peak_memory"] / GiB), y(best["throughput"])
    # Stop short of both markers so the arrow never hides them.
    length = math.hypot(x1 - x0, y1 - y0) or 1
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    pad = min(16, length / 3)
    speedup = best["throughput"] / baseline["throughput"] if baseline["throughput"] else 0
    # The label sits beside the middle of the arrow, on its lower-right side.
    mx, my = (x0 + x1) / 2 - uy * 12, (y0 + y1) / 2 + ux * 12
    return (f'<line class="arrow" x1="{x0 + ux * pad:.1f}" y1="{y0 + uy * pad:.1f}" '
            f'x2="{x1 - ux * pad:.1f}" y2="{y1 - uy * pad:.1f}" marker-end="url(#arrowhead)"/>'
            f'<text class="arrow-label" x="{mx:.1f}" y="{my + 4:.1f}">{speedup:.2f}×</text>'
            '<defs><marker id="arrowhead" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z" fill="#555"/>'
            '</marker></defs>')


# Legend glyphs for the frontier plot's marks, drawn like the marks themselves.
_MARK_GLYPHS = {
    "eager": '<circle cx="10" cy="10" r="6" fill="#888"/>',
    "compiled": '<path d="M10 3L17 10L10 17L3 10Z" fill="#888"/>',
    "activation checkpointing (dashed: selective)":
        '<circle cx="10" cy="10" r="4" fill="#888"/>'
        '<circle cx="10" cy="10" r="8" fill="none" stroke="#888" stroke-width="1.6"/>',
    "diverged (loss not finite)": '<circle cx="10" cy="10" r="6" fill="#fff" stroke="#888" stroke-width="2"/>',
    "out of memory": f'<path d="M4 4L16 16M4 16L16 4" stroke="{OOM_COLOUR}" stroke-width="2.6"/>',
    "Pareto front": f'<path d="M2 16H8V9H13V4H18" fill="none" stroke="{FRONT_COLOUR}" stroke-width="2.4"/>',
}


def _frontier_legend(points: list[dict], ooms: list[dict]) -> str:
    """Colours for the precisions present, then only the marks this plot actually uses."""
    items = [(_glyph(f'<circle cx="10" cy="10" r="6" fill="{PRECISION_COLOURS.get(p, OTHER_COLOUR)}"/>'),
              p) for p in _precisions(points + ooms)]
    present = [
        any(not _compiled(r) for r in points),
        any(_compiled(r) for r in points),
        any(_checkpointing(r) not in NO_CHECKPOINTING for r in points),
        any(r["status"] == "diverged" for r in points),
        bool(ooms),
        any(r.get("pareto") for r in points),
    ]
    items += [(_glyph(glyph), label) for (label, glyph), shown in zip(_MARK_GLYPHS.items(), present) if shown]
    return _legend(items)


def _glyph(inner: str) -> str:
    return f'<svg class="glyph" viewBox="0 0 20 20" width="18" height="18">{inner}</svg>'


def _legend(items: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(
        f'<span class="item">{glyph}{_e(label)}</span>' for glyph, label in items) + "</div>"


def _precisions(rows: list[dict]) -> list[str]:
    """The precisions present, in the palette's order, then any others alphabetically."""
    seen = {_precision(r) for r in rows}
    known = [p for p in PRECISION_COLOURS if p in seen]
    return known + sorted(seen - set(known))


# ---- plot 2: throughput vs batch size -----------------------------------------------------------

def _batch_plot(rows: list[dict]) -> str:
    measured = [r for r in rows if r.get("status") == "ok" and r.get("throughput") is not None
                and _batch(r)]
    if not measured:
        return '<p class="empty">No successful trial with a batch size to plot.</p>'
    ooms = [r for r in rows if r.get("status") == "oom" and _batch(r)]
    batches = [_batch(r) for r in measured + ooms]
    frame = _Frame(600, 360)
    x = frame.x(min(batches) / 1.4, max(batches) * 1.4, log2=True)
    y_hi, y_ticks = _nice_axis(max(r["throughput"] for r in measured) * 1.1)
    y = frame.y(0, y_hi)
    powers = [2**k for k in range(math.ceil(math.log2(x.lo)), math.floor(math.log2(x.hi)) + 1)]
    body = [_axes(frame, x, y, [(p, f"{p:g}") for p in powers], [(t, _tick_label(t)) for t in y_ticks],
                  "micro-batch size (log2)", "throughput (samples/s)")]
    precisions = _precisions(measured + ooms)
    body += [_series(x, y, precision, measured) for precision in precisions]
    body.append(_batch_ooms(frame, x, ooms, precisions))
    items = [(_glyph(f'<path d="M2 10H18" stroke="{PRECISION_COLOURS.get(p, OTHER_COLOUR)}" stroke-width="3"/>'),
              p) for p in precisions]
    if ooms:
        items.append((_glyph('<path d="M5 5L15 15M5 15L15 5" stroke="#777" stroke-width="2"/>'),
                      "OOM at that batch size"))
    legend = _legend(items)
    return _svg(frame, "batch", "".join(body), "throughput against batch size per precision") + legend


def _batch(row: dict) -> float | None:
    value = (row.get("config") or {}).get("batch_size")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _series(x: _Scale, y: _Scale, precision: str, measured: list[dict]) -> str:
    """One precision: every trial as a dot, a line through the fastest trial at each batch size."""
    mine = [r for r in measured if _precision(r) == precision]
    colour = PRECISION_COLOURS.get(precision, OTHER_COLOUR)
    fastest: dict[float, float] = {}
    for row in mine:
        fastest[_batch(row)] = max(fastest.get(_batch(row), 0.0), row["throughput"])
    line = "L".join(f"{x(b)} {y(t)}" for b, t in sorted(fastest.items()))
    parts = [f'<g class="series" data-precision="{_e(precision)}" style="--c:{colour}">']
    if line:
        parts.append(f'<path class="series-line" d="M{line}"/>')
    parts += [f'<g class="dot">{_tooltip(r)}<circle cx="{x(_batch(r))}" cy="{y(r["throughput"])}" '
              f'r="4.5"/></g>' for r in mine]
    return "".join(parts) + "</g>"


def _batch_ooms(frame: _Frame, x: _Scale, ooms: list[dict], precisions: list[str]) -> str:
    """OOMs as crosses in their precision's colour on the floor, stacked where they share a batch size."""
    floor, taken, parts = frame.height - frame.bottom - 9, Counter(), []
    for row in sorted(ooms, key=lambda r: (_batch(r), precisions.index(_precision(r)))):
        cy = floor - 11 * taken[_batch(row)]
        taken[_batch(row)] += 1
        parts.append(f'<g class="oom-batch" style="--c:{_colour(row)}">{_tooltip(row)}'
                     f'{_cross(x(_batch(row)), cy, 4.5)}</g>')
    return "".join(parts)


# ---- the best config's memory, stacked ----------------------------------------------------------

def _breakdown(best: dict | None, budget: int | None) -> str:
    breakdown = ((best or {}).get("memory") or {}).get("breakdown") or {}
    parts = [(k, v) for k, v in _breakdown_order(breakdown) if v]
    if not parts:
        return '<p class="empty">The best trial has no memory breakdown.</p>'
    peak = best.get("peak_memory") or 0
    if peak > sum(v for _, v in parts):
        # Allocator cache, CUDA context, workspaces: measured in the peak, in no phase.
        parts.append(("other", peak - sum(v for _, v in parts)))
    frame = _Frame(360, 360, left=56, right=10, top=24, bottom=24)
    stacked = sum(v for _, v in parts)
    on_scale = _on_scale(budget, stacked)
    top = max(stacked, budget if on_scale else 0) * 1.03
    unit, unit_name = (GiB, "GiB") if top >= GiB else (1024**2, "MiB")
    top_units, ticks = _nice_axis(top / unit, 6)
    y = frame.y(0, top_units * unit)  # in bytes
    body = [_breakdown_axis(frame, y, [(t * unit, f"{_tick_label(t)} {unit_name}") for t in ticks]),
            _stack(frame, y, parts)]
    if on_scale:
        body.append(_hline(frame, y(budget), "budget", f"budget {size(budget)}"))
    elif budget:
        body.append(_offscale_note(frame, f"budget {size(budget)}: off the scale ↑"))
    return _svg(frame, "breakdown", "".join(body), "memory breakdown of the best trial")


def _breakdown_order(breakdown: dict) -> list[tuple[str, float]]:
    known = [(k, breakdown[k]) for k in BREAKDOWN_COLOURS if k in breakdown]
    return known + sorted((k, v) for k, v in breakdown.items() if k not in BREAKDOWN_COLOURS)


def _breakdown_axis(frame: _Frame, y: _Scale, ticks: list[tuple[float, str]]) -> str:
    x0 = frame.left
    return "".join(
        f'<line class="grid" x1="{x0}" x2="{frame.width - frame.right}" y1="{y(t)}" y2="{y(t)}"/>'
        f'<text class="tick" x="{x0 - 8}" y="{y(t) + 4}" text-anchor="end">{_e(label)}</text>'
        for t, label in ticks
    )


def _stack(frame: _Frame, y: _Scale, parts: list[tuple[str, float]]) -> str:
    """Segments bottom-up, each labelled on the right; labels are pushed apart so none overlap."""
    bar_x, bar_w, label_x = frame.left + 16, 86, frame.left + 130
    base, svg, wanted = 0.0, [], []
    for name, value in parts:
        lo, hi = y(base), y(base + value)
        colour = BREAKDOWN_COLOURS.get(name, OTHER_COLOUR)
        svg.append(f'<rect class="segment" data-part="{_e(name)}" x="{bar_x}" y="{hi}" width="{bar_w}" '
                   f'height="{max(lo - hi, 0.5):.1f}" fill="{colour}">'
                   f'<title>{_e(name)}: {_e(size(value))}</title></rect>')
        wanted.append(((lo + hi) / 2, name, value, colour))
        base += value
    placed = _spread([w[0] for w in wanted], gap=30, low=frame.height - frame.bottom - 8)
    for label_y, (seg_y, name, value, colour) in zip(placed, wanted):
        svg.append(f'<path class="leader" d="M{bar_x + bar_w + 3} {seg_y:.1f}L{label_x - 6} {label_y:.1f}" '
                   f'stroke="{colour}"/>'
                   f'<text class="seg-label" x="{label_x}" y="{label_y - 2:.1f}">{_e(name)}</text>'
                   f'<text class="seg-value" x="{label_x}" y="{label_y + 13:.1f}">{_e(size(value))}</text>')
    return "".join(svg)


def _spread(ys: list[float], gap: float, low: float) -> list[float]:
    """Move label positions (listed bottom-up, y grows downwards) at least `gap` apart."""
    placed, limit = [], low
    for wanted in ys:
        placed.append(min(wanted, limit))
        limit = placed[-1] - gap
    return placed


def _hline(frame: _Frame, py: float, cls: str, label: str) -> str:
    return (f'<g class="limit {cls}"><line x1="{frame.left}" x2="{frame.width - frame.right}" y1="{py}" '
            f'y2="{py}"/><text x="{frame.width - frame.right}" y="{py - 6}" text-anchor="end">{_e(label)}'
            f'</text></g>')


# ---- the trial table ----------------------------------------------------------------------------

@dataclass
class _Column:
    label: str
    numeric: bool
    cell: Callable[[dict], tuple[str, str]]  # row -> (cell HTML, sort key)


def _columns(rows: list[dict]) -> list[_Column]:
    knobs = sorted({k for r in rows for k in (r.get("config") or {})}, key=lambda k: (_knob_rank(k), k))
    return [
        _Column("#", True, lambda r: _num(r.get("number"), str)),
        _Column("status", False, _status_cell),
        _Column("samples/s", True, lambda r: _num(r.get("throughput"), _rate)),
        _Column("peak memory", True, lambda r: _num(r.get("peak_memory"), size)),
        *(_Column(k, _numeric_knob(rows, k), _knob_cell(k)) for k in knobs),
        _Column("tokens/s", True, lambda r: _num(_median(r.get("tokens_per_s")), _rate)),
        _Column("TFLOP/s · MFU", True, _flops_cell),
        _Column("step ms", True, _step_cell),
        _Column("compile", True, lambda r: _num((r.get("timing") or {}).get("compile_s"), _seconds)),
        _Column("notes", False, _notes_cell),
    ]


def _num(value, fmt) -> tuple[str, str]:
    return ("", "") if value is None else (_e(fmt(value)), _e(value))


def _median(value: dict | float | None) -> float | None:
    # Records keep rates as {median, p10, p90}; a bare number is taken as the median.
    return value.get("median") if isinstance(value, dict) else value


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value else ""  # no compile: nothing to say


def _flops_cell(row: dict) -> tuple[str, str]:
    """Achieved TFLOP/s with MFU beside it; on one device both sort the same way."""
    flops = row.get("flops") or {}
    if flops.get("tflops") is None:
        return "", ""
    mfu = f' <span class="minor">{flops["mfu"]:.0%}</span>' if flops.get("mfu") is not None else ""
    return f"{_e(_rate(flops['tflops']))}{mfu}", _e(flops["tflops"])


def _step_cell(row: dict) -> tuple[str, str]:
    """Median step time, with its spread (coefficient of variation) beside it in grey."""
    step = (row.get("timing") or {}).get("step_s") or {}
    if step.get("median") is None:
        return "", ""
    spread = f' <span class="minor">±{step["cv"]:.0%}</span>' if step.get("cv") is not None else ""
    return f"{step['median'] * 1000:.1f}{spread}", _e(step["median"])


def _numeric_knob(rows: list[dict], key: str) -> bool:
    values = [(r.get("config") or {}).get(key) for r in rows]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)


def _knob_cell(key: str):
    def cell(row: dict) -> tuple[str, str]:
        value = (row.get("config") or {}).get(key)
        return ("", "") if value is None else (_e(value), _e(value))
    return cell


def _status_cell(row: dict) -> tuple[str, str]:
    status = row.get("status", "")
    return f'<span class="badge st-{_e(status)}">{_e(status)}</span>', _e(status)


def _notes_cell(row: dict) -> tuple[str, str]:
    flags = [flag for flag in ("best", "baseline", "pareto") if row.get(flag)]
    if row.get("tier"):
        flags.append(str(row["tier"]))
    tags = "".join(f'<span class="tag tag-{_e(f)}">{_e(f)}</span>' for f in flags)
    error = row.get("error") or {}
    message = " ".join(str(x) for x in (error.get("type"), error.get("message")) if x)
    text = f'<span class="err" title="{_e(message)}">{_e(_shorten(message, 48))}</span>' if message else ""
    return tags + text, _e(" ".join(flags) + " " + message)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(rows: list[dict]) -> str:
    # A column nobody filled (no FLOPs counted, no compile) is noise: leave it out.
    columns = [c for c in _columns(rows) if any(c.cell(r)[0] for r in rows)]
    head = "".join(f'<th data-type="{"num" if c.numeric else "text"}" class="{"num" if c.numeric else ""}">'
                   f'{_e(c.label)}</th>' for c in columns)
    body = []
    for row in _table_order(rows):
        cells = "".join(_td(c, row) for c in columns)
        marks = " ".join(flag for flag in ("best", "baseline") if row.get(flag))
        body.append(f'<tr class="{marks}" data-trial="{_e(row.get("number"))}">{cells}</tr>')
    return (f'<div class="table-wrap"><table class="trials sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _td(column: _Column, row: dict) -> str:
    text, sort_value = column.cell(row)
    cls = ' class="num"' if column.numeric else ""
    return f'<td{cls} data-v="{sort_value}">{text}</td>'


def _table_order(rows: list[dict]) -> list[dict]:
    """Fastest first; trials without a throughput after them, in the order they ran."""
    return sorted(rows, key=lambda r: (r.get("throughput") is None, -(r.get("throughput") or 0),
                                       r.get("number") or 0))


# ---- environment --------------------------------------------------------------------------------

def _env(study: dict, rows: list[dict]) -> dict:
    """The study's environment stamp, or else the first trial's (every trial records its own)."""
    return study.get("env") or next((r["env"] for r in rows if r.get("env")), {})


def _environment(study: dict, rows: list[dict]) -> str:
    facts = {k: v for k, v in _env(study, rows).items() if v is not None}
    if study.get("created"):
        facts["study created"] = study["created"]
    if not facts:
        return '<p class="empty">No environment was recorded.</p>'
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(_env_value(k, v))}</dd>" for k, v in facts.items())
    return f'<dl class="env">{items}</dl>'


def _env_value(key: str, value: object) -> object:
    # The stamp keeps memory sizes in bytes (device_total, host_memory); people read GiB.
    is_size = isinstance(value, int) and (key.endswith("_total") or key.endswith("memory"))
    return size(value) if is_size else value


# ---- page template ------------------------------------------------------------------------------

_CSS = """
:root { --ink:#1f2430; --muted:#6b7280; --line:#e5e7eb; --bg:#f4f5f7; --card:#fff; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
main { max-width:1360px; margin:0 auto; padding:28px 24px 48px; }
header h1 { font-size:24px; margin:0 0 4px; font-weight:650; }
header .name { color:#3b5bdb; }
header .meta { color:var(--muted); margin-bottom:10px; }
.chips { display:flex; gap:6px; flex-wrap:wrap; }
.chip, .badge, .tag { display:inline-block; border-radius:999px; padding:1px 9px; font-size:12px;
  font-weight:600; background:#eef0f3; color:#374151; }
.st-ok { background:#e3f4e8; color:#1e7b3a; } .st-oom { background:#fde2e2; color:#b42318; }
.st-timeout { background:#fff1d6; color:#a15c07; } .st-crash { background:#f3e3f7; color:#7a2e8e; }
.st-error { background:#fbe4e4; color:#912018; } .st-diverged { background:#ffe9d5; color:#b54708; }
.st-interrupted { background:#eceff3; color:#4b5563; }
.hero { background:linear-gradient(135deg,#1f2a44,#2f4a7a); color:#fff; border-radius:14px;
  padding:18px 22px; margin:18px 0; box-shadow:0 6px 18px rgba(31,42,68,.18); }
.hero.bad { background:#7a1f1f; }
.hero .lead { margin:0 0 14px; font-size:15px; }
.hero .kv { background:rgba(255,255,255,.14); border-radius:6px; padding:1px 7px; margin:0 3px;
  font-size:13px; }
.hero .kv b { font-weight:500; opacity:.75; }
.stats { display:grid; grid-template-columns:repeat(4,1fr); gap:12px; }
.stat { background:rgba(255,255,255,.08); border-radius:10px; padding:10px 14px; }
.stat .label { font-size:12px; text-transform:uppercase; letter-spacing:.05em; opacity:.75; }
.stat .value { font-size:28px; font-weight:700; font-variant-numeric:tabular-nums; }
.stat .detail { font-size:12px; opacity:.8; }
.tiers { display:grid; grid-template-columns:repeat(3,1fr); gap:12px; margin-bottom:18px; }
.tier { background:var(--card); border:1px solid var(--line); border-radius:12px; padding:10px 14px; }
.tier .label { text-transform:uppercase; font-size:12px; letter-spacing:.05em; color:var(--muted); }
.tier .value { font-size:18px; font-weight:650; margin-bottom:4px; }
.tier .kv { font-size:12px; background:#f1f3f5; border-radius:6px; padding:0 6px; margin:2px 3px 0 0;
  display:inline-block; }
.tier .kv b { font-weight:500; color:var(--muted); }
.card { background:var(--card); border:1px solid var(--line); border-radius:14px; padding:16px 18px;
  margin-bottom:18px; min-width:0; }
.card h2 { font-size:15px; margin:0 0 10px; font-weight:650; }
.card h2 .note { font-weight:400; color:var(--muted); font-size:12px; margin-left:10px; }
.two { display:grid; grid-template-columns:3fr 2fr; gap:18px; }
.two .card { margin-bottom:18px; }
svg.plot { width:100%; height:auto; display:block; font-size:12px; }
.grid { stroke:#eef0f3; } .axis { stroke:#9ca3af; }
.tick { fill:#6b7280; font-variant-numeric:tabular-nums; } .axis-title { fill:#374151; font-size:13px; }
.shape { stroke-width:1.5; } .ring { fill:none; stroke-width:1.8; }
.pt { cursor:default; } .pt:hover .shape { stroke:#111; stroke-width:2.5; }
.pt.diverged .shape { stroke-width:2.2; }
.pt.best .shape { stroke:#111; stroke-width:2.2; }
.pareto-front { fill:none; stroke:""" + FRONT_COLOUR + """; stroke-width:2.2; stroke-linejoin:round; }
.front-area { fill:""" + FRONT_COLOUR + """; opacity:.06; }
.oom path { stroke:""" + OOM_COLOUR + """; stroke-width:2.6; stroke-linecap:round; }
.limit line { stroke:#9b1c1c; stroke-width:1.4; } .limit text { fill:#9b1c1c; font-size:12px; }
.limit.usable line { stroke:#d97706; stroke-dasharray:6 4; } .limit.usable text { fill:#b45309; }
.offscale { fill:#9b1c1c; font-size:12px; }
.callout { font-weight:700; font-size:13px; fill:#111; paint-order:stroke; stroke:#fff; stroke-width:4px; }
.arrow { stroke:#555; stroke-width:1.4; stroke-dasharray:4 3; }
.arrow-label { font-weight:700; fill:#555; paint-order:stroke; stroke:#fff; stroke-width:4px; }
.series-line { fill:none; stroke:var(--c); stroke-width:2.4; }
.series .dot circle { fill:var(--c); stroke:#fff; stroke-width:1.2; }
.oom-batch path { stroke:var(--c); stroke-width:2; stroke-linecap:round; }
.segment { stroke:#fff; stroke-width:1; }
.leader { fill:none; stroke-width:1.2; }
.seg-label { font-weight:600; fill:#374151; } .seg-value { fill:#6b7280; font-variant-numeric:tabular-nums; }
.legend { display:flex; flex-wrap:wrap; gap:6px 16px; margin-top:8px; color:#4b5563; font-size:12.5px; }
.legend .item { display:inline-flex; align-items:center; gap:5px; }
.empty { color:var(--muted); font-style:italic; }
.table-wrap { overflow-x:auto; }
table.trials { border-collapse:collapse; width:100%; font-size:12.5px; white-space:nowrap; }
.trials th { text-align:left; font-weight:600; color:#4b5563; border-bottom:2px solid var(--line);
  padding:6px 6px; cursor:pointer; user-select:none; position:sticky; top:0; background:#fff;
  white-space:normal; vertical-align:bottom; }
.trials th:hover { color:#111; }
.trials th[data-dir=asc]::after { content:" ▲"; font-size:10px; }
.trials th[data-dir=desc]::after { content:" ▼"; font-size:10px; }
.trials td { padding:5px 6px; border-bottom:1px solid #f0f1f3; }
.trials .minor { color:#9ca3af; font-size:11px; }
.trials td:last-child { white-space:normal; min-width:180px; max-width:260px; }
.trials .num { text-align:right; font-variant-numeric:tabular-nums; }
.trials tbody tr:hover { background:#f8fafc; }
.trials tr.best { background:#eef6ff; } .trials tr.baseline { background:#fafaf0; }
.tag { margin-right:4px; background:#eef2ff; color:#3730a3; }
.tag-best { background:#1f2a44; color:#fff; } .tag-baseline { background:#fef3c7; color:#92400e; }
.err { color:#912018; }
dl.env { display:grid; grid-template-columns:max-content 1fr; gap:4px 18px; margin:0; font-size:13px; }
dl.env dt { color:var(--muted); }
dl.env dd { margin:0; font-family:ui-monospace,SFMono-Regular,Menlo,monospace; }
@media (max-width:800px) { .stats,.tiers,.two { grid-template-columns:1fr; } }
"""

# Sort the table on a header click; numeric columns compare numbers and keep blanks last.
_JS = """
document.querySelectorAll("table.sortable th").forEach((th, col) => th.addEventListener("click", () => {
  const table = th.closest("table"), body = table.tBodies[0];
  const asc = th.dataset.dir !== "asc";
  table.querySelectorAll("th").forEach(h => delete h.dataset.dir);
  th.dataset.dir = asc ? "asc" : "desc";
  const numeric = th.dataset.type === "num", sign = asc ? 1 : -1;
  const key = tr => tr.children[col].dataset.v;
  const rows = Array.from(body.rows).sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === "" || y === "") return (x === "") - (y === "");
    return sign * (numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y));
  });
  rows.forEach(tr => body.appendChild(tr));
}));
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style></head>
<body><main>
{body}
</main>
<script>{js}</script>
</body></html>
"""
