"""Per-trial overhead: a trial's wall time minus its first step, warm-up and measured steps (process
start, imports, build, FLOP count, reference loss, memory breakdown, teardown), before and after
cheap trials, interleaved on one machine in one run:

    fresh   a fresh interpreter per trial, every figure measured in every trial (bench before #15)
    warm    forked from the warm trial server, FLOP count / reference loss / breakdown filed by the
            first trial and reused by the others, as trials of one study do (harness.zygote, reuse)

The warm server's own start (importing torch once per sweep) is timed apart and printed, not hidden.

    python benchmarks/overhead.py --runs 5 --device cpu [--start both|fresh|warm] [--quick] [--json]

--json prints {"median_s": ..., "start": ..., ...} on the last line (the warm figure when both run).
"""
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import QUICK_MEASURE, describe, load_spec, parser
from harness import launch, spec as specs, zygote
from harness.cli import resolve_device


def overhead(rec: dict) -> float:
    t = rec["timing"]
    return t["trial_wall_s"] - (t["first_step_s"] + t["warmup_s"] + t["measure_s"])


def one_trial(spec, device: str, config: dict, start: str, reuse_dir: str, number: int) -> dict:
    os.environ[zygote.ENV_SWITCH] = start
    job = spec.job(device, config)
    if start == zygote.WARM:
        job.update(reuse_dir=reuse_dir, trial=number)
    rec = launch.run(job, launch.Limits(spec.trial_timeout_s, spec.stall_s), None)
    if rec["status"] != "ok":
        raise SystemExit(f"{start} trial ended {rec['status']}: {(rec.get('error') or {}).get('message')}")
    if rec["start"]["method"] != start:
        raise SystemExit(f"asked for a {start} start, got {rec['start']}")
    return rec


def main():
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=5, help="trials per start (default 5)")
    p.add_argument("--start", choices=("both", "fresh", "warm"), default="both")
    p.add_argument("--quick", action="store_true", help="short measuring (the overhead excludes it anyway)")
    p.add_argument("--json", action="store_true", help="a JSON summary on the last line")
    args = p.parse_args()
    spec = load_spec(args.spec, args.preset, **(QUICK_MEASURE if args.quick else {}))
    device = resolve_device(args.device)
    config = specs.trial_config(spec, specs.parse_overrides(tuple(args.overrides), spec))
    starts = [zygote.FRESH, zygote.WARM] if args.start == "both" else [args.start]
    load_before = os.getloadavg()
    server_s = None
    if zygote.WARM in starts:
        t0 = time.monotonic()
        failed = zygote.ensure_running()
        if failed:
            raise SystemExit(f"the warm trial server did not start: {failed}")
        server_s = time.monotonic() - t0
    recs = {s: [] for s in starts}
    with tempfile.TemporaryDirectory() as reuse_dir:
        for i in range(args.runs):
            for start in (starts if i % 2 == 0 else starts[::-1]):  # interleaved, alternating order
                recs[start].append(one_trial(spec, device, config, start, str(Path(reuse_dir) / "reuse"), i))
    load_after = os.getloadavg()

    first = next(iter(recs.values()))[0]
    print(f"config: {describe(first)}")
    print(f"load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{' '.join(f'{x:.2f}' for x in load_after)} after; {os.cpu_count()} CPUs")
    if server_s is not None:
        print(f"warm trial server start (once per sweep, not in the per-trial figures): {server_s:.2f} s")
    print("\n| start | run | trial wall s | start-up s | build s | first step s | warm-up s | measured s | overhead s |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for start, rows in recs.items():
        for i, r in enumerate(rows, 1):
            t = r["timing"]
            print(f"| {start} | {i} | {t['trial_wall_s']:.2f} | {t['startup_s']:.2f} | {t['setup_s']:.2f} | "
                  f"{t['first_step_s']:.2f} | {t['warmup_s']:.2f} | {t['measure_s']:.2f} | {overhead(r):.2f} |")
        values = [overhead(r) for r in rows]
        summary[start] = {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values),
                          "overheads_s": values}
    print()
    for start, s in summary.items():
        print(f"median per-trial overhead, {start} start: {s['median_s']:.2f} s "
              f"(min {s['min_s']:.2f}, max {s['max_s']:.2f}, {len(s['overheads_s'])} trials)")
    if args.json:
        main_start = zygote.WARM if zygote.WARM in summary else zygote.FRESH
        out = {**summary[main_start], "start": main_start, "runs": args.runs, "device": first["env"]["device"],
               "config": first["config"], "server_start_s": server_s, "load_avg_before": load_before,
               "load_avg_after": load_after, "cpu_count": os.cpu_count(),
               **{s: v for s, v in summary.items() if s != main_start}}
        print(json.dumps(out))


if __name__ == "__main__":
    main()
