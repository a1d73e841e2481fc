"""A database blip during a sweep: a private, real PostgreSQL server restarted or stopped mid-trial.

The server is this test's own (initdb in a temporary folder, its own port), so stopping it cannot
disturb another test's database. A trial waits on a gate file, so the database goes away while a
trial runs and comes back (or not) while its result is being recorded.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import FAST_TRIAL
from tests.test_interrupt import env_for


def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def driver() -> bool:
    try:
        import psycopg2  # noqa: F401
        return True
    except ImportError:
        return False


BIN = postgres_bin()
pytestmark = [
    pytest.mark.skipif(BIN is None, reason="no PostgreSQL server binaries (Debian's postgresql; .ci/run installs it)"),
    pytest.mark.skipif(not driver(), reason="psycopg2 is not installed (bench[postgres])"),
]

GATE_WAIT = '''
import os, time
import faulty

def build(params):
    params = dict(params)
    gate = params.pop("gate")
    open(gate + ".started", "w").close()
    while os.path.exists(gate):  # the trial runs on while the test plays with the database
        time.sleep(0.05)
    return faulty.build(params)
'''


class Server:
    """A PostgreSQL server of this test's own: stop() and start() at will."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.data = folder / "data"
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres")
        self.run(BIN / "initdb", "-D", self.data, "--auth=trust", "-U", "postgres")

    def run(self, *args) -> None:
        subprocess.run([*self.as_postgres, *map(str, args)], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self.run(BIN / "pg_ctl", "-D", self.data, "-l", self.folder / "log", "-w", "-t", "60", "start",
                 "-o", f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1")

    def stop(self) -> None:
        self.run(BIN / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    if os.geteuid() == 0 and subprocess.run(["id", "postgres"], capture_output=True).returncode != 0:
        pytest.skip("running as root without a postgres user to run the server as")
    folder = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    os.chmod(folder, 0o755)
    try:
        pg = Server(folder)
        pg.start()
        yield pg
        try:
            pg.stop()
        except subprocess.CalledProcessError:
            pass  # a test left it stopped
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def gated(tmp_path):
    (tmp_path / "gatewait.py").write_text(GATE_WAIT)
    gate = tmp_path / "gate"
    gate.touch()
    spec = {"study": "blip", "workload": {"factory": "gatewait:build",
                                          "params": {"fault": "none", "width": 16, "gate": str(gate)}},
            "search": {"batch_size": [4]}, "trials": 1, "sampler": "grid", "trial": dict(FAST_TRIAL)}
    (tmp_path / "blip.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tmp_path


def sweep(folder: Path, url: str, retry_s: float = 120) -> subprocess.Popen:
    env = dict(env_for(folder), BENCH_HEARTBEAT_S="1", BENCH_STORAGE_RETRY_S=str(retry_s))
    return subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep", "blip.yaml",
                             "--device", "cpu", "--storage", url], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def rows(folder: Path, url: str) -> list[dict]:
    result = subprocess.run([sys.executable, "-c", "from harness.cli import main; main()", "report", "blip",
                             "--storage", url, "--format", "json"], cwd=folder, env=env_for(folder),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return sorted(json.loads(result.stdout), key=lambda r: r["number"])


@pytest.mark.parametrize("down_s", [3, 15])
def test_the_database_down_while_a_trial_ends_loses_nothing(server, gated, down_s):
    """Restarted for 3 s, or down for 15 s, while the trial runs and its result is told: before, the sweep
    exited 1 with a 133-line traceback ending in StorageInternalError and the measured run was lost."""
    proc = sweep(gated, server.url)
    wait_for(gated / "gate.started", proc)
    server.stop()
    (gated / "gate").unlink()  # the trial ends, and is told, while the database is down
    time.sleep(down_s)
    server.start()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Warning" not in err  # Optuna's heartbeat UserWarning too
    [row] = rows(gated, server.url)
    assert row["status"] == "ok" and row["throughput"] > 0


def test_a_database_that_stays_down_is_one_line_and_the_resume_loses_nothing(server, gated):
    proc = sweep(gated, server.url, retry_s=3)
    wait_for(gated / "gate.started", proc)
    server.stop()
    (gated / "gate").unlink()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "the database has not answered for 3s" in lines[0] and "re-run" in lines[0], err
    server.start()
    time.sleep(4)  # past the heartbeat's grace period: the cut-off trial is stale
    again = sweep(gated, server.url)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert [(r["status"], r["baseline"]) for r in rows(gated, server.url)] == [("interrupted", False), ("ok", True)]
