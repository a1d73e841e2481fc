"""One config of the Lightning example measured inside lightning.Trainer and in bench's own loop.

What the framework's step costs: the same module (the example's CharLM, with a plain AdamW so bench's
loop can build its optimizer without a Trainer), the same datamodule, batch size, precision and
accumulation; the Trainer adds its loop, precision plugin, logging hooks (self.log) and callbacks.
Rounds alternate the two loops in fresh processes (A B A B ...), so a change in machine load hits
both. Prints the samples/s of every run and the medians.

    python benchmarks/trainer_vs_loop.py --rounds 3 --set batch_size=16 --set precision=fp32
"""
import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import cv, load_spec, trial  # noqa: E402
from harness import spec as specs  # noqa: E402
from harness.cli import resolve_device  # noqa: E402

PLAIN = '''\
import torch
from charlm import CharLM


class PlainCharLM(CharLM):
    """CharLM with a constant-rate AdamW: bench's own loop has no Trainer for the schedule to ask."""
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
'''

CONFIG = {
    "model": {"class_path": "plain.PlainCharLM",
              "init_args": {"vocab_size": 128, "block_size": 128, "dim": 128, "layers": 4, "heads": 4, "lr": 3e-3}},
    "data": {"class_path": "charlm.CharData", "init_args": {"block_size": 128, "batch_size": 16}},
    "trainer": {"precision": "32-true", "accumulate_grad_batches": 1},
}


def project(folder: Path, loop: str) -> Path:
    shutil.copytree(ROOT / "examples" / "lightning", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "plain.py").write_text(PLAIN)
    (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    (folder / "sweep.yaml").write_text(yaml.safe_dump({
        "study": f"charlm-{loop}", "workload": {"lightning": True, "path": ".", "loop": loop},
        "search": {"batch_size": [16]}, "trial": {"timeout": "5m", "stall": "3m", "warmup_steps": 3, "max_seconds": 10},
        "apply": {"file": "config.yaml", "preset": "lightning"}}, sort_keys=False))
    return folder / "sweep.yaml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    device = resolve_device(args.device)
    rates: dict[str, list[float]] = {"trainer": [], "bench": []}
    with tempfile.TemporaryDirectory() as tmp:
        spec_of = {loop: load_spec(project(Path(tmp) / loop, loop)) for loop in rates}
        for round_ in range(args.rounds):
            for loop, spec in spec_of.items():
                rec = trial(spec, device, specs.parse_overrides(tuple(args.overrides), spec))
                if rec["status"] != "ok":
                    raise SystemExit(f"{loop}: trial ended {rec['status']}: {(rec.get('error') or {}).get('message')}")
                rates[loop].append(rec["throughput"])
                print(f"round {round_ + 1} {loop:7s} {rec['throughput']:8.1f} samples/s  "
                      f"step cv {rec['timing']['step_s']['cv']:.1%}  "
                      f"({rec['env']['device']}, {' '.join(f'{k}={v}' for k, v in rec['config'].items())})", flush=True)
    for loop, values in rates.items():
        print(f"{loop:7s} median {statistics.median(values):8.1f} samples/s over {len(values)} runs "
              f"(cv {cv(values):.1%})")
    ratio = statistics.median(rates["trainer"]) / statistics.median(rates["bench"])
    print(f"lightning.Trainer / bench's loop: {ratio:.2f}x")


if __name__ == "__main__":
    main()
