"""The fault matrix: every way a trial can go wrong, in a real child process, and how it is recorded.

Each fault of the test-only `faulty` workload runs once through `harness.launch.run` with the job a
sweep builds (`Sweep.job`). They run three at a time (most of a trial is importing torch or waiting
for a limit), then each test below checks one row of the matrix. One CLI sweep over several faults
shows that a sweep goes on after each and records each status, with the log tail kept.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from harness import launch, pids, record, reuse, spec as specs
from harness.cli import main
from tests.conftest import FAULTY_DIR, faulty_spec

TIMEOUT_S = 30.0  # the overall limit; the stall detector must fire well before it
STALL_S = 3.0
HANG_START_TIMEOUT_S = 8.0  # a trial hanging before its first step only meets the overall limit
HANG_REBUILD_TIMEOUT_S = 20.0  # time to reach its measured steps' end on a busy machine
MATRIX_FAULTS = ("none", "segfault", "abort", "raise", "hang", "hang_start", "hang_rebuild", "exit0", "spam", "grandchild",
                 "inf", "build_error", "sigterm")


@pytest.fixture(scope="module")
def faulty_env(tmp_path_factory):
    """`faulty` importable here (spec check) and in the trial children (PYTHONPATH)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(FAULTY_DIR))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAULTY_DIR), os.environ.get("PYTHONPATH")])))
        yield tmp_path_factory.mktemp("faults")


def run_fault(folder: Path, fault: str, budget: int | None = None, width: int = 32) -> dict:
    """One real trial of `fault`, as a sweep would launch it; the record plus what the test needs."""
    timeout = {"hang_start": HANG_START_TIMEOUT_S, "hang_rebuild": HANG_REBUILD_TIMEOUT_S}.get(fault, TIMEOUT_S)
    pid_file = folder / f"{fault}.pid"
    path = faulty_spec(folder, f"fault-{fault}", [fault],
                       workload={"factory": "faulty:build", "params": {"fault": "none", "at_step": 3, "width": width,
                                                                       "pid_file": str(pid_file)}},
                       trial={"timeout": f"{timeout}s", "stall": f"{STALL_S}s", "warmup_steps": 1, "window": 0.05,
                              "min_windows": 2, "max_windows": 3, "max_seconds": 1})
    spec = replace(specs.load(path), memory_budget=budget)
    config = specs.trial_config(spec, {"fault": fault})
    log = folder / f"{fault}.log"
    started = time.monotonic()
    rec = launch.run(spec.job("cpu", config),
                     launch.Limits(spec.trial_timeout_s, spec.stall_s), log)
    # the matrix runs three at once, and trials take turns on the device: the wait for its turn is no part of it
    # (a CI run's hang_start waited 23 s behind another fault's trial, and its 8 s limit read as 31.5 s)
    elapsed = time.monotonic() - started - rec["timing"]["device_wait_s"]
    return {"rec": rec, "elapsed": elapsed, "log": log, "pid_file": pid_file}


def untouched_weights() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("bench-untouched-*"))


@pytest.fixture(scope="module")
def untouched_before_the_matrix() -> set[Path]:
    return untouched_weights()


@pytest.fixture(scope="module")
def matrix(faulty_env, untouched_before_the_matrix):
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {fault: pool.submit(run_fault, faulty_env, fault) for fault in MATRIX_FAULTS}
        return {fault: future.result() for fault, future in futures.items()}


def test_the_matrix_ran_through_the_warm_start(matrix):
    """Every row above is a trial forked from the warm trial server (harness.zygote), not a fresh interpreter."""
    assert {fault: out["rec"]["start"]["method"] for fault, out in matrix.items()} == dict.fromkeys(MATRIX_FAULTS, "warm")


def test_a_killed_trial_leaves_no_untouched_weights_behind(matrix, untouched_before_the_matrix):
    """A CPU trial keeps its untouched weights on disk until the reference pass after its steps; the
    trials killed in their steps (hang, segfault, abort) once left that file in the temp folder for good."""
    assert matrix["hang"]["rec"]["status"] == record.TIMEOUT and matrix["segfault"]["rec"]["status"] == record.CRASH
    assert untouched_weights() - untouched_before_the_matrix == set()


def error_of(outcome: dict) -> dict:
    return outcome["rec"].get("error") or {}


def test_no_fault_is_ok(matrix):
    rec = matrix["none"]["rec"]
    assert rec["status"] == record.OK, rec.get("error")
    assert rec["throughput"] > 0 and rec["peak_memory"] > 0


def test_segfault_is_a_crash_by_sigsegv(matrix):
    out = matrix["segfault"]
    assert out["rec"]["status"] == record.CRASH
    assert error_of(out)["type"] == "SIGSEGV" and "SIGSEGV" in error_of(out)["message"]
    assert out["rec"]["throughput"] is None and out["rec"]["peak_memory"] is None
    assert "Segmentation fault" in out["log"].read_text()  # faulthandler's stack is kept


def test_a_segfault_in_the_steps_under_a_cpu_memory_wall_is_read_as_out_of_memory(faulty_env):
    """A batch past the wall once died of SIGSEGV in its first step (a library that does not check a failed
    allocation): a crash, which the planner does not read as the wall. Without a wall it stays a crash."""
    walled = run_fault(faulty_env, "segfault", budget=2 * 1024**3)["rec"]
    assert walled["status"] == record.OOM and walled["error"]["type"] == "SIGSEGV", walled["error"]
    assert "under the CPU memory wall: read as out of memory" in walled["error"]["message"]
    assert "without --memory-budget tells a crash apart" in walled["error"]["message"]


def test_a_sigterm_is_said_as_sigterm_not_as_the_oom_killers_sigkill(matrix):
    """The trial ends its whole process group with SIGKILL when it is terminated (die_with_parent), so a
    SIGTERM from anywhere once read "killed by SIGKILL (often the kernel's OOM killer)"."""
    out = matrix["sigterm"]
    assert out["rec"]["status"] == record.CRASH
    assert error_of(out)["type"] == "SIGTERM", error_of(out)
    assert "OOM" not in error_of(out)["message"] and "SIGKILL" not in error_of(out)["message"]


def test_abort_is_a_crash_not_an_oom(matrix):
    out = matrix["abort"]
    assert out["rec"]["status"] == record.CRASH
    assert error_of(out)["type"] == "SIGABRT"
    assert "faulty.py" in error_of(out)["log_tail"]  # where it aborted


def test_a_segfault_counts_as_oom_only_in_the_steps_under_a_cpu_wall():
    job, steps = {"device": "cpu", "memory_budget": 2 * 1024**3}, {"phase": "measure"}
    assert launch.in_steps_under_a_cpu_wall(job, steps)
    assert not launch.in_steps_under_a_cpu_wall(job, {"phase": "build"})
    assert not launch.in_steps_under_a_cpu_wall(dict(job, memory_budget=None), steps)
    assert not launch.in_steps_under_a_cpu_wall(dict(job, device="cuda:0"), steps)
    assert launch.classify(-signal.SIGSEGV, None, None, "", at_cpu_wall=True)["status"] == record.OOM
    assert launch.classify(-signal.SIGBUS, None, None, "", at_cpu_wall=True)["status"] == record.OOM
    assert launch.classify(-signal.SIGABRT, None, None, "", at_cpu_wall=True)["status"] == record.CRASH
    assert launch.classify(-signal.SIGSEGV, None, None, "")["status"] == record.CRASH


def test_abort_counts_as_oom_only_with_bad_alloc():
    said = "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n"
    assert launch.classify(-signal.SIGABRT, None, None, said)["status"] == record.OOM
    assert launch.classify(-signal.SIGABRT, None, None, "Fatal Python error: Aborted\n")["status"] == record.CRASH


def test_raise_is_an_error_with_the_traceback_tail(matrix):
    out = matrix["raise"]
    err = error_of(out)
    assert out["rec"]["status"] == record.ERROR
    assert err["type"] == "RuntimeError" and err["message"] == "injected failure in the user's loss"
    assert "faulty.py" in err["traceback"] and err["traceback"].rstrip().endswith("injected failure in the user's loss")
    assert "injected failure in the user's loss" in out["log"].read_text()


def test_hang_is_a_timeout_by_the_stall_detector_before_the_time_limit(matrix):
    out = matrix["hang"]
    assert out["rec"]["status"] == record.TIMEOUT
    assert "no progress for 3s" in error_of(out)["message"]
    assert out["elapsed"] < TIMEOUT_S


def test_hang_before_the_first_step_is_a_timeout_by_the_time_limit(matrix):
    out = matrix["hang_start"]
    assert out["rec"]["status"] == record.TIMEOUT
    assert "exceeded the trial time limit of 8s while building the model" in error_of(out)["message"]
    assert out["rec"]["timing"]["killed_in"] == "build"  # the time split puts its 8 s there, not in "ended early"
    assert HANG_START_TIMEOUT_S <= out["elapsed"] < HANG_START_TIMEOUT_S + 10


def test_a_trial_killed_after_its_steps_says_so_not_that_it_was_measuring(matrix):
    """The model built again for a CPU trial's fp32 reference hangs: it was past its steps, whose heartbeat
    still said "measure"."""
    out = matrix["hang_rebuild"]
    assert out["rec"]["status"] == record.TIMEOUT
    assert "after its measured steps (memory breakdown, fp32 reference" in error_of(out)["message"]
    assert out["rec"]["timing"]["killed_in"] == "teardown"


def test_a_time_limit_under_a_second_is_said_as_set_not_as_0s(tmp_path):
    """`trial.timeout: 0.4s` killed every trial "exceeded the trial time limit of 0s"."""
    proc = subprocess.Popen(["sleep", "30"])
    try:
        said = launch.watch(proc, launch.Limits(0.4, 60.0), tmp_path / "no-heartbeat")
    finally:
        proc.kill()
        proc.wait()
    assert said == "exceeded the trial time limit of 0.4s"


def test_exit_without_a_result_is_a_crash(matrix):
    out = matrix["exit0"]
    assert out["rec"]["status"] == record.CRASH
    assert "without writing a result" in error_of(out)["message"]


def test_spam_is_ok_and_its_log_is_bounded(matrix):
    out = matrix["spam"]
    assert out["rec"]["status"] == record.OK, out["rec"].get("error")
    size = out["log"].stat().st_size
    assert 0 < size <= launch.LOG_TAIL_BYTES == 256 * 1024  # of ~8 MB printed
    assert out["log"].read_text().rstrip().endswith("spam")


def test_grandchild_does_not_outlive_its_trial(matrix):
    out = matrix["grandchild"]
    assert out["rec"]["status"] == record.OK, out["rec"].get("error")
    pid = int(out["pid_file"].read_text())
    assert gone(pid), f"grandchild {pid} still runs after its trial"


def test_non_finite_loss_is_diverged(matrix):
    out = matrix["inf"]
    assert out["rec"]["status"] == record.DIVERGED
    assert "loss became inf" in error_of(out)["message"]


def test_build_error_is_an_error_with_the_users_message(matrix):
    out = matrix["build_error"]
    err = error_of(out)
    assert out["rec"]["status"] == record.ERROR
    assert err["type"] == "ValueError" and err["message"] == "injected: this factory rejects its params"
    assert "faulty.py" in err["traceback"]


def test_oom_under_a_memory_budget(faulty_env, monkeypatch):
    """Through the CLI: `bench trial --memory-budget` makes the injected hoarding a real, recorded OOM."""
    path = faulty_spec(faulty_env, "oom", ["oom"])
    monkeypatch.chdir(faulty_env)
    result = CliRunner().invoke(main, ["trial", str(path), "--set", "fault=oom", "--memory-budget", "512MiB",
                                       "--device", "cpu"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rec = json.loads(result.stdout)
    assert rec["status"] == record.OOM, rec["error"]
    assert "can't allocate memory" in rec["error"]["message"] and "faulty.py" in rec["error"]["traceback"]
    assert rec["peak_memory"] is None and rec["throughput"] is None  # nothing was measured: no invented peak


def test_oom_while_setting_up_says_what_failed(faulty_env):
    """A budget too small for the model itself: an OOM before the first step, with a message (MemoryError has none)."""
    folder = faulty_env / "setup-oom"
    folder.mkdir()
    out = run_fault(folder, "none", budget=16 * 1024**2, width=2048)  # 2 x 16 MiB of weights alone
    assert out["rec"]["status"] == record.OOM
    assert error_of(out)["message"].strip(), error_of(out)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # killed; only its exit status is left
    except psutil.NoSuchProcess:
        return True


# ---- a sweep goes on after every fault -------------------------------------------------------------

SWEEP_FAULTS = {"segfault": record.CRASH, "raise": record.ERROR, "exit0": record.CRASH, "inf": record.DIVERGED,
                "build_error": record.ERROR}


def test_a_sweep_goes_on_after_each_fault_and_records_it(faulty_env, monkeypatch):
    monkeypatch.chdir(faulty_env)
    path = faulty_spec(faulty_env, "sweep-faults", list(SWEEP_FAULTS), sampler="grid")
    runner = CliRunner()
    result = runner.invoke(main, ["sweep", str(path), "--device", "cpu"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for status in set(SWEEP_FAULTS.values()):
        assert f"→ {status}" in result.stdout
    rows = json.loads(runner.invoke(main, ["report", "sweep-faults", "--format", "json"]).stdout)
    assert {r["config"]["fault"]: r["status"] for r in rows} == SWEEP_FAULTS
    assert len(rows) == len(SWEEP_FAULTS)  # each config measured once (the baseline is one of them)
    logs = faulty_env / "results" / "sweep-faults" / "logs"
    for row in rows:
        assert Path(row["log"]).parent == logs and Path(row["log"]).exists()
    by_fault = {r["config"]["fault"]: Path(r["log"]).read_text() for r in rows}
    assert "injected failure in the user's loss" in by_fault["raise"]
    assert "Segmentation fault" in by_fault["segfault"]


# ---- what a trial starts dies with it, even out of its process group ------------------------------------

ESCAPER = '''
import os, subprocess, sys
import faulty

def build(params):
    params = dict(params)
    pid_file = params.pop("escaper_pid_file")
    # a daemon's way out of the trial's process group: a new session
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open(pid_file, "w") as f:
        f.write(str(proc.pid))
    return faulty.build(params)
'''


@pytest.mark.parametrize("start", ["warm", "fresh"])
def test_a_grandchild_that_calls_setsid_dies_with_the_trial(faulty_env, monkeypatch, start):
    """Before, a grandchild in a session of its own outlived the trial and the sweep."""
    folder = faulty_env / f"escaper-{start}"
    folder.mkdir()
    (folder / "escaper.py").write_text(ESCAPER)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ["PYTHONPATH"]]))
    monkeypatch.setenv("BENCH_TRIAL_START", start)
    pid_file = folder / "escaper.pid"
    path = faulty_spec(folder, "escaper", ["none"], workload={
        "factory": "escaper:build", "params": {"fault": "none", "at_step": 3, "escaper_pid_file": str(pid_file)}})
    spec = specs.load(path)
    rec = launch.run(spec.job("cpu", specs.trial_config(spec, {})), launch.Limits(TIMEOUT_S, STALL_S), None)
    assert rec["status"] == record.OK, rec.get("error")
    assert rec["start"]["method"] == start
    pid = int(pid_file.read_text())
    try:
        deadline = time.monotonic() + 10
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(pid), f"grandchild {pid} (its own session) still runs after its trial"
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_what_a_trial_started_that_outlived_a_killed_sweep_ends_with_the_next_sweep():
    """A setsid grandchild survived a kill -9 of the sweep (its killer, the sweep, was gone), and the resume
    left it running: on a GPU, its memory spoils every later measurement."""
    killed_sweep = subprocess.Popen([sys.executable, "-c", "pass"])
    killed_sweep.wait()
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    orphan = subprocess.Popen(sleeper, start_new_session=True, env={**os.environ, launch.TOKEN: f"{killed_sweep.pid}-1-orphan"})
    ours = subprocess.Popen(sleeper, start_new_session=True, env={**os.environ, launch.TOKEN: launch.trial_token()})
    try:
        launch.end_orphans()
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert ours.poll() is None  # a live sweep's trial is not an orphan
    finally:
        for proc in (orphan, ours):
            proc.kill()
            proc.wait()


def test_a_step_of_the_wall_clock_leaves_a_live_sweep_alive(monkeypatch):
    """psutil's create_time() moves with the wall clock (boot time re-read): a step of a second made another
    worker take a live sweep's trial for a dead one's and run it again, and a second sweep kill the first
    one's trial as an orphan. A process is now its boot and start tick. Staged: the clock steps 5 s."""
    import psutil
    from harness import storage
    worker, token = storage.worker_id(), launch.trial_token()
    stepped = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: stepped(self) + 5.0)
    assert not storage.is_stale(worker)
    assert launch.runner_alive(token)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert storage.is_stale({**worker, "pid": gone.pid})  # a dead worker still reads dead
    assert not launch.runner_alive(f"{gone.pid}-t{pids.start_ticks(os.getpid())}-x")


def test_a_full_disk_leaves_no_half_written_temp_file(tmp_path):
    """A trial log (and a report, a reused figure) is written to NAME.tmp and renamed: on a full disk
    the write fails, and before, the half-written NAME.tmp stayed. A real, tiny tmpfs."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root in a machine that allows mounts)")
    try:
        with pytest.raises(OSError) as full:
            launch.save_log(disk / "logs" / "trial-0000.log", "x" * 1024 * 1024)
        assert full.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            reuse._write(disk / "reuse" / "flops-0.json", {"key": {}, "value": "x" * 1024 * 1024})
        assert list(disk.rglob("*.tmp")) == []
        figures = reuse.Figures(str(disk / "reuse"), trial=0)  # a cache that cannot be written is skipped
        assert figures.get("flops", {"k": 1}, lambda: "x" * 1024 * 1024) == "x" * 1024 * 1024
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_reuse_folder_that_cannot_be_written_is_skipped_with_a_note(faulty_env):
    """Before, a figure that could not be filed under reuse/ made a good trial a permanent `error`."""
    folder = faulty_env / "reuse-blocked"
    folder.mkdir()
    (folder / "reuse").write_text("a file where the reuse folder should be")  # unwritable as a folder, even for root
    path = faulty_spec(folder, "reuse-blocked", ["none"])
    spec = specs.load(path)
    job = dict(spec.job("cpu", specs.trial_config(spec, {})), reuse_dir=str(folder / "reuse"), trial=0)
    log = folder / "trial.log"
    rec = launch.run(job, launch.Limits(TIMEOUT_S, STALL_S), log)
    assert rec["status"] == record.OK, rec.get("error")
    assert "is not filed for later trials" in log.read_text()


EXITER = '''
import sys

def build(params):
    sys.exit({code})
'''


@pytest.mark.parametrize("code, said", [
    ('"this factory gives up: no GPU config for these params"', "this factory gives up: no GPU config for these params"),
    ("3", "your code called sys.exit(3) at {folder}/exiter.py:5; a trial cannot exit"),  # it said "3" alone
])
def test_sys_exit_in_the_users_factory_is_an_error_with_its_message(faulty_env, monkeypatch, code, said):
    """Before: `crash: exited with code 1 without writing a result`."""
    folder = faulty_env / f"exiter-{code.isdigit()}"
    folder.mkdir()
    (folder / "exiter.py").write_text(EXITER.format(code=code))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ["PYTHONPATH"]]))
    path = faulty_spec(folder, "exiter", ["none"], workload={"factory": "exiter:build", "params": {"fault": "none"}})
    spec = specs.load(path)
    rec = launch.run(spec.job("cpu", specs.trial_config(spec, {})), launch.Limits(TIMEOUT_S, STALL_S), None)
    assert rec["status"] == record.ERROR, rec
    assert rec["error"]["message"] == said.format(folder=folder)


ESCAPING = """
def build(params):
    raise ValueError("bad \\x1b[31mRED\\x1b[0m \\x1b]0;title\\x07 end")
"""


def test_terminal_escapes_in_a_users_error_are_spelled_out_not_sent_to_the_terminal(faulty_env, monkeypatch):
    """An ESC sequence in the user's exception (or another host's record in a shared study) was echoed byte
    for byte by `bench sweep` and `bench report`: colours, a window title, cursor moves."""
    folder = faulty_env / "escaping"
    folder.mkdir()
    (folder / "escaping.py").write_text(ESCAPING)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ["PYTHONPATH"]]))
    path = faulty_spec(folder, "escaping", ["none"], workload={"factory": "escaping:build", "params": {"fault": "none"}})
    spec = specs.load(path)
    rec = launch.run(spec.job("cpu", specs.trial_config(spec, {})), launch.Limits(TIMEOUT_S, STALL_S), None)
    assert rec["status"] == record.ERROR, rec
    assert "bad \\x1b[31mRED\\x1b[0m \\x1b]0;title\\x07 end" in rec["error"]["message"], rec["error"]["message"]
    assert "\x1b" not in rec["error"]["message"] + rec["error"].get("traceback", "")


BEATS = """
import json, os, sys, time
path = sys.argv[1]
for step in range(8):  # a healthy trial: a step of 0.4 s of computing (stopped, it computes nothing)
    with open(path + '.tmp', 'w') as f:
        json.dump({'phase': 'measure', 'step': step, 'time': time.time()}, f)
    os.replace(path + '.tmp', path)
    until = time.process_time() + 0.4
    while time.process_time() < until:
        pass
"""

WATCHER = """
import subprocess, sys
from pathlib import Path
from harness import launch
child = subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1]])
print(launch.watch(child, launch.Limits(timeout_s=60, stall_s=2.5), Path(sys.argv[1])))
"""


def test_a_job_stopped_and_continued_whole_does_not_time_out_its_healthy_trial(tmp_path):
    """Slurm's suspend (SIGSTOP, later SIGCONT, to every process of the job): on waking the parent saw a
    heartbeat older than trial.stall and recorded a healthy trial `timeout`, for good."""
    beat = tmp_path / "heartbeat.json"
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(beat), BEATS], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    deadline = time.monotonic() + 60
    while not beat.exists() and time.monotonic() < deadline:  # the child is stepping
        time.sleep(0.05)
    os.killpg(watcher.pid, signal.SIGSTOP)
    time.sleep(6.0)  # more than twice trial.stall
    os.killpg(watcher.pid, signal.SIGCONT)
    out, _ = watcher.communicate(timeout=60)
    assert out.strip() == "None", out
