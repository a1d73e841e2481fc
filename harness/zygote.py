"""Warm trial start: a trial server (zygote) imports torch once; each trial is a process forked from it.

A fresh `python -m harness.trial` spends about 1.5-2 s importing torch before it does anything. The
server pays that once per sweep. It imports torch and bench's trial modules and then only waits: it
never runs a torch op and never touches a device, because a child forked from a process whose OpenMP
pool has started deadlocks at its first parallel op, and a CUDA context cannot cross a fork. Each
trial forked from it starts its own session (process group), its own CUDA, its own memory wall and
its own heartbeat, and gets the environment, working folder and import path a fresh child would:
from `harness.trial.main` on, it is the same trial.

Why not multiprocessing's forkserver (set_forkserver_preload(["torch"])), which this follows (a
listener socket, file descriptors passed with SCM_RIGHTS, a status pipe that carries the child's pid
and then its exit code, the server ending when its parent does): each of its children re-runs the
parent's preparation, importing the parent's `__main__` (bench's CLI pulls in Optuna, pytest's
pulls in pytest) and taking the parent's working folder and sys.path, and it has no way to hand a
child its own stdout pipe but pickled Connections.

The parent side (`start_method`, `spawn`) never imports torch; the server side runs in
`python -m harness.zygote FD MODULE...`.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading

WARM, FRESH = "warm", "fresh"
ENV_SWITCH = "BENCH_TRIAL_START"
"""`fresh` turns the warm start off for every trial (`warm`, the default, uses it where it is safe)."""
READY_TIMEOUT_S = 300.0
MAX_REQUEST = 1 << 20
# What the server imports: torch and every module a trial would import before its first op. Never a
# user's module: its import could run an op, and in the trial it is imported afresh anyway.
PRELOAD = ("torch", "torch._dynamo", "torch._inductor.config", "torch.utils.flop_counter", "harness.trial",
           "harness.workloads.emberformer", "harness.workloads.gpt", "harness.workloads.retrieval",
           "harness.workloads.nli_encoder", "harness.workloads.naics", "harness.workloads.own")


# ---- parent side: which start, and a forked child that looks like a Popen -------------------------

def start_method(job: dict, env: dict) -> tuple[str, str | None]:
    """(WARM, None), or (FRESH, why): where forking from the server is unsafe or not wanted."""
    if os.environ.get(ENV_SWITCH, WARM) == FRESH:
        return FRESH, f"{ENV_SWITCH}=fresh"
    if job["measure"].get("start", "auto") == FRESH:
        return FRESH, "the spec asks for it (trial.start: fresh)"
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return FRESH, f"no safe fork on {sys.platform}"
    changed = [k for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF") if env.get(k) != os.environ.get(k)]
    if changed:  # the C++ allocator may read its conf when torch loads, in the server, not in the trial
        return FRESH, f"the trial sets {changed[0]} (expandable_segments), read when torch loads"
    if _server.failed:
        return FRESH, f"the trial server did not start: {_server.failed}"
    return WARM, None


class Forked:
    """A trial forked by the server, with the part of Popen's interface that harness.launch uses."""

    def __init__(self, pid: int, status_fd: int, stdout, server_pid: int):
        self.pid, self.status_fd, self.stdout, self.returncode = pid, status_fd, stdout, None
        self.server_pid = server_pid
        self.server_died = False
        """The server ended before the trial did (killed from outside): the trial was taken down with it."""

    def abandon(self) -> None:
        """The trial was killed, yet the server that reaps it never says so (stopped, wedged): end the server,
        which closes the status pipe, and the next trial starts a fresh one."""
        try:
            os.kill(self.server_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.status_fd], [], [], 0)[0]:
            self._read_exit()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.status_fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"trial {self.pid}", timeout)
            self._read_exit()
        return self.returncode

    def _read_exit(self) -> None:
        data = os.read(self.status_fd, 64)
        os.close(self.status_fd)
        # no exit code: the server died, and the trial with it (harness.trial.die_with_parent)
        self.server_died = not data.strip()
        self.returncode = -signal.SIGKILL if self.server_died else int(data)


class Server:
    """The parent's handle on its trial server: started on first use, restarted if it died."""

    def __init__(self):
        self.proc, self.sock, self.failed = None, None, None
        self.lock = threading.Lock()

    def ensure_running(self) -> bool:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                return True
            self.failed = None
            try:
                self._start()
            except (OSError, RuntimeError) as exc:
                self.failed = str(exc)[:300]
                self.proc = self.sock = None
        return self.failed is None

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        err = tempfile.TemporaryFile()
        with theirs:
            self.proc = subprocess.Popen([sys.executable, "-m", "harness.zygote", str(theirs.fileno()), *PRELOAD],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=err, stderr=err, start_new_session=True,
                                         # an import that asks torch.cuda.is_available() asks NVML, not cuInit:
                                         # a driver initialised in the server would be unusable in its forks
                                         env=dict(os.environ, PYTORCH_NVML_BASED_CUDA_CHECK="1"))
        ours.settimeout(READY_TIMEOUT_S)
        try:
            ready = ours.recv(64)
        except OSError:
            ready = b""
        ours.settimeout(None)
        if ready != b"ready":
            self.proc.kill()
            self.proc.wait()
            err.seek(0)
            tail = err.read().decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"exited {self.proc.returncode}: {tail[0]}")
        self.sock = ours

    def spawn(self, argv: list[str], env: dict, cwd: str) -> Forked:
        """Fork a trial running `python -m harness.trial *argv` in `env` and `cwd`; its output is .stdout."""
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        try:
            with self.lock:
                socket.send_fds(self.sock, [request], [out_w, status_w])
        finally:
            os.close(out_w)
            os.close(status_w)
        pid = _read_line(status_r)
        if pid is None:
            os.close(out_r)
            os.close(status_r)
            raise RuntimeError("the trial server ended before forking the trial")
        return Forked(pid, status_r, os.fdopen(out_r, "rb"), self.proc.pid)


def _read_line(fd: int) -> int | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            return None
        data += chunk
    return int(data)


_server = Server()


def prestart() -> None:
    """Start the server now, so torch's import overlaps what the sweep does before its first trial."""
    if os.environ.get(ENV_SWITCH, WARM) != FRESH and sys.platform.startswith("linux"):
        threading.Thread(target=_server.ensure_running, daemon=True).start()


def ensure_running() -> str | None:
    """Start the server and wait until it is ready: None, or why it could not start."""
    return None if _server.ensure_running() else _server.failed


def spawn(argv: list[str], env: dict, cwd: str) -> Forked:
    if not _server.ensure_running():
        raise RuntimeError(f"the trial server did not start: {_server.failed}")
    return _server.spawn(argv, env, cwd)


def server_pid() -> int | None:
    """The running server's pid (tests check that it stays op-free)."""
    return _server.proc.pid if _server.proc is not None and _server.proc.poll() is None else None


# ---- server side -----------------------------------------------------------------------------------

def serve(sock: socket.socket) -> None:
    """Fork one trial per request; report each child's pid, then its exit code, on its status pipe.

    Ends when the parent does (the socket reads EOF); its trials then end too (die_with_parent).
    """
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears of every exit
    signal.set_wakeup_fd(wake_w)
    statuses: dict[int, int] = {}  # child pid -> the write end of its status pipe
    while True:
        readable = select.select([sock, wake_r], [], [])[0]
        if wake_r in readable:
            os.read(wake_r, 4096)
            reap(statuses)
        if sock in readable:
            msg, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 2)
            if not msg:
                return
            out_w, status_w = fds
            server = os.getpid()
            pid = os.fork()
            if pid == 0:
                for fd in (sock.fileno(), wake_r, wake_w, *statuses.values()):
                    os.close(fd)
                os.close(status_w)
                become_trial(json.loads(msg), out_w, server)  # never returns
            os.close(out_w)
            os.write(status_w, b"%d\n" % pid)
            statuses[pid] = status_w


def reap(statuses: dict[int, int]) -> None:
    while statuses:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, b"%d\n" % os.waitstatus_to_exitcode(status))
            except BrokenPipeError:  # the parent stopped waiting for it
                pass
            os.close(fd)


def become_trial(request: dict, out_fd: int, server: int) -> None:
    """In the forked child: what a fresh `python -m harness.trial` would be, then run the trial."""
    code = 1
    try:
        os.setsid()  # its own process group: launch kills the trial and all it started at once
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(devnull)
        os.close(out_fd)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # PYTHONUNBUFFERED acts at start-up only
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[PARENT_ENV] = str(server)  # its parent is this server, not the sweep
        os.chdir(request["cwd"])
        paths = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *paths, *(p for p in sys.path[1:] if p not in paths)]  # as `python -m` sets it
        import faulthandler
        import random
        faulthandler.enable()  # PYTHONFAULTHANDLER, too, is read at start-up only
        random.seed()  # not the server's state: every trial would draw the same numbers
        unsafe = unsafe_fork()
        if unsafe:  # checked here, in the trial, not trusted from the server: start it afresh instead
            os.environ[FALLBACK_ENV] = unsafe
            os.execv(sys.executable, [sys.executable, "-m", "harness.trial", *request["argv"]])
        from harness import trial
        code = trial.main(request["argv"])
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        os._exit(code)


PARENT_ENV = "BENCH_TRIAL_PARENT"
"""The pid of the process that started a trial (the sweep, or this server), for harness.trial.die_with_parent:
a sweep killed while a fresh start still imported torch left the trial with init as its parent, whose death
it then watched for, and it trained on as an orphan."""

FALLBACK_ENV = "BENCH_FORK_FALLBACK"
"""Set in a trial that was forked unsafely and re-exec'd as a fresh interpreter: why (the env stamp keeps it)."""


def unsafe_fork() -> str | None:
    """Why this forked process cannot train, or None: torch's own check that the parent had
    initialised CUDA (torch.cuda._is_in_bad_fork, what DataLoader workers and _lazy_init consult)."""
    import torch
    if torch.cuda._is_in_bad_fork():
        return "the trial server had initialised CUDA before forking"
    return None


def preload(modules: list[str]) -> None:
    import importlib
    for name in modules:
        importlib.import_module(name)
    import torch
    if torch.cuda.is_initialized():  # checked, never caused: a CUDA context cannot cross a fork
        raise RuntimeError("CUDA was initialised while importing; trials start fresh")


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the sweep's to handle
    preload(argv[1:])
    sock.send(b"ready")
    serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
