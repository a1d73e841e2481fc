"""Kills and Ctrl-C at the seams between two writes that earlier rounds did not reach.

The sweep is stopped through the journal's append, the seam every study write goes through (as in
tests/test_ledger.py), or through the apply writer's own steps.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from harness.cli import main

from tests.conftest import FAST_TRIAL, project  # noqa: F401 (a fixture)
from tests.test_apply_cli import hydra_study
from tests.test_interrupt import ctrl_c_reaches_it, env_for

# kill -9 the sweep at its second write of a grid config into the queue: the first sweep of a grid spec
# stopped in the second or so it spends queueing the grid (Ctrl-C right after starting does the same)
IN_THE_GRID_QUEUE = '''
import os, signal
from harness.storage import GuardedJournal  # the journal append every sweep makes
seen = [0]
def append_logs(self, logs):
    seen[0] += sum(bool((log.get("user_attrs") or {}).get("grid")) for log in logs)
    if seen[0] >= 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, logs)
real, GuardedJournal.append_logs = GuardedJournal.append_logs, append_logs
from harness.cli import main; main()
'''


def bench(folder: Path, *args: str, code: str = "from harness.cli import main; main()") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=folder, capture_output=True, text=True,
                          env=env_for(folder), timeout=300, preexec_fn=ctrl_c_reaches_it)


def test_a_grid_queued_in_part_by_a_killed_sweep_is_queued_whole_on_resume(tmp_path):
    """A grid's configs are queued one write each; a kill between two of them left the rest never queued, and
    the resume drew random configs instead (a grid is a RandomSampler with the grid queued), so a grid sweep
    stopped early ("the best has not improved") with configs of its grid never measured."""
    spec = {"study": "grid", "workload": {"factory": "faulty:build", "params": {"fault": "none", "width": 16}},
            "search": {"batch_size": [1, 2, 4, 8, 16, 32], "accumulation": [1, 2, 4]}, "trials": 18, "sampler": "grid",
            "trial": dict(FAST_TRIAL)}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    killed = bench(tmp_path, "sweep", "grid.yaml", "--device", "cpu", code=IN_THE_GRID_QUEUE)
    assert killed.returncode == -9, killed.stderr
    resumed = bench(tmp_path, "sweep", "grid.yaml", "--device", "cpu")
    assert resumed.returncode == 0, resumed.stderr
    report = bench(tmp_path, "report", "grid", "--format", "json")
    assert report.returncode == 0, report.stderr
    measured = {(r["config"]["batch_size"], r["config"]["accumulation"]) for r in json.loads(report.stdout)
                if r["status"] == "ok"}
    assert measured == {(b, a) for b in (1, 2, 4, 8, 16, 32) for a in (1, 2, 4)}, resumed.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("landing", ["main config", "profile"])
def test_ctrl_c_as_a_file_of_the_pair_is_written_puts_both_back(project, monkeypatch, landing, signum):
    """A real SIGINT that lands while a file of the main config + Hydra profile pair is finishing its write
    (after its rename: its folder's fsync, the pruning of old backups) raised out of write() before
    write_together knew that file was written: the main config kept the new values with no profile to match
    them, or was put back while the new profile stayed; exit 130 all the same."""
    from harness.apply import _write
    group, target, before = hydra_study(project)
    real = _write._tidy

    def ctrl_c_while_tidying(path):
        if (Path(path).parent == group) == (landing == "profile"):
            os.kill(os.getpid(), signum)  # as a terminal's Ctrl-C (or a SIGTERM): Python raises at its next instruction
        return real(path)

    monkeypatch.setattr(_write, "_tidy", ctrl_c_while_tidying)
    mine = signal.signal(signal.SIGINT, signal.default_int_handler)  # a test run in the background ignores it
    try:
        result = CliRunner().invoke(main, ["apply", "best"])
    finally:
        signal.signal(signal.SIGINT, mine)
    said = " ".join(result.output.split())
    words = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"  # ended silently, between the two
    assert result.exit_code == 128 + signum and said.endswith(f"{words}: the command stopped"), said
    assert target.read_bytes() == before and not list(target.parent.glob("*.bench-backup-*"))
    assert not list(group.iterdir())


# Ctrl-C (a real SIGINT to the sweep itself) at a chosen point of a trial's life, outside the trial's run
CTRL_C_AT = '''
import os, signal, sys
where = sys.argv.pop(1)
from harness import study
owner = study.Sweep if where == "log_of" else study.search
real = getattr(owner, where)
def at(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
setattr(owner, where, at)
from harness.cli import main; main()
'''

STATES = '''
import json, sys, optuna
from optuna.storages.journal import JournalStorage, JournalFileBackend
study = optuna.load_study(study_name="seam", storage=JournalStorage(JournalFileBackend("results/seam/journal.log")))
print(json.dumps([[t.number, t.state.name, t.user_attrs.get("status"), (t.user_attrs.get("record") or {}).get("throughput")]
                  for t in study.get_trials(deepcopy=False)]))
'''


@pytest.mark.parametrize("where, then", [
    ("skip_reason", "interrupted"),  # claimed, its child not started yet
    ("log_of", "measured"),          # its child ran and returned a record, not yet told to the study
])
def test_ctrl_c_between_the_claim_and_the_tell_leaves_no_trial_running(tmp_path, where, then):
    """Only the claim itself and the child's run were guarded: a Ctrl-C landing on the steps between them
    (reading the study for a skip, the header, the slow cut; after the run, the leader before the tell)
    left the trial RUNNING under a line that said no trial was running or that it was recorded interrupted;
    after the run, the measurement it had made was dropped and the config ran again on resume."""
    spec = {"study": "seam", "workload": {"factory": "faulty:build", "params": {"fault": "none", "width": 16}},
            "search": {"batch_size": [4, 8]}, "trials": 1, "sampler": "random", "trial": dict(FAST_TRIAL)}
    (tmp_path / "seam.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    stopped = bench(tmp_path, where, "sweep", "seam.yaml", "--device", "cpu", code=CTRL_C_AT)
    assert stopped.returncode == 130, stopped.stderr
    assert "re-run the same command to resume" in stopped.stderr and "Traceback" not in stopped.stderr
    states = json.loads(bench(tmp_path, code=STATES).stdout)
    assert [s[1] for s in states if s[1] == "RUNNING"] == [], states
    trial = states[0]
    if then == "measured":
        assert trial[1] == "COMPLETE" and trial[2] == "ok" and trial[3] > 0, states
    else:
        assert trial[1] == "FAIL" and trial[2] == "interrupted", states
