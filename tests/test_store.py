"""The study store loses nothing: torn writes, a damaged record, a full disk, a read-only folder, a lock.

Every case runs the real `bench` in a subprocess on a real journal written by a real one-trial sweep,
or on a real SQLite file (written by Optuna, or by a real one-trial sweep where the sweep must find
its study whole).
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import FAST_TRIAL, FAULTY_DIR, ROOT

SPEC = {"study": "store", "workload": {"factory": "faulty:build", "params": {"fault": "none", "width": 16}},
        "search": {"batch_size": [4, 8]}, "trials": 2, "sampler": "grid", "trial": dict(FAST_TRIAL)}

# A full disk in the middle of a tell: half the record reaches the file, then ENOSPC (the seam: the write
# to the journal). Used only by the ENOSPC test, through `python -c`.
FULL_DISK = '''
import errno, os
real_write = os.write
def write(fd, data):
    if bytes(data).find(b'"record"') >= 0 and os.readlink(f"/proc/self/fd/{fd}").endswith("journal.log"):
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    return real_write(fd, data)
os.write = write
from harness.cli import main; main()
'''


def bench(folder: Path, *args: str, code: str = "from harness.cli import main; main()",
          **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=folder, capture_output=True, text=True,
                          env=bench_env(**env), timeout=300)


def bench_env(**env: str) -> dict:
    path = os.pathsep.join(filter(None, [str(FAULTY_DIR), str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **env)


def started(folder: Path, *args: str, **env: str) -> subprocess.Popen:
    """`bench` running, its stderr read as it comes."""
    return subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", *args], cwd=folder,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=bench_env(**env))


def said_before_end(proc: subprocess.Popen, phrase: str) -> str | None:
    """The first stderr line holding `phrase`, read while `proc` runs; None if it ends first."""
    for line in proc.stderr:
        if phrase in line:
            return line
    return None


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
    journal = (study / "results" / "store" / "journal.log").read_bytes()
    assert journal.endswith(b"\n")  # the half-written record was cut back off: no torn line for the next writer
    resumed = bench(study, "sweep", "store.yaml", "--device", "cpu")
    assert resumed.returncode == 0, resumed.stderr
    assert "was cut off" not in resumed.stderr  # nothing to repair
    assert "was left running by a process that died" in resumed.stdout  # the trial it was telling runs again
    statuses = sorted(r["status"] for r in rows(study))
    assert statuses == ["interrupted", "ok", "ok"]


def test_a_torn_tail_a_dead_writer_left_is_cut_before_the_next_record_not_joined_to_it(tmp_path):
    """A writer killed (or refused by a full disk) mid-line left a torn tail; the next worker's record joined
    it into one bad line in the middle of the journal, and every worker's read failed with a traceback."""
    from optuna.storages.journal import JournalFileOpenLock
    from harness import storage
    path = tmp_path / "journal.log"
    path.write_bytes(b'{"op_code":0,"worker_id":"a"}\n{"op_code":5,"wor')  # a whole line, then a torn one
    journal = storage.GuardedJournal(path, JournalFileOpenLock(str(path)))  # as open_storage makes it
    journal.append_logs([{"op_code": 0, "worker_id": "b"}])
    assert [log["worker_id"] for log in journal.read_logs(0)] == ["a", "b"]


def test_report_reads_a_read_only_results_folder(study):
    results = study / "results"
    before = sorted((p.relative_to(results), p.read_bytes()) for p in results.rglob("*") if p.is_file())
    result = read_only(study, results, "report", "store", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert [r["status"] for r in json.loads(result.stdout)] == ["ok"]
    assert sorted((p.relative_to(results), p.read_bytes()) for p in results.rglob("*") if p.is_file()) == before


def read_only(folder: Path, shut: Path, *args: str) -> subprocess.CompletedProcess:
    """`bench *args` run in `folder` while `shut` cannot be written."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(shut)], check=True)
        try:
            return bench(folder, *args)
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(shut)], check=True)
    if shutil.which("unshare") is None:  # root ignores mode bits: a read-only bind mount in a private mount namespace
        pytest.skip("root without unshare(1): cannot make a read-only folder")
    script = (f'mount --bind "{shut}" "{shut}" && mount -o remount,bind,ro "{shut}" && '
              f'exec "{sys.executable}" -c "from harness.cli import main; main()" ' + " ".join(args))
    return subprocess.run(["unshare", "--mount", "sh", "-c", script], cwd=folder, capture_output=True, text=True,
                          env=bench_env(), timeout=300)


def test_a_journal_lock_file_is_waited_for_in_one_line(study):
    """Before: the sweep waited Optuna's 30 s grace period for a lock file in silence, then went on."""
    lock = journal(study).with_name("journal.log.lock")
    lock.touch()
    proc = started(study, "sweep", "store.yaml", "--device", "cpu")
    line = said_before_end(proc, "waiting for")
    time.sleep(11)  # past Optuna's first "It is taking longer than 10.0 seconds": said once, by bench
    lock.unlink(missing_ok=True)  # its holder lets go: the sweep goes on
    rest = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, rest
    assert line and "journal.log.lock" in line and "up to 30 s" in line, line
    assert "Traceback" not in rest and "taking longer" not in rest, rest


def test_a_sweep_into_a_copied_study_folder_is_refused(study):
    """Before: the sweep made a second study, 'copy', in the copied journal (which holds 'store') and
    measured every config again, while `bench report copy` refused the folder."""
    results = study / "results"
    shutil.copytree(results / "store", results / "copy")
    copied = sorted((p.name, p.read_bytes()) for p in (results / "copy").rglob("*") if p.is_file())
    result = bench(study, "sweep", "store.yaml", "--device", "cpu", "--study", "copy")
    assert result.returncode == 2, result.stderr
    [line] = lines(result.stderr)
    assert "no study named 'copy'" in line and "it holds 'store'" in line and "Traceback" not in line, line
    assert sorted((p.name, p.read_bytes()) for p in (results / "copy").rglob("*") if p.is_file()) == copied


# ---- a SQLite database ---------------------------------------------------------------------------

SQLITE = "sqlite:///store.db"


def optuna_database(path: Path, trials: int = 0) -> Path:
    """Study 'store' as Optuna writes it to SQLite; `trials` make the file long enough that damage in its
    middle hits them."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    made = optuna.create_study(study_name="store", storage=f"sqlite:///{path}", directions=["maximize", "minimize"])
    for _ in range(trials):
        trial = made.ask()
        trial.set_user_attr("note", "x" * 200)
        made.tell(trial, [1.0, 1.0])
    return path


@pytest.fixture
def spec_folder(tmp_path) -> Path:
    (tmp_path / "store.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    return tmp_path


@pytest.mark.parametrize("damage", ["bytes overwritten", "cut short"])
def test_a_damaged_database_is_one_line_and_left_as_it_was(spec_folder, damage):
    """Before: a StorageInternalError traceback from `database disk image is malformed` (exit 1), or, cut
    short, 'holds no Optuna study (not a database a sweep wrote); ... run bench sweep with it first'."""
    path = optuna_database(spec_folder / "store.db", trials=200)
    with open(path, "r+b") as f:
        if damage == "cut short":
            f.truncate(40000)
        else:
            f.seek(20000)
            f.write(b"\xde\xad" * 1500)
    damaged = path.read_bytes()
    for args in (("report", "store"), ("apply", "best", "--study", "store"),
                 ("sweep", "store.yaml", "--device", "cpu")):
        result = bench(spec_folder, *args, "--storage", SQLITE)
        assert result.returncode == 2, result.stderr
        [line] = lines(result.stderr)
        assert "store.db" in line and "damaged" in line and "restore it from a backup" in line, line
    assert path.read_bytes() == damaged
    assert sorted(p.name for p in spec_folder.iterdir()) == ["store.db", "store.yaml"]  # no lock, no journal beside it


def test_a_database_locked_by_another_process_is_waited_for_then_said(tmp_path):
    """Before: 'holds no Optuna study (not a database a sweep wrote); check the path, or run bench sweep
    --storage with it first', five seconds after it was asked."""
    path = optuna_database(tmp_path / "store.db")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another program's transaction: nobody reads until it ends
    try:
        result = bench(tmp_path, "report", "store", "--storage", SQLITE, BENCH_STORAGE_RETRY_S="2")
        proc = started(tmp_path, "report", "store", "--storage", SQLITE)
        waiting = said_before_end(proc, "locked by another process")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 2, result.stderr
    *_, line = lines(result.stderr)
    assert "locked by another process" in line and "re-run" in line and "Traceback" not in result.stderr, line
    assert len(lines(result.stderr)) == 2 and "holds no Optuna study" not in result.stderr  # the wait, then why
    rest = proc.stderr.read()
    assert waiting and proc.wait(timeout=120) == 0, rest  # once the other process lets go, the report goes on


def test_a_sweep_of_scenarios_into_a_locked_database_says_its_wait_and_stops(spec_folder):
    """Before: the resume check of every scenario waited for the lock without a word, took the lock's
    error for "a first sweep" and went on to open the database again."""
    path = optuna_database(spec_folder / "store.db")
    spec = {**SPEC, "scenarios": {"small": {"search": {"batch_size": [4]}}, "big": {"search": {"batch_size": [8]}}}}
    (spec_folder / "store.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = bench(spec_folder, "sweep", "store.yaml", "--device", "cpu", "--storage", SQLITE,
                       BENCH_STORAGE_RETRY_S="2")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 2, result.stderr
    waited, stopped = lines(result.stderr)
    assert "locked by another process; waiting up to 2s" in waited, waited
    assert "locked by another process" in stopped and "re-run" in stopped and "Traceback" not in result.stderr, stopped
    assert [s.study_name for s in optuna.get_all_study_summaries(SQLITE.replace("store.db", str(path)))] == ["store"]


def test_a_read_only_database_is_one_line_at_once_not_a_blip(spec_folder):
    """Before: retried as a network blip for BENCH_STORAGE_RETRY_S, then 'the database has not answered
    for 30s ((sqlite3.OperationalError) attempt to write a readonly database)'."""
    path = optuna_database(spec_folder / "store.db")
    before = path.read_bytes()
    start = time.monotonic()
    result = bench(spec_folder, "sweep", "store.yaml", "--device", "cpu", "--storage",
                   "sqlite:///file:store.db?mode=ro&uri=true", BENCH_STORAGE_RETRY_S="30")
    assert result.returncode == 2, result.stderr
    [line] = lines(result.stderr)
    assert "read-only" in line and "permissions" in line and "Traceback" not in line, line
    assert time.monotonic() - start < 25  # at once, not after the retries
    assert path.read_bytes() == before


def test_a_full_disk_under_a_database_is_one_line_at_once(spec_folder):
    """Before: retried as a network blip, then 'the database has not answered for 30s (... database or disk
    is full)'. A real full disk: a 512 KiB file system, filled."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small file system")
    disk = spec_folder / "disk"
    disk.mkdir()
    make = ("import optuna; optuna.logging.set_verbosity(optuna.logging.WARNING); optuna.create_study("
            "study_name='store', storage='sqlite:///disk/store.db', directions=['maximize', 'minimize'])")
    script = (f'mount -t tmpfs -o size=512k tmpfs "{disk}" && "{sys.executable}" -c "{make}" && '
              f'{{ dd if=/dev/zero of="{disk}/fill" bs=4k 2>/dev/null; exec "{sys.executable}" -c '
              '"from harness.cli import main; main()" sweep store.yaml --device cpu '
              '--storage sqlite:///disk/store.db; }')
    start = time.monotonic()
    result = subprocess.run(["unshare", "--mount", "sh", "-c", script], cwd=spec_folder, capture_output=True,
                            text=True, env=bench_env(BENCH_STORAGE_RETRY_S="30"), timeout=300)
    assert result.returncode == 2, result.stderr
    [line] = lines(result.stderr)
    assert "no space left" in line and "re-run the same command" in line and "Traceback" not in line, line
    assert time.monotonic() - start < 30


DB_IN_FOLDER = "sqlite:///db/store.db"


@pytest.fixture(scope="module")
def one_trial_database(tmp_path_factory) -> Path:
    """A folder whose db/store.db holds a study after a real sweep of one of its two configs."""
    folder = tmp_path_factory.mktemp("one-trial-db")
    (folder / "store.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    (folder / "db").mkdir()
    result = bench(folder, "sweep", "store.yaml", "--device", "cpu", "--trials", "1", "--storage", DB_IN_FOLDER)
    assert result.returncode == 0, result.stderr
    return folder


def test_a_database_in_a_read_only_folder_is_one_line(one_trial_database, tmp_path):
    """Before: `OSError: [Errno 30] Read-only file system: '.../store.db.store.claim.lock'`, a traceback and
    exit 1 (the lock workers claim configs under is a file beside the database)."""
    folder = shutil.copytree(one_trial_database, tmp_path / "s")
    before = sorted((p.name, p.read_bytes()) for p in (folder / "db").iterdir())
    result = read_only(folder, folder / "db", "sweep", "store.yaml", "--device", "cpu", "--storage", DB_IN_FOLDER)
    assert result.returncode == 2, result.stderr
    [line] = lines(result.stderr)
    assert "store.db" in line and "cannot" in line and "writable" in line and "Traceback" not in line, line
    assert sorted((p.name, p.read_bytes()) for p in (folder / "db").iterdir()) == before
