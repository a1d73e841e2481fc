"""Where a study lives, and how workers share it without losing or repeating work.

The embedded store is an Optuna journal file under results/<study>/. A crash or a full disk can
leave its last record cut off; opening it for a sweep repairs the tail (after a backup), and a
record broken in the middle is refused, never skipped. Reading (report, apply) never writes.

A database URL (PostgreSQL) shares one study between machines. Workers then claim a config under a
lock the database itself holds (an advisory lock: it dies with the worker's connection), and a
killed worker's trial is found through Optuna's RDB heartbeat and queued again by any survivor.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Callable

import optuna
import psutil
import sqlalchemy
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend, JournalFileOpenLock

from harness import pids, record, spec as specs, units
from harness.errors import UserError

JOURNAL = "journal.log"
CLAIM_LOCK = "claim.lock"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def heartbeat_s() -> int:
    """Seconds between a running trial's heartbeats in a database (BENCH_HEARTBEAT_S, whole seconds as
    Optuna wants them); a trial silent for 3 of them is stale."""
    return math.ceil(units.env_seconds("BENCH_HEARTBEAT_S", 30, least=1))


def redact(url: str) -> str:
    """A storage URL fit to print: the password replaced by ***.

    Up to the last '@': a password may hold '/' or '@' (unescaped), and hiding a bit of the host
    with it is the safe side.
    """
    return re.sub(r"(://[^:/@]*:).*@", r"\1***@", url)


def study_dir(results: Path, study: str) -> Path:
    """The study's folder; a study named like a path (`bench report ../x`) is refused, never followed."""
    if not study or study in (".", "..") or any(c in study for c in "/\\\0"):
        raise UserError(f"study {study!r}: not a plain name (it names a folder under {results}/); "
                        "study names have no '/'")
    return Path(results) / study


# ---- opening -------------------------------------------------------------------------------------

def open_storage(url: str | None, results: Path, study: str, say: Callable[[str], None] = print):
    """Storage to sweep into: the database at `url`, or the journal under results/<study>/ (repaired)."""
    if url:
        if in_memory(url):
            raise UserError(f"--storage {redact(url)}: an in-memory database ends with the sweep, and every "
                            "measurement with it; give a file (sqlite:///results/bench.db) or leave --storage out "
                            "for the study's journal under results/")
        return open_database(url, heartbeat=True)
    folder = study_dir(results, study)
    path = folder / JOURNAL
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--results {results}: cannot write there ({exc.strerror or exc}); "
                        "pick a writable folder with --results") from None
    if path.is_file():  # read before anything is written: a refused sweep leaves the folder as it was
        refuse_another_study(path, study)
    lock = JournalFileOpenLock(str(path))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not path.exists():  # made if missing, never touched: a refused resume must not become the latest study
            path.touch()
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable")
        lock_file = path.with_name(path.name + ".lock")  # JournalFileOpenLock's file
        remove_stale_lock(lock_file, lock.grace_period, say)
        say_if_held(lock_file, lock.grace_period, say)
        with optuna_lock_wait_unsaid():  # said in one line above, not again in four of Optuna's
            lock.acquire()  # no other worker of this study appends while the tail is judged (its lock file is a write)
    except OSError as exc:
        raise UserError(f"{folder}: cannot write the study's journal there ({exc.strerror or exc}); "
                        "pick a writable folder with --results, or another name with --study") from None
    try:
        message = repair_journal(path)
    finally:
        lock.release()
    if message:
        say(message)
    remove_stale_temp_files(folder)
    return optuna.storages.JournalStorage(GuardedJournal(path, lock))


def refuse_another_study(path: Path, study: str) -> None:
    """A journal holding studies but not `study` is another study's folder, copied or renamed: a new study
    made in it would sit beside that one and measure everything again (`bench report` refuses it too)."""
    names = sorted(s.study_name for s in optuna.storages.JournalStorage(ReadOnlyJournal(path)).get_all_studies())
    if names and study not in names:
        raise UserError(f"no study named {study!r} in {path}: it holds {', '.join(map(repr, names))} (its folder "
                        "copied or renamed); rename the folder back to resume that study, or start this one under "
                        "another name with --study NAME")


class GuardedJournal(JournalFileBackend):
    """Optuna's journal file, refusing to go on once the file was deleted or replaced under the sweep:
    appending would start a new journal holding only the records after it (damage), reading fails."""

    def __init__(self, path: Path, lock) -> None:
        super().__init__(str(path), lock_obj=lock)
        self.path, self.inode, self.lock = path, path.stat().st_ino, lock

    def check(self) -> None:
        try:
            same = os.stat(self.path).st_ino == self.inode
        except FileNotFoundError:
            same = False
        if not same:
            raise UserError(f"{self.path}: the study's journal was deleted or replaced while this sweep ran; "
                            "nothing more was written to it: restore it from a backup to resume, or start a "
                            "new study with --study NAME")

    def read_logs(self, log_number_from: int):
        self.check()
        return super().read_logs(log_number_from)

    def append_logs(self, logs) -> None:
        """As Optuna appends, but never leaving a torn line: a write cut short (a full disk) is cut back off,
        and a torn tail a killed writer left is cut before writing. Left there, the next worker's record
        joined it into one bad line in the middle of the journal, which only cutting the records after it
        (measurements) could repair."""
        self.check()
        data = memoryview(("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode())
        with optuna_lock_wait_unsaid():  # a lock a killed worker left: broken after Optuna's grace, unsaid
            self.lock.acquire()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
            try:
                size = whole_lines(fd)
                try:
                    while data:
                        data = data[os.write(fd, data):]
                except OSError:
                    os.ftruncate(fd, size)
                    raise
                os.fsync(fd)  # a whole line a reader may have read already: never cut back
            finally:
                os.close(fd)
        finally:
            self.lock.release()


def whole_lines(fd: int) -> int:
    """The journal's size up to its last whole line, cutting off a torn tail (no reader got past it: Optuna
    reads whole lines only)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    tail = os.pread(fd, min(size, 1 << 20), max(size - (1 << 20), 0))
    if b"\n" not in tail and len(tail) < size:  # no line that long is Optuna's: leave it to repair_journal
        return size
    keep = size - len(tail) + tail.rfind(b"\n") + 1  # 0 where the one line there is torn
    os.ftruncate(fd, keep)
    return keep


STALE_TMP_S = 60
"""A *.tmp file older than this was left by a write that never finished (a live one lasts milliseconds)."""


def remove_stale_lock(stale: Path, grace_s: float, say: Callable[[str], None]) -> None:
    """The journal's lock file a kill -9 left while it was held (for milliseconds at a time): older than
    Optuna's grace period it is released now, as Optuna would after stalling that long, three warnings on."""
    try:
        if time.time() - stale.stat().st_mtime > grace_s:
            stale.unlink()
            say(f"{stale}: removed the journal's lock file a killed sweep left; nothing else was touched")
    except OSError:  # none (the usual case), or another worker released it meanwhile
        pass


@contextlib.contextmanager
def optuna_lock_wait_unsaid():
    """Optuna's journal warns, three times, then once more as it breaks a lock left by a killed sweep."""
    logger = logging.getLogger("optuna.storages.journal._file")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


HELD_S = 1.0
"""A live holder keeps the journal's lock file for milliseconds: one still there after this is worth a line."""


def say_if_held(lock_file: Path, grace_s: float, say: Callable[[str], None]) -> None:
    """One line before a long wait for the journal's lock file: Optuna waits out its grace period in silence."""
    deadline = time.monotonic() + HELD_S
    while lock_file.exists():
        if time.monotonic() > deadline:
            say(f"waiting for {lock_file}, held by another bench or left by one killed a moment ago "
                f"(up to {grace_s:.0f} s)")
            return
        time.sleep(0.05)


def remove_stale_temp_files(folder: Path) -> None:
    """Temp files (a trial log, a report, a reused figure) whose write a kill -9 or a full disk cut short."""
    for tmp in folder.rglob("*.tmp"):
        try:
            if time.time() - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink()
        except OSError:
            pass


class NoStudy(UserError):
    """The storage holds no such study (or is not there yet): to a sweep, a study to start, not an error."""


def existing_storage(url: str | None, results: Path, study: str, say: Callable[[str], None] | None = None):
    """Storage to read a study that must exist (report, apply): opens nothing for writing. A journal whose
    last record stays cut off (a crash, a full disk; not a sweep writing it now) is said through `say`."""
    if url:
        database = sqlite_path(url)
        if database is not None and not database.is_file():  # connecting would create an empty one
            raise NoStudy(f"--storage {redact(url)}: no database at {database}; check the path (sqlite:/// "
                          "then a relative path, sqlite://// then an absolute one)")
        if database is not None and not holds_optuna_tables(database, url, say):  # Optuna would create them in it
            raise NoStudy(f"--storage {redact(url)}: {database} holds no Optuna study (not a database a sweep "
                          "wrote); check the path, or run `bench sweep --storage` with it first")
        return open_database(url, heartbeat=False)
    path = study_dir(results, study) / JOURNAL
    if not path.exists():
        scenarios = sorted(d.name for d in Path(results).glob(f"{glob.escape(study)}-*") if (d / JOURNAL).is_file())
        if scenarios:  # a spec with scenarios names its studies <study>-<scenario>
            raise NoStudy(f"no study {study!r} under {results}/; its scenarios' studies are there: "
                          f"{', '.join(scenarios)} (name one, or add --scenario NAME)")
        raise NoStudy(f"no study {study!r} under {results}/; run `bench sweep` first or pass --results/--storage")
    journal = ReadOnlyJournal(path)
    if journal.torn is not None and say is not None and torn_for_good(path):
        say(f"{path}: its last record is cut off at line {journal.torn} (a crash or a full disk): this shows the "
            "whole records before it; the next `bench sweep` of the study repairs it")
    storage = optuna.storages.JournalStorage(journal)
    names = sorted(s.study_name for s in storage.get_all_studies())
    if names and study not in names:  # named by its folder, which holds another study's journal
        raise NoStudy(f"no study named {study!r} in {path}: it holds {', '.join(map(repr, names))} (its folder "
                      "copied or renamed); rename the folder back to its study's name to read it here")
    return storage


def holds_optuna_tables(database: Path, url: str, say: Callable[[str], None] | None = None) -> bool:
    """The SQLite file has Optuna's `studies` table; read without writing a byte (Optuna's connect would
    create its schema in any file, an empty one or another program's). A file another process holds
    locked is waited for up to retry_s(), as a database call is; a damaged one is said as such."""
    try:
        try:
            return has_studies_table(database, wait_s=1.0)  # a sweep writing it holds it for milliseconds
        except sqlite3.OperationalError as exc:
            if sqlite_fault(exc) != "locked":
                raise
            if say is not None:
                say(f"{database}: locked by another process; waiting up to {retry_s():.0f}s for it to let go")
            return has_studies_table(database, wait_s=retry_s())
    except sqlite3.DatabaseError as exc:
        if (fault := sqlite_fault(exc)) is None:  # not a SQLite file at all
            return False
        raise UserError(fault_line(fault, url)) from None


def has_studies_table(database: Path, wait_s: float) -> bool:
    with contextlib.closing(sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True, timeout=wait_s)) as db:
        return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='studies'").fetchone() is not None


def torn_for_good(path: Path, settle_s: float = 0.3) -> bool:
    """The journal's tail is still cut off, unchanged, a moment later: no sweep is writing it now."""
    before = path.stat().st_size
    time.sleep(settle_s)
    return path.stat().st_size == before and whole_records(path)[2] is not None


def sqlite_url(url: str):
    """A SQLite URL, parsed; None for any other database or one SQLAlchemy cannot read (open_database
    says what is wrong with it)."""
    if not url.startswith("sqlite"):
        return None
    try:
        return sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return None


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for any other database (or an in-memory one)."""
    parsed = sqlite_url(url)
    if parsed is None or _no_file(parsed) or parsed.query.get("uri"):  # a file: URI is SQLite's to read
        return None
    return Path(parsed.database)


def in_memory(url: str) -> bool:
    """A SQLite URL of no file: `sqlite://`, `sqlite:///:memory:`, a `mode=memory` URI."""
    parsed = sqlite_url(url)
    return parsed is not None and _no_file(parsed)


def _no_file(parsed) -> bool:
    database = parsed.database or ""
    return database in ("", ":memory:") or "mode=memory" in database or parsed.query.get("mode") == "memory"


def open_database(url: str, heartbeat: bool):
    """An Optuna RDBStorage that rides out a database blip (SteadyRDBStorage); with heartbeat, a killed
    worker's trial turns stale and is queued again."""
    retry_s()  # a typo in BENCH_STORAGE_RETRY_S is said now, not at the first blip
    beat = heartbeat_s() if heartbeat and not url.startswith("sqlite") else None
    beats = {"heartbeat_interval": beat, "grace_period": 3 * beat,
             "heartbeat_stale_trial_callback": requeue_stale} if beat else {}
    if beats:  # bench beats through ask/tell on purpose (storage.heartbeat); Optuna warns on every ask
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize",
                                category=UserWarning)
    # pool_pre_ping: a pooled connection that a database restart cut is replaced before use, not failed on
    engine = {} if url.startswith("sqlite") else {"engine_kwargs": {"pool_pre_ping": True}}
    try:
        with no_experimental_warning(), schema_lock(url):
            return schema_made(lambda: SteadyRDBStorage(url, **engine, **beats), url)
    except ImportError:
        raise UserError(f"--storage {redact(url)}: no database driver for this URL; for PostgreSQL install "
                        "bench[postgres] and write postgresql+psycopg2://USER:PASSWORD@HOST/DB") from None
    except Exception as exc:
        if fault := sqlite_fault(exc):
            raise UserError(fault_line(fault, url)) from None
        raise UserError(f"--storage {redact(url)}: cannot open it ({redact(str(exc)).splitlines()[0][:200]}); "
                        "check the URL, the server and the password") from None


SCHEMA_RACE = ("already exists", "UNIQUE constraint failed: alembic_version")
"""What a SQLite file says to the second of two workers creating Optuna's tables in it at once."""


def schema_made(open_it: Callable, url: str, tries: int = 10):
    """`open_it()`, opened again where another worker was creating Optuna's tables in the same new SQLite
    file at that moment: workers started together each ran CREATE TABLE, and all but one stopped with
    "cannot open it (table studies already exists)". By then the tables are made (or being made): the
    next try finds them. A lock file beside the database would do it too, but a damaged database must
    be left as it is, with nothing beside it."""
    for attempt in range(tries):
        try:
            return open_it()
        except Exception as exc:  # noqa: BLE001 (sqlalchemy's OperationalError or IntegrityError, as raised)
            if not url.startswith("sqlite") or attempt == tries - 1 or not any(s in str(exc) for s in SCHEMA_RACE):
                raise
            time.sleep(0.1 * (attempt + 1))


SCHEMA_LOCK_S = 60.0
"""How long opening a PostgreSQL study waits for another worker creating Optuna's tables (a second or two)."""


@contextlib.contextmanager
def schema_lock(url: str):
    """On PostgreSQL, one worker at a time creates Optuna's tables: workers started together on a new
    database each ran CREATE TABLE, which races on PostgreSQL's catalog (UniqueViolation on
    pg_type_typname_nsp_index), and all but one failed to open it. Not retried: a wrong URL or
    password is said at once, as before."""
    if not url.startswith("postgresql"):
        yield
        return
    key = lock_key("bench schema")  # not "bench:NAME", a study's claim lock
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            # a worker stalled while creating the tables must not hang every other one without a word
            connection.execute(sqlalchemy.text(f"SET lock_timeout = '{int(SCHEMA_LOCK_S * 1000)}ms'"))
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            try:
                yield
            finally:
                unlock(connection, key)
    finally:
        engine.dispose()


# ---- a database blip -----------------------------------------------------------------------------

def retry_s() -> float:
    """How long one storage call keeps retrying while the database does not answer (restart, failover):
    BENCH_STORAGE_RETRY_S, 120 s unset."""
    return units.env_seconds("BENCH_STORAGE_RETRY_S", 120)


class DatabaseGone(UserError):
    """The database stayed unreachable past retry_s(): one line, and the study holds what it held."""


def is_disconnect(exc: BaseException | None) -> bool:
    """A lost or refused connection (worth a retry), as opposed to a bad statement (a bug: raised) or a
    SQLite file that retrying cannot mend (damaged, read-only, on a full disk: said at once)."""
    if sqlite_fault(exc) in LASTING:
        return False
    while exc is not None:
        if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                            sqlalchemy.exc.DisconnectionError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def retry(call, url: str, finished_is_success: bool = False):
    """`call()`, again with backoff (0.25 s doubling to 8 s) while the database is unreachable (a SQLite
    file locked by another process too), for up to retry_s(); then DatabaseGone. A SQLite file that is
    damaged, read-only or on a full disk is a UserError at once. With finished_is_success, a retried tell
    that the first try did commit (the answer was lost) finds the trial finished: that is success."""
    limit = retry_s()
    delay, deadline, tries = 0.25, time.monotonic() + limit, 0
    while True:
        try:
            return call()
        except optuna.exceptions.UpdateFinishedTrialError:
            if finished_is_success and tries:
                return True
            raise
        except Exception as exc:
            if isinstance(exc, UserError):  # a nested call already gave up, or said what is wrong
                raise
            fault = sqlite_fault(exc)
            if fault in LASTING:  # a SQLite file's own fault, which no retry mends: one line
                raise UserError(fault_line(fault, url)) from None
            if not is_disconnect(exc):  # a bug keeps its traceback
                raise
            if time.monotonic() + delay > deadline:
                raise DatabaseGone(fault_line(fault, url) if fault == "locked" else
                                   f"--storage {redact(url)}: the database has not answered for {limit:.0f}s "
                                   f"({redact(str(exc.__cause__ or exc)).splitlines()[0][:160]}); the study keeps "
                                   "everything recorded before, and a trial cut off runs again: re-run the same "
                                   "command once the database is back") from None
        time.sleep(delay)
        delay, tries = min(2 * delay, 8.0), tries + 1


SQLITE_FAULTS = {  # words of SQLite's own messages (sqlite3_errstr) -> the fault of the file they name
    "malformed": "damaged",              # SQLITE_CORRUPT: "database disk image is malformed"
    "readonly database": "read-only",    # SQLITE_READONLY: "attempt to write a readonly database"
    "disk is full": "full",              # SQLITE_FULL: "database or disk is full"
    "database is locked": "locked",      # SQLITE_BUSY past the wait: another process's transaction
}
LASTING = ("damaged", "read-only", "full")
"""Faults no retry mends: said at once, not waited on as a blip."""


def sqlite_fault(exc: BaseException | None) -> str | None:
    """The fault of a SQLite file that `exc`, or an exception it was raised from, names; None for any other."""
    while exc is not None:
        if isinstance(exc, sqlite3.DatabaseError):
            return next((fault for words, fault in SQLITE_FAULTS.items() if words in str(exc)), None)
        exc = exc.__cause__ or exc.__context__
    return None


def fault_line(fault: str, url: str) -> str:
    where = f"--storage {redact(url)}"
    return {
        "damaged": f"{where}: the database is damaged (malformed); restore it from a backup, or "
                   "sweep into a new file",
        "read-only": f"{where}: the database cannot be written (read-only); check the permissions of the file and "
                     "its folder, and that its file system is not mounted read-only",
        "full": f"{where}: no space left on the device (database or disk is full); the study is intact: free some "
                "space and re-run the same command to resume",
        "locked": f"{where}: the database is locked by another process (a program holding it in a transaction); "
                  "re-run once it lets go",
    }[fault]


def retrying(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return retry(lambda: method(self, *args, **kwargs), self.url, method.__name__ == "set_trial_state_values")
    return call


class SteadyRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage with every call retried through a database blip (`retry`).

    A heartbeat that cannot be written is skipped, not raised: it runs on a thread of its own, and a
    trial that misses enough beats is only found stale and run again.
    """

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            retry(lambda: super(SteadyRDBStorage, self).record_heartbeat(trial_id), self.url)
        except DatabaseGone:
            pass


for _name in ("create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
              "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
              "get_study_system_attrs", "get_all_studies", "create_new_trial", "set_trial_param",
              "get_trial_id_from_study_id_trial_number", "set_trial_state_values", "set_trial_intermediate_value",
              "set_trial_user_attr", "set_trial_system_attr", "get_trial", "get_all_trials", "get_n_trials",
              "get_best_trial", "_get_stale_trial_ids", "get_trial_param", "get_trial_number_from_id",
              "_create_new_trial", "_set_trial_param", "_get_best_trial_id", "_get_trials"):  # _CachedStorage's
    if _name in vars(optuna.storages.RDBStorage):
        setattr(SteadyRDBStorage, _name, retrying(vars(optuna.storages.RDBStorage)[_name]))


class ReadOnlyJournal(BaseJournalBackend):
    """The journal's whole records, read without creating, locking or appending: a read-only results/
    reads fine, and a torn tail (a sweep writing now, or a crash) is left out, not misread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        _, self.end, self.torn = whole_records(path)

    def read_logs(self, log_number_from: int):
        with open(self.path, "rb") as f:
            lines = f.read(self.end).split(b"\n")[:-1]
        return [json.loads(line) for line in lines[log_number_from:]]

    def append_logs(self, logs):
        raise RuntimeError(f"{self.path} was opened for reading only")  # a bench bug if reached


# ---- the journal's tail --------------------------------------------------------------------------

def whole_records(path: Path) -> tuple[int, int, int | None]:
    """(whole records, bytes they span, first line of a broken tail or None).

    A line that is not JSON followed by whole records is not a torn write but damage, and a whole line
    that is not a record Optuna and bench can read (a crafted or mangled one) is damage wherever it is:
    refused, one line naming the file and line.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:  # a folder or an unreadable file where the journal goes
        raise UserError(f"{path}: cannot read the study's journal ({exc.strerror or exc}); it must be the file "
                        "a sweep wrote: move it aside, or pick another folder with --results") from None
    lines = data.split(b"\n")
    kept = end = 0
    broken_at = None
    for number, line in enumerate(lines[:-1], start=1):
        try:
            entry = json.loads(line)
        except ValueError:
            broken_at = broken_at or number
            continue
        except RecursionError:
            entry = None  # nested deeper than any record: refused below
        problem = record_problem(entry)
        if broken_at is not None or problem:
            where = f"{path}:{broken_at or number}"
            why = "a corrupt record in the middle of the study's journal" if not problem else \
                f"not a record of a study's journal ({problem})"
            raise UserError(f"{where}: {why}; restore the file from a backup, or cut it before line "
                            f"{broken_at or number} to keep what was recorded up to there")
        kept, end = kept + 1, end + len(line) + 1
    if lines[-1] and broken_at is None:
        broken_at = len(lines)  # the last line has no newline: a write that never finished
    return kept, end, broken_at


# Optuna's journal operations (optuna.storages.journal JournalOperation) and the keys each must carry.
_NUMBER = (int, float)
OPERATIONS = {
    0: {"study_name": str, "directions": list},            # create study
    1: {"study_id": int},                                  # delete study
    2: {"study_id": int, "user_attr": dict},               # set study user attr
    3: {"study_id": int, "system_attr": dict},
    4: {"study_id": int, "datetime_start": (str, type(None))},  # create trial
    5: {"trial_id": int, "param_name": str, "param_value_internal": _NUMBER, "distribution": str},
    6: {"trial_id": int, "state": int},                    # set trial state and values
    7: {"trial_id": int, "step": int},
    8: {"trial_id": int, "user_attr": dict},               # set trial user attr
    9: {"trial_id": int, "system_attr": dict},
    10: {},                                                # discard trials (Rustuna's)
}


def record_problem(entry) -> str | None:
    """Why `entry` is not a journal record bench can replay, or None: Optuna's shape, and bench's own
    attributes (a trial's record and config, the study's confirmation runs) of the types bench writes."""
    if not isinstance(entry, dict):
        return "not a JSON object, or nested too deep"
    op = entry.get("op_code")
    if isinstance(op, bool) or op not in OPERATIONS:
        return f"unknown op_code {op!r}"
    if not isinstance(entry.get("worker_id"), str):
        return "no worker_id"
    for key, kind in OPERATIONS[op].items():
        if isinstance(entry.get(key), bool) or not isinstance(entry.get(key), kind):
            return f"op_code {op} needs {key}"
    for key in ("user_attr", "system_attr"):
        if key in OPERATIONS[op] and len(entry[key]) != 1:
            return f"{key} must hold one attribute"
    for name, value in (entry.get("user_attr") or {}).items():
        problem = bench_attr_problem(name, value)
        if problem:
            return problem
    return None


def header_problem(name: str, value) -> str | None:
    """A study header attribute (ledger.create, Sweep.keep_model) of another type than bench writes:
    the report and apply would fail on it far from its line."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if name == "memory_budget" and not (value is None or (number(value) and isinstance(value, int) and value > 0)):
        return "memory_budget must be a whole number of bytes, or null"
    if name == "headroom" and not (number(value) and 0 <= value < 1):
        return "headroom must be a fraction from 0 to under 1"
    if name == "objective" and value not in ("samples", "tokens"):
        return "objective must be samples or tokens"
    if name in ("spec_path", "spec_relative") and not (value is None or isinstance(value, str)):
        return f"{name} must be a path"
    if name == "model":
        predicted = value.get("predicted", []) if isinstance(value, dict) else None
        if not (isinstance(predicted, list) and isinstance(value.get("why"), (str, type(None))) and all(
                isinstance(p, dict) and isinstance(p.get("config"), dict)
                and all(number(p.get(k)) for k in ("speed", "speed_sd", "peak_memory", "fit_chance", "beat_chance"))
                for p in predicted)):
            return "model must hold the search's predictions and its why"
        counts = (value.get("worth_measuring", 0), value.get("rows", 0))
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts) \
                or not isinstance(value.get("capped", False), bool):
            return "model's worth_measuring and rows must be counts, capped true or false"
    return None


def bench_attr_problem(name: str, value) -> str | None:
    if problem := header_problem(name, value):
        return problem
    if name in ("record", "config") and not isinstance(value, dict):
        return f"{name} must be a mapping"
    if name == "config":
        return config_problem(value)
    if name == "record":
        config = value.get("config") or {}
        return record.figure_problem(value) or (config_problem(config) if isinstance(config, dict)
                                                else "the record's config must be a mapping")
    if name == "repeats" and not (isinstance(value, dict) and all(
            isinstance(runs, list) and all(isinstance(run, dict) for run in runs) for runs in value.values())):
        return "repeats must map trial numbers to lists of runs"
    if name == "repeats":
        return next(filter(None, (record.figure_problem(run) for runs in value.values() for run in runs)), None)
    if name.startswith("confirm:") and not (isinstance(value, dict) and (value.get("state") != "done"
                                                                         or isinstance(value.get("run"), dict))):
        return f"{name} must be a confirmation run"
    if name.startswith("confirm:") and value.get("state") == "done":
        return record.figure_problem(value["run"])
    if name in ("superseded", "stopped_on_error") and not (
            isinstance(value, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in value)):
        return f"{name} must be a list of trial numbers"
    return None


def config_problem(config: dict) -> str | None:
    """A knob value no spec allows (a hand edit: batch_size "abc", null, -4, 1e30), which `bench apply`
    would write into the user's file or fail on; of a workload's own knob only its shape (its type is
    the workload's, which the parent does not know)."""
    for name, value in config.items():
        try:  # the spec's own checks of a searched value
            specs.check_value(name, value, f"the config's {name}")
            specs.check_knob_number(name, value, f"the config's {name}")
        except UserError as exc:
            return str(exc)
    return None


def repair_journal(path: Path) -> str | None:
    """Cut a torn tail off the journal, after backing the whole file up; the message to show, or None."""
    kept, end, broken_at = whole_records(path)
    if broken_at is None:
        return None
    backup = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        shutil.copyfile(path, backup)
        os.truncate(path, end)
    except OSError as exc:
        raise UserError(f"{path}: its last record is cut off, and repairing it failed ({exc.strerror}); "
                        "free some space or make the folder writable, then re-run") from None
    return (f"{path}: the last record was cut off at line {broken_at} (a crash or a full disk); "
            f"kept the {kept} whole records, the original is backed up at {backup}")


# ---- claiming a config ---------------------------------------------------------------------------

def claim_lock(storage, results: Path | None, study: str):
    """A context manager making ask-to-claim atomic among all workers of the study.

    A database study is locked by the database (nothing is written under the current folder);
    the embedded journal by a lock file beside it, which the kernel drops when its holder dies.
    """
    if isinstance(storage, optuna.storages.RDBStorage) and storage.engine.dialect.name == "postgresql":
        return lambda: advisory_lock(storage.engine, study)
    if isinstance(storage, optuna.storages.RDBStorage):
        database = Path(storage.engine.url.database or ".")
        return lambda: host_lock(database.with_name(database.name + f".{study}.{CLAIM_LOCK}"))
    return lambda: host_lock(study_dir(results, study) / CLAIM_LOCK)


@contextlib.contextmanager
def advisory_lock(engine: sqlalchemy.Engine, study: str):
    """A PostgreSQL session-level advisory lock: exclusive across machines, freed if the worker dies."""
    key = lock_key(f"bench:{study}")
    connection = locked(engine, key)
    try:
        yield
    finally:
        unlock(connection, key)
        connection.close()


def lock_key(name: str) -> int:
    """A PostgreSQL advisory lock key (signed 64-bit) for `name`."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def unlock(connection: sqlalchemy.Connection, key: int) -> None:
    try:
        connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
    except sqlalchemy.exc.DBAPIError:
        pass  # the connection was cut: the server dropped the lock with it


def locked(engine: sqlalchemy.Engine, key: int) -> sqlalchemy.Connection:
    """A connection holding the advisory lock `key`, retried through a database blip."""
    def connect():
        connection = engine.connect()
        try:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
        except BaseException:
            connection.close()
            raise
        return connection
    return retry(connect, engine.url.render_as_string(hide_password=True))


@contextlib.contextmanager
def host_lock(path: Path):
    """An exclusive lock among this host's processes; the kernel drops it when its holder dies."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")
    except OSError as exc:
        if is_no_space(exc):  # said by the sweep as every full disk is
            raise
        raise UserError(f"{path}: cannot write the lock file that workers claim configs under "
                        f"({exc.strerror or exc}); a sweep writes beside its study: make {path.parent} writable "
                        "(not a read-only mount), or move the study where it can be written") from None
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# ---- workers and stale trials --------------------------------------------------------------------

def worker_id() -> dict:
    proc = psutil.Process()
    return {"host": socket.gethostname(), "pid": proc.pid, "started": proc.create_time(), "start": pids.start_of(proc.pid)}


def is_stale(worker: dict | None) -> bool:
    """This host's trial whose worker process is gone (another host's: the heartbeat tells)."""
    if not worker or worker.get("host") != socket.gethostname():
        return False
    if worker.get("start"):  # its boot and start tick, which no clock step moves
        return pids.start_of(worker["pid"]) != worker["start"]
    try:  # a worker of a bench before 2026-12-08, or where /proc cannot say: its wall-clock start
        return abs(psutil.Process(worker["pid"]).create_time() - worker["started"]) > 1.0
    except psutil.NoSuchProcess:
        return True


def heartbeat(study: optuna.Study, trial: optuna.Trial):
    """Optuna's own heartbeat thread for a database trial (a no-op for the journal)."""
    from optuna.storages._heartbeat import get_heartbeat_thread  # Optuna's optimize() uses it; ask/tell has no public door
    return get_heartbeat_thread(trial._trial_id, study._storage)


def first_beat(study: optuna.Study, trial: optuna.Trial) -> None:
    """A database trial's first heartbeat, at its claim: Optuna finds a dead worker's trial by a heartbeat
    gone stale and skips one that never beat, so a worker that died before its trial started (its
    heartbeat thread starts there) would leave it running for good."""
    from optuna.storages._heartbeat import is_heartbeat_enabled
    if is_heartbeat_enabled(study._storage):
        study._storage.record_heartbeat(trial._trial_id)


def fail_stale_trials(study: optuna.Study) -> None:
    """Trials whose worker stopped beating (killed, machine gone) turn FAIL and are queued again."""
    with no_experimental_warning():  # returns at once for a storage without heartbeats (the journal)
        optuna.storages.fail_stale_trials(study)


@contextlib.contextmanager
def no_experimental_warning():
    """Optuna marks its heartbeat experimental (since 2.9); bench relies on it knowingly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


REQUEUE_KEEPS = ("baseline", "config", "remeasured_after", "remeasures")
"""What a trial queued again keeps of the one it replaces: what it is (your config?), and why it runs again."""


def requeue_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Optuna's stale-trial callback: the same config runs again, once, on whichever worker asks next."""
    keep = {k: v for k, v in trial.user_attrs.items() if k in REQUEUE_KEEPS}
    study.enqueue_trial(trial.params, user_attrs={**keep, "retry_of": trial.number}, skip_if_exists=False)


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_SPACE
