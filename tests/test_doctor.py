"""bench doctor: real facts on this machine, torch only in a child, warnings, and the NVML path."""
from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from rich.console import Console

from harness import doctor, nvml

GiB = 1024**3
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> dict:
    # One real collection for the module: it starts a torch child, which takes a couple of seconds.
    return doctor.collect(tmp_path_factory.mktemp("doctor") / "results-not-created-yet")


def _nvml_works() -> bool:
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


# ---- real facts on this machine -----------------------------------------------------------------

def test_collects_cpu_memory_disk_and_torch(facts):
    cpu = facts["cpu"]
    assert cpu["model"] and cpu["cores_logical"] >= 1 and cpu["cores_usable"] >= 1
    assert 0 < cpu["memory_available"] <= cpu["memory_total"]
    assert 0 < facts["disk"]["free"] <= facts["disk"]["total"]
    assert facts["torch"]["version"] == importlib.metadata.version("torch")
    assert facts["host"]["python"] == ".".join(map(str, sys.version_info[:3]))


@pytest.mark.skipif(_nvml_works(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_says_so_instead_of_failing(facts):
    assert facts["nvml"]["available"] is False
    assert "no NVIDIA driver" in facts["nvml"]["reason"]
    assert facts["torch"]["cuda_available"] is False and facts["torch"]["devices"] == []


def test_facts_are_json(facts):
    assert json.loads(json.dumps(facts)) == facts


def test_the_cli_process_never_imports_torch():
    code = ("import sys; from pathlib import Path; from harness import doctor; "
            "facts = doctor.collect(Path('.')); "
            "print(facts['torch']['version'], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    version, imported = out.stdout.split()
    assert version == importlib.metadata.version("torch")
    assert imported == "False"


def test_probe_child_prints_one_json_object():
    out = subprocess.run([sys.executable, "-m", "harness.doctor", "--probe"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0
    probed = json.loads(out.stdout)
    assert {"version", "cuda", "cuda_available", "cpu_capability", "devices"} <= probed.keys()


def test_a_broken_probe_is_a_fact_not_a_crash(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    assert doctor._probe_torch() == {"error": "the torch probe failed: exit code 1"}


def test_render_shows_the_facts(facts):
    console = Console(record=True, width=140)
    console.print(doctor.render(facts))
    text = console.export_text()
    assert facts["cpu"]["model"] in text and facts["torch"]["version"] in text
    assert "free of" in text
    # `--results /nonexistent/x` gave the free space "under /nonexistent/x" as if the folder were there
    assert not facts["disk"]["exists"]
    wide = Console(record=True, width=400)
    wide.print(doctor.render(facts))
    assert "results-not-created-yet (no such folder yet: a sweep creates it)" in wide.export_text()


# ---- warnings -----------------------------------------------------------------------------------

def test_low_disk_and_memory_warn_at_the_given_thresholds(facts):
    found = doctor.warnings(facts, min_free_disk=facts["disk"]["free"] + 1,
                            min_free_memory=facts["cpu"]["memory_available"] + 1)
    assert any("free on the disk" in w for w in found)
    assert any("host memory available" in w for w in found)
    relaxed = doctor.warnings(facts, min_free_disk=0, min_free_memory=0)
    assert not any("disk" in w or "host memory" in w for w in relaxed)


def test_a_results_path_that_is_a_file_is_a_warning(facts, tmp_path):
    """`bench doctor --results README.md` reported the disk's free space as if all were well."""
    (tmp_path / "README.md").write_text("x")
    disk = doctor._disk(tmp_path / "README.md")
    found = doctor.warnings(facts | {"disk": disk}, min_free_disk=0, min_free_memory=0)
    assert any("is a file, not a folder: a sweep cannot keep its studies there" in w for w in found), found
    assert not any("is a file" in w for w in doctor.warnings(facts, min_free_disk=0, min_free_memory=0))


def test_torch_failure_is_a_warning(facts):
    broken = facts | {"torch": {"error": "the torch probe failed: ImportError: libcudart.so.12"}}
    assert doctor.warnings(broken, 0, 0)[0].startswith("torch is not usable here")


# ---- the NVML path, against a stand-in driver -----------------------------------------------------

class _FakeNVMLError(Exception):
    pass


def _fake_pynvml(clock_mask: int, processes: list[tuple[int, int | None]], used: int = 1 * GiB):
    """A pynvml module with one 80 GiB Hopper GPU, as nvidia-ml-py presents it."""
    total = 80 * GiB
    proc = [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in processes]
    return types.SimpleNamespace(
        NVMLError=_FakeNVMLError,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "560.35.03",
        nvmlSystemGetCudaDriverVersion=lambda: 12060,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"handle{i}",
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlMemory_v2=2,
        nvmlDeviceGetMemoryInfo=lambda h, version=None: types.SimpleNamespace(total=total, used=used,
                                                                              free=total - used),
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetComputeRunningProcesses=lambda h: proc,
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: proc[:1],  # the same pid may show in both lists
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: clock_mask,
    )


def test_nvml_lists_devices_processes_and_clock_events(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(0x4 | 0x40, [(4242, 10 * GiB), (77, None)]))
    nvml = doctor.gpus()
    assert nvml["driver"] == "560.35.03" and nvml["cuda_driver"] == "12.6"
    (device,) = nvml["devices"]
    assert device["capability"] == "9.0" and device["bf16"] and device["tf32"] and device["fp8"]
    assert [p["pid"] for p in device["processes"]] == [77, 4242]
    assert device["processes"][1]["used_memory"] == 10 * GiB
    assert device["clock_events"] == ["SwPowerCap", "HwThermalSlowdown"]
    assert json.loads(json.dumps(nvml)) == nvml


def test_gpu_warnings_name_the_other_process_and_the_throttle(monkeypatch, facts):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(0x4, [(4242, 10 * GiB)], used=11 * GiB))
    found = doctor.warnings(facts | {"nvml": doctor.gpus()}, 0, 0)
    assert any("is shared: pid 4242" in w and "10.00 GiB" in w for w in found)
    assert any("clocks are held back now (software power cap)" in w for w in found)
    assert any("already has 11.00 GiB in use, 69.00 GiB free of 80.00 GiB" in w for w in found)


def test_idle_clocks_and_an_empty_gpu_do_not_warn(monkeypatch, facts):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(0x1, [], used=300 * 1024**2))
    torch = facts["torch"] | {"cuda_available": True, "cuda": "12.6"}
    assert doctor.warnings(facts | {"torch": torch, "nvml": doctor.gpus(), "load": quiet()}, 0, 0) == []


def test_torch_that_cannot_use_the_gpu_warns(monkeypatch, facts):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(0x1, []))
    nvml = doctor.gpus()
    cpu_build = facts["torch"] | {"cuda_available": False, "cuda": None}
    assert any("torch does not" in w for w in doctor.warnings(facts | {"torch": cpu_build, "nvml": nvml}, 0, 0))
    too_new = facts["torch"] | {"cuda_available": True, "cuda": "12.8"}
    assert any("driver supports up to 12.6" in w
               for w in doctor.warnings(facts | {"torch": too_new, "nvml": nvml}, 0, 0))


def test_render_with_a_gpu_escapes_markup(monkeypatch, facts):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(0x4, [(4242, 2 * GiB)]))
    monkeypatch.setattr(nvml, "_process_name", lambda pid: "[bold]trainer[/bold]")
    console = Console(record=True, width=160)
    console.print(doctor.render(facts | {"nvml": doctor.gpus()}))
    text = console.export_text()
    assert "NVIDIA H100 80GB HBM3" in text and "software power cap" in text
    assert "[bold]trainer[/bold]" in text  # shown as written, not swallowed as markup


def test_show_json_is_parseable(tmp_path):
    console = Console(record=True, width=200)
    doctor.show(tmp_path, as_json=True, console=console)
    printed = json.loads(console.export_text())
    assert {"host", "cpu", "disk", "torch", "nvml", "warnings"} <= printed.keys()


# ---- on a real GPU ------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not _nvml_works(), reason="needs an NVIDIA driver")
def test_real_gpu_is_described(facts):
    devices = facts["nvml"]["devices"]
    assert devices and all(d["memory_total"] > 0 and d["capability"] for d in devices)
    assert facts["torch"]["cuda_available"] and facts["torch"]["devices"]
    assert facts["torch"]["devices"][0]["capability"] in {d["capability"] for d in devices}


def test_a_machine_without_a_driver_is_reported_not_raised(monkeypatch):
    """The no-driver branch on any machine, GPU or not: nvmlInit fails the way it does without a driver."""
    def no_driver():
        raise _FakeNVMLError("NVML Shared Library Not Found")
    fake = _fake_pynvml(0, [])
    fake.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = doctor.gpus()
    assert nvml["available"] is False
    assert nvml["reason"] == "no NVIDIA driver (NVML Shared Library Not Found)"


# ---- what is running now ------------------------------------------------------------------------

def test_a_busy_process_is_named_with_its_cpu_share(facts):
    """A real process spinning on a core (not doctor's child: orphaned through a shell) is named."""
    shell = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    pid = int(shell.stdout)
    try:
        load = doctor._load(interval_s=1.0)
    finally:
        os.kill(pid, signal.SIGKILL)
    spinner = next(p for p in load["busy_processes"] if p["pid"] == pid)
    assert spinner["cpu_percent"] >= doctor.BUSY_PERCENT and "while True" in spinner["command"]
    found = doctor.warnings({**facts, "load": load})
    assert any(w.startswith(f"pid {pid} python") and "% of a core" in w for w in found), found
    assert 0 <= load["cpu_busy_percent"] <= 100 and load["steal_percent"] >= 0


def quiet(**changes):
    return {"interval_s": 1.0, "loadavg": [0.1, 0.1, 0.1], "busy_processes": [], "cpu_busy_percent": 3.0,
            "steal_percent": 0.0, "governors": [], **changes}


def test_load_steal_and_frequency_scaling_warn(facts):
    assert doctor._load_warnings({**facts, "load": quiet()}) == []
    cores = facts["cpu"]["cores_usable"]
    found = doctor._load_warnings({**facts, "load": quiet(loadavg=[cores + 1.0, 1, 1], steal_percent=7.5,
                                                          governors=["powersave"])})
    assert any(f"load average {cores + 1.0:.2f} on {cores} usable cores" in w for w in found)
    assert any("7.5% of CPU time was stolen" in w for w in found)
    assert any("governor powersave" in w for w in found)
    assert doctor._load_warnings({**facts, "load": quiet(governors=["performance"])}) == []


def test_render_shows_the_load(facts):
    console = Console(record=True, width=200)
    console.print(doctor.render({**facts, "load": quiet(busy_processes=[
        {"pid": 7, "name": "spin", "command": "spin --fast", "cpu_percent": 99.0}])}))
    text = console.export_text()
    assert "load average 0.10 0.10 0.10" in text and "1 other busy process" in text
    assert "pid 7 spin is using 99% of a core (spin --fast)" in text
    assert "nothing here would spoil" not in text


# `bench doctor`'s words for a busy process: a process on several cores reads as cores, not "184% of a
# core", and a bench trial running elsewhere on this machine (a sweep in another terminal, whose trials are
# forked from `python -m harness.zygote`) is named as one, not as an anonymous python process.
def busy_facts(*busy):
    return {"cpu": {"cores_usable": 2, "cores_logical": 2},
            "load": {"interval_s": 1.0, "loadavg": [0.1, 0.1, 0.1], "busy_processes": list(busy),
                     "cpu_busy_percent": 3.0, "steal_percent": 0.0, "governors": []}}


def test_a_process_on_more_than_a_core_reads_as_cores():
    found = doctor._load_warnings(busy_facts({"pid": 7, "name": "python", "command": "python train.py", "cpu_percent": 184.0}))
    assert found[0].startswith("pid 7 python is using 1.8 cores (python train.py)"), found
    one = doctor._load_warnings(busy_facts({"pid": 7, "name": "spin", "command": "spin --fast", "cpu_percent": 99.0}))
    assert one[0].startswith("pid 7 spin is using 99% of a core (spin --fast)"), one


def test_another_bench_trial_is_named_as_one():
    """Read from the whole command line: cut to 80 characters, a long interpreter path hid the module."""
    # not doctor's own child (those are left out): started from a shell that exits at once
    argv = " ".join([sys.executable, "-c", "'while True: pass'", "/" + "deep/" * 20 + "python", "-m", "harness.zygote"])
    pid = int(subprocess.run(["sh", "-c", f"{argv} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                             check=True).stdout)
    try:
        time.sleep(0.3)
        load = doctor._load(interval_s=1.0)
    finally:
        os.kill(pid, signal.SIGKILL)
    mine = [p for p in load["busy_processes"] if p["pid"] == pid]
    assert mine and "harness.zygote" not in mine[0]["command"], mine  # past the 80 characters shown
    found = doctor._load_warnings(busy_facts(*mine))
    assert "a bench trial (another `bench sweep` or `bench trial` on this machine)" in found[0], found
