"""One process against ranks that share the model (DDP, FSDP with and without resharding), same global batch.

    python benchmarks/parallel.py --spec sweeps/gpt.yaml --preset tiny --nproc 2 --runs 3 --device cpu

Each config runs `--runs` times in fresh processes, interleaved (one of each, then again), so a
change in the machine's load hits every config alike. Prints a Markdown table: global samples/s
(median over runs, with the runs' spread), peak memory of the fullest rank and of each rank, and
the load average before and after: on a shared machine the figures move with it.
"""
import contextlib
import os
import statistics

from _common import cv, load_spec, parser, trial

from harness import spec as specs
from harness.cli import resolve_device

MiB = 1024**2


def configs(nproc: int) -> dict:
    """name -> knobs; "1 thread" runs one process with OMP_NUM_THREADS=1, as each of 2 ranks on 2 cores has."""
    return {"one process": {},
            "one process, 1 thread": {},
            f"ddp x{nproc}": {"nproc": nproc, "parallel": "ddp"},
            f"fsdp x{nproc}": {"nproc": nproc, "parallel": "fsdp"},
            f"fsdp x{nproc}, no reshard": {"nproc": nproc, "parallel": "fsdp", "reshard_after_forward": False}}


@contextlib.contextmanager
def threads(count: str | None):
    """OMP_NUM_THREADS for the trials started inside (None: as it was)."""
    before = os.environ.get("OMP_NUM_THREADS")
    if count:
        os.environ["OMP_NUM_THREADS"] = count
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)
        if before is not None:
            os.environ["OMP_NUM_THREADS"] = before


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    spec = load_spec(args.spec, args.preset)
    device = resolve_device(args.device)
    extra = specs.parse_overrides(tuple(args.overrides), spec)
    load_before = os.getloadavg()
    records = {name: [] for name in configs(args.nproc)}
    for _ in range(args.runs):
        for name, knobs in configs(args.nproc).items():
            with threads("1" if name.endswith("1 thread") else None):
                rec = trial(spec, device, {**extra, **knobs})
            if rec["status"] != "ok":
                raise SystemExit(f"{name}: trial ended {rec['status']}: {(rec.get('error') or {}).get('message')}")
            records[name].append(rec)
    load_after = os.getloadavg()
    first = next(iter(records.values()))[0]["config"]
    print(f"{spec.workload.get('name')} preset {args.preset or spec.workload.get('preset')}, batch {first['batch_size']}, "
          f"global batch {first['batch_size'] * first['accumulation']}, {args.runs} interleaved runs each on {device}; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after\n")
    print("| config | accumulation | samples/s (median of runs) | runs' CV | peak MiB (fullest rank) | per rank MiB |")
    print("|---|---|---|---|---|---|")
    for name, recs in records.items():
        speeds = [r["throughput"] for r in recs]
        peaks = [r["peak_memory"] for r in recs]
        per_rank = recs[0].get("peak_memory_per_rank") or [recs[0]["peak_memory"]]
        print(f"| {name} | {recs[0]['config']['accumulation']} | {statistics.median(speeds):.1f} | {cv(speeds):.1%} | "
              f"{statistics.median(peaks) / MiB:.1f} | {', '.join(f'{b / MiB:.1f}' for b in per_rank)} |")


if __name__ == "__main__":
    main()
