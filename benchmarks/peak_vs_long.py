"""Is a short trial's peak the peak of the real run? A trial as the sweep runs it, then a long run.

    python benchmarks/peak_vs_long.py --steps 200 --set batch_size=16
Goal: the long run peaks within 2% of the trial. Two comparisons: across processes (the trial's
peak vs the long run's), and within the long run (its peak after as many steps as the trial
measured vs after all of them), which separates growth from process-to-process noise.
"""
from _common import describe, parser, run


def long_run(steps: int) -> dict:
    """Measurement settings of the long run: one step per window, exactly `steps` windows, no early stop."""
    return dict(window_s=0.0, min_windows=steps, max_windows=steps, max_seconds=1e9)


def compare(trial: dict, long: dict) -> dict:
    """The long run's peak vs the trial's (across processes) and vs itself at the trial's length."""
    at_trial_length = long["memory"]["peak_by_window"][min(trial["timing"]["measured_steps"],
                                                            len(long["memory"]["peak_by_window"])) - 1]
    return {"across_processes": (long["peak_memory"] - trial["peak_memory"]) / long["peak_memory"],
            "within_long_run": (long["peak_memory"] - at_trial_length) / long["peak_memory"],
            "peak_at_trial_length": at_trial_length}


def main():
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    trial = run(args)
    long = run(args, **long_run(args.steps))
    c = compare(trial, long)
    mib = 2**20
    print(f"config: {describe(trial)}")
    print("| run | measured steps | peak MiB | samples/s |")
    print("|---|---|---|---|")
    for name, r in (("trial", trial), ("long run", long)):
        print(f"| {name} | {r['timing']['measured_steps']} | {r['peak_memory'] / mib:.1f} | {r['throughput']:.2f} |")
    print(f"\nacross processes: long run ({long['timing']['measured_steps']} steps) peak vs trial peak: "
          f"{100 * c['across_processes']:+.2f}%")
    print(f"within the long run: peak after {trial['timing']['measured_steps']} steps "
          f"{c['peak_at_trial_length'] / mib:.1f} MiB, after {long['timing']['measured_steps']}: "
          f"{long['peak_memory'] / mib:.1f} MiB ({100 * c['within_long_run']:+.2f}%)")


if __name__ == "__main__":
    main()
