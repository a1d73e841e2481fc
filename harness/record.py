"""The trial record: the contract between the trial child, the study and every reader.

A record is a plain JSON object. The child writes it; the parent adds `number`, classifies the
status and stores it whole in the study. Keys every record has:

    status        one of STATUSES
    config        knob name -> value, as run
    throughput    samples/s, median over measured windows (null unless status is ok/diverged)
    peak_memory   bytes, the footprint feasibility is judged on (null when not measured):
                  CUDA: allocator peak reserved + CUDA context; CPU: peak RSS above post-import baseline
    timing        seconds: compile_s, warmup_s, measure_s, wall_s, and step-time statistics
    memory        every memory reading the trial took (see harness.measure)
    env           where it ran: device, driver, CUDA, torch, Python, OS, host, bench version

Optional: tokens_per_s, flops, loss, error ({type, message, log_tail}), workload, adapter (what bench
chose when adapting a model brought as it is, e.g. the checkpointed blocks), start ({method: warm |
fresh, reason}: how the trial process started, harness.zygote), reused (figure -> {trial, key}: the
FLOP count, reference loss or breakdown taken from an earlier trial, harness.reuse).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

OK = "ok"
OOM = "oom"
TIMEOUT = "timeout"
CRASH = "crash"
ERROR = "error"
DIVERGED = "diverged"
INTERRUPTED = "interrupted"
SKIPPED = "skipped"  # not run: its memory family proves it cannot fit (record["skip"] says why)
STATUSES = (OK, OOM, TIMEOUT, CRASH, ERROR, DIVERGED, INTERRUPTED, SKIPPED)

# Child exit codes that carry meaning for the parent (anything else is classified from the log).
EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_OOM = 3


def write_atomic(path: Path, record: dict) -> None:
    """Write JSON so a reader never sees half a file: temp file, fsync, rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True, default=_jsonable)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(path: Path) -> dict | None:
    """The record at `path`, or None when the child never wrote one (or wrote garbage)."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "status" in record else None


def _jsonable(value):
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)
