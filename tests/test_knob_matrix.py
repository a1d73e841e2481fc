"""Every value of every knob, on a tiny preset: it runs `ok` with a finite loss in a real child
trial, or the device refuses it before any trial with one clear line saying why.

One knob at a time from a plain baseline (not the cross product): a knob value that breaks a
trial breaks it alone. Compile is slow on a CPU, so each compile mode runs once, on the smallest
model; on a GPU compile modes are crossed with accumulation (CUDA graphs + accumulation is where
gradients went wrong).
"""
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from harness import knobs, launch, spec as specs
from harness.cli import main
from harness.spec import Measure
from harness.knobs import CHOICES as KNOB_CHOICES, UNIVERSAL as UNIVERSAL_KNOBS
from harness.workloads import WORKLOADS

FAST = Measure(warmup_steps=1, window_s=0.02, min_windows=2, max_windows=2, max_seconds=1).__dict__
BASE = {"batch_size": 4, "accumulation": 1, "precision": "fp32", "checkpointing": "none", "compile": "off"}

# Every value of every universal knob. batch_size and accumulation are open integers: two values each.
UNIVERSAL_VALUES = {
    "batch_size": [1, 3],
    "accumulation": [1, 2],
    **{knob: list(values) for knob, values in KNOB_CHOICES.items() if knob != "compile"},
    "num_workers": [0, 2],
    "pin_memory": [False, True],
    "cudnn_benchmark": [False, True],
    "expandable_segments": [False, True],
}
COMPILE_MODES = list(KNOB_CHOICES["compile"][1:])
# Each workload's own knobs, every value its tiny preset allows.
WORKLOAD_VALUES = {
    "emberformer": {"channels_last": [False, True]},
    "retrieval": {"hard_negatives": [0, 2]},
    "gpt": {"seq_len": [16, 32]},
    "nli-encoder": {"freeze_encoder": [False, True]},
    "naics": {"n_negatives": [1, 3]},
}


# Knobs of trials over several processes, each value run in 2-rank trials by tests/test_distributed.py
# (parallel's values run here too, as one rank each).
COVERED_BY_DISTRIBUTED = {"nproc", "reshard_after_forward"}


def test_the_matrix_covers_every_knob():
    assert set(UNIVERSAL_VALUES) | {"compile"} | COVERED_BY_DISTRIBUTED == UNIVERSAL_KNOBS
    for name, info in WORKLOADS.items():
        assert set(WORKLOAD_VALUES[name]) == set(info.knobs), name
        # a knob whose values are true/false is declared a flag, so a spec's `channels_last: yes please` is refused
        assert {k for k, vs in WORKLOAD_VALUES[name].items() if all(isinstance(v, bool) for v in vs)} == info.flags, name


def run_trial(tmp_path: Path, workload: dict, config: dict, device: str) -> dict:
    job = {"workload": workload, "config": {**BASE, **config}, "device": device, "memory_budget": None,
           "measure": FAST, "seed": 0}
    return launch.run(job, launch.Limits(300, 120), tmp_path / "trial.log")


def tiny(name: str, **params) -> dict:
    return {"name": name, "preset": "tiny", "params": {**WORKLOADS[name].presets["tiny"], **params}}


def assert_runs_or_is_refused(tmp_path, workload, knob, value, device):
    why = specs.refusal(knob, value, device)
    if why:
        assert_refused_by_the_cli(tmp_path, workload["name"], knob, value, device)
        return
    rec = run_trial(tmp_path, workload, {knob: value}, device)
    assert rec["status"] == "ok", f"{knob}={value}: {rec['status']}: {rec.get('error')}"
    assert rec["loss"]["finite"] and math.isfinite(rec["loss"]["last"]), (knob, value, rec["loss"])


def assert_refused_by_the_cli(tmp_path, workload_name, knob, value, device):
    """`bench trial --set knob=value` on this device: exit 2, one line naming the value and why, no trial."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"study": "m", "workload": {"name": workload_name, "preset": "tiny"},
                                    "search": {"batch_size": [4]}}))
    text = str(value).lower() if isinstance(value, bool) else str(value)
    res = CliRunner().invoke(main, ["trial", str(spec), "--device", device, "--set", f"{knob}={text}"])
    assert res.exit_code == 2, (knob, value, res.output)
    lines = [line for line in res.output.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and f"{knob}: {text} cannot run on" in lines[0], res.output
    assert "Traceback" not in res.output


# Default values are what the baseline trial runs; every other value gets its own trial.
UNIVERSAL_CASES = [(k, v) for k, values in UNIVERSAL_VALUES.items() for v in values
                   if knobs.DEFAULTS.get(k, object()) != v]


@pytest.mark.parametrize("knob,value", UNIVERSAL_CASES, ids=[f"{k}={v}" for k, v in UNIVERSAL_CASES])
def test_universal_knob_on_cpu(tmp_path, knob, value):
    assert_runs_or_is_refused(tmp_path, tiny("emberformer"), knob, value, "cpu")


def test_baseline_on_cpu(tmp_path):
    """Every knob at its default: optimizer default, no workers, fp32, no checkpointing, no compile."""
    defaults = {k: v for k, v in knobs.DEFAULTS.items() if k in UNIVERSAL_VALUES}
    rec = run_trial(tmp_path, tiny("emberformer"), defaults, "cpu")
    assert rec["status"] == "ok" and rec["loss"]["finite"], rec.get("error")


SMALLEST = {"factory": "faulty:build", "params": {"width": 16, "depth": 1}}


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compile_mode_on_cpu(tmp_path, faulty_path, mode):
    """Once per mode, on the smallest model (two Linear layers): CPU compile costs seconds per kernel."""
    if specs.refusal("compile", mode, "cpu"):
        assert_refused_by_the_cli(tmp_path, "gpt", "compile", mode, "cpu")
        return
    rec = run_trial(tmp_path, SMALLEST, {"compile": mode}, "cpu")
    assert rec["status"] == "ok" and rec["loss"]["finite"], rec.get("error")
    assert rec["timing"]["compile_s"] > 0 and rec["cuda_graphs"]["wanted"] is False


WORKLOAD_CASES = [(w, k, v) for w, knobs in WORKLOAD_VALUES.items() for k, values in knobs.items() for v in values]


@pytest.mark.parametrize("workload,knob,value", WORKLOAD_CASES, ids=[f"{w}-{k}={v}" for w, k, v in WORKLOAD_CASES])
def test_workload_knob_on_cpu(tmp_path, workload, knob, value):
    assert_runs_or_is_refused(tmp_path, tiny(workload), knob, value, "cpu")


def test_cpu_refuses_exactly_the_cuda_only_values():
    refused = {(k, v) for k, values in UNIVERSAL_VALUES.items() for v in values if specs.refusal(k, v, "cpu")}
    refused |= {("compile", m) for m in COMPILE_MODES if specs.refusal("compile", m, "cpu")}
    assert refused == {("precision", "tf32"), ("compile", "reduce-overhead"), ("pin_memory", True),
                       ("cudnn_benchmark", True), ("expandable_segments", True)}
    assert not any(specs.refusal(k, v, "cuda:0") for k, v in refused)


# ---- the same matrix on a CUDA GPU ----------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("knob,value", UNIVERSAL_CASES, ids=[f"{k}={v}" for k, v in UNIVERSAL_CASES])
def test_universal_knob_on_cuda(tmp_path, knob, value):
    assert_runs_or_is_refused(tmp_path, tiny("emberformer"), knob, value, "cuda:0")


@pytest.mark.gpu
@pytest.mark.parametrize("accumulation", [1, 2, 3])
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compile_mode_by_accumulation_on_cuda(tmp_path, mode, accumulation):
    rec = run_trial(tmp_path, tiny("gpt"), {"compile": mode, "accumulation": accumulation}, "cuda:0")
    assert rec["status"] == "ok", rec.get("error")
    assert rec["loss"]["finite"]
    wants_graphs = mode in ("reduce-overhead", "max-autotune")
    assert rec["cuda_graphs"]["wanted"] is wants_graphs


@pytest.mark.gpu
@pytest.mark.parametrize("workload,knob,value", WORKLOAD_CASES, ids=[f"{w}-{k}={v}" for w, k, v in WORKLOAD_CASES])
def test_workload_knob_on_cuda(tmp_path, workload, knob, value):
    assert_runs_or_is_refused(tmp_path, tiny(workload), knob, value, "cuda:0")
