"""The `bench` command's entry point: Ctrl-C while Python imports bench's libraries (optuna, pandas,
rich, click: most of a second) is one line and exit 130, as it is once a command runs; a reader that
leaves early (`bench apply best | head -1`) silences the rest of the output, not the command."""
import os
import sys


class OutputToAReaderThatMayLeave:
    """sys.stdout for a pipe whose reader may close it: once it has, the rest of the output goes to
    /dev/null and the command runs on (an apply still writes its file, a sweep still runs its trials)
    and exits as it would have, instead of dying mid-command on a BrokenPipeError."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
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
        from harness.cli import main as cli
    except KeyboardInterrupt:
        sys.stderr.write("interrupted while bench started; nothing was written\n")
        sys.exit(130)
    if sys.stdout is not None:
        sys.stdout = OutputToAReaderThatMayLeave(sys.stdout)
    cli()
