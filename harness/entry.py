"""The `bench` command's entry point: Ctrl-C while Python imports bench's libraries (optuna, pandas,
rich, click: most of a second) is one line and exit 130, as it is once a command runs."""
import sys


def main() -> None:
    try:
        from harness.cli import main as cli
    except KeyboardInterrupt:
        sys.stderr.write("interrupted while bench started; nothing was written\n")
        sys.exit(130)
    cli()
