"""The embedded study store loses nothing: torn writes, a damaged record, a full disk, a read-only folder.

Every case runs the real `bench` in a subprocess on a real journal written by a real one-trial sweep.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import FAST_TRIAL, FAULTY_DIR, ROOT

SPEC = {"study": "store", "workload": {"factory": "faulty:build", "params": {"fault": "none", "width": 16}},
        "search": {"batch_size": [4, 8]}, "trials": 2, "sampler": "grid", "trial": dict(FAST_TRIAL)}

# A full disk in the middle of a tell: half the record reaches the file, then ENOSPC (the seam: Optuna's
# journal append). Used only by the ENOSPC test, through `python -c`.
FULL_DISK = '''
import errno, json
from optuna.storages.journal import JournalFileBackend
def append_logs(self, logs):
    text = "\\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\\n"
    if '"record"' in text:
        with open(self._file_path, "ab") as f:
            f.write(text.encode()[: len(text) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", self._file_path)
    return real(self, logs)
real, JournalFileBackend.append_logs = JournalFileBackend.append_logs, append_logs
from harness.cli import main; main()
'''


def bench(folder: Path, *args: str, code: str = "from harness.cli import main; main()") -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(FAULTY_DIR), str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=folder, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path), timeout=300)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def rows(folder: Path) -> list[dict]:
    result = bench(folder, "report", "store", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def one_trial(tmp_path_factory) -> Path:
    """A study folder after a real sweep of one of its two configs."""
    folder = tmp_path_factory.mktemp("one-trial")
    (folder / "store.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    result = bench(folder, "sweep", "store.yaml", "--device", "cpu", "--trials", "1")
    assert result.returncode == 0, result.stderr
    return folder


@pytest.fixture
def study(one_trial, tmp_path) -> Path:
    shutil.copytree(one_trial, tmp_path / "s")
    return tmp_path / "s"


def journal(folder: Path) -> Path:
    return folder / "results" / "store" / "journal.log"


@pytest.mark.parametrize("damage", ["cut mid-record", "garbage appended"])
def test_a_torn_tail_is_backed_up_and_repaired_and_the_sweep_resumes(study, damage):
    path = journal(study)
    whole = path.read_bytes()
    records = whole.count(b"\n")
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[1]
    torn = whole[: len(whole) - len(last) // 2 - 1] if damage == "cut mid-record" else whole + b"\x00\x00garbage{\n"
    kept = records - 1 if damage == "cut mid-record" else records
    path.write_bytes(torn)

    assert [r["status"] for r in rows(study)] == ["ok"]  # reading skips the torn tail and writes nothing
    assert path.read_bytes() == torn
    shown = bench(study, "report", "store")  # and says so: it ranked what was left as if it were all
    assert shown.returncode == 0 and "its last record is cut off" in shown.stderr, shown.stderr
    assert "the next `bench sweep` of the study repairs it" in shown.stderr

    resumed = bench(study, "sweep", "store.yaml", "--device", "cpu")
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    [note] = lines(resumed.stderr)
    assert f"kept the {kept} whole records" in note and "backed up at" in note
    backup = study / note.rsplit("backed up at ", 1)[1]
    assert backup.read_bytes() == torn
    # a lost last record is a lost tell: the trial's record was written before it, so it is kept
    assert ("its measurement is kept" in resumed.stdout) == (damage == "cut mid-record")
    assert sorted(r["status"] for r in rows(study)) == ["ok", "ok"]
    assert bench(study, "sweep", "store.yaml", "--device", "cpu").returncode == 0  # and stays readable


def test_a_corrupt_record_in_the_middle_is_one_line_naming_file_and_line(study):
    path = journal(study)
    records = path.read_bytes().split(b"\n")
    records[2] = b'{"op_code": 5, "broken'
    damaged = b"\n".join(records)
    path.write_bytes(damaged)
    for args in (("report", "store"), ("sweep", "store.yaml", "--device", "cpu")):
        result = bench(study, *args)
        assert result.returncode == 2, result.stderr
        [line] = lines(result.stderr)
        assert f"{path.relative_to(study)}:3:" in line and "Traceback" not in line
    assert path.read_bytes() == damaged  # nothing repaired or lost behind the user's back


def test_a_full_disk_is_one_line_and_the_study_resumes_once_space_is_free(study):
    full = bench(study, "sweep", "store.yaml", "--device", "cpu", code=FULL_DISK)
    assert full.returncode == 2, full.stderr
    [line] = lines(full.stderr)
    assert "no space left" in line and "re-run the same command" in line
    resumed = bench(study, "sweep", "store.yaml", "--device", "cpu")
    assert resumed.returncode == 0, resumed.stderr
    assert "was cut off" in resumed.stderr  # the half-written record
    assert "was left running by a process that died" in resumed.stdout  # the trial it was telling runs again
    statuses = sorted(r["status"] for r in rows(study))
    assert statuses == ["interrupted", "ok", "ok"]


def test_report_reads_a_read_only_results_folder(study):
    results = study / "results"
    before = sorted((p.relative_to(results), p.read_bytes()) for p in results.rglob("*") if p.is_file())
    report = ["report", "store", "--format", "json"]
    if os.geteuid() == 0:  # root ignores mode bits: a read-only bind mount in a private mount namespace
        if shutil.which("unshare") is None:
            pytest.skip("root without unshare(1): cannot make a read-only folder")
        script = (f'mount --bind "{results}" "{results}" && mount -o remount,bind,ro "{results}" && '
                  f'exec "{sys.executable}" -c "from harness.cli import main; main()" ' + " ".join(report))
        path = os.pathsep.join(filter(None, [str(FAULTY_DIR), str(ROOT), os.environ.get("PYTHONPATH")]))
        result = subprocess.run(["unshare", "--mount", "sh", "-c", script], cwd=study, capture_output=True,
                                text=True, env=dict(os.environ, PYTHONPATH=path), timeout=120)
    else:
        subprocess.run(["chmod", "-R", "a-w", str(results)], check=True)
        try:
            result = bench(study, *report)
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(results)], check=True)
    assert result.returncode == 0, result.stderr
    assert [r["status"] for r in json.loads(result.stdout)] == ["ok"]
    assert sorted((p.relative_to(results), p.read_bytes()) for p in results.rglob("*") if p.is_file()) == before
