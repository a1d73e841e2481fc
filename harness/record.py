"""The trial record: the contract between the trial child, the study and every reader.

The child writes a record as JSON (`write_atomic`); the parent adds `number`, classifies the status
and stores it whole in the study. Every reader goes through `Record.of`, which reads any version
this bench wrote (VERSION history below) into the one typed structure, so no reader interprets the
raw dict on its own. Readers that need the figures a choice is made on (a config's confirmed
speed, its noise) ask harness.pareto, which reads these fields and nothing else.

Versions: 1 (no `version` key): every record up to bench 0.1, `tokens_per_s` a {median, p10, p90}
dict or, in the earliest studies, a bare number. 2: the same keys plus `version`.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

VERSION = 2

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
# The child's last line when it was sent SIGTERM: it then ends its whole group with SIGKILL (no grandchild
# may outlive it), so only the log can tell the parent which signal it was.
TERMINATED = "bench: the trial was sent SIGTERM; ending its process group"


@dataclass(frozen=True)
class Run:
    """One confirmation run of a config: the same config measured again in a fresh process."""

    status: str
    """How the run ended (one of STATUSES)."""
    throughput: float | None = None
    """samples/s, median over the run's measured windows."""
    tokens_per_s: float | None = None
    """tokens/s, median; None where samples have no length."""
    peak_memory: int | None = None
    """bytes, the footprint feasibility is judged on."""
    busy: dict | None = None
    """What made the machine busy during the run (harness.busy), None when it was quiet."""
    round: int | None = None
    """The confirmation round it ran in: two configs' runs of one round ran side by side (None: a study
    from before rounds were kept, where the k-th run is round k)."""


@dataclass(frozen=True)
class Record:
    """One trial as measured: what the child wrote plus what the parent added."""

    status: str
    """One of STATUSES; `running` for a trial still in flight when a report is drawn."""
    number: int | None = None
    """The trial's number in the study (the parent's)."""
    config: dict = field(default_factory=dict)
    """Knob name -> value, as run."""
    baseline: bool = False
    """The user's current config (read from the apply target), measured first."""
    throughput: float | None = None
    """samples/s, median over the measured windows of this trial's own run (null unless ok/diverged)."""
    tokens_per_s: float | None = None
    """tokens/s, median over the measured windows; None where samples have no length."""
    tokens_stats: dict | None = None
    """tokens/s as the child wrote it: {median, p10, p90} over the windows."""
    peak_memory: int | None = None
    """Bytes, the footprint feasibility is judged on. CUDA: allocator peak reserved + CUDA context;
    CPU: peak RSS above the post-import baseline. None when not measured."""
    timing: dict = field(default_factory=dict)
    """Seconds: compile_s, first_step_s, warmup_s, measure_s, setup_s, startup_s, trial_wall_s, and
    step_s {median, cv, ...}: the step-time statistics over the measured windows."""
    memory: dict = field(default_factory=dict)
    """Every memory reading the trial took (harness.measure): peak_allocated, peak_reserved,
    device_total, breakdown by phase, ..."""
    flops: dict = field(default_factory=dict)
    """FLOPs per step, achieved TFLOP/s and MFU where the device's peak is known."""
    loss: dict = field(default_factory=dict)
    """reference (fp32 eager loss of the untouched model on the first step's batch, at the first forward's
    random draws), redrawn (the same at other seeds: equal unless the loss draws random numbers;
    harness.reference), unchecked (why the first loss was not held to the reference, else None), first,
    last, finite, steps, scatter (the median change from one micro-batch's loss to the next). Fields are
    absent in records older than they are (scatter: 2026-11-25; redrawn, unchecked: 2026-12-06)."""
    env: dict = field(default_factory=dict)
    """Where it ran: device, driver, CUDA, torch, Python, OS, host, bench version."""
    error: dict | None = None
    """{type, message, log_tail} when the trial did not measure (or measured with a caveat)."""
    workload: dict | None = None
    """The workload as built: name or factory, preset, params."""
    adapter: dict | None = None
    """What bench chose when adapting a model brought as it is (e.g. the checkpointed blocks)."""
    start: dict | None = None
    """{method: warm | fresh, reason}: how the trial process started (harness.zygote)."""
    reused: dict | None = None
    """figure -> {trial, key}: a FLOP count, reference loss or breakdown taken from an earlier trial."""
    skip: dict | None = None
    """Why a config was not run (status skipped): reason, the trials it was inferred from."""
    busy: dict | None = None
    """What made the machine busy during the trial (harness.busy.describe), None when it was quiet."""
    remeasured_after: dict | None = None
    """What spoiled the run this trial replaced on a quiet machine: its busy verdict, or {"noisy_cv": CV}."""
    log: str | None = None
    """The trial's log file."""
    unsearched: tuple[str, ...] = ()
    """`knob=value` for each of its values the study's last sweep did not search (taken out of the spec
    since; the parent's, harness.ledger.mark_unsearched): measured, never chosen as best."""
    repeats: tuple[Run, ...] = ()
    """The config's confirmation runs, interleaved with the baseline's (study attribute `repeats`)."""
    extra: dict = field(default_factory=dict)
    """Keys this version does not name (cuda_graphs, distributed, ...), kept for JSON readers."""
    version: int = VERSION
    """The record version it was read from."""

    @classmethod
    def of(cls, raw: "Record | dict") -> "Record":
        """Read a record of any version (a Record is returned as it is)."""
        if isinstance(raw, Record):
            return raw
        known = {f.name for f in fields(cls)} - {"extra", "repeats", "tokens_per_s", "tokens_stats", "version"}
        values = {k: v for k, v in raw.items() if k in known and v is not None}
        if "unsearched" in values:
            values["unsearched"] = tuple(values["unsearched"])
        for name in ("config", "timing", "memory", "flops", "loss", "env"):
            if not isinstance(values.get(name), dict):
                values.pop(name, None)
        values.setdefault("status", "unknown")
        extra = {k: v for k, v in raw.items() if k not in known and k not in ("repeats", "tokens_per_s", "version")}
        tokens = raw.get("tokens_per_s")
        return cls(**values, tokens_per_s=_median(tokens), tokens_stats=tokens if isinstance(tokens, dict) else None,
                   repeats=tuple(Run(**{k: (_median(v) if k == "tokens_per_s" else v) for k, v in r.items()
                                        if k in Run.__dataclass_fields__})
                                 for r in raw.get("repeats") or () if isinstance(r, dict) and "status" in r),
                   extra=extra, version=int(raw.get("version") or 1))

    def rate(self, objective: str = "samples") -> float | None:
        """This trial's own run's throughput in the study's objective: samples/s or tokens/s. None for an
        `oom`: one over the budget ran to the end, but at a speed the budget does not allow."""
        if self.status == OOM:
            return None
        return self.tokens_per_s if objective == "tokens" else self.throughput

    def runs(self, objective: str = "samples") -> list[float]:
        """Every measured throughput of the config: this trial's run, then its ok confirmation runs."""
        return [v for v in [self.rate(objective), *(self.run_rate(r, objective) for r in self.repeats)] if v]

    def by_round(self, objective: str = "samples") -> dict[int, float | None]:
        """Each confirmation run's figure by its round: a failed run of round 0 shifted later runs by one
        in a list, and paired round 1 of one config with round 2 of another."""
        return {k if r.round is None else r.round: self.run_rate(r, objective) for k, r in enumerate(self.repeats)}

    @staticmethod
    def run_rate(run: Run, objective: str) -> float | None:
        return (run.tokens_per_s if objective == "tokens" else run.throughput) if run.status == OK else None

    @property
    def peak(self) -> int | None:
        """Bytes: the highest peak over this trial's run and its ok confirmation runs, what the choice
        judges fit on (one run's 188 MiB passed a 193.5 MiB line that the config's other two runs, at
        198 and 194 MiB, went over). None where this trial's run measured none."""
        if self.peak_memory is None:
            return None
        return max([self.peak_memory, *(r.peak_memory for r in self.repeats if r.status == OK and r.peak_memory)])

    @property
    def measured(self) -> bool:
        """Ran to the end with a throughput and a peak: a candidate for the choice."""
        return self.status == OK and bool(self.throughput) and self.peak_memory is not None

    @property
    def step_cv(self) -> float | None:
        """Coefficient of variation of the step time over the measured windows; None where none was
        measured (a trial cut after its first warm-up step: one timing has no spread)."""
        return None if self.one_timing else (self.timing.get("step_s") or {}).get("cv")

    @property
    def one_timing(self) -> bool:
        """Its figure is one warm-up step's (cut there as far slower than the best so far)."""
        return self.timing.get("windows") == 0

    @property
    def leak(self) -> dict | None:
        """memory.leak (harness.footprint.leak): bytes the steps kept, over how many steps; None when they
        kept none, or when a record edited by hand holds something else there."""
        found = self.memory.get("leak")
        if isinstance(found, dict) and all(isinstance(found.get(k), (int, float)) and not isinstance(found[k], bool)
                                           and 0 < found[k] < FIGURE_LIMIT for k in LEAK_FIGURES):
            return found
        return None

    def to_dict(self) -> dict:
        """The record as JSON readers get it (every field, extras flattened back in)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("extra", "tokens_stats")}
        out["tokens_per_s"] = self.tokens_stats or ({"median": self.tokens_per_s} if self.tokens_per_s else None)
        out["repeats"] = [asdict(r) for r in self.repeats] or None
        return {**self.extra, **out}


LEAK_FIGURES = ("bytes", "steps", "bytes_per_step")


def leak_words(found: dict) -> str:
    """A leak (Record.leak) in a short clause: how much, over how many steps."""
    return (f"memory the steps keep grew in every window, {found['bytes'] / 1024**2:.1f} MiB over {found['steps']:.0f} "
            f"steps ({found['bytes_per_step'] / 1024:.1f} KiB a step)")


FIGURES = ("throughput", "tokens_per_s", "peak_memory")
"""The figures every reader compares: a number or nothing."""


FIGURE_LIMIT = 2.0 ** 60
"""Above any real figure (an exbibyte of memory, 10^18 samples/s); 1e308 overflowed the noise's arithmetic."""


def error_words(error: dict | None, cut: int | None = None, at: str | None = None) -> str:
    """A failed trial's message on one line (cut to `cut` characters), where in the user's code it was
    raised (`at`), then what to do where the trial knew (`error.hint`): neither is cut off with a long message."""
    error = error or {}
    message = " ".join(str(error.get("message") or "").split())  # a C++ error's newlines: one line
    if cut and len(message) > cut:  # at a word, and said to be cut: the log holds the whole message
        message = message[:cut].rsplit(" ", 1)[0].rstrip(",;:") + " …"
    message += f" (at {at})" if at else ""
    return f"{message}; {error['hint']}" if error.get("hint") else message


def figure_problem(rec: dict) -> str | None:
    """Why a stored record (or confirmation run) cannot be read, or None: a figure that is not a number
    was written by hand or damaged, and would surface as a TypeError in whichever view read it first."""
    for name in FIGURES:
        value = _median(rec.get(name)) if name == "tokens_per_s" else rec.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"the record's {name} is {value!r}, not a number"
        if not 0 < value < FIGURE_LIMIT:  # NaN fails this too
            return f"the record's {name} is {value!r}, not a measurement (a positive number below 2**60)"
    return busy_problem(rec.get("busy"))


BUSY_FIGURES = ("load1", "cores", "steal")
"""What every busy verdict holds (harness.busy.now), and every view reads."""


def busy_problem(verdict) -> str | None:
    """A busy verdict (None: quiet) that is not what harness.busy writes: the report would fail on it."""
    if verdict is None:
        return None
    if not isinstance(verdict, dict) or not all(
            isinstance(verdict.get(k), (int, float)) and not isinstance(verdict.get(k), bool)
            and math.isfinite(verdict[k]) for k in BUSY_FIGURES):
        return f"the record's busy is {verdict!r}, not a verdict (numbers {', '.join(BUSY_FIGURES)})"
    return None


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with its control characters (terminal escapes, a bare CR) spelled out as \\x1b: an error
    message from the user's code, or another host's record, cannot drive the reader's terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _median(value) -> float | None:
    """Rates were kept as {median, p10, p90}, in the earliest studies as a bare number."""
    return value.get("median") if isinstance(value, dict) else value


def write_atomic(path: Path, record: dict) -> None:
    """Write JSON so a reader never sees half a file: temp file, fsync, rename. Stamped with VERSION."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump({**record, "version": VERSION}, f, indent=1, sort_keys=True, default=_jsonable)
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
