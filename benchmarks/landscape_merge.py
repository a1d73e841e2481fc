"""Merge several grid passes of one space into one landscape: per config, the median of the passes.

    bench report landscape-emberformer-p1 --format json > p1.json   # ... one study per pass (seed: 1, 2, 3)
    python benchmarks/landscape_merge.py OUT.json p1.json p2.json p3.json --budget 560MiB [--headroom 0.1] [--objective samples] [--recorded TEXT]

A config's status is the one most of its passes had; its throughput, tokens/s and peak are the
medians over its `ok` passes; every pass is kept in the row's `passes`, their spread in `passes_cv`.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from harness.units import parse_size


def merge(passes: list[dict]) -> list[dict]:
    merged = []
    for k, first in passes[0].items():
        runs = [p[k] for p in passes if k in p]
        status = Counter(r["status"] for r in runs).most_common(1)[0][0]
        ok = [r for r in runs if r["status"] == "ok"]
        row = dict(first, status=status, repeats=None, passes=[
            {"status": r["status"], "throughput": r["throughput"], "peak_memory": r["peak_memory"],
             "tokens_per_s": tokens(r)} for r in runs])
        if status == "ok":
            speeds = [r["throughput"] for r in ok]
            row.update(throughput=statistics.median(speeds), peak_memory=statistics.median(r["peak_memory"] for r in ok),
                       passes_cv=statistics.pstdev(speeds) / statistics.mean(speeds) if len(ok) > 1 else None)
            if tokens(first):
                row["tokens_per_s"] = {"median": statistics.median(tokens(r) for r in ok)}
        merged.append(row)
    return merged


def tokens(row: dict) -> float | None:
    """A row's tokens/s: `bench report --format json` writes the median (reports before 2026-12-06 wrote
    {median, p10, p90})."""
    value = row.get("tokens_per_s")
    return value.get("median") if isinstance(value, dict) else value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("reports", type=Path, nargs="+")
    ap.add_argument("--budget", required=True, help="the spec's memory budget, e.g. 560MiB")
    ap.add_argument("--headroom", type=float, default=0.1)
    ap.add_argument("--objective", choices=("samples", "tokens"), default="samples")
    ap.add_argument("--recorded", default="", help="when, where and how loaded the machine was")
    args = ap.parse_args()
    passes = [{json.dumps(r["config"], sort_keys=True): r for r in json.loads(p.read_text()) if r["status"] != "interrupted"}
              for p in args.reports]
    rows = merge(passes)
    args.out.write_text(json.dumps({"study": {
        "memory_budget": parse_size(args.budget, "--budget"), "headroom": args.headroom, "objective": args.objective,
        "recorded": args.recorded, "merged": f"median of {len(passes)} grid passes per config; each in `passes`"},
        "rows": rows}, indent=1))
    cvs = [r["passes_cv"] for r in rows if r.get("passes_cv") is not None]
    print(f"{args.out}: {len(rows)} configs from {len(passes)} passes; pass-to-pass CV median "
          f"{statistics.median(cvs):.1%}, max {max(cvs):.1%}" if cvs else f"{args.out}: {len(rows)} configs")


if __name__ == "__main__":
    main()
