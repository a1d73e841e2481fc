"""Repeatability: the same config N times, each in a fresh process -> CV of samples/s and of peak memory.

    python benchmarks/repeatability.py --runs 5 --set batch_size=16
Goal: CV <= 2% (throughput) and <= 1% (peak memory) on a GPU.
"""
from _common import cv, describe, parser, run


def summarize(recs: list[dict]) -> dict:
    """CVs across fresh processes of the ok runs (the suite and this script share it)."""
    ok = [r for r in recs if r["status"] == "ok"]
    return {"runs": len(recs), "ok": len(ok),
            "throughput_cv": cv([r["throughput"] for r in ok]) if len(ok) > 1 else None,
            "peak_cv": cv([r["peak_memory"] for r in ok]) if len(ok) > 1 else None}


def main():
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    recs = [run(args) for _ in range(args.runs)]
    s = summarize(recs)
    print(f"config: {describe(recs[0])}")
    print("| run | samples/s | peak MiB | within-trial step CV | windows |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(recs, 1):
        print(f"| {i} | {r['throughput']:.2f} | {r['peak_memory'] / 2**20:.1f} | "
              f"{100 * r['timing']['step_s']['cv']:.2f}% | {r['timing']['windows']} |")
    print(f"\nacross {args.runs} fresh processes: samples/s CV {100 * s['throughput_cv']:.2f}%, "
          f"peak memory CV {100 * s['peak_cv']:.2f}%")


if __name__ == "__main__":
    main()
