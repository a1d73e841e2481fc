"""Issue 23's item 9, at the seams it lives on: reuse keys, the warm start's own fork check, the
cold max-autotune warning."""
from __future__ import annotations

import pytest
import torch

from harness import trial, zygote

JOB = {"workload": {"name": "gpt", "params": {"vocab": 64}}, "device": "cpu", "measure": {}, "seed": 0,
       "config": {"batch_size": 4, "precision": "fp32"}}


def a_trial(**config) -> trial.Trial:
    return trial.Trial(dict(JOB, config={**JOB["config"], **config}), trial.Heartbeat(None))


def test_reused_figures_are_keyed_on_how_the_model_is_shared():
    """A DDP or FSDP rank's FLOPs and breakdown must not be taken from a one-process trial's."""
    one = a_trial().figure_key("precision")
    ddp = a_trial(nproc=2, parallel="ddp").figure_key("precision")
    fsdp = a_trial(nproc=2, parallel="fsdp").figure_key("precision")
    assert (ddp["nproc"], ddp["parallel"], fsdp["parallel"]) == (2, "ddp", "fsdp")
    assert len({str(sorted(k.items())) for k in (one, ddp, fsdp)}) == 3


def test_a_forked_trial_checks_its_own_fork(monkeypatch):
    assert zygote.unsafe_fork() is None  # this process never initialised CUDA
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert "initialised CUDA" in zygote.unsafe_fork()


def test_cold_max_autotune_is_announced_before_the_first_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cold"))
    a_trial(compile="max-autotune").warn_if_cold_autotune()
    assert "can take minutes" in capsys.readouterr().err
    (tmp_path / "warm").mkdir()
    (tmp_path / "warm" / "fxgraph").mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm"))
    a_trial(compile="max-autotune").warn_if_cold_autotune()
    a_trial(compile="default").warn_if_cold_autotune()
    assert capsys.readouterr().err == ""


def test_the_bf16_layer_measured_after_a_trial_at_its_wall_gives_way_to_an_oom_and_nothing_else(monkeypatch):
    """The layer runs after the measured steps, still under the wall: a trial that fit must not end
    in an OOM for it (the figure is left for the next trial), and a real error is not hidden."""
    def out_of_memory():
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(trial.measure, "cpu_bf16_speedup", out_of_memory)
    assert trial.bf16_speedup() is None

    def broken():
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(trial.measure, "cpu_bf16_speedup", broken)
    with pytest.raises(RuntimeError, match="shapes"):
        trial.bf16_speedup()


def test_a_cpu_trial_whose_peak_went_over_the_budget_under_its_wall_is_an_oom(tmp_path, faulty_path):
    """RLIMIT_DATA fails new private mappings only: shared memory (a DataLoader worker's batches), or pages
    mapped before the wall, fill in under it; a 4 MiB budget let a 26 MiB peak through as `ok`."""
    from tests.test_measure import run
    wl = {"factory": "faulty:build", "params": {"shared_mib": 64}}
    rec = run(tmp_path, wl, {"batch_size": 8}, budget=48 * 2**20)
    assert rec["status"] == "oom" and rec["error"]["type"] == "OverBudget", rec["error"]
    assert rec["peak_memory"] > 64 * 2**20 and "over the 48.0 MiB budget" in rec["error"]["message"]
    fits = run(tmp_path, {"factory": "faulty:build", "params": {}}, {"batch_size": 8}, budget=48 * 2**20)
    assert fits["status"] == "ok" and fits["error"] is None


def test_a_soft_data_limit_of_the_users_own_is_no_memory_wall_of_benchs():
    """Under `ulimit -d` (soft under hard) every trial read as at its wall: a cuDNN "not supported" or oneDNN
    "could not create a primitive" became an OOM, and the search stopped short of larger batches; lifting the
    wall raised the user's own limit to the hard one. Run in a child: the limit is the process's."""
    import subprocess
    import sys
    code = """
import resource
from harness import errors, measure
user = 64 * 2**30
resource.setrlimit(resource.RLIMIT_DATA, (user, resource.getrlimit(resource.RLIMIT_DATA)[1]))
vague = RuntimeError("could not create a primitive")
said = [measure.cpu_memory_limited(), errors.is_oom(vague, at_wall=measure.refused_memory())]
measure.limit_cpu_memory(2**30)
said += [measure.cpu_memory_limited(), errors.is_oom(vague, at_wall=measure.refused_memory())]
measure.lift_cpu_memory_limit()
said += [measure.cpu_memory_limited(), resource.getrlimit(resource.RLIMIT_DATA)[0] == user]
print(said)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[False, False, True, True, False, True]", out


def test_a_cpu_rank_s_heap_growth_is_not_called_a_leak():
    """Every DDP and FSDP trial on a CPU ended "memory the steps keep grew in every window ...: a leak?" for a
    model that keeps nothing: a rank's C heap also holds the process group's buffers, which grow as it
    settles. The same growth in a one-process trial is still one."""
    growing = {"live_by_window": [100 << 20, (100 << 20) + (400 << 10), (100 << 20) + (800 << 10)]}
    one, ranks = a_trial(), a_trial(nproc=2, parallel="ddp")
    ranks.world = 2  # as harness.distributed sets it in each rank
    for t in (one, ranks):
        t.memory.update(growing)
        t.timing["window_steps"] = 10
    assert one.leak() == {"bytes": 800 << 10, "steps": 20, "bytes_per_step": (800 << 10) / 20}
    assert ranks.leak() is None


def test_a_trial_whose_parent_died_during_its_start_up_ends_at_once():
    """A kill -9 of the sweep while a fresh start still imported torch: the trial, re-parented, then watched
    its new parent (init) and trained on as an orphan. It now knows which pid started it."""
    import os
    import subprocess
    import sys
    gone = subprocess.Popen(["true"])
    gone.wait()  # a parent that died before the trial armed its parent-death signal
    code = "import time\nfrom harness import trial\ntrial.die_with_parent()\ntime.sleep(20)\nprint('trained on')"
    child = subprocess.run([sys.executable, "-c", code], env={**os.environ, zygote.PARENT_ENV: str(gone.pid)},
                           capture_output=True, text=True, timeout=60, start_new_session=True)
    assert child.returncode == -9 and "trained on" not in child.stdout, (child.returncode, child.stdout, child.stderr)
