"""Run one trial config in a child process, with limits, and classify how it ended.

The child is forked from the warm trial server (harness.zygote) where that is safe, else a fresh
interpreter; either way a new process with its own session, and the record's `start` says which.

Never imports torch: the parent stays light and never touches a GPU, so a wedged CUDA context in a
trial can never hurt the study. The child gets its own process group; whatever it started
(DataLoader workers, compiler processes, stray grandchildren) is killed with it.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness import errors, pids, record, zygote

SERVER_DIED = "TrialServerDied"
WORKDIR_PREFIX = "bench-trial-"
TOKEN = "BENCH_TRIAL_TOKEN"
"""Environment variable naming one trial: everything the trial starts inherits it (kill_escaped)."""
LOG_TAIL_BYTES = 256 * 1024  # what is kept of a trial's output; a chatty child cannot fill the disk
POLL_S = 0.2
REAP_S = 10.0
"""How long a killed trial may take to be reported ended before its warm trial server is taken for stuck."""
STOPPED_S = 5.0
"""A gap this long between two of the watch's polls means the watch itself was not running: the whole job
was stopped (Slurm suspend, docker pause, a laptop asleep), the trial with it."""


@dataclass
class Limits:
    timeout_s: float
    """Wall-clock limit for the whole trial, start-up and compile included."""
    stall_s: float
    """Kill the trial when no step has completed for this long after its first step."""


class TailBuffer:
    """Keeps the last LOG_TAIL_BYTES of a pipe, read on a thread so the child never blocks on it."""

    def __init__(self, stream):
        self.chunks, self.size = collections.deque(), 0
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream):
        for chunk in iter(lambda: stream.read1(65536), b""):
            self.chunks.append(chunk)
            self.size += len(chunk)
            while self.size - len(self.chunks[0]) >= LOG_TAIL_BYTES:
                self.size -= len(self.chunks.popleft())

    def text(self) -> str:
        self.thread.join(timeout=5)
        return b"".join(self.chunks)[-LOG_TAIL_BYTES:].decode("utf-8", "replace")


def child_env(config: dict, device: str, inductor_cache: Path, import_paths: list[str]) -> dict:
    """The child's environment: allocator settings must be there before CUDA starts.

    Inductor keeps its default compile threads, so compile_s is what a user's run pays. The user's
    own allocator conf and CUDA_LAUNCH_BLOCKING pass through (the child records them in env).
    """
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([*import_paths, *filter(None, [os.environ.get("PYTHONPATH")])]),
               PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1",
               TORCHINDUCTOR_CACHE_DIR=str(inductor_cache))
    if "expandable_segments" in config and device.startswith("cuda"):
        env.update(allocator_conf(os.environ, bool(config["expandable_segments"])))
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs as NVML does (bench --device, doctor)
    if device.startswith("cuda"):  # the trial sees only its GPUs (one per process), from cuda:0 on
        env["CUDA_VISIBLE_DEVICES"] = ",".join(trial_gpus(config, device))
    return env


def trial_gpus(config: dict, device: str) -> list[str]:
    """The GPUs (as CUDA_VISIBLE_DEVICES names them) of a trial on `device`: its nproc from that index on."""
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    nproc = int(config.get("nproc", 1))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in visible.split(",")] if visible else [str(i) for i in range(index + nproc)]
    return ids[index:index + nproc]


def compile_cache(job: dict, workdir: Path) -> tuple[Path, str]:
    """Inductor's cache for this trial and whether it starts "cold" or "warm".

    Cold unless the trial repeats a measured config (`repeat`, e.g. a confirmation run): then it
    gets the cache that config's first, cold, run left in the study (`compile_cache`), so compile_s
    is what a user's first run pays and a repeat pays what a user's second run would.
    """
    kept = job.get("compile_cache")
    if not kept or job["config"].get("compile", "off") == "off":
        return workdir / "inductor", "cold"
    kept = Path(kept)
    if job.get("repeat") and kept.is_dir() and any(kept.iterdir()):
        return kept, "warm"
    shutil.rmtree(kept, ignore_errors=True)
    return kept, "cold"


def allocator_conf(environ: dict, expandable: bool) -> dict:
    """The user's allocator conf with the knob's expandable_segments merged in, other options kept.

    Torch reads PYTORCH_ALLOC_CONF, and PYTORCH_CUDA_ALLOC_CONF as its older name; the merged conf
    goes back under whichever name the user set.
    """
    name = "PYTORCH_ALLOC_CONF" if environ.get("PYTORCH_ALLOC_CONF") else "PYTORCH_CUDA_ALLOC_CONF"
    options = [o for o in (environ.get(name) or "").split(",")
               if o.strip() and o.split(":", 1)[0].strip() != "expandable_segments"]
    return {name: ",".join([*options, f"expandable_segments:{expandable}"])}


class Stopped(KeyboardInterrupt):
    """SIGTERM (Slurm, Kubernetes preemption) or SIGHUP (a closed terminal), handled as Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.exit_code = 128 + signum


@contextlib.contextmanager
def stop_signals_interrupt():
    """SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP raise Stopped, in the main thread, so the trial's
    group is killed and recorded.

    Once: a second signal during that clean-up is ignored rather than cutting it short (`timeout` forwards
    a Ctrl-C its group got too, and two in a row left the trial `running` though the line said recorded).
    """
    def stop(signum, frame):
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        raise KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)

    if threading.current_thread() is not threading.main_thread():  # only the main thread may handle signals
        yield
        return
    previous = {}  # filled as each is installed: a signal between two installs finds it
    try:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[s] = signal.signal(s, stop)
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def stopped_with_the_sweep(group: int):
    """Ctrl-Z stops the trial's process group with the sweep, and `fg` (SIGCONT) continues it: the group is a
    session of its own, which the terminal's SIGTSTP never reaches, so the trial trained on (a GPU kept busy)
    under a sweep shown stopped. A run across a stop measures the stop too: its windows disagree (noisy)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        signal_group(group, signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here, as the terminal asked, until SIGCONT
        signal.signal(signal.SIGTSTP, stop)
        signal_group(group, signal.SIGCONT)

    previous = signal.signal(signal.SIGTSTP, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, previous)


def signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:  # ended, or a forked trial not yet the leader of its group
        pass


def run(job: dict, limits: Limits, log_path: Path | None, on_beat=None, on_turn=None) -> dict:
    """Run `job` in a child; return its record with `status` classified. Never raises for a bad trial.

    KeyboardInterrupt (Stopped too) kills the child and propagates: the caller records the trial as
    interrupted. The log is kept at log_path when one is given, an interrupted trial's too.
    `on_beat(heartbeat or None)` is called on every poll, so a display can show the child's phase;
    `on_turn()` once the device is this trial's, before the child starts: a look at the machine there
    sees no other bench trial on the device, since those take turns with this one.
    """
    asked = time.monotonic()
    with device_turn(job, on_beat), tempfile.TemporaryDirectory(prefix=workdir_prefix()) as tmp:
        waited = time.monotonic() - asked  # for the device: the look at the machine below is no part of it
        if on_turn is not None:
            on_turn()
        workdir = Path(tmp)
        inductor_cache, cache_state = compile_cache(job, workdir)
        env = child_env(job["config"], job["device"], inductor_cache, job["workload"].get("path", []))
        job = dict(job, heartbeat=str(workdir / "heartbeat.json"),
                   device="cuda:0" if job["device"].startswith("cuda") else job["device"])
        (workdir / "job.json").write_text(json.dumps(job))
        result_path = workdir / "result.json"
        started, launched_at = time.monotonic(), time.time()
        env[TOKEN] = token = trial_token()
        proc, start = start_child([str(workdir / "job.json"), str(result_path)], job, env)
        tail = TailBuffer(proc.stdout)
        try:
            with stopped_with_the_sweep(proc.pid):
                killed_for = watch(proc, limits, Path(job["heartbeat"]), on_beat)
        finally:
            kill_group(proc, token)  # also on KeyboardInterrupt, and always: no grandchild outlives a trial
            log = tail.text()
            if log_path is not None:  # an interrupted trial's too: what it was doing when stopped
                save_log(log_path, log)
        result = record.read(result_path)
        beat = read_heartbeat(Path(job["heartbeat"]))
        killed_in = killed_phase(beat, job["config"]) if killed_for else None
        if killed_for and killed_for.startswith(OVER_TIME):
            killed_for = f"{killed_for} {KILLED_IN_WORDS[killed_in]}"
        outcome = classify(proc.returncode, result, killed_for, log, in_steps_under_a_cpu_wall(job, beat))
        if result is None and not killed_for and getattr(proc, "server_died", False):
            outcome = failure(record.INTERRUPTED, SERVER_DIED, "the warm trial server was killed during the trial "
                              "(from outside: the trial did nothing wrong); it runs again", log)
        timing = outcome.setdefault("timing", {})
        timing["trial_wall_s"] = time.monotonic() - started
        timing["device_wait_s"] = waited
        timing["compile_cache"] = cache_state
        if killed_in:
            timing["killed_in"] = killed_in  # the phase its wall time went to (harness.report's time split)
        if "started_at" in timing:
            timing["startup_s"] = max(timing.pop("started_at") - launched_at, 0.0)
        outcome["start"] = start
        if isinstance(outcome.get("error"), dict):  # the user's words, shown on every reader's terminal (the log
            outcome["error"] = {k: record.printable(v) if k in ("message", "traceback") and isinstance(v, str) else v
                                for k, v in outcome["error"].items()}  # tail, only in files and pages, stays as printed)
        return outcome


def turn_taken(job: dict) -> bool:
    """Whether another bench trial has one of `job`'s devices now (a look: no turn is kept)."""
    for device in trial_devices(job):
        if (fd := open_lock(device)) is None:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # and with it the lock, when it was had
    return False


def lock_path(device: str) -> Path:
    return Path(tempfile.gettempdir()) / f"bench-device-{device}.lock"


def open_lock(device: str) -> int | None:
    """The device's lock file, open to flock; None where it cannot be (a file another user made unreadable:
    measured without the turn). Created only where missing: under fs.protected_regular (systemd's default)
    an O_CREAT open of another user's file in /tmp fails though the file is there."""
    for flags in (os.O_RDONLY, os.O_RDONLY | os.O_CREAT):
        try:
            return os.open(lock_path(device), flags, 0o666)
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


@contextlib.contextmanager
def device_turn(job: dict, on_beat=None):
    """One trial at a time on each device, across every bench process on this machine: two sweeps of a
    study on one CPU measured each other's load (a baseline at 7 samples/s against 800 alone, and a
    "5.15x" best from it). The lock files are shared by every user; the kernel drops a lock when its
    holder dies, so a killed sweep blocks nothing."""
    fds = []
    try:
        for device in trial_devices(job):
            if (fd := open_lock(device)) is None:
                continue
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_beat:
                    on_beat({"phase": f"waiting for another bench trial on {device} to end"})
                fcntl.flock(fd, fcntl.LOCK_EX)  # Ctrl-C here raises as anywhere in the sweep
        yield
    finally:
        for fd in fds:
            os.close(fd)


def trial_devices(job: dict) -> list[str]:
    """The devices a trial runs on, as lock names, sorted (two trials taking several never wait on each
    other); a GPU by the name CUDA_VISIBLE_DEVICES gives it (an index in bus order, or a UUID)."""
    if not job["device"].startswith("cuda"):
        return [job["device"]]
    return sorted("cuda-" + re.sub(r"[^\w-]", "_", gpu) for gpu in trial_gpus(job["config"], job["device"]))


def start_child(argv: list[str], job: dict, env: dict):
    """The trial's process, forked from the warm trial server where that is safe (harness.zygote),
    else a fresh interpreter; and which start it got, for the record. Several processes (ddp,
    fsdp) start fresh: torch's elastic launcher spawns their ranks."""
    module = child_module(job["config"])
    method, why = (zygote.start_method(job, env) if module == "harness.trial"
                   else (zygote.FRESH, "several processes: torch's elastic launcher starts the ranks"))
    if method == zygote.WARM:
        try:
            return zygote.spawn(argv, env, os.getcwd()), {"method": zygote.WARM, "reason": None}
        except (OSError, RuntimeError) as exc:
            method, why = zygote.FRESH, f"the trial server failed: {exc}"[:300]
    proc = subprocess.Popen([sys.executable, "-m", module, *argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**env, zygote.PARENT_ENV: str(os.getpid())}, start_new_session=True, cwd=os.getcwd())
    return proc, {"method": method, "reason": why}


def child_module(config: dict) -> str:
    """The trial child: one process, or (ddp, fsdp) the launcher of its ranks."""
    return "harness.trial" if config.get("parallel", "none") == "none" else "harness.distributed"


def watch(proc: subprocess.Popen, limits: Limits, heartbeat: Path, on_beat=None) -> str | None:
    """Wait for the child; return why we killed it ('timeout', 'stall'), or None if it ended itself. Time the
    whole job spent stopped counts toward neither limit: the trial did not run either."""
    started, last, woke = time.monotonic(), (time.monotonic(), time.time()), 0.0
    while not ended(proc, POLL_S):
        now = (time.monotonic(), time.time())
        stopped = max(now[0] - last[0], now[1] - last[1]) - POLL_S  # a suspended laptop stops the monotonic clock
        if stopped > min(STOPPED_S, limits.stall_s / 2):
            started, woke = started + stopped, now[1]
        last = now
        if now[0] - started > limits.timeout_s:
            return f"{OVER_TIME} {limits.timeout_s:g}s"  # 0.4s, not "0s"
        beat = read_heartbeat(heartbeat)
        if on_beat:
            on_beat(beat)
        if beat and beat["phase"] in ("warmup", "measure") and now[1] - max(beat["time"], woke) > limits.stall_s:
            return f"no progress for {limits.stall_s:g}s (stuck after step {beat['step']} of {beat['phase']})"
    return None


def ended(proc, timeout: float) -> bool:
    """Wait up to `timeout` for the child to end; True as soon as it has (no poll interval added to a trial)."""
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


OVER_TIME = "exceeded the trial time limit of"
KILLED_IN_WORDS = {
    "start-up": "before the trial's own code ran (process start, imports)",
    "build": "while building the model, its data and its fp32 reference (raise trial.timeout if that takes this long)",
    "compile": "while compiling, in the first step",
    "warm-up": "in its first steps (warm-up)",
    "measuring": "in its measured steps",
    "teardown": "after its measured steps (memory breakdown, fp32 reference, FLOP count: a CPU trial may build your "
                "model twice more there)",
}
"""A killed trial's phase, as the time split names it, in words for its timeout's message."""


def killed_phase(beat: dict | None, config: dict) -> str:
    """The phase (as harness.report's time split names it) the trial's last heartbeat said it was in."""
    phase = (beat or {}).get("phase")
    if phase == "first_step":
        return "compile" if config.get("compile", "off") != "off" else "warm-up"
    return {"start": "build", "trainer_setup": "build", "warmup": "warm-up", "measure": "measuring",
            "teardown": "teardown", "done": "teardown"}.get(phase, "start-up")


def read_heartbeat(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kill_group(proc: subprocess.Popen, token: str | None = None) -> None:
    """The trial's process group, then whatever the trial started that left the group (kill_escaped)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # a forked trial killed before its setsid() is not yet a group leader
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:  # a forked trial whose server never says it ended: stopped or wedged
        if hasattr(proc, "abandon"):
            proc.abandon()
        proc.wait()
    if token:
        kill_escaped(token)


def trial_token() -> str:
    """This process's pid and start time, then a part of the trial's own: a process still carrying it once this
    process is gone (a kill -9 of the sweep) is an orphan of its trial (end_orphans)."""
    me, ticks = os.getpid(), pids.start_ticks(os.getpid())
    if ticks is None:  # no /proc (not Linux): the wall-clock start, as before
        return f"{me}-{psutil.Process(me).create_time():.0f}-{uuid.uuid4().hex}"
    return f"{me}-t{ticks}-{uuid.uuid4().hex}"


def end_orphans() -> None:
    """Kill what a trial started that outlived the sweep that ran it (kill -9 gave it no time to): a server or
    daemon in a session of its own, holding memory that would spoil every later measurement."""
    for proc in psutil.process_iter():
        try:
            token = proc.environ().get(TOKEN)
            if token and not runner_alive(token):
                proc.kill()
        except psutil.Error:  # gone meanwhile, or another user's
            pass


def runner_alive(token: str) -> bool:
    """The process that ran the token's trial still runs (a token of an older bench: not for us to judge)."""
    pid, started, _ = (token.split("-") + ["", ""])[:3]
    if pid.isdigit() and started.startswith("t") and started[1:].isdigit():  # its start tick: no clock step moves it
        return str(pids.start_ticks(int(pid))) == started[1:]
    if not (pid.isdigit() and started.isdigit()):
        return True
    try:  # a token of a bench before 2026-12-08: its wall-clock start
        return f"{psutil.Process(int(pid)).create_time():.0f}" == started
    except psutil.NoSuchProcess:
        return False


def kill_escaped(token: str) -> None:
    """Processes that left the trial's group (setsid(), a daemon's double fork) still carry the trial's
    TOKEN in their environment: found by it, and killed too."""
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TOKEN) == token:
                proc.kill()
        except psutil.Error:  # gone meanwhile, or another user's
            pass


def save_log(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written temp file behind
        raise


def workdir_prefix() -> str:
    """A trial folder's name starts with its sweep's pid and start tick: remove_stale_workdirs reads them."""
    return f"{WORKDIR_PREFIX}{os.getpid()}.{pids.start_ticks(os.getpid())}-"


def remove_stale_workdirs() -> None:
    """Trial folders a sweep killed with -9 (or by a full disk) left in the temp folder: their sweep's
    pid is in the name, and that process is gone (or is a newer one with the same pid)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*-*"):
        pid, _, ticks = folder.name[len(WORKDIR_PREFIX):].split("-", 1)[0].partition(".")
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        if ticks.isdigit():  # its sweep's start tick, which no clock step moves
            if str(pids.start_ticks(int(pid))) != ticks:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        try:  # a folder of a bench before 2026-12-08: its sweep's wall-clock start against the folder's
            alive = psutil.Process(int(pid)).create_time() <= folder.stat().st_mtime
        except psutil.NoSuchProcess:
            alive = False
        except OSError:
            continue
        if not alive:
            shutil.rmtree(folder, ignore_errors=True)


def in_steps_under_a_cpu_wall(job: dict, beat: dict | None) -> bool:
    """Whether the trial was in its steps on a CPU under a memory wall, where allocations past the wall fail."""
    return (job["device"] == "cpu" and bool(job.get("memory_budget"))
            and (beat or {}).get("phase") in ("first_step", "warmup", "measure"))


def classify(rc: int, result: dict | None, killed_for: str | None, log: str, at_cpu_wall: bool = False) -> dict:
    """How the trial ended -> its record. The child's own word wins when it left one. `at_cpu_wall`:
    it died in its steps under a CPU memory wall (in_steps_under_a_cpu_wall)."""
    if killed_for:
        return failure(record.TIMEOUT, "Timeout", killed_for, log)
    if result is not None:
        return result
    if rc == -signal.SIGABRT and "std::bad_alloc" in log:
        return failure(record.OOM, "bad_alloc", "aborted with std::bad_alloc (allocation failed)", log)
    if "MemoryError" in log or errors.is_oom_text(log):  # one table of every library's OOM words
        return failure(record.OOM, "OutOfMemory", "allocation failed before the trial could report", log)
    if at_cpu_wall and rc in (-signal.SIGSEGV, -signal.SIGBUS):
        # a library that does not check a failed allocation crashes instead of raising (one batch past
        # the wall in 26 ended so, in CI; the rest raised out-of-memory errors)
        name = signal.Signals(-rc).name
        return failure(record.OOM, name, f"killed by {name} in its steps under the CPU memory wall: read as out of "
                       "memory (a library that does not check a failed allocation); `bench trial` without "
                       "--memory-budget tells a crash apart", log)
    if rc == -signal.SIGKILL and record.TERMINATED in log:
        return failure(record.CRASH, "SIGTERM", "killed by SIGTERM (from outside bench, or the training code's own)", log)
    if rc < 0:
        name = signal.Signals(-rc).name
        hint = " (an unexplained SIGKILL is often the kernel's OOM killer)" if rc == -signal.SIGKILL else ""
        return failure(record.CRASH, name, f"killed by {name}{hint}", log)
    if rc == 0:
        return failure(record.CRASH, "NoResult", "exited 0 without writing a result", log)
    return failure(record.CRASH, f"exit {rc}", f"exited with code {rc} without writing a result", log)


def failure(status: str, kind: str, message: str, log: str) -> dict:
    return {"status": status, "throughput": None, "peak_memory": None,
            "error": {"type": kind, "message": message, "log_tail": log[-2000:]}}


def prestart() -> None:
    """Start the warm trial server early (harness.zygote), so its import of torch overlaps other work;
    meanwhile, remove the trial folders killed sweeps left, and what their trials started."""
    zygote.prestart()
    remove_stale_workdirs()
    end_orphans()
