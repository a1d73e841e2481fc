"""Measurement you can trust: real trials in child processes, checked against what must hold."""
import math
import platform
from pathlib import Path

import pytest

from harness import footprint, launch, live, measure, pareto
from harness.record import Record
from harness.spec import Measure


FAST = Measure(warmup_steps=1, window_s=0.05, min_windows=2, max_windows=3, max_seconds=1).__dict__
TINY_EMBER = {"name": "emberformer", "params": {"frames": 2, "image": 32, "channels": 4, "patch": 8, "d_model": 32,
                                                "layers": 1, "heads": 2, "ff": 64, "stage_dims": [16, 32],
                                                "decoder_dim": 32, "samples": 256}}


def run(tmp_path, workload, config, device="cpu", budget=None, timeout=60):
    config = {"accumulation": 1, "precision": "fp32", "checkpointing": "none", "compile": "off", **config}
    job = {"workload": workload, "config": config, "device": device, "memory_budget": budget,
           "measure": FAST, "seed": 0}
    return launch.run(job, launch.Limits(timeout, 30), Path(tmp_path) / "trial.log")


def test_breakdown_parts_are_positive_and_fit_in_the_peak(tmp_path):
    rec = run(tmp_path, TINY_EMBER, {"batch_size": 8})
    assert rec["status"] == "ok", rec.get("error")
    parts = rec["memory"]["breakdown"]
    assert set(parts) == {"weights", "gradients", "optimizer", "activations"}
    assert all(v > 0 for v in parts.values()), parts
    assert sum(parts.values()) <= rec["peak_memory"]
    # AdamW keeps two moments per parameter: its state is about twice the fp32 weights
    assert 1.8 * parts["weights"] <= parts["optimizer"] <= 2.2 * parts["weights"] + 4096


def test_checkpointing_saves_measured_activation_memory(tmp_path):
    plain = run(tmp_path, TINY_EMBER, {"batch_size": 8})
    ckpt = run(tmp_path, TINY_EMBER, {"batch_size": 8, "checkpointing": "full"})
    assert ckpt["memory"]["breakdown"]["activations"] < 0.7 * plain["memory"]["breakdown"]["activations"]


def test_flops_of_a_plain_mlp_match_the_analytic_count(tmp_path, faulty_path):
    """faulty's Net: depth residual Linear(w, w) blocks + one Linear(w, w) head.

    Forward: 2*B*w*w per layer. Backward: weight grads for every layer, input grads for all but
    the first (the data needs no grad): per step B*w*w*(6*depth + 4), times accumulation.
    """
    width, depth, batch, accum = 32, 2, 8, 3
    wl = {"factory": "faulty:build", "params": {"width": width, "depth": depth}}
    rec = run(tmp_path, wl, {"batch_size": batch, "accumulation": accum})
    assert rec["status"] == "ok", rec.get("error")
    assert rec["flops"]["per_step"] == batch * width * width * (6 * depth + 4) * accum
    assert rec["flops"]["tflops"] > 0
    assert rec["flops"]["mfu"] is None  # a CPU has no peak in the table: no invented MFU


def test_an_fp32_convolutions_flops_are_weighed_at_the_tf32_peak_cudnn_runs_them_at():
    """cuDNN runs fp32 convolutions in TF32 by default: MFU against the fp32 peak alone read 8x too high
    for a convolutional model on an A100 (156 against 19.5 TFLOP/s)."""
    import torch
    conv, head = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8 * 16 * 16, 10)
    x = torch.randn(4, 3, 16, 16)
    counted = measure.count_flops(lambda: head(conv(x).flatten(1)).sum().backward())
    forward = 2 * 4 * 8 * 16 * 16 * 3 * 3 * 3  # 2 x batch x out channels x pixels x kernel x in channels
    assert counted["conv"] == 2 * forward  # the forward and the weight gradient (the input needs none)
    assert counted["total"] == counted["conv"] + 3 * 2 * 4 * 8 * 16 * 16 * 10  # the Linear's 3 matmuls
    a100 = "NVIDIA A100-SXM4-80GB"
    assert measure.peak_tflops(a100, "fp32") == 19.5
    assert measure.peak_tflops(a100, "fp32", conv_share=0.5, conv_tf32=True) == pytest.approx(1 / (0.5 / 156 + 0.5 / 19.5))
    assert measure.peak_tflops(a100, "fp32", conv_share=0.5, conv_tf32=False) == 19.5  # cuDNN's TF32 turned off
    assert measure.peak_tflops(a100, "bf16-mixed", conv_share=0.5, conv_tf32=True) == 312.0


def test_a_budget_that_fits_is_ok_and_one_that_does_not_is_a_real_oom(tmp_path):
    fits = run(tmp_path, TINY_EMBER, {"batch_size": 4}, budget=2 * 1024**3)
    assert fits["status"] == "ok", fits.get("error")
    assert fits["peak_memory"] < 2 * 1024**3
    tight = run(tmp_path, TINY_EMBER, {"batch_size": 8}, budget=4 * 1024**2)
    assert tight["status"] == "oom"
    assert ("allocate" in tight["error"]["message"] or tight["error"]["type"] == "MemoryError"
            or tight["error"]["message"] in ("could not create a primitive", "could not execute a primitive"))  # oneDNN


def test_non_finite_loss_is_diverged_never_ok(tmp_path, faulty_path):
    rec = run(tmp_path, {"factory": "faulty:build", "params": {"fault": "inf", "at_step": 3}}, {"batch_size": 8})
    assert rec["status"] == "diverged"
    assert "inf" in rec["error"]["message"]


def test_mixed_precision_starts_from_the_fp32_reference_loss(tmp_path):
    rec = run(tmp_path, TINY_EMBER, {"batch_size": 4, "precision": "bf16-mixed"})
    assert rec["status"] == "ok"
    loss = rec["loss"]
    assert math.isclose(loss["first"], loss["reference"], rel_tol=0.05)


def test_warmup_and_compile_are_timed_apart_from_measured_steps(tmp_path):
    rec = run(tmp_path, TINY_EMBER, {"batch_size": 4})
    t = rec["timing"]
    assert t["first_step_s"] > 0 and t["warmup_s"] > 0 and t["compile_s"] == 0.0
    assert t["measured_steps"] >= t["windows"] >= 2
    step = t["step_s"]
    assert step["p10"] <= step["median"] <= step["p90"] and step["cv"] >= 0
    assert t["first_step_s"] + t["warmup_s"] + t["measure_s"] <= t["wall_s"]
    # the first step and the warm-up are not among the measured steps (every step's loss is kept)
    assert rec["loss"]["steps"] == 1 + t["warmup_steps"] + t["measured_steps"]
    assert rec["loss"]["scatter"] > 0  # every micro-batch is another batch: the yardstick of "its loss rose"
    # the CPU's bf16 layer speed-up, the planner's bf16 prior: 0.03-0.04 on an AVX2-only AMD EPYC (bf16 emulated)
    assert 0 < rec["env"]["cpu_bf16_speedup"] < 20
    assert t["measured_steps"] == t["window_steps"] * t["windows"] == t["window_steps"] * len(t["window_step_s"])
    assert rec["samples_per_s"]["p10"] <= rec["throughput"] <= rec["samples_per_s"]["p90"]


def test_peak_is_tracked_per_window_and_the_record_holds_the_last(tmp_path):
    rec = run(tmp_path, TINY_EMBER, {"batch_size": 4})
    peaks = rec["memory"]["peak_by_window"]
    assert len(peaks) == rec["timing"]["windows"]
    assert peaks == sorted(peaks) and peaks[-1] == rec["peak_memory"]


def test_records_carry_an_environment_stamp(tmp_path):
    rec = run(tmp_path, TINY_EMBER, {"batch_size": 4})
    env = rec["env"]
    for key in ("device", "device_count", "device_total", "driver", "cuda", "torch", "python", "os", "hostname", "bench"):
        assert key in env
    assert env["device_total"] > 0 and env["torch"].startswith("2.")
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() == "x86_64" and cpuinfo.exists():  # the planner's bf16 prior on a CPU reads this
        flags = set(cpuinfo.read_text().split())
        assert env["cpu_bf16"] is bool({"avx512_bf16", "amx_bf16"} & flags)


@pytest.mark.gpu
def test_gpu_trial_reads_allocator_context_and_nvml(tmp_path):
    rec = run(tmp_path, TINY_EMBER, {"batch_size": 8, "precision": "bf16-mixed"}, device="cuda:0")
    assert rec["status"] == "ok", rec.get("error")
    mem = rec["memory"]
    assert mem["peak_reserved"] >= mem["peak_allocated"] > 0
    assert mem["context_bytes"] and mem["context_bytes"] > 0
    assert rec["peak_memory"] == mem["peak_reserved"] + mem["context_bytes"]
    assert mem["nvml_used"] and mem["device_total"] > 0


@pytest.mark.gpu
def test_gpu_budget_gives_a_real_cuda_oom(tmp_path):
    rec = run(tmp_path, TINY_EMBER, {"batch_size": 256}, device="cuda:0", budget=600 * 1024**2)
    assert rec["status"] == "oom"
    assert "out of memory" in rec["error"]["message"].lower()


@pytest.mark.gpu
def test_gpu_mfu_is_reported_against_a_named_peak(tmp_path):
    rec = run(tmp_path, TINY_EMBER, {"batch_size": 32, "precision": "bf16-mixed"}, device="cuda:0")
    if rec["flops"]["peak_tflops"] is None:
        pytest.skip(f"no datasheet peak for {rec['env']['device']}")
    assert 0 < rec["flops"]["mfu"] < 1


def test_nvml_reads_the_gpu_cuda_means_not_nvml_index_0(monkeypatch):
    """NVML numbers all GPUs of the machine; a trial sees its GPU as cuda:0 through CUDA_VISIBLE_DEVICES."""
    import sys
    import types

    from harness import nvml
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: ("index", i),
        nvmlDeviceGetHandleByUUID=lambda u: ("uuid", u),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used={("index", 5): 5000, ("uuid", "GPU-abc"): 7000,
                                                                      ("index", 0): 1}[h]))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert nvml.used_bytes(1) == 5000
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert nvml.used_bytes(0) == 7000
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml.used_bytes(0) == 1


def test_a_config_far_under_the_best_so_far_stops_after_two_windows_and_says_so(tmp_path):
    def with_measure(**extra):
        config = {"batch_size": 8, "accumulation": 1, "precision": "fp32", "checkpointing": "none", "compile": "off"}
        measure = dict(FAST, min_windows=4, max_windows=6, max_seconds=30, target_cv=0.0, **extra)
        job = {"workload": TINY_EMBER, "config": config, "device": "cpu", "memory_budget": None,
               "measure": measure, "seed": 0}
        return launch.run(job, launch.Limits(60, 30), Path(tmp_path) / "trial.log")

    cut = with_measure(slow_below=1e9)  # no CPU runs a billion samples/s
    assert cut["status"] == "ok" and cut["timing"]["windows"] == 2 and "under" in cut["timing"]["cut_short"]
    assert cut["throughput"] > 0 and cut["timing"]["step_s"]["n"] == 2  # still a real, if short, measurement
    assert cut["memory"]["breakdown"] is None  # out of the race: its memory is not taken apart
    full = with_measure(slow_below=1.0, warm_slow_below=0.5, warmup_steps=2)
    assert full["timing"]["windows"] >= 4 and "cut_short" not in full["timing"]
    assert full["timing"]["warmup_steps"] == 2
    assert full["memory"]["breakdown"]["activations"] > 0


def test_an_eager_config_far_under_the_best_stops_after_one_warm_up_step_and_says_so(tmp_path):
    """One warm-up step under `warm_slow_below` ends the timing: no further warm-up, no window; that
    step (not the first, which holds one-off work) is the throughput, the first steps' peak the peak."""
    config = {"batch_size": 8, "accumulation": 1, "precision": "fp32", "checkpointing": "none", "compile": "off"}
    measure = dict(FAST, warmup_steps=3, min_windows=4, max_windows=6, target_cv=0.0, slow_below=1e9,
                   warm_slow_below=1e9)
    job = {"workload": TINY_EMBER, "config": config, "device": "cpu", "memory_budget": None, "measure": measure,
           "seed": 0}
    cut = launch.run(job, launch.Limits(60, 30), Path(tmp_path) / "trial.log")
    timing = cut["timing"]
    assert cut["status"] == "ok" and timing["cut_at"] == "1 warm-up step" and "first warm-up step" in timing["cut_short"]
    assert timing["warmup_steps"] == 1 and timing["windows"] == 0 and timing["step_s"]["n"] == 1
    assert cut["loss"]["steps"] == 2  # the first step and one warm-up step, nothing after
    assert cut["throughput"] == pytest.approx(8 / timing["window_step_s"][0])
    assert 0 < cut["peak_memory"] == cut["memory"]["peak_by_window"][0]
    assert cut["memory"]["breakdown"] is None
    # one step's timing has no spread: not "cv 0.0%" and the least precise figure, not the most
    assert Record.of(cut).step_cv is None and pareto.noise(cut) == pareto.MAX_NOISE
    assert ", cv -, " in live.outcome(cut) and "1 warm-up step: under 25% of the best so far" in live.outcome(cut)


def test_a_long_warm_up_step_is_judged_against_the_higher_bar_and_a_short_one_is_not(tmp_path, faulty_path):
    """`long_warm_slow_below` applies only where the first warm-up step took `long_warm_step_s` or
    more: the same trial, the same bars, cut or timed in full by that step's length alone. The first
    step sleeps 400 ms and the others 40 ms, so the warm-up step is never slower than the first (that
    one is not cut on) however busy the machine: a real model's 10 ms first step was, under load."""
    config = {"batch_size": 8, "accumulation": 1, "precision": "fp32", "checkpointing": "none", "compile": "off"}
    workload = {"factory": "faulty:build", "params": {"steady_ms": 40, "slow_ms": 400, "at_step": 1}}

    def run(long_s: float) -> dict:
        measure = dict(FAST, warmup_steps=2, slow_below=1e-9, warm_slow_below=1e-9, long_warm_slow_below=1e9,
                       long_warm_step_s=long_s)
        job = {"workload": workload, "config": config, "device": "cpu", "memory_budget": None,
               "measure": measure, "seed": 0}
        return launch.run(job, launch.Limits(60, 30), Path(tmp_path) / f"trial-{long_s}.log")

    cut, full = run(0.0), run(1e9)  # every step is "long" / none is
    assert cut["status"] == "ok" and cut["timing"]["cut_at"] == "1 long warm-up step"
    assert cut["timing"]["windows"] == 0 and cut["loss"]["steps"] == 2
    assert ", 1 long warm-up step: under 55% of the best so far" in live.outcome(cut)
    assert full["status"] == "ok" and "cut_short" not in full["timing"] and full["timing"]["windows"] >= 2
    assert full["timing"]["warmup_steps"] == 2


def test_a_warm_up_step_slower_than_the_first_is_not_cut_on(tmp_path, faulty_path):
    """A quickstart trial's warm-up step ran 1.34x its first step (something else took the cores) and was
    cut at a third of the config's speed, its family never measured again. A warm step slower than the
    cold first one is timed on; the same step slow as the first step is cut as before."""
    config = {"batch_size": 8, "accumulation": 1, "precision": "fp32", "checkpointing": "none", "compile": "off"}

    def run_slow_at(step: int) -> dict:
        workload = {"factory": "faulty:build", "params": {"steady_ms": 40, "slow_ms": 400, "at_step": step}}
        measure = dict(FAST, warmup_steps=2, slow_below=1e-9, warm_slow_below=1e9, max_seconds=3)
        job = {"workload": workload, "config": config, "device": "cpu", "memory_budget": None,
               "measure": measure, "seed": 0}
        return launch.run(job, launch.Limits(60, 30), Path(tmp_path) / f"trial-{step}.log")

    disturbed, slow_config = run_slow_at(2), run_slow_at(1)  # the first warm-up step; the first step
    assert disturbed["status"] == "ok" and "cut_at" not in disturbed["timing"], disturbed["timing"]
    assert disturbed["timing"]["windows"] >= 2 and disturbed["timing"]["warmup_steps"] == 2
    assert slow_config["status"] == "ok" and slow_config["timing"]["cut_at"] == "1 warm-up step"


# ---- what counts as out of memory (harness.errors) ------------------------------------------------------

@pytest.mark.parametrize("library", ["cublas", "cudnn", "nccl"])
def test_a_librarys_allocation_failure_is_an_oom(tmp_path, faulty_path, library):
    """cuBLAS, cuDNN and NCCL say they ran out of memory in their own words (tests/workloads/faulty.py
    quotes them from pytorch's sources); the search must learn the wall there, not see an error."""
    wl = {"factory": "faulty:build", "params": {"fault": "library_oom", "library": library, "at_step": 2}}
    rec = run(tmp_path, wl, {"batch_size": 8})
    assert rec["status"] == "oom", rec.get("error")


def test_cudnns_not_supported_is_an_oom_only_at_the_wall(tmp_path, faulty_path):
    wl = {"factory": "faulty:build", "params": {"fault": "library_oom", "library": "cudnn_not_supported", "at_step": 2}}
    assert run(tmp_path, wl, {"batch_size": 8})["status"] == "error"
    assert run(tmp_path, wl, {"batch_size": 8}, budget=2 * 1024**3)["status"] == "oom"


def test_oom_table_reads_the_cause_chain():
    from harness import errors
    try:
        try:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        except RuntimeError as inner:
            raise ValueError("the user's loss failed") from inner
    except ValueError as outer:
        assert errors.is_oom(outer)
    assert not errors.is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling `cublasSgemm`"))
    assert not errors.is_oom(RuntimeError("GET was unable to find an engine to execute this computation"))
    assert errors.is_oom(RuntimeError("GET was unable to find an engine to execute this computation"), at_wall=True)
    # oneDNN's other refusal at a CPU wall (the gpu suite's "just over" batch on an AVX2-only EPYC, in backward)
    assert errors.is_oom(RuntimeError("could not execute a primitive"), at_wall=True)
    assert not errors.is_oom(RuntimeError("could not execute a primitive"))


# ---- the peak windows: first steps, then the steady state ----------------------------------------------

def test_first_step_work_is_its_own_peak_and_not_the_configs(tmp_path, faulty_path):
    """A first step that allocates 256 MiB once (as cuDNN benchmarking or autotuning does) shows in
    first_step_peak; peak_memory, the steady state's, holds what every step needs."""
    wl = {"factory": "faulty:build", "params": {"first_step_mib": 256}}
    rec = run(tmp_path, wl, {"batch_size": 8})
    assert rec["status"] == "ok", rec.get("error")
    mem = rec["memory"]
    assert mem["first_step_peak"] >= 256 * 2**20
    assert 0 < rec["peak_memory"] < 64 * 2**20, rec["peak_memory"]
    plain = run(tmp_path, {"factory": "faulty:build", "params": {}}, {"batch_size": 8})
    assert plain["memory"]["first_step_peak"] < 64 * 2**20


# ---- the loss is compiled with the model ------------------------------------------------------------------

def test_the_loss_is_in_the_compiled_graph_with_the_model(monkeypatch):
    """nanoGPT compiles its model with the loss inside: one graph holds the matmuls and the cross-entropy."""
    import functools

    import torch
    import torch.nn.functional as F

    from harness import transforms
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    torch._dynamo.reset()
    model = torch.nn.Linear(16, 10)
    loss_of = transforms.compiled_loss(lambda m, b: F.cross_entropy(m(b[0]), b[1]), model, "default")
    loss_of((torch.randn(4, 16), torch.tensor([1, 2, 3, 4])))
    assert len(graphs) == 1
    ops = {str(n.target) for n in graphs[0].graph.nodes if n.op in ("call_function", "call_module")}
    assert any("linear" in op for op in ops) and any("cross_entropy" in op for op in ops), ops


@pytest.mark.parametrize("live, kept", [
    ([0, 1, 2, 3], True),  # MiB after each window: a tensor kept every step
    ([0, 1, 2], True),
    ([0, 4.8, 6.0, 6.8], False),  # a cache filling up, one entry per batch shape (an audit's padded batches)
    ([0, 1, 1, 2], False),  # not in every window
    ([0, 0.05, 0.1, 0.15], False),  # under 256 KiB over the trial
])
def test_a_leak_is_growth_in_every_window_that_does_not_slow_down(live, kept):
    found = footprint.leak({"live_by_window": [int(m * 2**20) for m in live]}, 10)
    assert (found is not None) == kept
    if kept:
        assert found["steps"] == 10 * (len(live) - 1) and found["bytes_per_step"] == pytest.approx(2**20 / 10)
