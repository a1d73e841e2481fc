"""Stopping a sweep: Ctrl-C and kill -9 of a real `bench sweep` process, then resuming it.

The spec's factory (written below into the test folder) hangs on the `hang` config while a gate
file exists, and starts a grandchild there too; with the gate removed the same config trains
normally, so the re-run can finish the study.
"""
from __future__ import annotations

import json
import os
import re
import pty
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from click.testing import CliRunner

from harness import cli
from harness.cli import main
from tests.conftest import FAST_TRIAL, FAULTY_DIR, ROOT, faulty_spec

GATED = '''
import os, subprocess, sys
import torch
import faulty

def build(params):
    params = dict(params)
    gate = params.pop("gate")
    if params["fault"] == "hang" and not os.path.exists(gate):
        params["fault"] = "none"
    if params["fault"] == "hang" and not torch.empty(0).is_meta:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(gate + ".grandchild", "w") as f:
            f.write(str(proc.pid))
    return faulty.build(params)
'''


def write_gated(folder: Path, faults: list[str], study: str = "stop") -> Path:
    """The gated factory, its spec `stop.yaml` (a grid over `faults`, in that order) and the gate, closed."""
    (folder / "gated.py").write_text(GATED)
    gate = folder / "gate"
    gate.touch()
    spec = {"study": study, "workload": {"factory": "gated:build",
                                         "params": {"fault": "none", "at_step": 3, "gate": str(gate)}},
            "search": {"batch_size": [8], "fault": faults}, "trials": 2, "sampler": "grid",
            "trial": {**FAST_TRIAL, "stall": "120s", "timeout": "120s"}}  # only a signal ends the hang
    (folder / "stop.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return gate


def end_gated(folder: Path, sweeps: list[subprocess.Popen]) -> None:
    """A failed test must not leave a hanging sweep (its trial dies with it) or the factory's grandchild."""
    for sweep in sweeps:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    grandchild = folder / "gate.grandchild"
    if grandchild.exists() and not pid_gone(int(grandchild.read_text())):
        os.kill(int(grandchild.read_text()), signal.SIGKILL)


@pytest.fixture
def gated(tmp_path):
    """A study folder: the gated factory, its spec (grid over none and hang) and the gate, closed."""
    write_gated(tmp_path, ["none", "hang"])
    yield tmp_path
    end_gated(tmp_path, STARTED)
    STARTED.clear()


def env_for(folder: Path) -> dict:
    path = os.pathsep.join(filter(None, [str(folder), str(FAULTY_DIR), str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


STARTED: list[subprocess.Popen] = []


def ctrl_c_reaches_it() -> None:
    """As in a terminal: a test run started in the background (CI, `cmd &`) inherits SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_sweep(folder: Path, **streams) -> subprocess.Popen:
    streams = streams or {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    STARTED.append(subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep",
                                     "stop.yaml", "--device", "cpu"], cwd=folder, env=env_for(folder),
                                    preexec_fn=ctrl_c_reaches_it, **streams))
    return STARTED[-1]


def run_sweep(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from harness.cli import main; main()", "sweep", "stop.yaml",
                           "--device", "cpu"], cwd=folder, env=env_for(folder), capture_output=True, text=True,
                          timeout=120)


def hanging_trial(sweep: subprocess.Popen, limit_s: float = 90, tmp: Path | None = None) -> psutil.Process:
    """The sweep's trial process for the `hang` config, once it is past its first step (hanging).

    Found by its heartbeat (which names its pid) among the sweep's descendants: a trial forked from
    the warm trial server is the server's child and carries the server's command line.
    """
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert sweep.poll() is None, sweep.communicate()
        ours = {p.pid: p for p in psutil.Process(sweep.pid).children(recursive=True)}
        for beat_path in Path(tmp or tempfile.gettempdir()).glob("bench-trial-*/heartbeat.json"):
            try:
                beat = json.loads(beat_path.read_text())
                job = json.loads((beat_path.parent / "job.json").read_text())
                if beat.get("pid") in ours and job["config"]["fault"] == "hang" and beat["phase"] in ("warmup", "measure"):
                    return ours[beat["pid"]]
            except (OSError, ValueError, KeyError):
                pass
        time.sleep(0.2)
    raise AssertionError("the hanging trial never started")


def live_members(pgid: int) -> list[int]:
    """Processes of a process group that still run (a killed one may linger as a zombie: not counted)."""
    live = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                live.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return live


def wait_until_gone(pgid: int, limit_s: float = 10) -> list[int]:
    deadline = time.monotonic() + limit_s
    while live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return live_members(pgid)


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def report_rows(folder: Path) -> list[dict]:
    old = os.getcwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(main, ["report", "stop", "--format", "json"], catch_exceptions=False)
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def by_fault(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["number"]):
        out.setdefault(row["config"]["fault"], []).append(row)
    return out


def measured(rows: list[dict]) -> list[tuple]:
    return [(r["number"], r["status"], r["throughput"], r["peak_memory"]) for r in rows]


def assert_resumes(folder: Path, before: dict, stale_note: bool) -> None:
    """Re-running the same command finishes the study: the stopped config runs again, nothing is lost."""
    (folder / "gate").unlink()
    rerun = run_sweep(folder)
    assert rerun.returncode == 0, rerun.stderr
    assert ("was left running by a process that died" in rerun.stdout) == stale_note
    after = by_fault(report_rows(folder))
    assert measured(after["none"]) == measured(before["none"])  # the completed trial survives, untouched
    stopped, again = after["hang"]
    assert stopped["number"] == before["hang"][0]["number"] and stopped["status"] == "interrupted"
    assert stopped["throughput"] is None and stopped["peak_memory"] is None  # never a measured result
    assert again["status"] == "ok" and again["number"] > stopped["number"] and again["throughput"] > 0


def test_ctrl_c_stops_the_trial_records_it_interrupted_and_resume_finishes(gated):
    sweep = start_sweep(gated)
    child = hanging_trial(sweep)
    pgid = os.getpgid(child.pid)
    grandchild = int((gated / "gate.grandchild").read_text())
    sweep.send_signal(signal.SIGINT)
    stdout, stderr = sweep.communicate(timeout=30)
    assert sweep.returncode == 130
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "the running trial was stopped and recorded as interrupted" in lines[0], stderr
    # the stopped trial is named, under its header, though a header waits for its outcome
    assert re.search(r"\[\d+/\d+\] #\d+ [^\n]*fault=hang[^\n]*\n(    [^\n]*\n)*    → interrupted\n$", stdout), stdout
    assert "re-run" in lines[0] and "Traceback" not in stderr
    assert wait_until_gone(pgid, limit_s=2) == [] and pid_gone(grandchild)
    before = by_fault(report_rows(gated))
    assert [r["status"] for r in before["none"]] == ["ok"]
    assert [r["status"] for r in before["hang"]] == ["interrupted"]
    assert before["hang"][0]["throughput"] is None
    log = before["hang"][0]["log"]  # what it printed until stopped: it kept none, though finished trials do
    assert log and Path(log).is_file(), log
    assert_resumes(gated, before, stale_note=False)


def test_kill_9_takes_the_trial_down_and_resume_recovers_the_stale_trial(gated):
    sweep = start_sweep(gated)
    child = hanging_trial(sweep)
    pgid = os.getpgid(child.pid)
    grandchild = int((gated / "gate.grandchild").read_text())
    sweep.kill()
    sweep.communicate(timeout=30)
    assert sweep.returncode == -signal.SIGKILL
    # the child notices its parent is gone (parent-death signal, watchdog) and takes its group down
    assert wait_until_gone(pgid) == [], "the trial (or its grandchild) outlived its killed sweep"
    assert pid_gone(grandchild)
    before = by_fault(report_rows(gated))
    # RUNNING in the study, as the killed sweep left it; the report says it will run again (it said `running`)
    assert [r["status"] for r in before["hang"]] == ["interrupted"]
    assert "its bench process died; the next `bench sweep` runs it again" in before["hang"][0]["error"]["message"]
    assert_resumes(gated, before, stale_note=True)


def test_ctrl_c_in_a_terminal_gives_the_cursor_back(gated, monkeypatch):
    """The live spinner hides the cursor; after Ctrl-C it must be shown again before the message."""
    monkeypatch.setenv("TERM", "xterm-256color")
    screen, (master, terminal) = bytearray(), pty.openpty()
    sweep = start_sweep(gated, stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    reader = threading.Thread(target=drain, args=(master, screen), daemon=True)
    reader.start()
    hanging_trial(sweep)
    sweep.send_signal(signal.SIGINT)
    assert sweep.wait(timeout=30) == 130
    reader.join(timeout=10)
    hidden, shown = screen.rfind(b"\x1b[?25l"), screen.rfind(b"\x1b[?25h")
    assert 0 <= hidden < shown, "the terminal is left without a cursor"
    assert b"interrupted: " in screen[shown:]


def drain(fd: int, into: bytearray) -> None:
    """Read a pty until its other end is closed (EIO), so the child never blocks on a full terminal."""
    try:
        while chunk := os.read(fd, 65536):
            into.extend(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_like_ctrl_c_and_leave_no_temp_folder(gated, signum):
    """Preemption (Slurm, Kubernetes) and a closed terminal: trial killed, recorded, re-queued, one line."""
    tmp = gated / "tmp"
    tmp.mkdir()
    sweep = subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep", "stop.yaml",
                              "--device", "cpu"], cwd=gated, env=dict(env_for(gated), TMPDIR=str(tmp)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(sweep)
    child = hanging_trial(sweep, tmp=tmp)
    pgid = os.getpgid(child.pid)
    assert list(tmp.glob("bench-trial-*")), "the trial's temporary folder should exist while it runs"
    sweep.send_signal(signum)
    _, stderr = sweep.communicate(timeout=30)
    assert sweep.returncode == 128 + signum
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and signal.Signals(signum).name in lines[0] and "re-run" in lines[0], stderr
    assert wait_until_gone(pgid, limit_s=2) == []
    assert not list(tmp.glob("bench-trial-*")), "the trial's temporary folder was left behind"
    before = by_fault(report_rows(gated))
    assert [r["status"] for r in before["hang"]] == ["interrupted"]
    if signum == signal.SIGTERM:
        assert_resumes(gated, before, stale_note=False)


def controlling_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is its stdin (the pty), as a login
    shell's job has; closing the pty's other end then hangs it up with SIGHUP, as closing a terminal does."""
    import fcntl
    import termios
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def read_until(fd: int, stop: threading.Event) -> None:
    """Keep a pty read (so its writer never blocks on a full terminal) until `stop`; the fd stays open."""
    import select
    while not stop.is_set():
        if select.select([fd], [], [], 0.1)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                return


def test_a_real_terminal_hang_up_exits_129_and_records_the_trial_interrupted(gated, monkeypatch):
    """Before, a real hang-up exited 1: writing the message to the gone terminal failed on the way out."""
    monkeypatch.setenv("TERM", "xterm-256color")
    master, terminal = pty.openpty()
    sweep = subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep", "stop.yaml",
                              "--device", "cpu"], cwd=gated, env=env_for(gated), stdin=terminal, stdout=terminal,
                             stderr=terminal, preexec_fn=controlling_terminal)
    STARTED.append(sweep)
    os.close(terminal)
    stop = threading.Event()
    reader = threading.Thread(target=read_until, args=(master, stop), daemon=True)
    reader.start()
    child = hanging_trial(sweep)
    pgid = os.getpgid(child.pid)
    stop.set()
    reader.join(timeout=10)
    os.close(master)  # the terminal goes away: the kernel hangs up its session
    assert sweep.wait(timeout=30) == 129
    assert wait_until_gone(pgid, limit_s=5) == []
    assert [r["status"] for r in by_fault(report_rows(gated))["hang"]] == ["interrupted"]


def test_temp_folders_and_files_a_killed_sweep_left_are_removed_by_the_next(gated):
    """kill -9 leaves the trial's bench-trial-* folder, and a write it cut short leaves a *.tmp file:
    before, both stayed forever; the next sweep of the study removes them."""
    tmp = gated / "tmp"
    tmp.mkdir()
    env = dict(env_for(gated), TMPDIR=str(tmp))
    sweep = subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "sweep", "stop.yaml",
                              "--device", "cpu"], cwd=gated, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    STARTED.append(sweep)
    pgid = os.getpgid(hanging_trial(sweep, tmp=tmp).pid)
    sweep.kill()
    sweep.communicate(timeout=30)
    assert wait_until_gone(pgid) == []
    assert list(tmp.glob("bench-trial-*")), "kill -9 should have left the trial's folder"
    cut_short = gated / "results" / "stop" / "logs" / "trial-0001.log.tmp"  # as a kill mid-write leaves it
    cut_short.write_text("half a log")
    os.utime(cut_short, (time.time() - 600, time.time() - 600))
    (gated / "gate").unlink()
    rerun = subprocess.run([sys.executable, "-c", "from harness.cli import main; main()", "sweep", "stop.yaml",
                            "--device", "cpu"], cwd=gated, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert not list(tmp.glob("bench-trial-*")) and not list((gated / "results").rglob("*.tmp"))


def ctrl_c(*args, **kwargs):
    """Stands in for whatever a Ctrl-C interrupts."""
    raise KeyboardInterrupt()


def test_ctrl_c_before_any_trial_does_not_claim_one_was_recorded(tmp_path, faulty_path, monkeypatch):
    """Ctrl-C while the sweep waited for a quiet machine said "the running trial was stopped and recorded
    as interrupted", though no trial had started and no study existed yet."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "sweep_into_study", ctrl_c)  # while it waited for a quiet machine
    path = faulty_spec(tmp_path, "early", ["none"], trials=1)
    result = CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"])
    assert result.exit_code == 130
    assert "interrupted: no trial was running, nothing measured is lost; re-run the same command to resume" in result.output


@pytest.mark.parametrize("command", [["report"], ["report", "--format", "html"], ["apply", "best"]])
def test_ctrl_c_in_report_or_apply_is_one_line_and_exit_130(tmp_path, monkeypatch, command):
    """Ctrl-C a second into `bench apply` or `bench report` printed click's "Aborted!" and exited 1."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "pick_study", ctrl_c)
    result = CliRunner().invoke(cli.main, command)
    assert result.exit_code == 130 and "Aborted" not in result.output
    assert result.output.strip().splitlines() == ["interrupted: the command stopped"]


def test_ctrl_c_while_a_trial_is_claimed_records_it_interrupted_not_running(tmp_path, faulty_path, monkeypatch):
    """Ctrl-C between ask and claim said "recorded as interrupted" and left the trial running until a resume."""
    import optuna
    from harness import ledger, storage as stores
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ledger, "suggest", ctrl_c)
    path = faulty_spec(tmp_path, "claim", ["none"], trials=1)
    result = CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"])
    assert result.exit_code == 130, result.output
    study = ledger.load(stores.existing_storage(None, tmp_path / "results", "claim"), "claim")
    states = [(t.state, t.user_attrs.get("status")) for t in study.get_trials(deepcopy=False)]
    assert (optuna.trial.TrialState.FAIL, "interrupted") in states, states
    assert not any(state == optuna.trial.TrialState.RUNNING for state, _ in states), states
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(faulty_path))
    monkeypatch.setenv("PYTHONPATH", str(faulty_path))
    again = CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"])
    assert again.exit_code == 0 and "left running by a process that died" not in again.output, again.output


def test_a_trial_ctrl_c_stopped_keeps_its_wall_time_in_the_sweeps_time(tmp_path, faulty_path, monkeypatch):
    """The report's time split left out a trial Ctrl-C stopped: "time in 2 trials" where 3 had run."""
    from harness import launch

    def stopped_after_a_while(*args, **kwargs):
        time.sleep(0.5)
        raise KeyboardInterrupt()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "run", stopped_after_a_while)
    path = faulty_spec(tmp_path, "spent", ["none"], trials=1)
    assert CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"]).exit_code == 130
    rows = json.loads(CliRunner().invoke(cli.main, ["report", "--format", "json"]).output)
    assert [r["status"] for r in rows] == ["interrupted"] and rows[0]["timing"]["trial_wall_s"] >= 0.5
    table = " ".join(CliRunner().invoke(cli.main, ["report"], env={"COLUMNS": "200"}).output.split())
    assert "time in 1 trial, " in table and re.search(r"ended early \d+\.\ds \(100%\)", table), table


def test_ctrl_c_during_a_confirmation_run_says_that_run_was_stopped(tmp_path, faulty_path, monkeypatch):
    """It said "no trial was running" while a confirmation run's child was measuring."""
    from harness import study as studies
    monkeypatch.chdir(tmp_path)

    def stopped_when_confirming(self, config, number, repeat=False):  # steady figures, whatever the machine's load
        if repeat:
            raise KeyboardInterrupt()
        return {"status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
                "timing": {"step_s": {"cv": 0.005}}}
    monkeypatch.setattr(studies.Sweep, "launch", stopped_when_confirming)
    path = faulty_spec(tmp_path, "confirming", ["none"], trials=2, search={"batch_size": [8, 16], "fault": ["none"]})
    result = CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"])
    assert result.exit_code == 130, result.output
    assert "the confirmation run of #1 was stopped; it runs again" in result.output, result.output


def test_a_second_ctrl_c_during_the_clean_up_is_ignored():
    """`timeout` forwards the Ctrl-C its group got as well: the second one cut the clean-up short and left
    the trial `running`, though the line said it was recorded."""
    import os
    import signal
    from harness import launch
    cleaned = False
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite was started in the background (`cmd &`)
    with pytest.raises(KeyboardInterrupt):
        with launch.stop_signals_interrupt():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            except KeyboardInterrupt:
                os.kill(os.getpid(), signal.SIGINT)  # the second, while recording the first
                time.sleep(0.1)
                cleaned = True
                raise
    assert cleaned and signal.getsignal(signal.SIGINT) is before  # the handler it found, not the clean-up's


def stopped_at_confirmation_run(k: int, monkeypatch) -> tuple[list[int], set]:
    """Trials with steady figures, whatever the machine's load, and a Ctrl-C in the k-th confirmation
    run while the returned set is not cleared; the confirmation runs' trial numbers, as they ran."""
    from harness import study as studies
    repeats, armed = [], {"armed"}

    def steady(self, config, number, repeat=False):
        if repeat:
            repeats.append(number)
            if len(repeats) == k and armed:
                raise KeyboardInterrupt()
        return {"status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
                "timing": {"step_s": {"cv": 0.005}}}
    monkeypatch.setattr(studies.Sweep, "launch", steady)
    return repeats, armed


def test_a_resume_says_only_the_confirmation_runs_that_are_left(tmp_path, faulty_path, monkeypatch):
    """A resume printed "confirming: #1, #0 run 2 more times" whatever was already recorded, and a sweep
    run again after it finished printed it too, then ran nothing."""
    monkeypatch.chdir(tmp_path)
    repeats, armed = stopped_at_confirmation_run(3, monkeypatch)
    path = faulty_spec(tmp_path, "resumed", ["none"], trials=2, search={"batch_size": [8, 16], "fault": ["none"]})
    first = CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"])
    assert first.exit_code == 130 and "confirming: #1, #0 run 2 more times each, interleaved" in first.output, first.output
    armed.clear()
    second = CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"])
    assert second.exit_code == 0, second.output
    assert "confirming: #1, #0 run 1 more time each, interleaved" in second.output, second.output
    assert len(repeats) == 5, repeats  # the stopped run again, and the one after it
    third = CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"])
    assert third.exit_code == 0 and "confirming:" not in third.output, third.output
    assert len(repeats) == 5, repeats


def test_a_round_stopped_between_its_two_runs_runs_again_whole(tmp_path, faulty_path, monkeypatch):
    """A Ctrl-C after #1's run of a round and before #0's: the resume made #0's run minutes later and the
    report paired the two as side by side."""
    monkeypatch.chdir(tmp_path)
    repeats, armed = stopped_at_confirmation_run(2, monkeypatch)
    path = faulty_spec(tmp_path, "split", ["none"], trials=2, search={"batch_size": [8, 16], "fault": ["none"]})
    assert CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"]).exit_code == 130
    armed.clear()
    second = CliRunner().invoke(cli.main, ["sweep", str(path), "--device", "cpu"])
    assert "confirming: #1, #0 run 2 more times each, interleaved" in second.output, second.output
    assert repeats == [1, 0] + [1, 0, 0, 1]  # A B B A
    rows = json.loads(CliRunner().invoke(cli.main, ["report", "split", "--format", "json"]).output)
    assert next(r for r in rows if r["number"] == 1)["vs_baseline"]["paired"] == 2


INTERRUPTED_IMPORT = """
import sys
class Interrupt:  # Ctrl-C arriving while Python imports the command's libraries
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "harness.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt)
from harness.entry import main
main()
"""


def test_ctrl_c_while_bench_starts_is_one_line_and_exit_130(tmp_path):
    """The first half second of `bench report` or `bench sweep` is imports: Ctrl-C there printed a
    10-44 line KeyboardInterrupt traceback from inside optuna or numpy."""
    from importlib.metadata import entry_points
    assert entry_points(group="console_scripts")["bench"].value == "harness.entry:main"
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 130 and done.stderr == "interrupted while bench started; nothing was written\n", done.stderr


SWALLOWED_IMPORT = """
import os, signal, sys, weakref
class Interrupt:  # Ctrl-C whose handler runs inside a weakref callback of the import machinery
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "harness.cli":
            class Lock: pass
            lock = Lock()
            ref = weakref.ref(lock, lambda _: os.kill(os.getpid(), signal.SIGINT))
            del lock
sys.meta_path.insert(0, Interrupt)
from harness.entry import main
sys.argv = ["bench", "--version"]
main()
"""


def test_ctrl_c_that_python_swallows_while_bench_starts_still_stops_it(tmp_path):
    """Python drops an exception raised in a weakref callback ("Exception ignored in: <function
    _get_module_lock.<locals>.cb>"): a Ctrl-C about a second into `bench sweep` was lost, and the sweep ran on."""
    done = subprocess.run([sys.executable, "-c", SWALLOWED_IMPORT], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, preexec_fn=ctrl_c_reaches_it)  # ignored where the suite runs as `cmd &`
    assert done.returncode == 130, (done.stdout, done.stderr)
    assert done.stderr.endswith("interrupted while bench started; nothing was written\n") and not done.stdout


SIGNAL_AS_PYTHON_ENDS = """
import atexit, os, signal, sys
from harness.entry import main
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), print("shut down")))  # as Python shuts down
sys.argv = ["bench", "--version"]
main()
"""


def test_a_signal_once_the_command_has_ended_leaves_its_exit_status(tmp_path):
    """`bench apply best` had written its file and said so; a Ctrl-C as Python shut down made it exit 130
    with no word, as if nothing had been written (4 of 14 tries at 1.1 s)."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_AS_PYTHON_ENDS], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.endswith("shut down\n") and not done.stderr, (done.stdout, done.stderr)


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_a_signal_stops_bench_trial_in_one_line_and_leaves_no_folder_behind(gated, sig, code, word):
    """`bench trial` said "Aborted!" (exit 1) on Ctrl-C, and on SIGTERM died silently, leaving its trial
    folder (the model's untouched weights) and a log folder in the temp folder."""
    tmp = gated / "tmp"
    tmp.mkdir()
    trial = subprocess.Popen([sys.executable, "-c", "from harness.cli import main; main()", "trial", "stop.yaml",
                              "--set", "fault=hang", "--device", "cpu"], cwd=gated,
                             env=dict(env_for(gated), TMPDIR=str(tmp)), preexec_fn=ctrl_c_reaches_it,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(trial)
    pgid = os.getpgid(hanging_trial(trial, tmp=tmp).pid)
    trial.send_signal(sig)
    stdout, stderr = trial.communicate(timeout=30)
    assert trial.returncode == code and stdout == ""  # no record: nothing was measured
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [f"{word}: the trial was stopped; nothing was measured"], stderr
    assert wait_until_gone(pgid) == []
    assert [p.name for p in tmp.iterdir() if p.name.startswith("bench-")] == ["bench-device-cpu.lock"]  # shared, kept


def test_ctrl_z_stops_the_trial_with_the_sweep_and_fg_continues_it(gated):
    """The trial runs in a session of its own, which a terminal's Ctrl-Z (SIGTSTP to the sweep's group) never
    reached: the sweep showed stopped while its trial trained on, a GPU kept busy."""
    sweep = start_sweep(gated)
    child = hanging_trial(sweep)
    grandchild = psutil.Process(int((gated / "gate.grandchild").read_text()))

    def states(want: str, limit_s: float = 10) -> list[str]:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            now = [p.status() for p in (psutil.Process(sweep.pid), child, grandchild)]
            if all((s == psutil.STATUS_STOPPED) == (want == "stopped") for s in now):
                break
            time.sleep(0.1)
        return now
    sweep.send_signal(signal.SIGTSTP)
    stopped = states("stopped")
    sweep.send_signal(signal.SIGCONT)
    going = states("going")
    sweep.send_signal(signal.SIGINT)
    sweep.communicate(timeout=30)
    assert stopped == [psutil.STATUS_STOPPED] * 3, stopped
    assert psutil.STATUS_STOPPED not in going, going
    assert sweep.returncode == 130
