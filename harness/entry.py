"""The `bench` command's entry point: Ctrl-C while Python imports bench's libraries (optuna, pandas,
rich, click: most of a second) is one line and exit 130, as it is once a command runs; a reader that
leaves early (`bench apply best | head -1`, `2>&1 | head -1` too) silences the rest of the output, not
the command, and so does an output that cannot be written (`bench sweep spec.yaml > sweep.log` on a full
disk), which is said in one line and makes the exit status 2."""
import contextlib
import os
import signal
import sys


@contextlib.contextmanager
def _ctrl_c_noted():
    """Ctrl-C raises KeyboardInterrupt as ever, and is noted in the list it yields (not where it is ignored:
    `nohup bench sweep ... &`)."""
    noted: list[int] = []
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield noted
        return

    def interrupt(signum, frame):
        noted.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


class OutputToAReaderThatMayLeave:
    """sys.stdout or sys.stderr for a pipe whose reader may close it: once it has, the rest of the output goes to
    /dev/null and the command runs on (an apply still writes its file, a sweep still runs its trials)
    and exits as it would have, instead of dying mid-command on a BrokenPipeError."""

    def __init__(self, stream):
        self._stream = stream
        self.lost: OSError | None = None
        """Why the output could not be written (not a reader that left: that is the reader's choice)."""

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._cannot_write(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._cannot_write(exc)

    def _cannot_write(self, exc: OSError) -> None:
        if not isinstance(exc, BrokenPipeError) and self.lost is None:
            self.lost = exc
            sys.stderr.write(f"bench: cannot write its output ({exc.strerror or exc}); the rest of it is dropped and "
                             "the command runs on\n")
        self._reader_left()

    def _reader_left(self) -> None:
        # what is still buffered is flushed into /dev/null, at exit too, instead of failing again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main() -> None:
    try:
        with _ctrl_c_noted() as noted:
            from harness.cli import main as cli
        if noted:  # raised where Python drops it (a weakref callback of the import locks): the import went on
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        sys.stderr.write("interrupted while bench started; nothing was written\n")
        sys.exit(130)
    if sys.stdout is None or sys.stderr is None:
        cli()
    # stderr too: apply's warnings come before it writes, and one failed write there stopped it (exit 1, unwritten)
    sys.stdout = OutputToAReaderThatMayLeave(sys.stdout)
    sys.stderr = OutputToAReaderThatMayLeave(sys.stderr)
    outputs = sys.stdout, sys.stderr
    try:
        cli()
    except SystemExit as done:
        if any(o.lost is not None for o in outputs) and done.code in (0, None):
            sys.exit(2)  # it did its work, but what it had to say is lost
        raise
    finally:
        _done()


def _done() -> None:
    """The command has ended, its exit status decided: a Ctrl-C while Python shuts down (an `apply` that
    had written its file exited 130 without a word, as if nothing had been) cannot change it."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
