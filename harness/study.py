"""The only module that imports Optuna: storage, sampler, the ask/run/tell loop, resume.

Two objectives: throughput (maximize) and peak memory (minimize). Every trial carries the same two
constraints (Optuna 5 `set_constraint`, feasible when <= 0): `memory` (over the budget's usable
part, or OOM) and `numerics` (diverged). An OOM is COMPLETE and infeasible, so the sampler learns
where the wall is; a crash, timeout or error is FAIL. The full trial record lives in the trial's
user attributes, so the study alone is enough to report and apply.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import random
import re
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
import psutil
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import TrialState

from harness import __version__, launch, pareto, record
from harness.errors import UserError
from harness.spec import Dimension, Spec, all_configs

optuna.logging.set_verbosity(optuna.logging.WARNING)

JOURNAL = "journal.log"
CLAIM_LOCK = "claim.lock"
MAX_DUPLICATES_IN_A_ROW = 30


# ---- storage -------------------------------------------------------------------------------------

def redact(url: str) -> str:
    """A storage URL fit to print: the password replaced by ***.

    Up to the last '@': a password may hold '/' or '@' (unescaped), and hiding a bit of the host
    with it is the safe side.
    """
    return re.sub(r"(://[^:/@]*:).*@", r"\1***@", url)


def study_dir(results: Path, study: str) -> Path:
    return Path(results) / study


def open_storage(url: str | None, results: Path, study: str):
    """The given Optuna storage URL, or the embedded journal file under results/<study>/."""
    if url:
        try:
            return optuna.storages.get_storage(url)
        except Exception as exc:
            raise UserError(f"--storage {redact(url)}: cannot open it ({redact(str(exc)).splitlines()[0][:200]}); "
                            "check the URL, the server and the driver package") from None
    folder = study_dir(results, study)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / JOURNAL
        path.touch()
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        raise UserError(f"--results {results}: cannot write there ({exc.strerror or exc}); "
                        "pick a writable folder with --results") from None
    return optuna.storages.JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))


def existing_storage(url: str | None, results: Path, study: str):
    """Storage for reading a study that must already exist (report, apply)."""
    if url:
        return open_storage(url, results, study)
    path = study_dir(results, study) / JOURNAL
    if not path.exists():
        raise UserError(f"no study {study!r} under {results}/; run `bench sweep` first or pass --results/--storage")
    return open_storage(None, results, study)


def latest_study(results: Path, storage_url: str | None) -> str:
    """The most recently written study: under results/, or in the given storage."""
    if storage_url:
        summaries = optuna.get_all_study_summaries(open_storage(storage_url, results, ""))
        if not summaries:
            raise UserError(f"--storage {redact(storage_url)}: holds no study; run `bench sweep` first")
        return max(summaries, key=lambda s: s.datetime_start or datetime.datetime.min).study_name
    journals = sorted(Path(results).glob(f"*/{JOURNAL}"), key=lambda p: p.stat().st_mtime)
    journals = [j for j in journals if j.stat().st_size > 0]
    if not journals:
        raise UserError(f"no study under {results}/; run `bench sweep SPEC` first")
    return journals[-1].parent.name


def load(storage, name: str) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise UserError(f"no study named {name!r} in that storage; `bench report` lists what is there") from None


def make_sampler(spec: Spec) -> optuna.samplers.BaseSampler:
    samplers = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=min(8, max(spec.trials // 2, 1))),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=spec.seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=spec.seed),
        "grid": lambda: optuna.samplers.RandomSampler(seed=spec.seed),  # the grid itself is enqueued (create)
    }
    return samplers[spec.sampler]()


def create(spec: Spec, storage, device: str) -> optuna.Study:
    study = optuna.create_study(study_name=spec.study, storage=storage, load_if_exists=True,
                                directions=["maximize", "minimize"], sampler=make_sampler(spec))
    if "spec_path" not in study.user_attrs:
        attrs = {"spec_path": str(spec.path), "scenario": spec.scenario, "workload": spec.workload,
                 "memory_budget": spec.memory_budget, "headroom": spec.headroom, "device": device,
                 "objective": spec.objective,
                 "created": datetime.datetime.now().isoformat(timespec="seconds"), "bench": __version__}
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    return study


# ---- the sweep loop ------------------------------------------------------------------------------

class Progress:
    """What the sweep tells its display; the CLI supplies the printing."""

    def started(self, done: int, total: int, study: str) -> None: ...
    def trial_started(self, number: int, done: int, total: int, config: dict, baseline: bool) -> None: ...
    def trial_phase(self, heartbeat: dict | None) -> None: ...
    def trial_finished(self, number: int, rec: dict, best: dict | None) -> None: ...
    def duplicate(self, number: int, of: int, config: dict) -> None: ...
    def note(self, message: str) -> None: ...


@dataclass
class Sweep:
    spec: Spec
    study: optuna.Study
    device: str
    results: Path
    total: int
    deadline: float | None
    progress: Progress = field(default_factory=Progress)

    def run(self) -> None:
        self.fail_stale_trials()
        self.progress.started(self.counted(), self.total, self.spec.study)
        duplicates_in_a_row, space = 0, self.spec.space_size()
        while self.counted() < self.total:
            if self.deadline and time.monotonic() > self.deadline:
                self.progress.note("sweep time limit reached; re-run the same command to continue")
                return
            if len(self.measured_configs()) >= space:
                self.progress.note(f"all {space} configs of the search space are measured")
                return
            if duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
                self.progress.note("the sampler keeps proposing measured configs; stopping early")
                return
            duplicates_in_a_row = 0 if self.run_one() else duplicates_in_a_row + 1

    def run_one(self) -> bool:
        """Ask, run (or reuse a measurement) and tell one trial. False when it was a duplicate."""
        done = self.counted()
        with self.claiming():
            trial = self.study.ask()
            config = trial.user_attrs.get("config") or self.spec.config(suggest(trial, self.spec))
            trial.set_user_attr("config", config)
            trial.set_user_attr("worker", worker_id())
            previous = self.measured_configs().get(config_key(config))
        if previous is not None and previous.number != trial.number:
            self.tell_duplicate(trial, previous)
            self.progress.duplicate(trial.number, previous.number, config)
            self.enqueue_unmeasured(trial.number)
            return False
        baseline = bool(trial.user_attrs.get("baseline"))
        self.progress.trial_started(trial.number, done, self.total, config, baseline)
        try:
            rec = launch.run(self.spec.job(self.device, config), launch.Limits(self.spec.trial_timeout_s, self.spec.stall_s),
                             self.log_path(trial.number), on_beat=self.progress.trial_phase)
        except KeyboardInterrupt:
            self.tell_interrupted(trial, config, "interrupted by the user (Ctrl-C)")
            raise
        if (rec.get("error") or {}).get("type") == "FactoryImportError":  # every config would fail alike: stop
            self.tell_interrupted(trial, config, rec["error"]["message"])
            raise UserError(f"{self.spec.path}: workload.factory: {rec['error']['message']}; fix it and re-run "
                            f"(traceback in {self.log_path(trial.number)})")
        rec.update(number=trial.number, config=config)
        rec.setdefault("error", None)
        rec["log"] = str(self.log_path(trial.number).resolve())  # readable from wherever `bench report` runs
        self.tell(trial, rec)
        self.progress.trial_finished(trial.number, rec, self.best_so_far())
        return True

    def claiming(self):
        """This host's workers take turns from ask to claiming a config, and in recovering stale trials.

        Without it two workers can both claim one sampled config (each checks before the other
        has written its own), or both recover one stale trial (the second tell raises).
        """
        return host_lock(study_dir(self.results, self.spec.study) / CLAIM_LOCK)

    def log_path(self, number: int) -> Path:
        return study_dir(self.results, self.spec.study) / "logs" / f"trial-{number:04d}.log"

    # -- telling -----------------------------------------------------------------------------------
    def tell(self, trial: optuna.Trial, rec: dict) -> None:
        speed = pareto.speed(rec, self.spec.objective)
        if rec["status"] in (record.OK, record.DIVERGED) and speed is None:
            rec.update(status=record.ERROR, error={"type": "NoTokens", "message": (
                "objective: tokens, but the workload reports no tokens_per_sample; use objective: samples")})
        status = rec["status"]
        trial.set_user_attr("status", status)
        trial.set_user_attr("record", rec)
        limit = usable_memory(self.spec)
        if status in (record.OK, record.DIVERGED):
            peak = float(rec["peak_memory"])
            trial.set_constraint("memory", peak / limit - 1.0 if limit else -1.0)
            trial.set_constraint("numerics", 1.0 if status == record.DIVERGED else -1.0)
            self.study.tell(trial, [float(speed), peak])
        elif status == record.OOM:
            # Optuna COMPLETEs a trial only with values, and an OOM measured none. Told as COMPLETE with
            # the `memory` constraint violated, the constrained samplers learn the infeasible region
            # (FAIL would let them propose it again) and best_trials never holds it. The values are the
            # sampler's penalty only, marked as such: no throughput, and memory no better than the
            # budget (or than any config measured so far). Reports read the record, whose peak is null.
            trial.set_constraint("memory", 1.0)
            trial.set_constraint("numerics", -1.0)
            trial.set_user_attr("values_are_penalty", True)
            self.study.tell(trial, [0.0, self.oom_penalty()])
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def oom_penalty(self) -> float:
        if self.spec.memory_budget:
            return float(self.spec.memory_budget)
        told = [t.values[1] for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        return max(told, default=0.0)

    def tell_duplicate(self, trial, previous) -> None:
        """A config measured before is not run again: its result is copied, marked duplicate_of."""
        trial.set_user_attr("duplicate_of", previous.number)
        trial.set_user_attr("status", previous.user_attrs.get("status"))
        for key, value in (previous.constraints or {}).items():
            trial.set_constraint(key, value)
        if previous.state == TrialState.COMPLETE:
            self.study.tell(trial, previous.values)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def enqueue_unmeasured(self, number: int) -> None:
        """Samplers re-propose measured configs (TPE on a small space does, often): queue one not yet measured."""
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        rng, measured = random.Random(self.spec.seed * 100_003 + number), self.measured_configs()
        for _ in range(1000):
            params = {name: rng.choice(dim.choices) if dim.choices else rng.randint(dim.low, dim.high)
                      for name, dim in self.spec.search.items()}
            config = self.spec.config(params)
            if config_key(config) not in measured:
                self.study.enqueue_trial(params, user_attrs={"config": config})
                return

    def tell_interrupted(self, trial, config: dict, why: str) -> None:
        """Never a measured result: FAIL, marked interrupted, and queued to run again on resume."""
        rec = {"status": record.INTERRUPTED, "config": config, "throughput": None, "peak_memory": None,
               "number": trial.number, "error": {"type": "Interrupted", "message": why}}
        trial.set_user_attr("status", record.INTERRUPTED)
        trial.set_user_attr("record", rec)
        self.study.tell(trial, state=TrialState.FAIL)
        requeue(self.study, trial.params, trial.user_attrs)

    def fail_stale_trials(self) -> None:
        """RUNNING trials whose sweep process died on this host (kill -9, reboot): interrupted, re-queued."""
        with self.claiming():
            for ft in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if is_stale(ft.user_attrs.get("worker")):
                    config = ft.user_attrs.get("config") or self.spec.config(ft.params)
                    handle = optuna.trial.Trial(self.study, ft._trial_id)  # Optuna has no public handle by number
                    self.tell_interrupted(handle, config, "its bench process died")
                    self.progress.note(f"trial {ft.number} was left running by a process that died; it runs again")

    # -- counting ----------------------------------------------------------------------------------
    def finished(self):
        return self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))

    def counted(self) -> int:
        """Trials that count toward the total: measured (not duplicates, not interrupted) or running."""
        done = sum(1 for t in self.finished()
                   if "duplicate_of" not in t.user_attrs and t.user_attrs.get("status") != record.INTERRUPTED)
        running = len(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))  # other workers'
        return done + running

    def measured_configs(self) -> dict:
        """config key -> the trial that measured it (running ones too, so workers never run a config twice)."""
        out = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)):
            if t.user_attrs.get("status") == record.INTERRUPTED or "duplicate_of" in t.user_attrs:
                continue
            if "config" in t.user_attrs:
                out.setdefault(config_key(t.user_attrs["config"]), t)
        return out

    def best_so_far(self) -> dict | None:
        return pareto.choose(rows_of(self.study), self.spec.memory_budget, self.spec.headroom, self.spec.objective).best


def usable_memory(spec: Spec) -> float | None:
    return spec.memory_budget * (1 - spec.headroom) if spec.memory_budget else None


def suggest(trial: optuna.Trial, spec: Spec) -> dict:
    params = {}
    for name, dim in spec.search.items():
        if dim.choices:
            params[name] = trial.suggest_categorical(name, list(dim.choices))
        else:
            params[name] = trial.suggest_int(name, dim.low, dim.high)
    return params


def requeue(study: optuna.Study, params: dict, attrs: dict) -> None:
    keep = {k: v for k, v in attrs.items() if k in ("baseline", "config")}
    study.enqueue_trial(params, user_attrs=keep, skip_if_exists=False)


def config_key(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))


@contextlib.contextmanager
def host_lock(path: Path):
    """An exclusive lock among this host's processes; the kernel drops it when its holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def worker_id() -> dict:
    proc = psutil.Process()
    return {"host": socket.gethostname(), "pid": proc.pid, "started": proc.create_time()}


def is_stale(worker: dict | None) -> bool:
    if not worker or worker.get("host") != socket.gethostname():
        return False  # another machine's trial: only its own sweep can tell
    try:
        return abs(psutil.Process(worker["pid"]).create_time() - worker["started"]) > 1.0
    except psutil.NoSuchProcess:
        return True


# ---- baseline ------------------------------------------------------------------------------------

def including(spec: Spec, config: dict) -> Spec:
    """The spec with the user's current config inside its search space, so it can be enqueued."""
    search, fixed = dict(spec.search), dict(spec.fixed)
    for name, value in config.items():
        if name in search:
            dim = search[name]
            if dim.choices and value not in dim.choices:
                search[name] = Dimension(name, choices=(*dim.choices, value))
            elif not dim.choices and not dim.low <= value <= dim.high:
                search[name] = Dimension(name, low=min(dim.low, value), high=max(dim.high, value))
        elif name in fixed and fixed[name] != value:
            del fixed[name]
            search[name] = Dimension(name, choices=(spec.fixed[name], value))
    return replace(spec, search=search, fixed=fixed)


def resumed(spec: Spec, study: optuna.Study, device: str) -> Spec:
    """The spec as the study it resumes ran it; refused when the runs would not be comparable.

    Optuna refuses a categorical knob whose choices change within a study, so a resume keeps the
    choices the study was sampled with (they include the first run's baseline value, which a later
    `bench apply best` may have replaced). A new choice, another memory budget or another kind of
    device would mix unlike measurements in one study: that needs a new study.
    """
    info, name = study.user_attrs, spec.study
    hint = "resume with the study's settings, or start a new study with --study NAME"
    if info.get("memory_budget") != spec.memory_budget:
        raise UserError(f"study {name!r} measured under memory budget {_budget(info.get('memory_budget'))}, this run "
                        f"asks for {_budget(spec.memory_budget)}; {hint}")
    if "device" in info and info["device"].split(":")[0] != device.split(":")[0]:
        raise UserError(f"study {name!r} ran on {info['device']}, this run is on {device}; {hint}")
    sampled = {}
    for trial in study.get_trials(deepcopy=False):
        for knob, dist in trial.distributions.items():
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                sampled.setdefault(knob, tuple(dist.choices))
    search = dict(spec.search)
    for knob, choices in sampled.items():
        dim = search.get(knob)
        if dim is None or not dim.choices:
            continue
        new = [c for c in dim.choices if c not in choices]
        if new:
            raise UserError(f"study {name!r}: search.{knob} now has {', '.join(map(str, new))}, which the study's "
                            f"space ({', '.join(map(str, choices))}) lacks; Optuna cannot change a study's choices: "
                            f"start a new study with --study NAME")
        search[knob] = Dimension(knob, choices=choices)
    return replace(spec, search=search)


def _budget(size) -> str:
    return f"{size / 2**30:.3g} GiB" if size else "none"


def enqueue_baseline(study: optuna.Study, spec: Spec, config: dict) -> None:
    """Measure the user's current config first (once per study)."""
    if any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False)):
        return
    params = {name: config[name] for name in spec.search if name in config}
    study.enqueue_trial(params, user_attrs={"baseline": True, "config": config}, skip_if_exists=False)


def enqueue_grid(study: optuna.Study, spec: Spec) -> None:
    """sampler: grid — every config once, in order (Optuna's grid samplers call stop(), which ask/tell forbids)."""
    if spec.sampler != "grid" or any(t.user_attrs.get("grid") for t in study.get_trials(deepcopy=False)):
        return
    for config in all_configs(spec):
        study.enqueue_trial({n: config[n] for n in spec.search}, user_attrs={"config": config, "grid": True})


# ---- reading -------------------------------------------------------------------------------------

def rows_of(study: optuna.Study) -> list[dict]:
    """One row per trial for reports: the stored record plus number, baseline and duplicate marks."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.WAITING,):
            continue
        rec = dict(t.user_attrs.get("record") or {})
        if "duplicate_of" in t.user_attrs:
            continue  # the same measurement is already in the table under its own number
        if t.state == TrialState.RUNNING and not rec:
            rec = {"status": "running", "throughput": None, "peak_memory": None, "error": None}
        rec.update(number=t.number, config=t.user_attrs.get("config", rec.get("config", {})),
                   baseline=bool(t.user_attrs.get("baseline")))
        rec.setdefault("status", t.user_attrs.get("status", "unknown"))
        rows.append(rec)
    return rows


def study_info(study: optuna.Study) -> dict:
    return {"name": study.study_name, **study.user_attrs}
