"""What was measured, for people (a rich table and summary) and for pipelines (JSON, CSV, pandas).

The HTML page lives in harness.report_html; this module chooses what every format shows.
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from dataclasses import dataclass

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness import busy, pareto, report_time
from harness.units import gib, size

JSON_KEYS = ("number", "status", "config", "throughput", "peak_memory", "pareto", "best", "baseline", "tier",
             "samples_per_s", "tokens_per_s", "memory", "timing", "flops", "loss", "env", "error", "workload", "adapter", "log",
             "reused", "start", "repeats", "skip", "busy", "remeasured_after", "model")
MAIN_KNOBS = ("batch_size", "accumulation", "precision", "checkpointing", "compile")


def annotate(rows: list[dict], info: dict) -> pareto.Choice:
    choice = pareto.choose(rows, info.get("memory_budget"), info.get("headroom", 0.1), info.get("objective", "samples"))
    if choice.best is not None and info.get("model"):  # the planner's why and predictions (harness.planner)
        choice.best["model"] = info["model"]
    return choice


def to_json(rows: list[dict]) -> str:
    return json.dumps([{k: r.get(k) for k in JSON_KEYS} for r in rows], indent=1, default=str)


def flat(rows: list[dict]) -> list[dict]:
    """One flat dict per trial: config.* columns plus the headline figures."""
    out = []
    for r in rows:
        row = {"number": r["number"], "status": r["status"], "baseline": r.get("baseline"), "pareto": r.get("pareto"),
               "best": r.get("best"), "tier": r.get("tier")}
        row.update({f"config.{k}": v for k, v in (r.get("config") or {}).items()})
        step = (r.get("timing") or {}).get("step_s") or {}
        mem = r.get("memory") or {}
        flops = r.get("flops") or {}
        row.update(throughput=r.get("throughput"), tokens_per_s=(r.get("tokens_per_s") or {}).get("median"),
                   peak_memory=r.get("peak_memory"), step_s=step.get("median"), step_cv=step.get("cv"),
                   compile_s=(r.get("timing") or {}).get("compile_s"), tflops=flops.get("tflops"), mfu=flops.get("mfu"),
                   peak_allocated=mem.get("peak_allocated"), peak_reserved=mem.get("peak_reserved"),
                   error=(r.get("error") or {}).get("message"))
        out.append(row)
    return out


def to_csv(rows: list[dict]) -> str:
    records = flat(rows)
    columns = list(dict.fromkeys(k for r in records for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(records)
    return buf.getvalue()


# ---- terminal ------------------------------------------------------------------------------------

STATUS_STYLE = {"ok": "green", "oom": "red", "timeout": "yellow", "crash": "red", "error": "red",
                "diverged": "magenta", "interrupted": "dim", "running": "cyan"}


def knob_columns(rows: list[dict]) -> list[str]:
    seen = list(dict.fromkeys(k for r in rows for k in (r.get("config") or {})))
    return [k for k in MAIN_KNOBS if k in seen] + [k for k in seen if k not in MAIN_KNOBS]


# Narrow terminals: short headers and values for the knob columns, never for a number.
SHORT_HEADER = {"batch_size": "batch", "accumulation": "acc", "precision": "prec", "checkpointing": "ckpt",
                "num_workers": "workers", "optimizer": "opt"}
SHORT_VALUE = {"bf16-mixed": "bf16m", "fp16-mixed": "fp16m", "bf16-true": "bf16t", "reduce-overhead": "r-o",
               "max-autotune": "max-at", "max-autotune-no-cudagraphs": "max-at-ncg", "default": "dflt"}


@dataclass
class Column:
    header: str
    cells: list
    number: bool = False
    knob: str | None = None

    def width(self) -> int:
        return max([len(self.header)] + [len(str(c)) for c in self.cells])


def table(rows: list[dict], choice: pareto.Choice, info: dict, width: int | None = None) -> Group:
    """The trials as a table that fits `width` columns (None: everything, `--wide`). To fit, knob
    headers and values are abbreviated, knobs that are the same in every trial move to a line under
    the table, then `% mem`, then the workload's own knobs go; a number is never cut."""
    rows = sorted(rows, key=lambda r: r["number"])
    columns, notes = fit(columns_for(rows, choice.capacity), rows, width)
    narrow = width is not None
    t = Table(title=f"study {info.get('name')}: throughput vs peak memory", title_justify="left",
              box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD, pad_edge=not narrow)
    for c in columns:
        t.add_column(c.header, justify="right" if c.number or c.knob in ("batch_size", "accumulation") else "left",
                     no_wrap=True, min_width=c.width())
    for i, r in enumerate(rows):
        cells = [Text(str(c.cells[i]), style=STATUS_STYLE.get(str(c.cells[i]), "")) if c.header == "status"
                 else str(c.cells[i]) for c in columns]
        t.add_row(*cells, style="bold" if r.get("best") else None)
    return Group(Whole(t, sum(c.width() + 3 for c in columns) + 4), Text("\n".join(notes + [legend()])),
                 summary(rows, choice, info))


class Whole:
    """A table rendered at least as wide as its cells: when the terminal is narrower than even the
    trimmed table, its lines run long (print with crop=False) rather than rich cutting a number."""

    def __init__(self, table: Table, width: int):
        self.table, self.width = table, width

    def __rich_console__(self, console, options):
        yield from console.render(self.table, options.update(max_width=max(options.max_width, self.width)))


def columns_for(rows: list[dict], cap: float | None) -> list[Column]:
    peaks = [r.get("peak_memory") if r["status"] in ("ok", "diverged") else None for r in rows]
    in_gib = any(p is not None and p >= 1024**3 for p in peaks)
    unit, scale = ("GiB", 1024**3) if in_gib else ("MiB", 1024**2)
    steps = [(r.get("timing") or {}).get("step_s") or {} for r in rows]
    return [
        Column("#", [r["number"] for r in rows], number=True),
        Column("", [("★" if r.get("best") else "") + ("◆" if r.get("pareto") else "") + ("B" if r.get("baseline") else "")
                    for r in rows]),
        *[Column(k.replace("_", " "), [(r.get("config") or {}).get(k, "") for r in rows], knob=k)
          for k in knob_columns(rows)],
        Column("status", [r["status"] for r in rows]),
        Column("samples/s", [f"{r['throughput']:.1f}" if r.get("throughput") else "-" for r in rows], number=True),
        Column("± cv", [f"{100 * s['cv']:.1f}%" if s.get("cv") is not None and r.get("throughput") else "-"
                        for r, s in zip(rows, steps)], number=True),
        Column(f"peak {unit}", [f"{p / scale:.2f}" if in_gib else f"{p / scale:.1f}" if p is not None else "-"
                                for p in peaks], number=True),
        Column("% mem", [f"{100 * p / cap:.0f}%" if p is not None and cap else "-" for p in peaks], number=True),
    ]


def fit(columns: list[Column], rows: list[dict], width: int | None) -> tuple[list[Column], list[str]]:
    """Columns (and notes for what moved out of them) that fit `width`; every number stays whole."""
    notes: list[str] = []
    if width is None:
        return columns, notes

    def fits():
        return sum(c.width() + 2 for c in columns) + 2 <= width

    for c in columns:  # 1. short knob headers and values
        if c.knob and not fits():
            c.header = SHORT_HEADER.get(c.knob, c.header)
            c.cells = [SHORT_VALUE.get(v, v) if isinstance(v, str) else v for v in c.cells]
    if not fits():  # 2. a knob with one value in every trial is a line, not a column
        same = [c for c in columns if c.knob and len({repr(v) for v in c.cells}) == 1 and rows]
        if same:
            notes.append("same in every trial: " + ", ".join(f"{c.knob}={c.cells[0]}" for c in same))
            columns = [c for c in columns if c not in same]
    for drop in ("% mem", "own knobs"):  # 3. the least needed columns
        if fits():
            break
        gone = [c for c in columns if c.header == drop or (drop == "own knobs" and c.knob and c.knob not in MAIN_KNOBS)]
        columns = [c for c in columns if c not in gone]
        if gone and drop == "own knobs":
            notes.append(f"not shown ({width} columns; --wide shows them): " + ", ".join(c.knob for c in gone))
    return columns, notes


def legend() -> str:
    return "★ best   ◆ Pareto front   B baseline (your current config)   GiB = 1024³ bytes, MiB = 1024² bytes"


def summary(rows: list[dict], choice: pareto.Choice, info: dict) -> Text:
    counts = Counter(r["status"] for r in rows)
    lines = ["trials: " + ", ".join(f"{n} {s}" for s, n in counts.most_common())]
    if choice.capacity:
        label = "budget" if info.get("memory_budget") else "device memory"
        lines.append(f"capacity: {gib(choice.capacity)} ({label}), required headroom {info.get('headroom', 0.1):.0%}")
    best, base = choice.best, choice.baseline
    objective = info.get("objective", "samples")

    def rate(row):  # the throughput the study chose on: samples/s, or tokens/s
        return f"{pareto.speed(row, objective):.1f} {objective}/s"
    if best is None:
        lines.append("best: none — no measured config fits; see the statuses above")
    else:
        lines.append(f"best: trial {best['number']}  {describe(best['config'])}  "
                     f"{rate(best)}, peak {gib(best['peak_memory'])}")
        if base and pareto.speed(base, objective) and base["status"] == "ok":
            lines.append(f"vs baseline (trial {base['number']}): {speedup_text(best, base, info)}, "
                         f"memory {signed_gib(best['peak_memory'] - base['peak_memory'])}")
        elif base:
            lines.append(f"baseline (trial {base['number']}) ended {base['status']}: nothing to compare against")
        if choice.capacity:
            lines.append(f"headroom left: {1 - best['peak_memory'] / choice.capacity:.0%} of {gib(choice.capacity)}")
    if best and (best.get("memory") or {}).get("breakdown"):
        parts = best["memory"]["breakdown"]
        reused = (best.get("reused") or {}).get("breakdown")
        where = f"tensors measured in trial {reused['trial']}, same build and shape" if reused else "measured tensors"
        lines.append("best's memory: " + ", ".join(f"{k} {size(v)}" for k, v in parts.items())
                     + f" ({where}; the rest of the {size(best['peak_memory'])} peak is allocator, "
                     "runtime and data)")
    lines.extend(model_lines(info.get("model"), objective))
    lines.extend(compile_lines(rows))
    lines.extend(report_time.lines(rows))
    lines.extend(watch_lines(rows))
    lines.append("tiers (headroom of capacity: " + ", ".join(f"{n} {h:.0%}" for n, h in pareto.TIERS.items()) + "):")
    for name, tier in choice.tiers.items():
        lines.append(f"  {name:<10} " + (f"trial {tier['number']}: {rate(tier)}, "
                                         f"peak {gib(tier['peak_memory'])}" if tier else "nothing fits"))
    return Text("\n".join(lines))


def model_lines(model: dict | None, objective: str) -> list[str]:
    """Why best is best, and the configs never measured that the model predicts fastest: predicted, not measured."""
    if not model:
        return []
    lines = [f"why best: {model['why']}"] if model.get("why") else []
    if model.get("predicted"):
        lines.append("PREDICTED, not measured (the search's model; run them with `bench trial`):")
        for p in model["predicted"]:
            lines.append(f"  {describe(p['config'])}  ~{p['speed']:.1f} {objective}/s (likely within "
                         f"×{math.exp(p['speed_sd']):.2f} either way), "
                         f"peak ~{gib(p['peak_memory'])}, fits {p['fit_chance']:.0%}, beats best {p['beat_chance']:.0%}")
    return lines


def speedup_text(best: dict, base: dict, info: dict) -> str:
    """The speedup with its spread over the interleaved confirmation runs; inside the noise it is a tie."""
    objective = info.get("objective", "samples")
    ratio, spread = pareto.speedup(best, base, objective)
    runs = min(len(pareto.runs_of(best, objective)), len(pareto.runs_of(base, objective)))
    if spread is None:
        return f"{ratio:.2f}× {objective}/s (one run each, not confirmed)"
    tie = abs(ratio - 1) <= max(2 * spread, pareto.noise(best), pareto.noise(base))
    verdict = " — a tie: within the noise" if tie else ""
    return f"{ratio:.2f}× ± {spread:.2f} {objective}/s over {runs} runs each, interleaved{verdict}"


def watch_lines(rows: list[dict]) -> list[str]:
    """Skipped configs (never measured) and trials re-measured because the machine was busy."""
    lines = []
    for r in rows:
        if r["status"] == "skipped":
            skip = r.get("skip") or {}
            lines.append(f"skipped #{r['number']} {describe(r['config'])}: {skip.get('reason')} "
                         f"(inferred from trials {', '.join(map(str, skip.get('from', [])))}); not measured")
        if r.get("remeasured_after"):
            b = r["remeasured_after"]
            lines.append(f"re-measured #{r['number']}: the machine was busy during its first run ({busy.describe(b)})")
        elif r.get("busy"):
            b = r["busy"]
            lines.append(f"busy during #{r['number']}: {busy.describe(b)}; its numbers may be low")
    return lines


def compile_payback(rows: list[dict]) -> list[dict]:
    """For each compiled ok trial with an eager twin (same knobs, compile off): cost and break-even."""
    eager = {tuple(sorted((k, repr(v)) for k, v in r["config"].items() if k != "compile")): r
             for r in rows if r["status"] == "ok" and r["config"].get("compile", "off") == "off"}
    out = []
    for r in rows:
        if r["status"] != "ok" or r["config"].get("compile", "off") == "off":
            continue
        twin = eager.get(tuple(sorted((k, repr(v)) for k, v in r["config"].items() if k != "compile")))
        if twin is None:
            continue
        saved = twin["timing"]["step_s"]["median"] - r["timing"]["step_s"]["median"]
        cost = r["timing"]["compile_s"] - twin["timing"]["first_step_s"]
        out.append({"trial": r["number"], "eager": twin["number"], "compile_s": r["timing"]["compile_s"],
                    "saved_s_per_step": saved, "break_even_steps": cost / saved if saved > 0 else None})
    return out


def compile_lines(rows: list[dict]) -> list[str]:
    lines = []
    for p in compile_payback(rows):
        if p["break_even_steps"] is None:
            verdict = "never pays for itself (not faster than eager)"
        else:
            verdict = f"pays for itself after {p['break_even_steps']:,.0f} steps"
        lines.append(f"compile: trial {p['trial']} spent {p['compile_s']:.1f}s compiling, "
                     f"{1000 * p['saved_s_per_step']:+.1f} ms/step saved vs trial {p['eager']}: {verdict}")
    return lines


def describe(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def signed_gib(delta: float) -> str:
    return ("+" if delta >= 0 else "-") + gib(abs(delta))
