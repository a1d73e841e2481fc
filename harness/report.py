"""What was measured, for people (a rich table and summary) and for pipelines (JSON, CSV, pandas).

The HTML page lives in harness.report_html; this module chooses what every format shows.
"""
from __future__ import annotations

import csv
import io
import json
from collections import Counter

from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness import pareto
from harness.units import gib, size

JSON_KEYS = ("number", "status", "config", "throughput", "peak_memory", "pareto", "best", "baseline", "tier",
             "samples_per_s", "tokens_per_s", "memory", "timing", "flops", "loss", "env", "error", "workload", "adapter", "log")
MAIN_KNOBS = ("batch_size", "accumulation", "precision", "checkpointing", "compile")


def annotate(rows: list[dict], info: dict) -> pareto.Choice:
    return pareto.choose(rows, info.get("memory_budget"), info.get("headroom", 0.1), info.get("objective", "samples"))


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


def table(rows: list[dict], choice: pareto.Choice, info: dict) -> Group:
    knobs = knob_columns(rows)
    t = Table(title=f"study {info.get('name')}: throughput vs peak memory", title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("", no_wrap=True)
    for k in knobs:
        t.add_column(k.replace("_", " "), justify="right" if k in ("batch_size", "accumulation") else "left")
    t.add_column("status")
    t.add_column("samples/s", justify="right")
    t.add_column("± cv", justify="right")
    t.add_column("peak", justify="right")
    t.add_column("% mem", justify="right")
    for r in sorted(rows, key=lambda r: r["number"]):
        t.add_row(*row_cells(r, knobs, choice.capacity), style="bold" if r.get("best") else None)
    return Group(t, Text(legend()), summary(rows, choice, info))


def row_cells(r: dict, knobs: list[str], cap: float | None) -> list:
    marks = ("★" if r.get("best") else "") + ("◆" if r.get("pareto") else "") + ("B" if r.get("baseline") else "")
    step = (r.get("timing") or {}).get("step_s") or {}
    peak = r.get("peak_memory") if r["status"] in ("ok", "diverged") else None
    return [str(r["number"]), marks, *[str((r.get("config") or {}).get(k, "")) for k in knobs],
            Text(r["status"], style=STATUS_STYLE.get(r["status"], "")),
            f"{r['throughput']:.1f}" if r.get("throughput") else "-",
            f"{100 * step['cv']:.1f}%" if step.get("cv") is not None and r.get("throughput") else "-",
            gib(peak), f"{100 * peak / cap:.0f}%" if peak is not None and cap else "-"]


def legend() -> str:
    return "★ best   ◆ Pareto front   B baseline (your current config)   peak in GiB = 1024³ bytes"


def summary(rows: list[dict], choice: pareto.Choice, info: dict) -> Text:
    counts = Counter(r["status"] for r in rows)
    lines = ["trials: " + ", ".join(f"{n} {s}" for s, n in counts.most_common())]
    if choice.capacity:
        label = "budget" if info.get("memory_budget") else "device memory"
        lines.append(f"capacity: {gib(choice.capacity)} ({label}), required headroom {info.get('headroom', 0.1):.0%}")
    best, base = choice.best, choice.baseline
    if best is None:
        lines.append("best: none — no measured config fits; see the statuses above")
    else:
        lines.append(f"best: trial {best['number']}  {describe(best['config'])}  "
                     f"{best['throughput']:.1f} samples/s, peak {gib(best['peak_memory'])}")
        if base and base.get("throughput") and base["status"] == "ok":
            lines.append(f"vs baseline (trial {base['number']}): {best['throughput'] / base['throughput']:.2f}× throughput, "
                         f"memory {signed_gib(best['peak_memory'] - base['peak_memory'])}")
        elif base:
            lines.append(f"baseline (trial {base['number']}) ended {base['status']}: nothing to compare against")
        if choice.capacity:
            lines.append(f"headroom left: {1 - best['peak_memory'] / choice.capacity:.0%} of {gib(choice.capacity)}")
    if best and (best.get("memory") or {}).get("breakdown"):
        parts = best["memory"]["breakdown"]
        lines.append("best's memory: " + ", ".join(f"{k} {size(v)}" for k, v in parts.items())
                     + f" (measured tensors; the rest of the {size(best['peak_memory'])} peak is allocator, "
                     "runtime and data)")
    lines.extend(compile_lines(rows))
    lines.append("tiers (headroom of capacity: " + ", ".join(f"{n} {h:.0%}" for n, h in pareto.TIERS.items()) + "):")
    for name, tier in choice.tiers.items():
        lines.append(f"  {name:<10} " + (f"trial {tier['number']}: {tier['throughput']:.1f} samples/s, "
                                         f"peak {gib(tier['peak_memory'])}" if tier else "nothing fits"))
    return Text("\n".join(lines))


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
