"""Shared by the benchmark scripts: run one config of a spec in a fresh child, as `bench trial` does."""
import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

from harness import launch, spec as specs
from harness.cli import resolve_device


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--spec", default="sweeps/emberformer.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--device", default="auto")
    p.add_argument("--preset", help="workload preset (default: the spec's)")
    return p


def run(args, **measure) -> dict:
    """One trial of the config in a fresh process; `measure` overrides the spec's trial settings."""
    spec = specs.load(args.spec)
    if args.preset:
        spec = specs.with_preset(spec, args.preset)
    spec = dataclasses.replace(spec, measure=dataclasses.replace(spec.measure, **measure))
    device = resolve_device(args.device)
    config = specs.trial_config(spec, specs.parse_overrides(tuple(args.overrides), spec))
    job = spec.job(device, config)
    with tempfile.TemporaryDirectory() as tmp:
        rec = launch.run(job, launch.Limits(1800, 600), Path(tmp) / "trial.log")
    if rec["status"] != "ok":
        raise SystemExit(f"trial ended {rec['status']}: {(rec.get('error') or {}).get('message')}")
    return rec


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def describe(rec: dict) -> str:
    return f"{rec['env']['device']}, " + " ".join(f"{k}={v}" for k, v in rec["config"].items())
