"""The HTML report: one self-contained page a person can open anywhere, offline.

Everything is inline (CSS, SVG drawn in Python by `_svg`, a few lines of JS for sorting
the table), so the file can be mailed, attached to a ticket or opened years later without a network.
Every string that came from the user (config values, names, environment, error messages) goes
through `esc`.

Input is the choice (harness.pareto.Choice) every view shows, and the study's attributes (name,
env, created, workload, and optionally `warning`: what to know before acting on the page, a smoke
run or an apply target that describes another model size than was measured). This module decides
nothing, it only draws: every figure on the page is the choice's, so it equals the terminal's.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from harness import record
from harness.knobs import rank
from harness.pareto import Choice, Standing, unsearched_words
from harness.report import _terminal, _time
from harness.report._format import esc, ordered, rate
from harness.report._svg import FRONT_COLOUR, OOM_COLOUR, batch_plot, breakdown_plot, frontier_plot
from harness.spec import workload_label
from harness.units import fixed, size



def render_html(choice: Choice, study: dict) -> str:
    """The whole report page for the choice made over one study's trials."""
    unit = choice.unit
    sections = [
        _header(choice, study),
        _story(choice),
        _tiers(choice),
        _card(f"Throughput vs peak memory ({unit})", _plot(frontier_plot(choice)),
              note="up and left is better; the staircase is the most throughput measured within each memory, "
                   "each config at its confirmed median"),
        '<div class="two">'
        + _card("Throughput vs batch size", _plot(batch_plot(choice)),
                note="a line joins trials that differ only in batch size")
        + _card("Where the best config's memory goes",
                _plot(breakdown_plot(choice.best, choice.capacity, choice.capacity_label)),
                note=_breakdown_source(choice.best))
        + "</div>",
        _card(f"All trials ({len(choice.rows)})", _table(choice), note="click a column header to sort"),
        _predicted(choice),
        _card("Where the sweep's time went", _time.html([s.record for s in choice.rows]),
              note="every trial's wall time by phase, summed (harness/report/_time.py says what each phase holds)"),
        _card("Environment", _environment(study, choice)),
    ]
    title = f"bench report: {study.get('name', 'study')}"
    return _PAGE.format(title=esc(title), css=_CSS, body="\n".join(sections), js=_JS)


def _breakdown_source(best: Standing | None) -> str:
    reused = ((best.record.reused if best else None) or {}).get("breakdown")
    return f"tensors measured in trial {reused['trial']} (same build and shape), not again in this one" if reused else ""


# ---- page sections ------------------------------------------------------------------------------

def _header(choice: Choice, study: dict) -> str:
    counts = Counter(s.status for s in choice.rows)
    chips = "".join(
        f'<span class="chip st-{esc(status)}">{esc(status)} {esc(n)}</span>'
        for status, n in counts.items() if n
    )
    workload = study.get("workload")
    name = workload.get("name") if isinstance(workload, dict) else workload
    # a study whose every trial failed has no trial's stamp: the study's header names the device it swept on
    device = _env(study, choice).get("device") or study.get("device")
    meta = " · ".join(esc(x) for x in (name, device, study.get("created")) if x)
    warning = study.get("warning")
    warning = f'<p class="size-warning">⚠ {esc(warning)}</p>' if warning else ""
    return (
        f'<header><h1>bench report <span class="name">{esc(study.get("name", "study"))}</span></h1>'
        f'<div class="meta">{meta}</div><p class="measured">{esc(_measured(choice, device, workload))}</p>{warning}'
        f'<div class="chips">{chips}</div></header>'
    )


def _measured(choice: Choice, device: str | None, swept: object = None) -> str:
    """What the numbers are of: the workload preset (a CPU preset is a smaller stand-in) and the device.
    `swept`: the study's workload, for a study none of whose trials recorded one."""
    workload = next((s.record.workload for s in choice.rows if s.record.workload), None) \
        or (swept if isinstance(swept, dict) else {})
    # the name the sweep's banner gave it: your model's class, not "the workload"
    what = workload_label(workload) if set(workload) & {"name", "factory", "model", "lightning", "hf"} else "the workload"
    preset = f" preset {workload['preset']}" if workload.get("preset") else ""
    return f"measured: {what}{preset} on {device or 'an unrecorded device'}"


def _story(choice: Choice) -> str:
    """The sweep's story in a few sentences: what won against your config and by how much, with the
    spread and whether it is a tie, how many runs confirmed it, busy periods, and what to run next."""
    best = choice.best
    # why best is best (the search's model) and what compiling cost: the terminal's lines, word for word
    said = (_terminal.story(choice) + _terminal.why_lines(choice) + _terminal.compile_lines(choice)
            + _terminal.remeasured_lines(choice))
    if best is None:
        # the story below says why (nothing fits the headroom, every run noisy); none was measured is not a fit
        what = ("No measured configuration qualifies as best" if any(s.measured for s in choice.rows)
                else "No configuration was measured")
        return (f'<section class="hero bad"><p>{what}.</p>'
                f'<ul class="story">{_story_items(said)}</ul></section>')
    lead = ("Your config stays best" if best.record.baseline else "Best") + f": trial #{esc(best.number)}"
    cards = [
        _stat("vs your config", *_speedup(choice)),
        _stat(f"best {choice.unit}", f"{rate(best.speed)} {choice.unit}",
              best.runs_words
              + (f"; your config {rate(choice.baseline.speed)} {choice.unit}"  # not where it is compared with nothing
                 if choice.baseline and choice.baseline.measured and not choice.baseline.noisy else "")),
        _stat("peak memory", size(best.peak), _memory_change(best, choice.baseline)),
        _stat("headroom left", *_headroom(best, choice)),
    ]
    return (
        f'<section class="hero"><p class="lead">{lead} {_config_chips(best.config)}</p>'
        f'<ul class="story">{_story_items(said)}</ul>'
        f'<div class="stats">{"".join(cards)}</div></section>'
    )


def _items(lines: list[str]) -> str:
    return "".join(f"<li>{esc(line)}</li>" for line in lines)


STORY_LINES = 8
"""Story lines shown before the rest fold away: a large study has a line per compile that does not pay
back, and 157 of them put the figures 3,800 px down the page."""


def _story_items(lines: list[str]) -> str:
    if len(lines) <= STORY_LINES + 1:  # one line more is no fold
        return _items(lines)
    rest = lines[STORY_LINES:]
    return (_items(lines[:STORY_LINES]) + f'<li class="more"><details><summary>{len(rest)} more lines</summary>'
            f'<ul class="story">{_items(rest)}</ul></details></li>')


def _stat(label: str, value: str, detail: str) -> str:
    return (
        f'<div class="stat"><div class="label">{esc(label)}</div>'
        f'<div class="value">{esc(value)}</div><div class="detail">{esc(detail)}</div></div>'
    )


def _speedup(choice: Choice) -> tuple[str, str]:
    # best against your config; the leader's where it is best or your config stays (its tie is the news)
    who = choice.best if choice.sure_over_tie else choice.leader
    v = choice.against_baseline(choice.best) if choice.sure_over_tie else choice.versus
    if v is None:
        base = choice.baseline
        if base is None:
            return "-", "no baseline measured"
        if not base.measured:
            return "-", f"your config ended {base.record.status}"
        if base.noisy:
            return "-", f"your config's windows disagree ({base.record.step_cv:.0%} CV): nothing to compare with"
        return "-", "best is your config"
    return v.figure(), (f"{v.verdict()}; " if v.tie else "") + \
        f"trial #{who.number} vs #{choice.baseline.number}, {v.side_by_side_words()}" + ("" if v.tie else f"; {v.verdict()}")


def _memory_change(best: Standing, baseline: Standing | None) -> str:
    if baseline is None or best.peak is None or baseline.peak is None:
        return "no baseline memory"
    delta = best.peak - baseline.peak
    sign = "+" if delta >= 0 else "−"
    return f"{sign}{size(abs(delta))} vs your config ({size(baseline.peak)})"


def _headroom(best: Standing, choice: Choice) -> tuple[str, str]:
    if not choice.capacity or best.peak is None:
        return "-", "no memory budget"
    left = choice.capacity - best.peak
    return size(left), f"{left / choice.capacity:.0%} of the {size(choice.capacity)} {choice.capacity_label}"


def _config_chips(config: dict) -> str:
    return "".join(f'<span class="kv"><b>{esc(k)}</b> {esc(v)}</span>' for k, v in ordered(config))


def _tiers(choice: Choice) -> str:
    groups = [(names, s) for names, s in _terminal.tier_groups(choice) if s]
    if not groups:
        return ""
    cards = "".join(
        f'<div class="tier"><div class="label">{esc(" · ".join(names))} · #{esc(s.number)}</div>'
        f'<div class="value">{esc(rate(s.speed))} {esc(choice.unit)} · {esc(size(s.peak))}</div>'
        f'<div>{_config_chips(s.config)}</div></div>'
        for names, s in groups
    )
    return f'<section class="tiers">{cards}</section>'


def _plot(svg: str) -> str:
    """A plot in a box that scrolls sideways on a narrow window, where it keeps a width its labels can be
    read at (shrunk to a phone's width, a 12 px tick label was drawn 4 px high)."""
    return f'<div class="plot-wrap">{svg}</div>' if svg else svg


def _card(title: str, body: str, note: str = "") -> str:
    note_html = f'<span class="note">{esc(note)}</span>' if note else ""
    return f'<section class="card"><h2>{esc(title)}{note_html}</h2>{body}</section>'


def _predicted(choice: Choice) -> str:
    """The configs never measured that the search's model predicts fastest, apart from the measured table
    and marked as predictions: `bench trial` measures one."""
    predicted = (choice.model or {}).get("predicted") or []
    if not predicted:
        return ""
    rows = "".join(
        f'<tr><td>{_config_chips(p["config"])}</td><td class="num">~{esc(rate(p["speed"]))}</td>'
        f'<td class="num">×{math.exp(p["speed_sd"]):.2f}</td><td class="num">~{esc(size(p["peak_memory"]))}</td>'
        f'<td class="num">{p["fit_chance"]:.0%}</td><td class="num">{p["beat_chance"]:.0%}</td></tr>'
        for p in predicted)
    head = (f"<tr><th>config</th><th class=\"num\">predicted {esc(choice.unit)}</th><th class=\"num\">"
            "likely within, either way</th><th class=\"num\">predicted peak</th><th class=\"num\">chance it fits</th>"
            f"<th class=\"num\">chance it beats {esc(_terminal.beaten(choice))}</th></tr>")
    return _card("Predicted, not measured", f'<div class="table-wrap"><table class="predicted"><thead>{head}'
                 f"</thead><tbody>{rows}</tbody></table></div>",
                 note="the search's model, fit from the trials above; run one with `bench trial`")


# ---- the trial table ----------------------------------------------------------------------------

@dataclass
class _Column:
    label: str
    numeric: bool
    cell: Callable[[Standing], tuple[str, str]]  # row -> (cell HTML, sort key)


def _columns(choice: Choice) -> list[_Column]:
    """Measured columns carry their unit in the title; knob columns are the knobs' own names. The
    objective's column is the choice's figure (the confirmed median); the other rates and the step time are
    the trial's own run, and say so."""
    rows = choice.rows
    knobs = sorted({k for r in rows for k in r.config}, key=lambda k: (rank(k), k))
    chosen = _Column(choice.unit, True, _speed_cell)
    # Record.rate: none for an OOM (a CPU trial over its budget keeps the rates it measured), as in the terminal
    other = (_Column("tokens/s (this run)", True, lambda r: _num(r.record.rate("tokens"), rate))
             if choice.objective == "samples" else
             _Column("samples/s (this run)", True, lambda r: _num(r.record.rate("samples"), rate)))
    return [
        _Column("#", True, lambda r: _num(r.number, str)),
        _Column("status", False, _status_cell),
        chosen, other,
        _peak_column(rows),
        *(_Column(_knob_title(k), _numeric_knob(rows, k), _knob_cell(k)) for k in knobs),
        _Column("TFLOP/s (this run)", True, _flops_cell),
        _Column("MFU (this run)", True, _mfu_cell),  # only where the device has a known peak: dropped when all blank
        _Column("step time (ms, this run)", True, _step_cell),
        _Column("compile time (s)", True, lambda r: _num(r.record.timing.get("compile_s"), _seconds)),
        _Column("notes", False, _notes_cell),
    ]


MEASURED_TITLES = {"#", "status", "samples/s", "tokens/s", "tokens/s (this run)", "samples/s (this run)",
                   "peak memory (GiB)", "peak memory (MiB)", "TFLOP/s (this run)", "MFU (this run)",
                   "step time (ms, this run)", "compile time (s)", "notes"}


def _knob_title(knob: str) -> str:
    """A knob's name, unless a measured column already has that title (a factory param may be called anything)."""
    return f"{knob} (knob)" if knob in MEASURED_TITLES else knob


def _peak_column(rows) -> _Column:
    """The terminal's peaks (`_terminal.shown_peak`: none for an OOM, a timeout or a crash) in its unit: MiB
    where every one is under a GiB (85 and 95 MiB both read 0.09 GiB), else GiB."""
    shown = _terminal.shown_peak
    if _terminal.peak_unit(rows)[0] == "MiB":
        return _Column("peak memory (MiB)", True, lambda r: _num(shown(r), lambda v: f"{v / 1024**2:,.1f}"))
    return _Column("peak memory (GiB)", True, lambda r: _num(shown(r), lambda v: fixed(v / 1024**3, 2)))


def _num(value, fmt) -> tuple[str, str]:
    return ("", "") if value is None else (esc(fmt(value)), esc(value))


def _speed_cell(row: Standing) -> tuple[str, str]:
    """The choice's figure, with the number of runs it is the median of and their spread beside it in grey
    (the table's `runs` and `± cv`: the page showed only the step time's spread of the trial's own run, so
    three runs 45% apart read as ±5%)."""
    if row.speed is None:
        return "", ""
    runs = f' <span class="minor">×{row.runs}</span>' if row.runs > 1 else ""
    spread = f' <span class="minor">±{row.cv:.0%}</span>' if row.runs > 2 and row.cv is not None else ""  # pareto.spread
    return f"{esc(rate(row.speed))}{runs}{spread}", esc(row.speed)


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value else ""  # no compile: nothing to say


def _flops_cell(row: Standing) -> tuple[str, str]:
    return _num(row.record.flops.get("tflops"), rate)


def _mfu_cell(row: Standing) -> tuple[str, str]:
    mfu = row.record.flops.get("mfu")
    return ("", "") if mfu is None else (f"{mfu:.0%}", esc(mfu))


def _step_cell(row: Standing) -> tuple[str, str]:
    """Median step time, with its spread (coefficient of variation) beside it in grey: the typed record's,
    so a trial cut after one warm-up step (one timing, no spread) shows none, as the table's `-` says."""
    step = row.record.timing.get("step_s") or {}
    if step.get("median") is None:
        return "", ""
    cv = row.record.step_cv
    spread = f' <span class="minor">±{cv:.0%}</span>' if cv is not None else ""
    return f"{step['median'] * 1000:.1f}{spread}", esc(step["median"])


def _numeric_knob(rows, key: str) -> bool:
    values = [r.config.get(key) for r in rows]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)


def _knob_cell(key: str):
    def cell(row: Standing) -> tuple[str, str]:
        value = row.config.get(key)
        return ("", "") if value is None else (esc(value), esc(value))
    return cell


def _status_cell(row: Standing) -> tuple[str, str]:
    return f'<span class="badge st-{esc(row.status)}">{esc(row.status)}</span>', esc(row.status)


def _flags(row: Standing) -> list[str]:
    flags = {"best": row.best, "baseline": row.record.baseline, "pareto": row.pareto, "unsafe": bool(row.unsafe),
             "unsearched": bool(row.record.unsearched)}
    return [flag for flag, on in flags.items() if on] + ([row.tier] if row.tier else [])


def _notes_cell(row: Standing) -> tuple[str, str]:
    flags = _flags(row)
    tags = "".join(f'<span class="tag tag-{esc(f)}">{esc(f)}</span>' for f in flags)
    error = row.record.error or {}
    unsearched = unsearched_words(row) if row.record.unsearched else None
    skipped = _terminal.skipped_words(row.record) if row.record.status == record.SKIPPED else None
    message = " ".join(str(x) for x in (error.get("type"), record.error_words(error), row.unsafe, unsearched, skipped)
                       if x)
    text = f'<span class="err" title="{esc(message)}">{esc(_shorten(message, 48))}</span>' if message else ""
    return tags + text, esc(" ".join(flags) + " " + message)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(choice: Choice) -> str:
    # A column nobody filled (no FLOPs counted, no MFU without a known peak, no compile) is noise.
    columns = [c for c in _columns(choice) if any(c.cell(r)[0] for r in choice.rows)]

    head = "".join(f'<th data-type="{"num" if c.numeric else "text"}" class="{"num" if c.numeric else ""}">'
                   f'{esc(c.label)}</th>' for c in columns)
    body = []
    for row in _table_order(choice.rows):
        cells = "".join(_td(c, row) for c in columns)
        marks = " ".join(flag for flag, on in (("best", row.best), ("baseline", row.record.baseline)) if on)
        body.append(f'<tr class="{marks}" data-trial="{esc(row.number)}">{cells}</tr>')
    return (f'<div class="table-wrap"><table class="trials sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _td(column: _Column, row: Standing) -> str:
    text, sort_value = column.cell(row)
    cls = ' class="num"' if column.numeric else ""
    return f'<td{cls} data-v="{sort_value}">{text}</td>'


def _table_order(rows) -> list[Standing]:
    """Fastest first (on the choice's figure); trials without one after them, in the order they ran."""
    return sorted(rows, key=lambda r: (r.speed is None, -(r.speed or 0), r.number or 0))


# ---- environment --------------------------------------------------------------------------------

def _env(study: dict, choice: Choice) -> dict:
    """The study's environment stamp, or else the first trial's (every trial records its own)."""
    return study.get("env") or next((s.record.env for s in choice.rows if s.record.env), {})


def _environment(study: dict, choice: Choice) -> str:
    facts = {k: v for k, v in _env(study, choice).items() if v is not None}
    if study.get("created"):
        facts["study created"] = study["created"]
    if not facts:
        return '<p class="empty">No environment was recorded.</p>'
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(_env_value(k, v))}</dd>" for k, v in facts.items())
    return f'<dl class="env">{items}</dl>'


def _env_value(key: str, value: object) -> object:
    # The stamp keeps memory sizes in bytes (device_total, host_memory); people read GiB.
    is_size = isinstance(value, int) and (key.endswith("_total") or key.endswith("memory"))
    if is_size:
        return size(value)
    if isinstance(value, float):  # a measured ratio (cpu_bf16_speedup): three figures, not seventeen
        return f"{value:.3g}"
    if isinstance(value, dict):  # a setting's parts (tf32's matmul and cudnn): key value, in a line
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return value


# ---- page template ------------------------------------------------------------------------------

_CSS = """
:root { --ink:#1f2430; --muted:#6b7280; --line:#e5e7eb; --bg:#f4f5f7; --card:#fff; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
main { max-width:1360px; margin:0 auto; padding:28px 24px 48px; }
header h1 { font-size:24px; margin:0 0 4px; font-weight:650; }
header .name { color:#3b5bdb; overflow-wrap:anywhere; }
header .meta { color:var(--muted); margin-bottom:4px; }
header .measured { margin:0 0 8px; font-weight:600; }
header .size-warning { margin:0 0 10px; padding:6px 10px; border-radius:8px; background:#fff1d6; color:#7a4a00; }
.chips { display:flex; gap:6px; flex-wrap:wrap; }
.chip, .badge, .tag { display:inline-block; border-radius:999px; padding:1px 9px; font-size:12px;
  font-weight:600; background:#eef0f3; color:#374151; }
.st-ok { background:#e3f4e8; color:#1e7b3a; } .st-oom { background:#fde2e2; color:#b42318; }
.st-timeout { background:#fff1d6; color:#a15c07; } .st-crash { background:#f3e3f7; color:#7a2e8e; }
.st-error { background:#fbe4e4; color:#912018; } .st-diverged { background:#ffe9d5; color:#b54708; }
.st-interrupted { background:#eceff3; color:#4b5563; }
.st-skipped { background:#f3f4f6; color:#6b7280; font-style:italic; }
.st-noisy { background:#fff1d6; color:#7a4a00; font-style:italic; }
.tag-unsafe { background:#fde2e2; color:#b42318; } .tag-unsearched { background:#eef0f3; color:#4b5563; }
.hero { background:linear-gradient(135deg,#1f2a44,#2f4a7a); color:#fff; border-radius:14px;
  padding:18px 22px; margin:18px 0; box-shadow:0 6px 18px rgba(31,42,68,.18); }
.hero.bad { background:#7a1f1f; }
.hero .lead { margin:0 0 8px; font-size:15px; }
.hero .story { margin:0 0 14px; padding-left:20px; font-size:14px; line-height:1.5; }
.hero .story li { margin:2px 0; }
.hero .story li.more { list-style:none; margin-left:-20px; }
.hero .story summary { cursor:pointer; opacity:.85; }
.hero .story .story { margin:4px 0 0; }
.hero .kv { background:rgba(255,255,255,.14); border-radius:6px; padding:1px 7px; margin:0 3px;
  font-size:13px; }
.hero .kv b { font-weight:500; opacity:.75; }
.kv { overflow-wrap:anywhere; }  /* a factory param's path: wraps in its chip, not past a narrow page */
.predicted .kv { overflow-wrap:normal; white-space:nowrap; }  /* its table scrolls: "batc h_si ze" read as two */
.stats { display:grid; grid-template-columns:repeat(4,1fr); gap:12px; }
.stat { background:rgba(255,255,255,.08); border-radius:10px; padding:10px 14px; }
.stat .label { font-size:12px; text-transform:uppercase; letter-spacing:.05em; opacity:.75; }
.stat .value { font-size:28px; font-weight:700; font-variant-numeric:tabular-nums; }
.stat .detail { font-size:12px; opacity:.8; }
.tiers { display:grid; grid-template-columns:repeat(3,1fr); gap:12px; margin-bottom:18px; }
.tier { background:var(--card); border:1px solid var(--line); border-radius:12px; padding:10px 14px; }
.tier .label { text-transform:uppercase; font-size:12px; letter-spacing:.05em; color:var(--muted); }
.tier .value { font-size:18px; font-weight:650; margin-bottom:4px; }
.tier .kv, .predicted .kv { font-size:12px; background:#f1f3f5; border-radius:6px; padding:0 6px; margin:2px 3px 0 0;
  display:inline-block; }
.tier .kv b, .predicted .kv b { font-weight:500; color:var(--muted); }
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
.pt.baseline .shape { stroke:#111; stroke-width:2.2; }
.series.baseline .dot circle { stroke:#111; stroke-width:2.5; }
.pareto-front { fill:none; stroke:""" + FRONT_COLOUR + """; stroke-width:2.2; stroke-linejoin:round; }
.front-area { fill:""" + FRONT_COLOUR + """; opacity:.06; }
.oom path { stroke:""" + OOM_COLOUR + """; stroke-width:2.6; stroke-linecap:round; }
.limit line { stroke:#9b1c1c; stroke-width:1.4; } .limit text { fill:#9b1c1c; font-size:12px; }
.limit.usable line { stroke:#d97706; stroke-dasharray:6 4; } .limit.usable text { fill:#b45309; }
.offscale { fill:#9b1c1c; font-size:12px; }
.oom-count { fill:#9b1c1c; font-size:12px; font-weight:600; paint-order:stroke; stroke:#fff; stroke-width:4px; }
.callout { font-weight:700; font-size:13px; fill:#111; paint-order:stroke; stroke:#fff; stroke-width:4px; }
.arrow { stroke:#555; stroke-width:1.4; stroke-dasharray:4 3; }
.arrow-label { font-weight:700; fill:#555; paint-order:stroke; stroke:#fff; stroke-width:4px; }
.series-line { fill:none; stroke:var(--c); stroke-width:2.4; }
.series .dot circle { fill:var(--c); stroke:#fff; stroke-width:1.2; }
.series .dot.hollow circle { fill:#fff; stroke:var(--c); stroke-width:2; }
.oom-batch path { stroke:var(--c); stroke-width:2; stroke-linecap:round; }
.segment { stroke:#fff; stroke-width:1; }
.leader { fill:none; stroke-width:1.2; }
.seg-label { font-weight:600; fill:#374151; } .seg-value { fill:#6b7280; font-variant-numeric:tabular-nums; }
.legend { display:flex; flex-wrap:wrap; gap:6px 16px; margin-top:8px; color:#4b5563; font-size:12.5px; }
.legend .item { display:inline-flex; align-items:center; gap:5px; }
.empty { color:var(--muted); font-style:italic; }
/* The wrapper scrolls sideways, so it, not the page, is what the sticky header sticks in: it scrolls
   down too, at most a window high, and a long table keeps its header in view. Printed, all of it. */
.table-wrap { overflow:auto; max-height:calc(100vh - 32px); }
@media print { .table-wrap { overflow:visible; max-height:none; }
  .hero { -webkit-print-color-adjust:exact; print-color-adjust:exact; }  /* white on blue, not pale grey */
  .card, .stat, svg.plot { break-inside:avoid; } }
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
table.predicted { border-collapse:collapse; width:100%; font-size:12.5px; font-style:italic; }
.predicted th { text-align:left; font-weight:600; color:#4b5563; border-bottom:2px solid var(--line); padding:6px; }
.predicted td { padding:5px 6px; border-bottom:1px solid #f0f1f3; color:#4b5563; }
.predicted .num { text-align:right; font-variant-numeric:tabular-nums; }
.tag { margin-right:4px; background:#eef2ff; color:#3730a3; }
.tag-best { background:#1f2a44; color:#fff; } .tag-baseline { background:#fef3c7; color:#92400e; }
.err { color:#912018; }
dl.env { display:grid; grid-template-columns:max-content 1fr; gap:4px 18px; margin:0; font-size:13px; }
dl.env dt { color:var(--muted); }
dl.env dd { margin:0; font-family:ui-monospace,SFMono-Regular,Menlo,monospace; min-width:0; overflow-wrap:anywhere; }
@media (max-width:800px) { .stats,.tiers,.two { grid-template-columns:1fr; }
  .plot-wrap { overflow-x:auto; } .plot-wrap svg.plot { min-width:720px; } }
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
