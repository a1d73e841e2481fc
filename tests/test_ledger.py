"""A trial's life in the study (asked -> claimed -> measured | interrupted) survives a kill anywhere.

Real `bench sweep` processes on a real journal. The claim window (between Optuna's ask() and the
worker's claim) is hit through the journal's append, the seam every study write goes through: a
kill -9 or a full disk exactly when the claim is written. The warm trial server is killed with a
real SIGKILL while a trial runs in it.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import FAST_TRIAL
from tests.test_interrupt import ctrl_c_reaches_it, end_gated, env_for, hanging_trial, wait_until_gone, write_gated

# Stop the sweep the moment it writes its first claim of a trial (the `worker` user attr): the trial is
# asked (RUNNING) and never claimed. KILL: the process dies there; FULL: the disk is full there.
IN_THE_CLAIM_WINDOW = '''
import errno, os, signal, sys
from harness.storage import GuardedJournal  # the journal append every sweep makes
how = sys.argv.pop(1)
def append_logs(self, logs):
    if any("worker" in (log.get("user_attr") or {}) for log in logs):
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, "No space left on device", self._file_path)
    return real(self, logs)
real, GuardedJournal.append_logs = GuardedJournal.append_logs, append_logs
from harness.cli import main; main()
'''


def bench(folder: Path, *args: str, code: str = "from harness.cli import main; main()") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=folder, capture_output=True, text=True,
                          env=env_for(folder), timeout=300)


def rows(folder: Path, study: str) -> list[dict]:
    result = bench(folder, "report", study, "--format", "json")
    assert result.returncode == 0, result.stderr
    return sorted(json.loads(result.stdout), key=lambda r: r["number"])


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture
def two_configs(tmp_path) -> Path:
    spec = {"study": "ledger", "workload": {"factory": "faulty:build", "params": {"fault": "none", "width": 16}},
            "search": {"batch_size": [4, 8]}, "trials": 2, "sampler": "grid", "trial": dict(FAST_TRIAL)}
    (tmp_path / "ledger.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tmp_path


@pytest.mark.parametrize("how", ["kill", "full"])
def test_a_trial_asked_but_never_claimed_is_interrupted_and_runs_again(two_configs, how):
    """kill -9 or a full disk between ask() and the claim: before, the trial stayed `running` forever,
    counted toward --trials, and its config counted as measured though it never ran."""
    first = bench(two_configs, how, "sweep", "ledger.yaml", "--device", "cpu", code=IN_THE_CLAIM_WINDOW)
    if how == "kill":
        assert first.returncode == -signal.SIGKILL
    else:
        assert first.returncode == 2, first.stderr
        [line] = lines(first.stderr)
        assert "no space left" in line and "re-run the same command" in line
    assert [r["status"] for r in rows(two_configs, "ledger")] == ["running"]  # as the dead sweep left it
    aged = bench(two_configs, "report", "ledger", "--format", "json",  # no worker was ever named: its age tells
                 code="from harness import ledger; ledger.UNCLAIMED_AFTER_S = 0; from harness.cli import main; main()")
    assert [r["status"] for r in json.loads(aged.stdout)] == ["interrupted"], aged.stderr

    again = bench(two_configs, "sweep", "ledger.yaml", "--device", "cpu")
    assert again.returncode == 0, again.stderr
    assert "trial 0 was left running by a process that died; it runs again" in again.stdout
    assert "already measured" not in again.stdout  # nothing counted as measured that was not
    after = rows(two_configs, "ledger")
    assert after[0]["status"] == "interrupted" and after[0]["throughput"] is None
    measured = {r["config"]["batch_size"]: r for r in after if r["status"] == "ok"}
    assert sorted(measured) == [4, 8]  # every config measured, the orphan's included
    assert sum(r["baseline"] for r in after) == 1 and measured[after[0]["config"]["batch_size"]]["baseline"]


AFTER_THE_RECORD = '''
import os, signal, sys
from harness.storage import GuardedJournal  # the journal append every sweep makes
def append_logs(self, logs):
    real(self, logs)
    if any(((log.get("user_attr") or {}).get("record") or {}).get("status") == "ok" for log in logs):
        os.kill(os.getpid(), signal.SIGKILL)  # the record is written, the tell is not
real, GuardedJournal.append_logs = GuardedJournal.append_logs, append_logs
from harness.cli import main; main()
'''


def test_a_kill_between_the_record_and_the_tell_keeps_the_measurement(two_configs):
    """The record was written and the process died before Optuna's tell: the resume called the trial
    interrupted and measured its config again, discarding a measurement it held."""
    first = bench(two_configs, "sweep", "ledger.yaml", "--device", "cpu", code=AFTER_THE_RECORD)
    assert first.returncode == -signal.SIGKILL
    [left] = rows(two_configs, "ledger")
    assert left["status"] == "ok" and left["throughput"] > 0  # the record is there, the trial RUNNING
    again = bench(two_configs, "sweep", "ledger.yaml", "--device", "cpu")
    assert again.returncode == 0, again.stderr
    assert "trial 0 was measured by a process that died before it was told; its measurement is kept" in again.stdout
    after = rows(two_configs, "ledger")
    assert sorted((r["config"]["batch_size"], r["status"]) for r in after) == [(4, "ok"), (8, "ok")], after  # once each
    assert after[0]["throughput"] == left["throughput"] and after[0]["baseline"]


# ---- the warm trial server killed mid-trial ------------------------------------------------------------

@pytest.fixture
def gated(tmp_path):
    """The gated factory (tests/test_interrupt.py) with `hang` first: the baseline is the hanging config."""
    write_gated(tmp_path, ["hang", "none"])
    started: list[subprocess.Popen] = []
    yield tmp_path, started
    end_gated(tmp_path, started)


def start(folder: Path, started: list, *args: str) -> subprocess.Popen:
    started.append(subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep",
                                     "stop.yaml", "--device", "cpu", *args], cwd=folder, env=env_for(folder),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=ctrl_c_reaches_it))
    return started[-1]


def assert_baseline_measured(folder: Path) -> list[dict]:
    """The hanging config (the baseline) measured ok and marked baseline; its stopped try is only a try."""
    after = rows(folder, "stop")
    hang = [r for r in after if r["config"]["fault"] == "hang"]
    assert [r["status"] for r in hang] == ["interrupted", "ok"], hang
    assert [r["baseline"] for r in hang] == [False, True]
    table = bench(folder, "report", "stop")
    assert table.returncode == 0, table.stderr
    assert "ended interrupted" not in table.stdout and "nothing to compare against" not in table.stdout
    # compared with, itself best, or (a busy machine) named as noisy: measured, whichever
    assert re.search(rf"(trial #?|noisy\): .*#){hang[1]['number']}\b", table.stdout), table.stdout
    return after


def test_kill_9_of_the_warm_trial_server_mid_trial_is_interrupted_and_runs_again(gated):
    """Before: `crash: killed by SIGKILL (... OOM killer)`, never re-run, and (as the baseline) the
    comparison gone."""
    folder, started = gated
    sweep = start(folder, started)
    trial = hanging_trial(sweep)
    server = psutil.Process(trial.ppid())
    assert server.pid != sweep.pid and "harness.zygote" in " ".join(server.cmdline())  # a warm start
    (folder / "gate").unlink()  # the same config, run again, trains normally
    server.kill()
    out, err = sweep.communicate(timeout=240)
    assert sweep.returncode == 0, err
    assert "Traceback" not in err
    assert wait_until_gone(trial.pid) == []
    assert "→ interrupted: the warm trial server was killed during the trial" in out
    after = assert_baseline_measured(folder)
    stopped = next(r for r in after if r["status"] == "interrupted")
    assert stopped["number"] == 0 and stopped["error"]["type"] == "TrialServerDied"


def test_grid_with_the_baseline_interrupted_keeps_the_baseline_on_resume(gated):
    """Ctrl-C in the baseline (trial 0) of a grid, then resume: before, its config re-ran as a plain grid
    trial and the report said `baseline (trial 0) ended interrupted: nothing to compare against`."""
    folder, started = gated
    sweep = start(folder, started)
    hanging_trial(sweep)
    sweep.send_signal(signal.SIGINT)
    sweep.communicate(timeout=60)
    assert sweep.returncode == 130
    (folder / "gate").unlink()
    resumed = bench(folder, "sweep", "stop.yaml", "--device", "cpu")
    assert resumed.returncode == 0, resumed.stderr
    assert_baseline_measured(folder)


def test_the_journal_deleted_mid_sweep_is_one_line_and_no_new_journal(tmp_path):
    """Before: a traceback (and an append would start a new journal holding only the records after it)."""
    from tests.test_database_blip import GATE_WAIT, wait_for
    (tmp_path / "gatewait.py").write_text(GATE_WAIT)
    gate = tmp_path / "gate"
    gate.touch()
    spec = {"study": "gone", "workload": {"factory": "gatewait:build",
                                          "params": {"fault": "none", "width": 16, "gate": str(gate)}},
            "search": {"batch_size": [4, 8]}, "trials": 2, "sampler": "grid", "trial": dict(FAST_TRIAL)}
    (tmp_path / "gone.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    sweep = subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep", "gone.yaml",
                              "--device", "cpu"], cwd=tmp_path, env=env_for(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(tmp_path / "gate.started", sweep)
        journal = tmp_path / "results" / "gone" / "journal.log"
        journal.unlink()
        gate.unlink()
        _, err = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode == 2, err
    [line] = lines(err)
    assert "journal.log: the study's journal was deleted or replaced while this sweep ran" in line
    assert not journal.exists()


def test_a_lock_file_a_kill_9_left_does_not_stall_the_next_sweep(tmp_path):
    """kill -9 while the journal's lock file existed: the next sweep stalled 30 s behind three Optuna
    warnings, and so did every other worker of the study."""
    import os
    import time
    from harness import storage
    lock = tmp_path / "results" / "s" / "journal.log.lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    an_hour_ago = time.time() - 3600
    os.utime(lock, (an_hour_ago, an_hour_ago))
    said, started = [], time.monotonic()
    storage.open_storage(None, tmp_path / "results", "s", say=said.append)
    assert time.monotonic() - started < 10 and not lock.exists()
    assert said == [f"{lock}: removed the journal's lock file a killed sweep left; nothing else was touched"]


def test_a_trial_asked_before_any_config_was_drawn_shows_no_row(tmp_path):
    """A kill between ask() and the config's draw left a row with no config: `running` (so the report said a
    sweep was running when none was), then `interrupted` for good, though nothing was to run again."""
    import optuna
    from harness import ledger
    study = optuna.create_study(directions=["maximize", "minimize"])
    trial = study.ask()  # what a kill -9 right after it leaves
    assert ledger.rows_of(study) == []
    trial.set_user_attr("status", "interrupted")  # the next sweep's recovery (Sweep.tell_interrupted)
    trial.set_user_attr("record", {"status": "interrupted", "config": None, "error": {"message": "its process died"}})
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    assert ledger.rows_of(study) == []
