"""The HTML report: one self-contained page a person can open anywhere, offline.

Everything is inline (CSS, SVG drawn in Python by harness.report_svg, a few lines of JS for sorting
the table), so the file can be mailed, attached to a ticket or opened years later without a network.
Every string that came from the user (config values, names, environment, error messages) goes
through `esc`.

Input is what the report module hands over; this module decides nothing, it only draws:

    rows   one dict per trial: number, status, config, throughput, peak_memory, pareto, best,
           baseline, tier, timing, memory, flops, tokens_per_s, env, error (see harness.record)
    study  name, budget, headroom, device_total, env, created, objective, and optionally counts by
           status and `size_warning` (the apply target describes another model size than was measured)
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from harness import report_time
from harness.report_svg import FRONT_COLOUR, OOM_COLOUR, batch_plot, breakdown_plot, frontier_plot
from harness.report_text import capacity, esc, flagged, knob_rank, ordered, rate
from harness.units import size

TIER_ORDER = {"safe": 0, "balanced": 1, "aggressive": 2}


def render_html(rows: list[dict], study: dict) -> str:
    """The whole report page for `rows` (one per trial) of `study`."""
    best = flagged(rows, "best")
    baseline = flagged(rows, "baseline")
    budget, label = capacity(study)
    unit = _unit(study)
    sections = [
        _header(rows, study),
        _summary(best, baseline, budget, label, unit),
        _tiers(rows, unit),
        _card("Throughput vs peak memory", frontier_plot(rows, study),
              note="up and left is better; the staircase is the most throughput measured within each memory"),
        '<div class="two">'
        + _card("Throughput vs batch size", batch_plot(rows),
                note="a line joins trials that differ only in batch size")
        + _card("Where the best config's memory goes", breakdown_plot(best, budget, label), note=_breakdown_source(best))
        + "</div>",
        _card(f"All trials ({len(rows)})", _table(rows, unit), note="click a column header to sort"),
        _card("Where the sweep's time went", report_time.html(rows),
              note="every trial's wall time by phase, summed (harness/report_time.py says what each phase holds)"),
        _card("Environment", _environment(study, rows)),
    ]
    title = f"bench report: {study.get('name', 'study')}"
    return _PAGE.format(title=esc(title), css=_CSS, body="\n".join(sections), js=_JS)


def _breakdown_source(best: dict | None) -> str:
    reused = ((best or {}).get("reused") or {}).get("breakdown")
    return f"tensors measured in trial {reused['trial']} (same build and shape), not again in this one" if reused else ""


def _unit(study: dict) -> str:
    """The throughput the study optimized; every number shown with it is samples/s unless stated."""
    return "tokens/s" if study.get("objective") == "tokens" else "samples/s"


def _speed(row: dict | None, unit: str) -> float | None:
    row = row or {}
    return _median(row.get("tokens_per_s")) if unit == "tokens/s" else row.get("throughput")


# ---- page sections ------------------------------------------------------------------------------

def _header(rows: list[dict], study: dict) -> str:
    counts = study.get("counts") or Counter(r.get("status") for r in rows)
    chips = "".join(
        f'<span class="chip st-{esc(status)}">{esc(status)} {esc(n)}</span>'
        for status, n in counts.items() if n
    )
    workload = study.get("workload")
    workload = workload.get("name") if isinstance(workload, dict) else workload
    device = _env(study, rows).get("device")
    meta = " · ".join(esc(x) for x in (workload, device, study.get("created")) if x)
    warning = study.get("size_warning")
    warning = f'<p class="size-warning">⚠ {esc(warning)}</p>' if warning else ""
    return (
        f'<header><h1>bench report <span class="name">{esc(study.get("name", "study"))}</span></h1>'
        f'<div class="meta">{meta}</div><p class="measured">{esc(_measured(rows, device))}</p>{warning}'
        f'<div class="chips">{chips}</div></header>'
    )


def _measured(rows: list[dict], device: str | None) -> str:
    """What the numbers are of: the workload preset (a CPU preset is a smaller stand-in) and the device."""
    workload = next((r["workload"] for r in rows if r.get("workload")), None) or {}
    what = workload.get("factory") or workload.get("name") or "the workload"
    preset = f" preset {workload['preset']}" if workload.get("preset") else ""
    return f"measured: {what}{preset} on {device or 'an unrecorded device'}"


def _summary(best: dict | None, baseline: dict | None, budget: int | None, label: str, unit: str) -> str:
    if best is None:
        return '<section class="hero bad"><p>No configuration finished inside the budget.</p></section>'
    cards = [
        _stat("speedup", *_speedup(best, baseline, unit)),
        _stat(f"best {unit}", f"{rate(_speed(best, unit))} {unit}",
              f"baseline {rate(_speed(baseline, unit))} {unit}"),
        _stat("peak memory", size(best.get("peak_memory")), _memory_change(best, baseline)),
        _stat("headroom left", *_headroom(best, budget, label)),
    ]
    return (
        f'<section class="hero"><p class="lead">Best: trial #{esc(best.get("number"))} '
        f'{_config_chips(best.get("config") or {})}</p><div class="stats">{"".join(cards)}</div></section>'
    )


def _stat(label: str, value: str, detail: str) -> str:
    return (
        f'<div class="stat"><div class="label">{esc(label)}</div>'
        f'<div class="value">{esc(value)}</div><div class="detail">{esc(detail)}</div></div>'
    )


def _speedup(best: dict, baseline: dict | None, unit: str) -> tuple[str, str]:
    if not _speed(baseline, unit) or _speed(best, unit) is None:
        return "-", "no baseline measured"
    speedup = _speed(best, unit) / _speed(baseline, unit)
    return f"{speedup:.2f}×", f"{unit} over the baseline, trial #{baseline.get('number')}"


def _memory_change(best: dict, baseline: dict | None) -> str:
    if not baseline or best.get("peak_memory") is None or baseline.get("peak_memory") is None:
        return "no baseline memory"
    delta = best["peak_memory"] - baseline["peak_memory"]
    sign = "+" if delta >= 0 else "−"
    return f"{sign}{size(abs(delta))} vs baseline ({size(baseline['peak_memory'])})"


def _headroom(best: dict, budget: int | None, label: str) -> tuple[str, str]:
    if not budget or best.get("peak_memory") is None:
        return "-", "no memory budget"
    left = budget - best["peak_memory"]
    return size(left), f"{left / budget:.0%} of the {size(budget)} {label}"


def _config_chips(config: dict) -> str:
    return "".join(f'<span class="kv"><b>{esc(k)}</b> {esc(v)}</span>' for k, v in ordered(config))


def _tiers(rows: list[dict], unit: str) -> str:
    tiered = sorted((r for r in rows if r.get("tier")), key=lambda r: TIER_ORDER.get(r["tier"], len(TIER_ORDER)))
    if not tiered:
        return ""
    cards = "".join(
        f'<div class="tier"><div class="label">{esc(r["tier"])} · #{esc(r.get("number"))}</div>'
        f'<div class="value">{esc(rate(_speed(r, unit)))} {esc(unit)} · {esc(size(r.get("peak_memory")))}</div>'
        f'<div>{_config_chips(r.get("config") or {})}</div></div>'
        for r in tiered
    )
    return f'<section class="tiers">{cards}</section>'


def _card(title: str, body: str, note: str = "") -> str:
    note_html = f'<span class="note">{esc(note)}</span>' if note else ""
    return f'<section class="card"><h2>{esc(title)}{note_html}</h2>{body}</section>'


# ---- the trial table ----------------------------------------------------------------------------

@dataclass
class _Column:
    label: str
    numeric: bool
    cell: Callable[[dict], tuple[str, str]]  # row -> (cell HTML, sort key)


def _columns(rows: list[dict], unit: str) -> list[_Column]:
    """Measured columns carry their unit in the title; knob columns are the knobs' own names."""
    knobs = sorted({k for r in rows for k in (r.get("config") or {})}, key=lambda k: (knob_rank(k), k))
    speeds = [_Column("samples/s", True, lambda r: _num(r.get("throughput"), rate)),
              _Column("tokens/s", True, lambda r: _num(_median(r.get("tokens_per_s")), rate))]
    return [
        _Column("#", True, lambda r: _num(r.get("number"), str)),
        _Column("status", False, _status_cell),
        *(speeds if unit == "samples/s" else speeds[::-1]),
        _Column("peak memory (GiB)", True, lambda r: _num(r.get("peak_memory"), _gib)),
        *(_Column(_knob_title(k), _numeric_knob(rows, k), _knob_cell(k)) for k in knobs),
        _Column("TFLOP/s", True, _flops_cell),
        _Column("MFU", True, _mfu_cell),  # only where the device has a known peak: dropped when all blank
        _Column("step time (ms)", True, _step_cell),
        _Column("compile time (s)", True, lambda r: _num((r.get("timing") or {}).get("compile_s"), _seconds)),
        _Column("notes", False, _notes_cell),
    ]


MEASURED_TITLES = {"#", "status", "samples/s", "tokens/s", "peak memory (GiB)", "TFLOP/s", "MFU", "step time (ms)",
                   "compile time (s)", "notes"}


def _knob_title(knob: str) -> str:
    """A knob's name, unless a measured column already has that title (a factory param may be called anything)."""
    return f"{knob} (knob)" if knob in MEASURED_TITLES else knob


def _gib(value: float) -> str:
    return f"{value / 1024**3:.2f}"


def _num(value, fmt) -> tuple[str, str]:
    return ("", "") if value is None else (esc(fmt(value)), esc(value))


def _median(value: dict | float | None) -> float | None:
    # Records keep rates as {median, p10, p90}; a bare number is taken as the median.
    return value.get("median") if isinstance(value, dict) else value


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value else ""  # no compile: nothing to say


def _flops_cell(row: dict) -> tuple[str, str]:
    return _num((row.get("flops") or {}).get("tflops"), rate)


def _mfu_cell(row: dict) -> tuple[str, str]:
    mfu = (row.get("flops") or {}).get("mfu")
    return ("", "") if mfu is None else (f"{mfu:.0%}", esc(mfu))


def _step_cell(row: dict) -> tuple[str, str]:
    """Median step time, with its spread (coefficient of variation) beside it in grey."""
    step = (row.get("timing") or {}).get("step_s") or {}
    if step.get("median") is None:
        return "", ""
    spread = f' <span class="minor">±{step["cv"]:.0%}</span>' if step.get("cv") is not None else ""
    return f"{step['median'] * 1000:.1f}{spread}", esc(step["median"])


def _numeric_knob(rows: list[dict], key: str) -> bool:
    values = [(r.get("config") or {}).get(key) for r in rows]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)


def _knob_cell(key: str):
    def cell(row: dict) -> tuple[str, str]:
        value = (row.get("config") or {}).get(key)
        return ("", "") if value is None else (esc(value), esc(value))
    return cell


def _status_cell(row: dict) -> tuple[str, str]:
    status = row.get("status", "")
    return f'<span class="badge st-{esc(status)}">{esc(status)}</span>', esc(status)


def _notes_cell(row: dict) -> tuple[str, str]:
    flags = [flag for flag in ("best", "baseline", "pareto") if row.get(flag)]
    if row.get("tier"):
        flags.append(str(row["tier"]))
    tags = "".join(f'<span class="tag tag-{esc(f)}">{esc(f)}</span>' for f in flags)
    error = row.get("error") or {}
    message = " ".join(str(x) for x in (error.get("type"), error.get("message")) if x)
    text = f'<span class="err" title="{esc(message)}">{esc(_shorten(message, 48))}</span>' if message else ""
    return tags + text, esc(" ".join(flags) + " " + message)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(rows: list[dict], unit: str) -> str:
    # A column nobody filled (no FLOPs counted, no MFU without a known peak, no compile) is noise.
    columns = [c for c in _columns(rows, unit) if any(c.cell(r)[0] for r in rows)]

    head = "".join(f'<th data-type="{"num" if c.numeric else "text"}" class="{"num" if c.numeric else ""}">'
                   f'{esc(c.label)}</th>' for c in columns)
    body = []
    for row in _table_order(rows):
        cells = "".join(_td(c, row) for c in columns)
        marks = " ".join(flag for flag in ("best", "baseline") if row.get(flag))
        body.append(f'<tr class="{marks}" data-trial="{esc(row.get("number"))}">{cells}</tr>')
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
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(_env_value(k, v))}</dd>" for k, v in facts.items())
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
.pt.baseline .shape { stroke:#111; stroke-width:2.2; }
.series.baseline .dot circle { stroke:#111; stroke-width:2.5; }
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
