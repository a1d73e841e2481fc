"""Several `bench sweep` processes on one study (same spec, same results folder, embedded journal).

No trial is lost, none runs twice (each config is measured once; only an interrupted one runs
again), and one `bench report` shows them all. Also when the workers start together on a study
whose last sweep was killed: the stale trial is recovered once, not once per worker.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import yaml
from click.testing import CliRunner

from harness.cli import main
from harness.study import CONFIRM_ROUNDS, WIDE_TIE_ROUNDS
from tests.conftest import FAST_TRIAL
from tests.test_interrupt import env_for, gated, hanging_trial, start_sweep, wait_until_gone  # noqa: F401 (fixture)

WORKERS = 3
SPACE = {"batch_size": [4, 8, 16], "width": [16, 32]}


def sweep_together(folder: Path, spec: str) -> list[subprocess.CompletedProcess]:
    """WORKERS `bench sweep` processes started at once; their results once all have ended."""
    procs = [subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep", spec,
                               "--device", "cpu"], cwd=folder, env=env_for(folder),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(WORKERS)]
    try:
        return [finished(proc) for proc in procs]
    finally:
        for proc in procs:  # only when one hangs: leave no sweep behind (its trials die with it)
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def finished(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def report(folder: Path, study: str) -> list[dict]:
    old = os.getcwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(main, ["report", study, "--format", "json"], catch_exceptions=False)
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def config_of(row: dict) -> tuple:
    return tuple(row["config"][k] for k in SPACE)


def test_three_workers_share_one_study_without_losing_or_repeating_a_trial(tmp_path):
    spec = {"study": "shared", "workload": {"factory": "faulty:build", "params": {"fault": "none", "width": 16}},
            "search": SPACE, "trials": 6, "sampler": "grid", "trial": dict(FAST_TRIAL)}
    (tmp_path / "shared.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    workers = sweep_together(tmp_path, "shared.yaml")
    for w in workers:
        assert w.returncode == 0, w.stderr
        assert "Traceback" not in w.stderr
    runs = sum(w.stdout.count("    → ") for w in workers)  # one line per trial a worker really ran
    rows = report(tmp_path, "shared")
    assert sorted(config_of(r) for r in rows) == sorted((b, w) for b in SPACE["batch_size"] for w in SPACE["width"])
    assert all(r["status"] == "ok" and r["throughput"] > 0 for r in rows)
    assert runs == len(rows) == 6
    logs = tmp_path / "results" / "shared" / "logs"
    assert len(list(logs.glob("trial-????.log"))) == 6  # each confirmation run beside them in its own log
    assert all(re.fullmatch(r"trial-\d{4}(-confirm-\d+)?\.log", log.name) for log in logs.iterdir())
    assert sum(r["baseline"] for r in rows) == 1


def test_workers_resuming_a_killed_sweep_recover_its_stale_trial_once(gated):  # noqa: F811 (fixture)
    killed = start_sweep(gated)
    pgid = os.getpgid(hanging_trial(killed).pid)
    killed.kill()
    killed.communicate(timeout=30)
    assert wait_until_gone(pgid) == []
    (gated / "gate").unlink()  # the re-run of the stopped config trains normally
    workers = sweep_together(gated, "stop.yaml")
    for w in workers:
        assert w.returncode == 0, w.stderr
        assert "Traceback" not in w.stderr
    assert sum("was left running by a process that died" in w.stdout for w in workers) == 1
    rows = report(gated, "stop")
    assert Counter((r["config"]["fault"], r["status"]) for r in rows) == {
        ("none", "ok"): 1, ("hang", "interrupted"): 1, ("hang", "ok"): 1}


COUNTED = '''
import os
import time
import torch
import faulty

def build(params):
    params = dict(params)
    runs, hold, hold_after = params.pop("runs"), params.pop("hold", None), params.pop("hold_after", 0)
    if not torch.empty(0).is_meta:  # one line per trial process that trains (a FLOP count builds on meta)
        with open(runs) if os.path.exists(runs) else open(os.devnull) as f:
            earlier = len({line.split()[-1] for line in f} - {str(os.getpid())})  # other processes before it
        with open(runs, "a") as f:
            f.write(f"{params.get('batch_size', '')} {os.getpid()}\\n")
        while hold and earlier >= hold_after and os.path.exists(hold):
            time.sleep(0.05)  # a run held where the test wants the sweep killed: it never finishes
    return faulty.build(params)
'''


def processes_within(runs: Path, count: int, timeout_s: float) -> list[int]:
    """The pids COUNTED wrote to `runs`, in order, once `count` processes have (or those at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = list(dict.fromkeys(int(line.split()[-1]) for line in runs.read_text().splitlines())) \
            if runs.exists() else []
        if len(pids) >= count or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


def gone_within(pid: int, timeout_s: float) -> bool:
    """Process `pid` has ended (a zombie's parent has not reaped it yet) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_one_of_the_workers_runs_the_whole_confirmation_and_each_run_is_its_own_record(tmp_path):
    """Workers that reach the confirmation together (here: resuming a sweep killed as its confirmation
    began). Before, every worker ran the whole confirmation (3 workers: 12 runs instead of 4), and the
    study kept one worker's runs: a last-writer-wins `repeats` attribute. Then the workers split the
    runs, one #1's and another #0's: not side by side, though the report said so."""
    (tmp_path / "counted.py").write_text(COUNTED)
    runs, hold = tmp_path / "runs.txt", tmp_path / "hold"
    hold.touch()  # the first sweep's first confirmation run waits on it: none is done when the sweep is killed
    spec = {"study": "confirm", "workload": {"factory": "counted:build",
                                             "params": {"fault": "none", "width": 16, "runs": str(runs),
                                                        "hold": str(hold), "hold_after": 2,  # the 2 trials' processes
                                                        "steady_ms": 20}},  # never noisy: it reaches confirmation
            "search": {"batch_size": [2, 256]}, "trials": 2, "sampler": "grid", "trial": dict(FAST_TRIAL)}
    (tmp_path / "confirm.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    first = subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep", "confirm.yaml",
                              "--device", "cpu"], cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        said = []
        for line in first.stdout:  # up to its first confirmation line
            said.append(line)
            if line.startswith("confirming:"):
                break
        held = processes_within(runs, 3, timeout_s=120)  # its first confirmation run has started, and waits
    finally:
        first.kill()
        first.wait()
    assert said and said[-1].startswith("confirming:") and len(held) == 3, "".join(said)  # killed in its confirmation, none done
    # (before, a loaded CI machine read the line late: 3 runs were done and the workers rightly made only 1 more round)
    hold.unlink()
    held_pid = held[-1]
    assert gone_within(held_pid, timeout_s=60)  # its confirmation run dies with it
    before = len(runs.read_text().splitlines())
    workers = sweep_together(tmp_path, "confirm.yaml")
    for w in workers:
        assert w.returncode == 0, w.stderr
        assert "Traceback" not in w.stderr
    rows = {r["config"]["batch_size"]: r for r in report(tmp_path, "confirm")}
    assert rows[2]["baseline"]  # the baseline and the leader are confirmed, whichever config leads
    rounds = len(rows[2]["repeats"])  # a busy machine may make a wide tie, settled by more rounds (Sweep.settle_wide_tie)
    assert rounds in (CONFIRM_ROUNDS, CONFIRM_ROUNDS + WIDE_TIE_ROUNDS) and len(rows[256]["repeats"]) == rounds
    assert len(runs.read_text().splitlines()) - before == 2 * rounds  # 2 configs x their rounds, in all
    made = sorted(len(re.findall(r"#\d+ confirmation run \d+ of", w.stdout)) for w in workers)
    assert made == [0] * (WORKERS - 1) + [2 * rounds]


def test_a_trial_waits_for_another_bench_trial_on_the_same_device(gated):  # noqa: F811 (fixture)
    """Two sweeps of a study on one CPU ran their trials at once and measured each other's load (a
    baseline at 7 samples/s against 800 alone, and a "5.15x" best from it): the second trial now
    starts only when the first has ended, and says how long it waited."""
    tmp = gated / "tmp"
    tmp.mkdir()
    env = dict(env_for(gated), TMPDIR=str(tmp))
    trial = [sys.executable, "-c", "from harness.cli import main; main()", "trial", "stop.yaml", "--device", "cpu"]
    first = subprocess.Popen(trial + ["--set", "fault=hang"], cwd=gated, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = None
    try:
        pgid = os.getpgid(hanging_trial(first, tmp=tmp).pid)
        second = subprocess.Popen(trial + ["--set", "fault=none"], cwd=gated, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # from when it holds the lock file open (waiting for its turn), not from its start: a busy machine's
        # imports took 2 of the 4 s this test once slept in all
        assert waits_on(second, tmp / "bench-device-cpu.lock", within_s=120)
        time.sleep(3)
        assert second.poll() is None and len(list(tmp.glob("bench-trial-*"))) == 1  # no trial of its own yet
        first.terminate()
        stdout, stderr = second.communicate(timeout=120)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert wait_until_gone(pgid) == []
    assert second.returncode == 0, stderr
    rec = json.loads(stdout)
    assert rec["status"] == "ok" and rec["timing"]["device_wait_s"] > 2.5


def waits_on(proc: subprocess.Popen, lock: Path, within_s: float) -> bool:
    """True once `proc` holds `lock` open (a trial waiting for the device, or running on it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if any(os.path.realpath(fd) == str(lock.resolve()) for fd in Path(f"/proc/{proc.pid}/fd").iterdir()):
                return True
        except OSError:  # an fd closed between the listing and the look
            pass
        time.sleep(0.05)
    return False


HOLDER = """
import fcntl, os, pathlib, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)  # another worker's trial has the device
pathlib.Path(sys.argv[2]).write_text("held")
time.sleep(4)
pathlib.Path(sys.argv[3]).write_text("released")
"""


def test_a_sweep_looks_at_the_machine_only_in_its_turn_of_the_device(tmp_path, faulty_path, monkeypatch):
    """Two workers on one CPU: each looked for quiet before taking its turn, so the other's trial read as
    outside load ("machine busy before the sweep starts (1.0 of 2 cores in use by others)"), its wait
    spent on it and its runs marked busy. Every look now comes while no other bench trial has the device."""
    import tempfile
    from harness import busy
    from tests.conftest import faulty_spec
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's own device locks
    held, released = tmp_path / "held", tmp_path / "released"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "bench-device-cpu.lock"), str(held),
                               str(released)])
    looks = []  # whether the holder had let go, at each look

    def look(device, sample_s=busy.SAMPLE_S):
        looks.append(released.exists())
        if len(looks) == 1:
            time.sleep(6)  # a long look: no part of the trial's wait for the device
        return None  # quiet: what this test asks is when bench looks, not what it sees
    monkeypatch.setattr(busy, "now", look)
    try:
        while not held.exists():
            assert holder.poll() is None
            time.sleep(0.05)
        swept = CliRunner().invoke(main, ["sweep", str(faulty_spec(tmp_path, "turns", ["none"], trials=1)),
                                          "--device", "cpu"])
    finally:
        holder.kill()
        holder.wait()
    assert swept.exit_code == 0, swept.output
    assert looks and all(looks), looks
    (first,) = [r for r in json.loads(CliRunner().invoke(main, ["report", "--format", "json"]).output) if r["number"] == 0]
    assert 0 < first["timing"]["device_wait_s"] < 6, first["timing"]  # the holder's 4 s at most


def test_another_users_lock_file_is_still_a_turn_under_protected_regular(tmp_path, monkeypatch):
    """With fs.protected_regular (systemd's default) an O_CREAT open of another user's file in /tmp fails
    though it exists: the trial then measured beside the other user's, without its turn. Staged: O_CREAT
    opens of an existing file refused, as the kernel refuses them there."""
    import fcntl
    from harness import launch
    lock = tmp_path / "bench-device-cpu.lock"
    monkeypatch.setattr(launch, "lock_path", lambda device: lock)
    lock.touch()
    held = os.open(lock, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # the other user's sweep has the device
    real_open = os.open

    def protected(path, flags, *args):
        if flags & os.O_CREAT and os.path.exists(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)
    monkeypatch.setattr(os, "open", protected)
    try:
        assert launch.turn_taken({"device": "cpu", "config": {}})
    finally:
        os.close(held)
    assert not launch.turn_taken({"device": "cpu", "config": {}})
