"""Is a short trial's peak the peak of the real run? A trial as the sweep runs it, then a long run.

    python benchmarks/peak_vs_long.py --steps 200 --set batch_size=16
Goal: the long run peaks within 2% of the trial. Two comparisons: across processes (the trial's
peak vs the long run's), and within the long run (its peak after as many steps as the trial
measured vs after all of them), which separates growth from process-to-process noise.
"""
from _common import describe, parser, run


def main():
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    trial = run(args)
    # Long run: one step per window, exactly `steps` windows, no early stop on a small spread.
    long = run(args, window_s=0.0, min_windows=args.steps, max_windows=args.steps, max_seconds=1e9)
    at_trial_length = long["memory"]["peak_by_window"][trial["timing"]["measured_steps"] - 1]
    mib = 2**20
    print(f"config: {describe(trial)}")
    print("| run | measured steps | peak MiB | samples/s |")
    print("|---|---|---|---|")
    for name, r in (("trial", trial), ("long run", long)):
        print(f"| {name} | {r['timing']['measured_steps']} | {r['peak_memory'] / mib:.1f} | {r['throughput']:.2f} |")
    print(f"\nacross processes: long run ({long['timing']['measured_steps']} steps) peak vs trial peak: "
          f"{100 * (long['peak_memory'] - trial['peak_memory']) / long['peak_memory']:+.2f}%")
    print(f"within the long run: peak after {trial['timing']['measured_steps']} steps {at_trial_length / mib:.1f} MiB, "
          f"after {long['timing']['measured_steps']}: {long['peak_memory'] / mib:.1f} MiB "
          f"({100 * (long['peak_memory'] - at_trial_length) / long['peak_memory']:+.2f}%)")


if __name__ == "__main__":
    main()
