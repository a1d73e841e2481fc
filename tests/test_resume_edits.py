"""Resumes after a spec edit, and workers that start together: each is checked against the study it joins,
and every view chooses as the sweep did."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import optuna
from click.testing import CliRunner

from harness import ledger, storage as stores
from harness.cli import hardware_model, main
from tests.conftest import faulty_spec


def test_a_worker_joining_a_study_with_no_trial_yet_is_checked_like_any_resume(tmp_path, faulty_path, monkeypatch):
    """A second worker that reached the study after the first had written its header but before its baseline
    was queued took the study for its own: it ran under its own memory budget (or device) in the first one's
    study, and the report judged every trial by the header's budget."""
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "s", ["none"], trials=1)
    first = faulty_spec(tmp_path, "first", ["none"], trials=1, study="s", memory={"budget": "2GiB"})
    from harness import spec as specs
    spec = specs.load(first)
    (tmp_path / "results").mkdir()
    storage = stores.open_storage(None, tmp_path / "results", "s", say=lambda line: None)
    ledger.create(spec, storage, "cpu", hardware_model("cpu"))  # the first worker, a moment before its baseline
    joined = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu", "--memory-budget", "3GiB"])
    assert joined.exit_code == 2, joined.output
    assert "study 's' measured under memory budget 2 GiB, this run asks for 3 GiB" in joined.output
    assert not optuna.load_study(study_name="s", storage=storage).get_trials()


def test_workers_started_together_with_other_budgets_do_not_share_a_study(tmp_path, faulty_path):
    """Two `bench sweep`s started at one instant (a Slurm array's tasks) both ran, each under its own budget, in
    one study: neither was checked, as neither found a trial when it opened the study."""
    faulty_spec(tmp_path, "s", ["none"], trials=1)
    start = time.time() + 6
    go = ("import sys, time\nfrom harness.cli import main\nimport harness.ledger, harness.study, optuna\n"
          f"while time.time() < {start}: time.sleep(0.0005)\nsys.argv = ['bench'] + sys.argv[1:]\nmain()\n")
    env = dict(os.environ, BENCH_QUIET_WAIT="0")
    workers = [subprocess.Popen([sys.executable, "-c", go, "sweep", "s.yaml", "--device", "cpu", *extra],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for extra in ([], ["--memory-budget", "2GiB"])]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    codes = sorted(w.returncode for w in workers)
    assert codes == [0, 2], outputs
    assert any("measured under memory budget" in out for out in outputs), outputs


def test_a_resume_with_another_headroom_is_the_headroom_every_view_chooses_with(tmp_path, faulty_path, monkeypatch):
    """The sweep chose with the spec's new headroom, `bench report` and `bench apply` with the study's first:
    raised from 10% to 30%, the report still named as best a trial leaving 20% free, and nothing said so."""
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "s", ["none"], trials=1, memory={"budget": "512MiB", "headroom": 0.1})
    assert CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"]).exit_code == 0
    path = faulty_spec(tmp_path, "s", ["none"], trials=1, memory={"budget": "512MiB", "headroom": 0.3})
    again = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    assert "note: memory.headroom 0.1 -> 0.3: best now leaves 30% of the capacity free" in said, said
    shown = CliRunner().invoke(main, ["report", "s"])
    assert shown.exit_code == 0, shown.output
    assert "required headroom 30%" in " ".join(shown.output.split()), shown.output
    same = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert same.exit_code == 0 and "memory.headroom" not in same.output, same.output
    narrower = faulty_spec(tmp_path, "s", ["none"], trials=1, memory={"budget": "1GiB", "headroom": 0.5})
    refused = CliRunner().invoke(main, ["sweep", str(narrower), "--device", "cpu"])  # a refused resume writes nothing
    assert refused.exit_code == 2, refused.output
    storage = stores.open_storage(None, tmp_path / "results", "s", say=lambda line: None)
    assert optuna.load_study(study_name="s", storage=storage).user_attrs["headroom"] == 0.3


def test_workers_started_together_on_a_new_sqlite_file_all_open_it(tmp_path):
    """Two `bench sweep --storage sqlite:///...` started together on a file not made yet: both created Optuna's
    tables, and the one that lost said "cannot open it ((sqlite3.OperationalError) table studies already
    exists); check the URL, the server and the password", exit 2 (2 of 3 tries with two workers)."""
    opener = ("import sys, time\nfrom pathlib import Path\nfrom harness import storage\n"
              "while time.time() < float(sys.argv[2]): time.sleep(0.0005)\n"
              "storage.open_storage(sys.argv[1], Path('results'), 's', say=print)\nprint('opened')\n")
    for n in range(3):
        start = str(time.time() + 4)
        url = f"sqlite:///{tmp_path / f'new{n}.db'}"
        workers = [subprocess.Popen([sys.executable, "-c", opener, url, start], cwd=tmp_path, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for _ in range(4)]
        outputs = [w.communicate(timeout=120)[0] for w in workers]
        assert all(w.returncode == 0 and "opened" in out for w, out in zip(workers, outputs)), outputs
