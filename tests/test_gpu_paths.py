"""The CUDA paths issue 23 fixed, checked where a GPU is lent: `python -m pytest -q -m gpu`.

FSDP's mixed precision is FSDP2's MixedPrecisionPolicy (bf16 weights inside the forward, fp32
shards, no autocast); cuDNN benchmarking's workspaces fall in the first steps' window, not the steady
peak; the CUDA context is counted on every rank (NVML's baseline is read before the rank's
set_device creates it). One GPU is enough for all but the 2-rank check, which runs where there are two.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import record
from tests.conftest import gpu_count
from tests.test_measure import run

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
CONV = {"name": "emberformer", "params": {"frames": 4, "image": 128, "channels": 12, "patch": 8, "d_model": 64,
                                          "layers": 2, "heads": 4, "ff": 256, "stage_dims": [32, 64, 160, 256],
                                          "decoder_dim": 256, "samples": 2048}}


def cli_trial(*sets: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "harness.cli", "trial", str(ROOT / "sweeps" / "gpt.yaml"),
                           "--preset", "tiny", "--device", "cuda", *(a for s in sets for a in ("--set", s))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.gpu
def test_fsdp_bf16_mixed_is_fsdp2_mixed_precision_policy():
    """All-gathered weights are bf16 inside the forward; the shards the optimizer steps stay fp32."""
    rec = cli_trial("nproc=1", "parallel=fsdp", "precision=bf16-mixed")
    assert rec["status"] == record.OK, rec.get("error")
    assert rec["distributed"]["mixed_precision"] == {"sharded": "torch.float32", "in_forward": "torch.bfloat16"}
    assert abs(rec["loss"]["first"] - rec["loss"]["reference"]) < 0.05 * rec["loss"]["reference"]


@pytest.mark.gpu
def test_fsdp_never_places_the_whole_model_and_bf16_true_shards_bf16():
    rec = cli_trial("nproc=1", "parallel=fsdp", "precision=bf16-true")
    assert rec["status"] == record.OK, rec.get("error")
    assert rec["distributed"]["mixed_precision"] == {"sharded": "torch.bfloat16", "in_forward": "torch.bfloat16"}


@pytest.mark.gpu
def test_cudnn_benchmark_workspaces_stay_out_of_the_steady_peak(tmp_path):
    """cudnn.benchmark tries every algorithm with its workspace in the first steps; the steady peak
    of the config with it is the steady peak without it, give or take the chosen algorithm's workspace."""
    plain = run(tmp_path, CONV, {"batch_size": 32, "precision": "bf16-mixed"}, device="cuda:0", timeout=300)
    bench = run(tmp_path, CONV, {"batch_size": 32, "precision": "bf16-mixed", "cudnn_benchmark": True},
                device="cuda:0", timeout=300)
    for rec in (plain, bench):
        assert rec["status"] == "ok", rec.get("error")
        assert rec["memory"]["first_step_peak"] > 0 and rec["peak_memory"] > 0
    slack = max(0.25 * plain["peak_memory"], 256 * MIB)  # the chosen algorithms' own workspaces
    assert bench["peak_memory"] <= plain["peak_memory"] + slack, (bench["memory"], plain["memory"])
    print(f"first-step / steady peak, MiB: plain {plain['memory']['first_step_peak'] / MIB:.0f} / "
          f"{plain['peak_memory'] / MIB:.0f}, cudnn_benchmark {bench['memory']['first_step_peak'] / MIB:.0f} / "
          f"{bench['peak_memory'] / MIB:.0f}")


@pytest.mark.gpu
def test_fp32_runs_with_torchs_cudnn_tf32_default(tmp_path):
    rec = run(tmp_path, CONV, {"batch_size": 8}, device="cuda:0", timeout=300)
    assert rec["status"] == "ok", rec.get("error")
    tf32 = rec["env"]["tf32"]
    assert tf32["cudnn_allow_tf32"] is True and tf32["float32_matmul_precision"] == "highest"
    assert tf32["torch_defaults"] == {"float32_matmul_precision": "highest", "cudnn_allow_tf32": True}


@pytest.mark.gpu
@pytest.mark.parametrize("nproc", [1, 2])
def test_every_rank_counts_its_cuda_context(nproc):
    """NVML's device-wide baseline is read before the rank's set_device creates its context, so the
    context (~0.5 GiB on an H100/H200) is counted on every rank even where NVML has no per-process figure."""
    if gpu_count() < nproc:
        pytest.skip(f"needs {nproc} GPUs")
    rec = cli_trial(f"nproc={nproc}", "parallel=ddp")
    assert rec["status"] == record.OK, rec.get("error")
    for rank, mem in enumerate(rec["memory"]["per_rank"]):
        assert mem["context_at_start"] and mem["context_at_start"] > 100 * MIB, (rank, mem["context_source"])
        assert mem["nvml_used_at_start"] is not None
