"""Each knob does what it says on every device: the issue #12 findings, one test each."""
import math
from pathlib import Path

import pytest
import torch

from harness import footprint, launch, measure, nvml, spec as specs, transforms
from harness.errors import UserError
from harness.spec import Measure
from harness.knobs import CHOICES as KNOB_CHOICES
from harness.workloads import WORKLOADS

FAST = Measure(warmup_steps=1, window_s=0.02, min_windows=2, max_windows=2, max_seconds=1).__dict__


def run_trial(tmp_path, config, device="cpu"):
    workload = {"name": "emberformer", "preset": "tiny", "params": WORKLOADS["emberformer"].presets["tiny"]}
    config = {"batch_size": 2, "accumulation": 1, "precision": "fp32", "checkpointing": "none", "compile": "off",
              **config}
    job = {"workload": workload, "config": config, "device": device, "memory_budget": None, "measure": FAST,
           "seed": 0}
    return launch.run(job, launch.Limits(120, 60), Path(tmp_path) / "trial.log")


# ---- precision --------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", KNOB_CHOICES["precision"])
def test_legacy_tf32_getters_still_read_after_each_precision(precision):
    """Inductor and user code read the legacy flags; setting only the new API made them raise."""
    transforms.set_numerics(precision, False)
    mode = transforms.tf32_mode()  # reads get_float32_matmul_precision, matmul.allow_tf32, cudnn.allow_tf32
    assert mode["cudnn_allow_tf32"] is mode["torch_defaults"]["cudnn_allow_tf32"] is True  # torch's default, every precision
    assert mode["float32_matmul_precision"] == ("high" if precision == "tf32" else "highest")
    assert torch.backends.cuda.matmul.fp32_precision in ("tf32" if precision == "tf32" else "ieee",)
    transforms.set_numerics("fp32", False)


def test_bf16_true_casts_float_inputs_and_keeps_token_ids():
    batch = {"image": torch.ones(2, 3), "ids": torch.arange(4), "pair": (torch.zeros(1), torch.tensor([1]))}
    out = transforms.to_device(batch, torch.device("cpu"), False, transforms.input_dtype("bf16-true"))
    assert out["image"].dtype == torch.bfloat16 and out["pair"][0].dtype == torch.bfloat16
    assert out["ids"].dtype == torch.int64 and out["pair"][1].dtype == torch.int64
    assert transforms.input_dtype("bf16-mixed") is None


def test_bf16_true_trains_an_image_model(tmp_path):
    """`--set precision=bf16-true` on emberformer ended in `error`: float frames met bf16 weights."""
    rec = run_trial(tmp_path, {"precision": "bf16-true"})
    assert rec["status"] == "ok", rec.get("error")
    assert math.isfinite(rec["loss"]["last"])


# ---- memory accounting --------------------------------------------------------------------------------

def test_activations_leave_out_saved_weights():
    """2 x Linear(1024), batch 2: Linear saves its weight for backward; that is weights, not activations."""
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
    x = torch.randn(2, 1024, requires_grad=True)
    acts = measure.saved_activation_bytes(lambda: model(x).sum(), list(model.parameters()))
    assert acts <= 2 * 2 * 1024 * 4 + 1024  # the two inputs of 2x1024 floats (~16 KiB), not 4 MiB of weights
    with_weights = measure.saved_activation_bytes(lambda: model(x).sum())
    assert with_weights >= 2 * 1024 * 1024 * 4  # what it counted before


def test_autocasts_copies_of_the_weights_are_not_activations():
    """Under bf16 autocast Linear saves a bf16 copy of its weight (its transpose): 2 MiB for a 1024x1024
    layer at batch 2, which was counted as that batch's activations and inflated the per-sample prior."""
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    x = torch.randn(2, 1024)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        acts = measure.saved_activation_bytes(lambda: model(x).sum(), list(model.parameters()))
    assert 0 < acts <= 2 * 2 * 1024 * 2 + 1024  # the bf16 input and ReLU output of 2x1024, not the cast weight
    assert acts < 1024 * 1024 * 2  # what it counted before: one bf16 weight, 2,105,344 bytes with them
    model[2].weight.requires_grad_(False)  # frozen (a LoRA base, a frozen backbone): its copy has no graph to trace
    x.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        frozen = measure.saved_activation_bytes(lambda: model(x).sum(), list(model.parameters()))
    assert frozen < 1024 * 1024 * 2
    query = torch.nn.Parameter(torch.randn(1, 4, 64))  # expanded to the batch, then cast: the batch's copies

    def expanded(batch):
        keys = torch.randn(batch, 4, 64, requires_grad=True)  # so the matmul saves the query's side too
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return measure.saved_activation_bytes(
                lambda: torch.matmul(query.expand(batch, -1, -1).to(torch.bfloat16), keys.transpose(1, 2)).sum(), [query])
    assert expanded(64) >= 2 * 64 * 4 * 64 * 2  # the keys' bf16 copy and the expanded query's, at batch 64


def test_allocation_retries_before_the_steady_window_are_not_the_configs(monkeypatch):
    """The allocator counts retries from the process's start and reset_peak_memory_stats keeps the count:
    the fp32 reference pass and the first steps' 7 retries made the report say the best "ran at the memory
    wall" though its steady steps retried twice. Staged allocator (no GPU here): 7 before, 9 at the end."""
    retries = iter([7, 9])
    stats = lambda device: {"num_alloc_retries": next(retries), "num_ooms": 0}
    for name, value in {"memory_stats": stats, "max_memory_allocated": lambda d: 1, "max_memory_reserved": lambda d: 2,
                        "get_device_properties": lambda d: type("P", (), {"total_memory": 80 * 2**30})}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(measure, "context_reading", lambda device, before: {"bytes": 0, "source": "staged"})
    monkeypatch.setattr(measure, "release_cached", lambda device: None)
    monkeypatch.setattr(measure, "reset_peak", lambda device: None)
    monkeypatch.setattr(nvml, "used_bytes", lambda index: None)
    monkeypatch.setattr(nvml, "process_bytes", lambda index: None)
    probe = footprint.CudaFootprint(torch.device("cuda", 0), budget=None)
    probe.steady_window()
    probe.read()
    assert probe.memory["alloc_retries"] == 2


def test_on_a_cpu_the_reference_pass_and_the_flop_count_come_after_the_peak_is_read(monkeypatch):
    """The fp32 reference pass must not inflate the trial's peak. On a GPU the peak is reset after it; on a
    CPU the resident high-water mark kept what it changed (+3 MiB, and +5 MiB from the FLOP count's meta
    build), so both come after the peak is read, on the untouched weights, and the loss matches the old one."""
    from harness import trial as trial_mod
    calls = []
    monkeypatch.setattr(measure, "reset_peak", lambda device: calls.append("reset"))
    real_reference, real_read = trial_mod.Trial.fp32_loss, footprint.CpuFootprint.read
    monkeypatch.setattr(trial_mod.Trial, "fp32_loss", lambda self, m, b: calls.append("reference") or real_reference(self, m, b))
    monkeypatch.setattr(trial_mod.Trial, "count_flops", lambda self: calls.append("flops") or [None, None])
    monkeypatch.setattr(footprint.CpuFootprint, "read", lambda self: calls.append("read") or real_read(self))
    job = {"workload": {"name": "emberformer", "params": WORKLOADS["emberformer"].presets["tiny"]},
           "config": {"batch_size": 2}, "device": "cpu", "measure": FAST}
    t = trial_mod.Trial(job, trial_mod.Heartbeat(None))
    torch.manual_seed(0)  # the trial's seed: the weights it starts from
    built = t.build_workload()
    untouched, batch = built.model, t.sample_batch(built.dataset, None)
    rec = t.run()
    assert calls.index("read") < calls.index("reference") and calls.index("read") < calls.index("flops")
    assert "reference" not in calls[:calls.index("reset")] and t.untouched is None
    assert t.fp32_loss(untouched, batch) == {"reference": rec["loss"]["reference"], "redrawn": rec["loss"]["redrawn"],
                                             "repeatable": True}
    assert rec["loss"]["reference"] == rec["loss"]["first"]  # fp32: the same loss


def test_the_optimizer_state_is_counted_when_fp16s_first_step_was_skipped(monkeypatch):
    """fp16-mixed's GradScaler skips a step whose gradients overflow, and AdamW makes its state in its first
    step(): read right after the first step, the breakdown's optimizer state was 0. Staged: a loss scale
    first step's gradients overflow (inf), as a loss scale of 65536 often makes them."""
    from harness import trial as trial_mod
    skipped = []

    def scaler(precision, device):
        real = torch.amp.GradScaler(device.type)
        step = real.step

        def overflowing_first(opt, *args, **kwargs):
            if not skipped:
                for group in opt.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.fill_(float("inf"))
            skipped.append(not opt.state)
            return step(opt, *args, **kwargs)
        real.step = overflowing_first
        return real
    monkeypatch.setattr(transforms, "grad_scaler", scaler)
    job = {"workload": {"name": "emberformer", "params": WORKLOADS["emberformer"].presets["tiny"]},
           "config": {"batch_size": 2, "precision": "fp16-mixed"}, "device": "cpu", "measure": FAST}
    rec = trial_mod.Trial(job, trial_mod.Heartbeat(None)).run()
    assert rec["status"] == "ok", rec.get("error")
    assert skipped[:2] == [True, True], "staging: the first step was to be skipped"
    parts = rec["memory"]["breakdown"]
    assert parts["optimizer"] == pytest.approx(2 * parts["weights"], rel=0.01)  # AdamW's two moments


def test_no_context_reading_is_said_not_left_none(monkeypatch):
    monkeypatch.setattr(nvml, "process_bytes", lambda index: None)
    monkeypatch.setattr(nvml, "used_bytes", lambda index: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    reading = measure.context_reading(torch.device("cuda", 0), None)
    assert reading["bytes"] is None and reading["source"].startswith("no context reading: NVML unavailable")


def test_context_prefers_the_per_process_nvml_figure(monkeypatch):
    monkeypatch.setattr(nvml, "process_bytes", lambda index: 900)
    monkeypatch.setattr(nvml, "used_bytes", lambda index: 5000)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 400)
    assert measure.context_reading(torch.device("cuda", 0), 100) == {
        "bytes": 500, "source": "nvml per-process used - allocator reserved"}


# ---- MFU -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(measure.PEAK_TFLOPS))
def test_every_peak_table_row_matches_its_exact_name(name):
    peaks = measure.PEAK_TFLOPS[name]
    assert measure.peak_tflops(name, "bf16-mixed") == peaks["bf16"]
    assert measure.peak_tflops(name, "tf32") == peaks["tf32"]
    assert measure.peak_tflops(name, "fp32") == peaks["fp32"]
    assert measure.peak_tflops(name + " X", "fp32") is None  # a longer name is another device


@pytest.mark.parametrize("name,not_as", [
    ("NVIDIA L40", "NVIDIA L4"), ("NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3"), ("NVIDIA H200 NVL", "NVIDIA H200")])
def test_lookalike_names_get_their_own_peak(name, not_as):
    assert measure.peak_tflops(name, "bf16-mixed") != measure.peak_tflops(not_as, "bf16-mixed")


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA RTX A1000", "NVIDIA RTX A1000 6GB Laptop GPU",
                                  "H100", "NVIDIA GeForce RTX 4090 D", "AMD EPYC 7B13"])
def test_unknown_devices_get_no_mfu(name):
    assert measure.peak_tflops(name, "bf16-mixed") is None


# ---- device refusals -----------------------------------------------------------------------------------

def spec_with(tmp_path, search: dict):
    """A real spec file; a scalar in `search` pins that knob."""
    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"study": "s", "workload": {"name": "gpt", "preset": "tiny"},
                                    "search": {"batch_size": [4], **search}}))
    return specs.load(path)


def test_a_cpu_sweep_leaves_out_what_only_cuda_honours_and_says_so(tmp_path):
    spec, notes = specs.for_device(spec_with(tmp_path, {"precision": ["fp32", "tf32"], "compile": ["off", "reduce-overhead"]}),
                                   "cpu")
    assert spec.search["precision"].choices == ("fp32",) and spec.search["compile"].choices == ("off",)
    assert len(notes) == 2 and any("TF32" in n for n in notes) and any("CUDA graphs" in n for n in notes)
    same, none = specs.for_device(spec_with(tmp_path, {"precision": ["fp32", "tf32"]}), "cuda:0")
    assert same.search["precision"].choices == ("fp32", "tf32") and none == []


@pytest.mark.parametrize("search", [{"precision": ["tf32"]}, {"batch_size": [4], "compile": "reduce-overhead"},
                                    {"pin_memory": [True, False]}])
def test_a_cpu_sweep_refuses_a_knob_it_cannot_run_at_all(tmp_path, search):
    with pytest.raises(UserError, match="cannot run on cpu"):
        specs.for_device(spec_with(tmp_path, search), "cpu")


# ---- the child's environment -------------------------------------------------------------------------

def test_expandable_segments_merges_into_the_users_allocator_conf():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:False"}
    assert launch.allocator_conf(env, True) == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    assert launch.allocator_conf({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8"}, False) == {
        "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8,expandable_segments:False"}
    assert launch.allocator_conf({}, True) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_the_child_gets_the_merged_allocator_conf(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    env = launch.child_env({"expandable_segments": True}, "cuda:0", tmp_path, [])
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"


def test_compile_threads_are_left_at_torchs_default(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    env = launch.child_env({"compile": "default"}, "cpu", tmp_path, [])
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in env


def test_env_records_what_shapes_a_measurement(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    rec = run_trial(tmp_path, {})
    assert rec["status"] == "ok", rec.get("error")
    env = rec["env"]
    assert env["allocator_conf"] == "max_split_size_mb:64"
    assert env["cuda_launch_blocking"] is True
    import torch._inductor.config as inductor
    assert env["compile_threads"] == inductor.compile_threads >= 1
    assert env["tf32"]["float32_matmul_precision"] == "highest"
    from tests.conftest import gpu_count
    assert env["device_count"] == gpu_count()  # GPUs in the machine, not the one the trial sees
    assert rec["cuda_graphs"] == {"wanted": False, "used": False, "skipped_graphs": 0}


# ---- GPU ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graph_gradients_accumulate_like_eager(mode):
    """pytorch#169545: a .grad installed from a CUDA-graph output is overwritten by the next replay."""
    torch.manual_seed(0)
    dev = torch.device("cuda")
    eager = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
    graphed = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
    graphed.load_state_dict(eager.state_dict())
    compiled = transforms.compiled_loss(lambda m, x: m(x).sum(), graphed, mode)
    assert transforms.uses_cuda_graphs(mode, dev)
    transforms.own_gradients(graphed.parameters())
    xs = [torch.randn(8, 64, device=dev) for _ in range(3)]
    for _ in range(3):  # warm-up replays, then the step whose gradients are compared
        for p in graphed.parameters():
            p.grad.zero_()
        for x in xs:
            torch.compiler.cudagraph_mark_step_begin()
            compiled(x).backward()
    for x in xs:
        eager(x).sum().backward()
    for a, b in zip(eager.parameters(), graphed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_cuda_peak_agrees_with_nvml_per_process_use(tmp_path):
    """peak_memory = peak reserved + context. NVML's per-process figure at the end is current
    reserved + context, so it can only be at or under the peak; tolerance 64 MiB for NVML's 2 MiB
    page rounding and driver-side allocations outside both."""
    rec = run_trial(tmp_path, {"batch_size": 8}, device="cuda:0")
    assert rec["status"] == "ok", rec.get("error")
    mem = rec["memory"]
    assert mem["context_bytes"] is not None, mem["context_source"]
    if mem["nvml_process_used"] is None:
        pytest.skip("NVML lists no per-process use here (container PID namespace)")
    assert mem["nvml_process_used"] <= rec["peak_memory"] + 64 * 2**20
    assert mem["context_bytes"] >= mem["context_at_start"]
