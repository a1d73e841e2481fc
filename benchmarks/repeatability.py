"""Repeatability: the same config N times, each in a fresh process -> CV of samples/s and of peak memory.

    python benchmarks/repeatability.py --runs 5 --set batch_size=16
Goal: CV <= 2% (throughput) and <= 1% (peak memory) on a GPU.
"""
from _common import cv, describe, parser, run


def main():
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    recs = [run(args) for _ in range(args.runs)]
    tput = [r["throughput"] for r in recs]
    peak = [r["peak_memory"] for r in recs]
    print(f"config: {describe(recs[0])}")
    print("| run | samples/s | peak MiB | within-trial step CV | windows |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(recs, 1):
        print(f"| {i} | {r['throughput']:.2f} | {r['peak_memory'] / 2**20:.1f} | "
              f"{100 * r['timing']['step_s']['cv']:.2f}% | {r['timing']['windows']} |")
    print(f"\nacross {args.runs} fresh processes: samples/s CV {100 * cv(tput):.2f}%, peak memory CV {100 * cv(peak):.2f}%")


if __name__ == "__main__":
    main()
