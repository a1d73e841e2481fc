"""Shared by the benchmark scripts: run one config of a spec in a fresh child, as `bench trial` does."""
import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from harness import launch, spec as specs
from harness.cli import resolve_device

# Short measurement for --quick runs on tiny presets: the same code path, seconds per trial.
QUICK_MEASURE = dict(warmup_steps=1, window_s=0.05, min_windows=2, max_windows=3, max_seconds=1.0)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--spec", default="sweeps/emberformer.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--device", default="auto")
    p.add_argument("--preset", help="workload preset (default: the spec's)")
    return p


def load_spec(path, preset: str | None = None, budget: int | None = None, **measure):
    """The spec, with another preset, memory budget or trial measurement settings."""
    spec = specs.load(path)
    if preset:
        spec = specs.with_preset(spec, preset)
    if budget is not None:
        spec = dataclasses.replace(spec, memory_budget=budget)
    return dataclasses.replace(spec, measure=dataclasses.replace(spec.measure, **measure))


def trial(spec, device: str, overrides: dict, deadline: float | None = None) -> dict:
    """One trial of the spec's config with `overrides`, in a fresh process; its record, whatever the status.

    `deadline` (time.monotonic) caps the trial's time limit, so a timed suite stays inside its slot.
    """
    config = specs.trial_config(spec, overrides)
    timeout = spec.trial_timeout_s if deadline is None else max(min(spec.trial_timeout_s, deadline - time.monotonic()), 1)
    with tempfile.TemporaryDirectory() as tmp:
        rec = launch.run(spec.job(device, config), launch.Limits(timeout, spec.stall_s), Path(tmp) / "trial.log")
    rec.setdefault("config", config)
    return rec


def run(args, **measure) -> dict:
    """The command-line scripts' trial: `--spec/--preset/--set/--device`; stops on a failed trial."""
    spec = load_spec(args.spec, args.preset, **measure)
    rec = trial(spec, resolve_device(args.device), specs.parse_overrides(tuple(args.overrides), spec), None)
    if rec["status"] != "ok":
        raise SystemExit(f"trial ended {rec['status']}: {(rec.get('error') or {}).get('message')}")
    return rec


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def describe(rec: dict) -> str:
    return f"{rec['env']['device']}, " + " ".join(f"{k}={v}" for k, v in rec["config"].items())


# Trial settings as a spec's `trial:` section spells them.
MEASURE_YAML_KEYS = {"warmup_steps": "warmup_steps", "window_s": "window", "min_windows": "min_windows",
                     "max_windows": "max_windows", "max_seconds": "max_seconds"}


class BusyMachine(Exception):
    """The sweep ran, but on a machine too busy for its figures to rank any config."""


def sweep_best(spec_path, preset: str, budget: int | None, device: str, trials: int, timeout_s: float,
               measure: dict | None = None, search: dict | None = None) -> dict | None:
    """`bench sweep` on a copy of a spec (preset, budget, trial settings; no apply) and its best config.

    Runs the real CLI in a subprocess: the study, the sampler and the choice of best are bench's own.
    `search` replaces some knobs' choices. Past `timeout_s` the sweep is stopped; what it measured counts.
    """
    import json
    import subprocess
    import sys
    import yaml
    raw = specs.read_yaml(Path(spec_path), "sweep spec")  # bench's loader: `off` stays a string
    for key in ("apply", "scenarios"):
        raw.pop(key, None)
    raw["workload"]["preset"] = preset
    if budget:
        raw.setdefault("memory", {})["budget"] = budget
    raw["search"] = {**raw["search"], **(search or {})}
    raw["trial"] = {**raw.get("trial", {}), **{MEASURE_YAML_KEYS[k]: v for k, v in (measure or {}).items()},
                    "timeout": f"{max(int(timeout_s / 2), 5)}s"}
    root = Path(__file__).resolve().parent.parent
    cli = [sys.executable, "-m", "harness.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        copy, results = Path(tmp) / Path(spec_path).name, Path(tmp) / "results"
        copy.write_text(yaml.safe_dump(raw))
        t0 = time.monotonic()
        try:
            done = subprocess.run([*cli, "sweep", str(copy), "--device", device, "--trials", str(trials), "--timeout",
                                   f"{max(int(timeout_s / 2), 1)}s", "--results", str(results)],
                                  cwd=root, capture_output=True, text=True, timeout=max(timeout_s, 1))
            if done.returncode:
                raise RuntimeError(f"bench sweep exited {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
        except subprocess.TimeoutExpired:
            pass  # the trial in flight is lost; the finished ones are in the study
        if not results.exists():
            return None
        wall = time.monotonic() - t0
        rows = json.loads(subprocess.run([*cli, "report", "--format", "json", "--results", str(results)],
                                         cwd=root, check=True, capture_output=True, text=True).stdout)
    best = next((r for r in rows if r.get("best")), None)
    spoiled = [r for r in rows if r.get("noisy") or r.get("busy")]
    if best is None and spoiled:  # a loaded machine is an outcome to state, not a failure of the sweep
        raise BusyMachine(f"no config qualified as best: {len(spoiled)} of {len(rows)} trials ran on a busy machine "
                          "or too noisy to rank; run it again on a quiet one")
    return best and {"config": best["config"], "throughput": best["speed"]["value"], "peak_memory": best["peak_memory"],
                     "trials": len(rows), "wall_s": wall}
