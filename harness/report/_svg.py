"""The report's plots, drawn here in Python as inline SVG, so the page needs no plotting library and
no network.

    frontier_plot   throughput against peak memory: a marker per measured trial, the Pareto front as
                    a staircase, the budget and the budget less headroom, OOMs as crosses
    batch_plot      throughput against micro-batch size, colour = precision, a line per family of
                    trials that differ only in batch size
    breakdown_plot  where the best config's memory goes, as one stacked bar

Each returns an HTML fragment (the <svg> and its legend, or a note when there is nothing to draw)
whose classes the page's CSS styles. Every string that came from the user goes through `esc`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.pareto import Choice, Standing
from harness.report._format import esc, ordered, rate
from harness.report._terminal import peak_unit
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
# A budget more than this many times the largest measurement (a 24 GiB plan measured on a small
# CPU model) would squeeze every point against the axis: it is named off the scale instead.
OFF_SCALE = 4


# ---- axis numbers -------------------------------------------------------------------------------

def _tick_label(value: float) -> str:
    """A tick as people write it: 12.5 stays 12.5 (a 2.5 step), 12,500 is 12.5k, 10,000 is 10k."""
    if value >= 10_000:
        return f"{value / 1000:,g}k"
    return f"{value:,.0f}" if value == int(value) else f"{value:g}"


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
                     f'<text class="tick" x="{x0 - 8}" y="{py + 4}" text-anchor="end">{esc(label)}</text>')
    for value, label in xticks:
        px = x(value)
        parts.append(f'<line class="grid" x1="{px}" x2="{px}" y1="{y1}" y2="{y0}"/>'
                     f'<text class="tick" x="{px}" y="{y0 + 18}" text-anchor="middle">{esc(label)}</text>')
    parts.append(f'<line class="axis" x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}"/>'
                 f'<line class="axis" x1="{x0}" x2="{x0}" y1="{y1}" y2="{y0}"/>')
    parts.append(f'<text class="axis-title" x="{(x0 + x1) / 2}" y="{frame.height - 10}" '
                 f'text-anchor="middle">{esc(xlabel)}</text>')
    parts.append(f'<text class="axis-title" transform="translate(16 {(y0 + y1) / 2}) rotate(-90)" '
                 f'text-anchor="middle">{esc(ylabel)}</text>')
    return "".join(parts)


def _svg(frame: _Frame, cls: str, body: str, label: str) -> str:
    return (f'<svg class="plot {cls}" viewBox="0 0 {frame.width} {frame.height}" role="img" '
            f'aria-label="{esc(label)}">{body}</svg>')


def _precision(row: dict) -> str:
    return str(row.config.get("precision", "default"))


def _colour(row: dict) -> str:
    return PRECISION_COLOURS.get(_precision(row), OTHER_COLOUR)


def _compiled(row: dict) -> bool:
    return str(row.config.get("compile", "off")) not in ("off", "False", "None")


def _checkpointing(row: dict) -> str:
    return str(row.config.get("checkpointing", "none"))


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


def _tooltip(row: Standing, unit: str) -> str:
    """What hovering a mark says: the trial, its figure in the objective's unit (`unit`) and its peak; an
    OOM has neither, only the size it failed at where the record has one."""
    config = ", ".join(f"{k}={v}" for k, v in ordered(row.config))
    runs = f" (median of {row.runs} runs)" if row.runs > 1 else ""
    if row.record.status == "oom":
        what = f"out of memory at {size(row.peak)}" if row.peak else \
            "out of memory (no size recorded)"
    else:
        what = f"{rate(row.speed)} {unit}{runs}, peak {size(row.peak)}"
    return f"<title>#{esc(row.number)} {esc(row.status)}: {esc(what)}\n{esc(config)}</title>"


# ---- plot 1: throughput vs peak memory ----------------------------------------------------------

def frontier_plot(choice: Choice) -> str:
    """Every point at the figure the choice ranks it on (a confirmed config at its median), so the
    staircase through the front passes through its points and no ranked point lies above it."""
    rows = list(choice.rows)
    points = [r for r in rows if r.record.status in MEASURED and _has_xy(r)]
    ooms = [r for r in rows if r.record.status == "oom"]
    budget, label = choice.capacity, choice.capacity_label
    if not points and not ooms:
        return '<p class="empty">No trial measured both throughput and memory yet.</p>'
    frame = _Frame(960, 440)
    unit_name, unit = peak_unit(rows)  # the table's unit, so one page reads one unit
    x_hi, x_ticks = _nice_axis(_memory_extent(points, ooms, budget) * 1.04 / unit, 8)
    y_hi, y_ticks = _nice_axis(max([r.speed for r in points] + [0]) * 1.12)
    x, y = frame.x(0, x_hi * unit), frame.y(0, y_hi)  # x in bytes
    marks = [_mark_box(x, y, r) for r in points]
    labels, taken = _labels(frame, x, y, choice, marks)
    crosses, counts = _oom_spots(frame, x, ooms, budget)
    taken += marks
    taken += [(x0 - 3, y0 - 3, x1 + 3, y1 + 3) for x0, y0, x1, y1 in _staircase(frame, x, y, list(choice.front))]
    taken += [(cx - 8, cy - 8, cx + 8, cy + 8) for _, cx, cy in crosses] + [_count_box(*c) for c in counts]
    body = [
        _axes(frame, x, y, [(t * unit, _tick_label(t)) for t in x_ticks], [(t, _tick_label(t)) for t in y_ticks],
              f"peak memory ({unit_name})", f"throughput ({choice.unit})"),
        _budget_lines(frame, x, budget, label, choice.headroom or 0, taken),
        _front(frame, x, y, list(choice.front)),
        *(_point(r, x, y, choice.unit) for r in _on_top_last(points)),
        _oom_marks(crosses, choice.unit),
        _oom_counts(counts),
        labels,
    ]
    plot = _svg(frame, "frontier", "".join(body), "throughput against peak memory per trial")
    return plot + _frontier_legend(points, ooms)


def _on_top_last(rows: list[Standing]) -> list[Standing]:
    """SVG paints in order: the best, then the baseline, last, so no other trial's ring hides them."""
    return sorted(rows, key=lambda r: (r.record.baseline, r.best))


def _has_xy(row: Standing) -> bool:
    return row.speed is not None and row.peak is not None


def _on_scale(budget: int | None, measured: float) -> bool:
    """Whether the budget belongs on a memory axis that must show `measured` bytes legibly."""
    return bool(budget) and (not measured or budget <= OFF_SCALE * measured)


def _offscale_note(frame: _Frame, text: str) -> str:
    return (f'<text class="offscale" x="{frame.width - frame.right}" y="{frame.top - 7}" '
            f'text-anchor="end">{esc(text)}</text>')


def _memory_extent(points: list[dict], ooms: list[dict], budget: int | None) -> float:
    """The memory axis covers the points and the budget when it is on scale; an OOM that asked
    for far more is drawn at the right edge rather than squeezing everything else to the left."""
    measured = max((r.peak for r in points), default=0)
    reference = max(measured, budget if _on_scale(budget, measured) else 0)
    attempts = [r.peak for r in ooms if r.peak]
    if not reference:
        return max(attempts, default=GiB)
    return max([reference] + [min(a, 1.5 * reference) for a in attempts])


def _budget_lines(frame: _Frame, x: _Scale, budget: int | None, label: str, headroom: float,
                  taken: list[tuple] = ()) -> str:
    """The budget and the budget less headroom, labelled along the lines where no point or callout is
    (`taken`: their boxes): beside the line at the top, else on its other side, else from the floor up;
    a line beyond the axis is named above the plot instead."""
    if not budget:
        return ""
    lines = [(budget, "budget", f"{label} {size(budget)}")]
    if headroom > 0:
        usable = budget * (1 - headroom)
        lines.append((usable, "usable", f"{headroom:.0%} headroom: {size(usable)}"))
    top, bottom, taken, svg = frame.top, frame.height - frame.bottom, list(taken), []
    for value, cls, text in lines:
        if value > x.hi:
            continue
        px, length = x(value), LIMIT_CHAR_PX * len(text)
        tx, ty, anchor, box = _limit_label_spot(px, length, top, bottom, taken)
        taken.append(box)
        svg.append(f'<g class="limit {cls}"><line x1="{px}" x2="{px}" y1="{top}" y2="{bottom}"/>'
                   f'<text transform="translate({tx} {ty}) rotate(-90)" text-anchor="{anchor}">{esc(text)}</text></g>')
    beyond = [text for value, _, text in lines if value > x.hi]
    if beyond:
        svg.append(_offscale_note(frame, " · ".join(reversed(beyond)) + ": off the scale →"))
    return "".join(svg)


def _limit_label_spot(px: float, length: float, top: float, bottom: float, taken: list[tuple]) -> tuple:
    """Where a limit line's label (written down the line, `length` long) goes: beside the line, left
    then right, as high as it is clear of every box in `taken` (from the top, just below something in
    the way, or up from the floor); the top left where nowhere is. The x of the rotated text's
    baseline, its y, its anchor and its box."""
    sides = [(px - 5, px - 17, px - 2), (px + 15, px + 3, px + 18)]
    floor = bottom - 4 - length
    spots = []
    for order, (tx, x0, x1) in enumerate(sides):
        below = [t[3] + 4 for t in taken if x0 < t[2] and t[0] < x1 and top < t[3] < floor]
        spots += [(y0, order, tx, x0, x1) for y0 in [top + 4, *below, floor] if top + 4 <= y0 <= floor]
    for y0, _, tx, x0, x1 in sorted(spots):
        box = (x0, y0, x1, y0 + length)
        if not any(_overlap(box, t) for t in taken):
            return (tx, bottom - 4, "start", box) if y0 == floor else (tx, y0, "end", box)
    return px - 5, top + 4, "end", (px - 17, top + 4, px - 2, top + 4 + length)


LIMIT_CHAR_PX = 6.8
"""Width of a character of a limit line's 12 px label, a little over the font's average: room to spare."""
CALLOUT_CHAR_PX = 8.0
"""The same for a callout's and the speedup arrow's 13 px bold labels."""


def _overlap(a: tuple, b: tuple) -> bool:
    """Two boxes (x0, y0, x1, y1) share area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _text_box(x: float, y: float, text: str, anchor: str = "start") -> tuple:
    """The box a callout-sized label takes, its baseline at y."""
    width = CALLOUT_CHAR_PX * len(text)
    x0 = x - width if anchor == "end" else x
    return x0, y - 13, x0 + width, y + 4


def _front(frame: _Frame, x: _Scale, y: _Scale, front: list[Standing]) -> str:
    """The Pareto front as a staircase: the most throughput reachable within each amount of memory."""
    corners = _corners(frame, x, y, front)
    if not corners:
        return ""
    (x0, y0), bottom = corners[0], frame.height - frame.bottom
    line = f"M{x0} {y0}" + "".join(f"H{cx}" if k % 2 == 0 else f"V{cy}" for k, (cx, cy) in enumerate(corners[1:]))
    area = line + f"V{bottom}H{x0}Z"
    return f'<path class="front-area" d="{area}"/><path class="pareto-front" d="{line}"/>'


def _corners(frame: _Frame, x: _Scale, y: _Scale, front: list[Standing]) -> list[tuple[float, float]]:
    """The staircase's corners, left to right: a step across to each next front point, then up to it,
    and on to the plot's right edge at the best's height."""
    if not front:
        return []
    front = sorted(front, key=lambda r: (r.peak, r.speed))
    corners = [(x(front[0].peak), y(front[0].speed))]
    for row in front[1:]:
        corners += [(x(row.peak), corners[-1][1]), (x(row.peak), y(row.speed))]
    return corners + [(frame.width - frame.right, corners[-1][1])]


def _staircase(frame: _Frame, x: _Scale, y: _Scale, front: list[Standing]) -> list[tuple]:
    """The staircase's segments as boxes (x0, y0, x1, y1)."""
    corners = _corners(frame, x, y, front)
    return [(min(ax, bx), min(ay, by), max(ax, bx), max(ay, by)) for (ax, ay), (bx, by) in zip(corners, corners[1:])]


def _point(row: Standing, x: _Scale, y: _Scale, unit: str) -> str:
    cx, cy = x(row.peak), y(row.speed)
    flags = {"pareto": row.pareto, "best": row.best, "baseline": row.record.baseline, "noisy": row.noisy,
             "unsafe": bool(row.unsafe), "diverged": row.record.status == "diverged"}
    classes = " ".join(["pt"] + [flag for flag, on in flags.items() if on])
    marker = _marker(cx, cy, _colour(row), _compiled(row), _checkpointing(row),
                     hollow=row.record.status == "diverged" or row.noisy or bool(row.unsafe))
    return f'<g class="{classes}" data-trial="{esc(row.number)}">{_tooltip(row, unit)}{marker}</g>'


def _oom_spots(frame: _Frame, x: _Scale, ooms: list[Standing], budget: int | None) -> tuple[list[tuple], list[tuple]]:
    """Where each OOM's cross goes (row, cx, cy): on the floor, at the memory where it failed; and the
    count of a stack pressed together (`_pile`).

    Without a recorded size an OOM sits at the budget (or the right edge without one); crosses that
    would overlap are stacked upwards so each one stays countable.
    """
    groups: dict[int, list[tuple]] = {}
    for row in sorted(ooms, key=lambda r: r.number or 0):
        mem = row.peak or budget
        cx = x(min(mem, x.hi)) if mem else x(x.hi)
        groups.setdefault(round(cx / 14), []).append((row, cx))
    return _pile(frame, list(groups.values()), frame.height - frame.bottom - 10, 16)


def _pile(frame: _Frame, groups: list[list[tuple]], floor: float, step: float) -> tuple[list[tuple], list[tuple]]:
    """Crosses that share a spot ((row, cx) each), stacked up from `floor` `step` apart so each stays
    countable; a stack that would climb past the plot's lowest quarter (above it a cross reads as a
    throughput, and thirty of them left the plot) is pressed into it and labelled with its count.
    Returns (row, cx, cy) per cross and (label, cx, y) per pressed stack."""
    climb = (frame.height - frame.bottom - frame.top) / 4 - (frame.height - frame.bottom - floor)
    spots, counts = [], []
    for group in groups:
        gap = step if (len(group) - 1) * step <= climb else climb / (len(group) - 1)
        spots += [(row, cx, round(floor - gap * k, 1)) for k, (row, cx) in enumerate(group)]
        if gap < step:
            counts.append((f"{len(group)} OOMs", group[-1][1], round(floor - climb - 12, 1)))
    return spots, counts


def _oom_marks(spots: list[tuple], unit: str) -> str:
    """OOMs have no throughput: a red cross each, where `_oom_spots` put it."""
    return "".join(f'<g class="oom" data-trial="{esc(row.number)}">{_tooltip(row, unit)}{_cross(cx, cy)}</g>'
                   for row, cx, cy in spots)


def _oom_counts(counts: list[tuple]) -> str:
    """How many crosses a pressed stack holds, above it."""
    return "".join(f'<text class="oom-count" x="{cx}" y="{y}" text-anchor="middle">{esc(label)}</text>'
                   for label, cx, y in counts)


def _count_box(label: str, cx: float, y: float) -> tuple:
    width = LIMIT_CHAR_PX * len(label)
    return cx - width / 2, y - 12, cx + width / 2, y + 4


def _mark_box(x: _Scale, y: _Scale, row: Standing) -> tuple:
    """The box a point's marker (and its ring) takes."""
    cx, cy = x(row.peak), y(row.speed)
    return cx - 13, cy - 13, cx + 13, cy + 13


def _labels(frame: _Frame, x: _Scale, y: _Scale, choice: Choice, marks: list[tuple]) -> tuple[str, list[tuple]]:
    """Name the best and the baseline points right on the plot, with an arrow from the baseline to the
    leader labelled with the choice's speedup (and "tie" when it is within the noise); each label where it
    covers no other point's mark (`marks`) or label. Returns the SVG and the boxes those labels take, which
    the limit lines' labels keep clear of."""
    best, baseline, leader = choice.best, choice.baseline, choice.leader
    parts, boxes = [], []
    if leader and baseline and choice.versus and _has_xy(baseline) and _has_xy(leader):
        arrow, box = _speedup_arrow(x, y, baseline, leader, choice.versus, marks)
        parts.append(arrow)
        boxes.append(box)
    for row, cls, dy in ((best, "best", -16), (baseline, "baseline", 24)):
        if row is None or not _has_xy(row) or (cls == "baseline" and row is best):
            continue
        text = f"{'best = your config' if cls == 'best' and row is baseline else cls} #{row.number}"
        own = _mark_box(x, y, row)
        tx, ty, anchor, box = _clear_spot(_callout_spots(frame, x(row.peak), y(row.speed), dy, text),
                                          [m for m in marks if m != own] + boxes)
        parts.append(f'<text class="callout {cls}" x="{tx}" y="{ty}" text-anchor="{anchor}">{esc(text)}</text>')
        boxes.append(box)
    return "".join(parts), boxes


def _callout_spots(frame: _Frame, cx: float, cy: float, dy: float, text: str) -> list[tuple]:
    """Where a point's name may go, best first: on its side of the point (left near the right edge),
    above or below as asked, then the other way up, then the other side."""
    side = -1 if cx > frame.width * 0.8 else 1
    spots = []
    for sx in (side, -side):
        for sy in (dy, 24 if dy < 0 else -16):
            anchor = "start" if sx > 0 else "end"
            spots.append((cx + 14 * sx, cy + sy, anchor, _text_box(cx + 14 * sx, cy + sy, text, anchor)))
    return spots


def _clear_spot(spots: list[tuple], taken: list[tuple]) -> tuple:
    """The first spot whose box overlaps nothing in `taken`; the first where none is clear."""
    return next((s for s in spots if not any(_overlap(s[3], t) for t in taken)), spots[0])


def _speedup_arrow(x: _Scale, y: _Scale, baseline: Standing, best: Standing, versus, marks: list[tuple]) -> tuple:
    x0, y0 = x(baseline.peak), y(baseline.speed)
    x1, y1 = x(best.peak), y(best.speed)
    # Stop short of both markers so the arrow never hides them.
    length = math.hypot(x1 - x0, y1 - y0) or 1
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    pad = min(16, length / 3)
    label = versus.figure() + (" (tie)" if versus.tie else "")
    # Beside the middle of the arrow: on its lower-right side, else its upper-left, else below the start.
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    spots = [(round(mx - uy * 12, 1), round(my + ux * 12 + 4, 1), "start"),
             (round(mx + uy * 12, 1), round(my - ux * 12 + 4, 1), "end"),
             (x0, round(max(y0, y1) + 30, 1), "start")]
    lx, ly, anchor, box = _clear_spot([(sx, sy, an, _text_box(sx, sy, label, an)) for sx, sy, an in spots], marks)
    svg = (f'<line class="arrow" x1="{x0 + ux * pad:.1f}" y1="{y0 + uy * pad:.1f}" '
           f'x2="{x1 - ux * pad:.1f}" y2="{y1 - uy * pad:.1f}" marker-end="url(#arrowhead)"/>'
           f'<text class="arrow-label" x="{lx}" y="{ly}" text-anchor="{anchor}">{esc(label)}</text>'
           '<defs><marker id="arrowhead" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z" fill="#555"/>'
           '</marker></defs>')
    return svg, box


# Legend glyphs for the frontier plot's marks, drawn like the marks themselves.
_MARK_GLYPHS = {
    "eager": '<circle cx="10" cy="10" r="6" fill="#888"/>',
    "compiled": '<path d="M10 3L17 10L10 17L3 10Z" fill="#888"/>',
    "activation checkpointing (dashed: selective)":
        '<circle cx="10" cy="10" r="4" fill="#888"/>'
        '<circle cx="10" cy="10" r="8" fill="none" stroke="#888" stroke-width="1.6"/>',
    "hollow: diverged, noisy or unsafe (not ranked)": '<circle cx="10" cy="10" r="6" fill="#fff" stroke="#888" stroke-width="2"/>',
    "out of memory": f'<path d="M4 4L16 16M4 16L16 4" stroke="{OOM_COLOUR}" stroke-width="2.6"/>',
    "Pareto front": f'<path d="M2 16H8V9H13V4H18" fill="none" stroke="{FRONT_COLOUR}" stroke-width="2.4"/>',
}


def _frontier_legend(points: list[Standing], ooms: list[Standing]) -> str:
    """Colours for the precisions of the points drawn, then only the marks this plot actually uses."""
    items = [(_glyph(f'<circle cx="10" cy="10" r="6" fill="{PRECISION_COLOURS.get(p, OTHER_COLOUR)}"/>'),
              p) for p in _precisions(points)]  # an OOM is red, whatever its precision
    present = [
        any(not _compiled(r) for r in points),
        any(_compiled(r) for r in points),
        any(_checkpointing(r) not in NO_CHECKPOINTING for r in points),
        any(r.record.status == "diverged" or r.noisy or r.unsafe for r in points),
        bool(ooms),
        any(r.pareto for r in points),
    ]
    items += [(_glyph(glyph), label) for (label, glyph), shown in zip(_MARK_GLYPHS.items(), present) if shown]
    return _legend(items)


def _glyph(inner: str) -> str:
    return f'<svg class="glyph" viewBox="0 0 20 20" width="18" height="18">{inner}</svg>'


def _legend(items: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(
        f'<span class="item">{glyph}{esc(label)}</span>' for glyph, label in items) + "</div>"


def _precisions(rows: list[Standing]) -> list[str]:
    """The precisions present, in the palette's order, then any others alphabetically."""
    seen = {_precision(r) for r in rows}
    known = [p for p in PRECISION_COLOURS if p in seen]
    return known + sorted(seen - set(known))


# ---- plot 2: throughput vs batch size -----------------------------------------------------------

def batch_plot(choice: Choice) -> str:
    rows = list(choice.rows)
    measured = [r for r in rows if r.record.status == "ok" and r.speed is not None and _batch(r)]
    if not measured:
        return '<p class="empty">No successful trial with a batch size to plot.</p>'
    ooms = [r for r in rows if r.record.status == "oom" and _batch(r)]
    batches = [_batch(r) for r in measured + ooms]
    frame = _Frame(600, 360)
    x = frame.x(min(batches) / 1.4, max(batches) * 1.4, log2=True)
    y_hi, y_ticks = _nice_axis(max(r.speed for r in measured) * 1.1)
    y = frame.y(0, y_hi)
    powers = [2**k for k in range(math.ceil(math.log2(x.lo)), math.floor(math.log2(x.hi)) + 1)]
    body = [_axes(frame, x, y, [(p, f"{p:g}") for p in powers], [(t, _tick_label(t)) for t in y_ticks],
                  "micro-batch size (log2)", f"throughput ({choice.unit})")]
    precisions = _precisions(measured + ooms)
    # a line joins ranked trials only: a noisy run's figure is no point on its family's curve
    body += [_family_line(x, y, family) for family in _families([r for r in measured if _ranked(r)])]
    body += [_batch_dot(x, y, r, choice.unit) for r in _on_top_last(measured)]
    body.append(_batch_ooms(frame, x, ooms, precisions, choice.unit))
    items = [(_glyph(f'<circle cx="10" cy="10" r="5" fill="{PRECISION_COLOURS.get(p, OTHER_COLOUR)}"/>'),
              p) for p in precisions]
    if any(r.record.baseline for r in measured):
        items.append((_glyph('<circle cx="10" cy="10" r="5" fill="#888" stroke="#111" stroke-width="2.5"/>'),
                      "baseline (dark outline)"))
    if not all(_ranked(r) for r in measured):
        items.append((_glyph('<circle cx="10" cy="10" r="5" fill="#fff" stroke="#888" stroke-width="2"/>'),
                      "hollow: noisy or unsafe (not ranked)"))
    if ooms:
        items.append((_glyph('<path d="M5 5L15 15M5 15L15 5" stroke="#777" stroke-width="2"/>'),
                      "OOM at that batch size"))
    legend = _legend(items)
    return _svg(frame, "batch", "".join(body), "throughput against batch size per precision") + legend


def _batch(row: Standing) -> float | None:
    value = row.config.get("batch_size")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _family(row: Standing) -> tuple:
    """Every knob but the batch size: trials of one family differ only in batch size."""
    return tuple(sorted((k, str(v)) for k, v in row.config.items() if k != "batch_size"))


def _families(measured: list[dict]) -> list[list[dict]]:
    """Trials grouped by family; only a family measured at two or more batch sizes makes a line."""
    groups: dict[tuple, list[dict]] = {}
    for row in measured:
        groups.setdefault(_family(row), []).append(row)
    return [rows for rows in groups.values() if len({_batch(r) for r in rows}) >= 2]


def _family_line(x: _Scale, y: _Scale, family: list[dict]) -> str:
    """A line through one family's trials by batch size (the fastest where a batch size repeats)."""
    fastest: dict[float, float] = {}
    for row in family:
        fastest[_batch(row)] = max(fastest.get(_batch(row), 0.0), row.speed)
    line = "L".join(f"{x(b)} {y(t)}" for b, t in sorted(fastest.items()))
    others = ", ".join(f"{k}={v}" for k, v in _family(family[0]))
    return (f'<g class="series" data-family="{esc(others)}" style="--c:{_colour(family[0])}">'
            f'<title>{esc(others)}</title><path class="series-line" d="M{line}"/></g>')


def _ranked(row: Standing) -> bool:
    """A trial the choice ranks: not noisy (its windows disagree) and not unsafe (a worse loss)."""
    return not row.noisy and not row.unsafe


def _batch_dot(x: _Scale, y: _Scale, row: Standing, unit: str) -> str:
    mark = " baseline" if row.record.baseline else ""
    hollow = "" if _ranked(row) else " hollow"
    return (f'<g class="series{mark}" style="--c:{_colour(row)}"><g class="dot{hollow}" data-trial="{esc(row.number)}">'
            f'{_tooltip(row, unit)}<circle cx="{x(_batch(row))}" cy="{y(row.speed)}" r="4.5"/></g></g>')


def _batch_ooms(frame: _Frame, x: _Scale, ooms: list[dict], precisions: list[str], unit: str) -> str:
    """OOMs as crosses in their precision's colour on the floor, stacked where they share a batch size."""
    groups: dict[float, list[tuple]] = {}
    for row in sorted(ooms, key=lambda r: (_batch(r), precisions.index(_precision(r)))):
        groups.setdefault(_batch(row), []).append((row, x(_batch(row))))
    spots, counts = _pile(frame, list(groups.values()), frame.height - frame.bottom - 9, 11)
    return "".join(f'<g class="oom-batch" style="--c:{_colour(row)}">{_tooltip(row, unit)}{_cross(cx, cy, 4.5)}</g>'
                   for row, cx, cy in spots) + _oom_counts(counts)


# ---- the best config's memory, stacked ----------------------------------------------------------

def breakdown_plot(best: Standing | None, budget: int | None, label: str = "budget") -> str:
    breakdown = (best.record.memory.get("breakdown") if best else None) or {}
    parts = [(k, v) for k, v in _breakdown_order(breakdown) if v]
    if not parts:
        return ('<p class="empty">No config is best: no memory to break down.</p>' if best is None
                else '<p class="empty">The best trial has no memory breakdown.</p>')
    peak = best.peak or 0
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
        body.append(_hline(frame, y(budget), "budget", f"{label} {size(budget)}"))
    elif budget:
        body.append(_offscale_note(frame, f"{label} {size(budget)}: off the scale ↑"))
    return _svg(frame, "breakdown", "".join(body), "memory breakdown of the best trial")


def _breakdown_order(breakdown: dict) -> list[tuple[str, float]]:
    known = [(k, breakdown[k]) for k in BREAKDOWN_COLOURS if k in breakdown]
    return known + sorted((k, v) for k, v in breakdown.items() if k not in BREAKDOWN_COLOURS)


def _breakdown_axis(frame: _Frame, y: _Scale, ticks: list[tuple[float, str]]) -> str:
    x0 = frame.left
    return "".join(
        f'<line class="grid" x1="{x0}" x2="{frame.width - frame.right}" y1="{y(t)}" y2="{y(t)}"/>'
        f'<text class="tick" x="{x0 - 8}" y="{y(t) + 4}" text-anchor="end">{esc(label)}</text>'
        for t, label in ticks
    )


def _stack(frame: _Frame, y: _Scale, parts: list[tuple[str, float]]) -> str:
    """Segments bottom-up, each labelled on the right; labels are pushed apart so none overlap."""
    bar_x, bar_w, label_x = frame.left + 16, 86, frame.left + 130
    base, svg, wanted = 0.0, [], []
    for name, value in parts:
        lo, hi = y(base), y(base + value)
        colour = BREAKDOWN_COLOURS.get(name, OTHER_COLOUR)
        svg.append(f'<rect class="segment" data-part="{esc(name)}" x="{bar_x}" y="{hi}" width="{bar_w}" '
                   f'height="{max(lo - hi, 0.5):.1f}" fill="{colour}">'
                   f'<title>{esc(name)}: {esc(size(value))}</title></rect>')
        wanted.append(((lo + hi) / 2, name, value, colour))
        base += value
    placed = _spread([w[0] for w in wanted], gap=30, low=frame.height - frame.bottom - 8)
    for label_y, (seg_y, name, value, colour) in zip(placed, wanted):
        svg.append(f'<path class="leader" d="M{bar_x + bar_w + 3} {seg_y:.1f}L{label_x - 6} {label_y:.1f}" '
                   f'stroke="{colour}"/>'
                   f'<text class="seg-label" x="{label_x}" y="{label_y - 2:.1f}">{esc(name)}</text>'
                   f'<text class="seg-value" x="{label_x}" y="{label_y + 13:.1f}">{esc(size(value))}</text>')
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
            f'y2="{py}"/><text x="{frame.width - frame.right}" y="{py - 6}" text-anchor="end">{esc(label)}'
            f'</text></g>')
