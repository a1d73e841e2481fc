"""Per-trial overhead: a trial's wall time minus its first step, warm-up and measured steps
(process start, imports, build, FLOP count, reference loss, teardown).

    python benchmarks/overhead.py --runs 3 --preset tiny
"""
import statistics

from _common import describe, parser, run


def main():
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    recs = [run(args) for _ in range(args.runs)]
    print(f"config: {describe(recs[0])}")
    print("| run | trial wall s | first step s | warm-up s | measured s | overhead s |")
    print("|---|---|---|---|---|---|")
    overheads = []
    for i, r in enumerate(recs, 1):
        t = r["timing"]
        work = t["first_step_s"] + t["warmup_s"] + t["measure_s"]
        overheads.append(t["trial_wall_s"] - work)
        print(f"| {i} | {t['trial_wall_s']:.2f} | {t['first_step_s']:.2f} | {t['warmup_s']:.2f} | "
              f"{t['measure_s']:.2f} | {overheads[-1]:.2f} |")
    print(f"\nmedian per-trial overhead: {statistics.median(overheads):.2f} s")


if __name__ == "__main__":
    main()
