"""The study: sampler, the ask/run/tell loop, resume (where it is stored: harness/storage.py).

Two objectives: throughput (maximize) and peak memory (minimize). Every trial carries the same two
constraints (Optuna 5 `set_constraint`, feasible when <= 0): `memory` (over the budget's usable
part, or OOM) and `numerics` (diverged). An OOM is COMPLETE and infeasible, so the sampler learns
where the wall is; a crash, timeout or error is FAIL. The full trial record lives in the trial's
user attributes, so the study alone is enough to report and apply.
"""
from __future__ import annotations

import datetime
import hashlib
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from harness import __version__, launch, pareto, record
from harness import storage
from harness.storage import (JOURNAL, existing_storage, is_stale, open_storage,  # noqa: F401 (open_storage: API)
                             redact, study_dir, worker_id)
from harness.errors import UserError
from harness.spec import Dimension, Spec, all_configs

optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_DUPLICATES_IN_A_ROW = 30


# ---- storage (harness/storage.py holds where and how; these read a study) ----------------------

def latest_study(results: Path, storage_url: str | None) -> str:
    """The most recently written study: under results/, or in the given storage."""
    if storage_url:
        summaries = optuna.get_all_study_summaries(existing_storage(storage_url, results, ""))
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


def relative(path: Path) -> str | None:
    """The spec's path relative to the sweep's folder, when inside it: how another machine's checkout finds it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return None


def spec_file(info: dict) -> str:
    """The study's spec on this machine: where it was swept, else the same path inside the current folder."""
    if Path(info["spec_path"]).exists() or not info.get("spec_relative"):
        return info["spec_path"]
    return info["spec_relative"]


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
        attrs = {"spec_path": str(spec.path), "spec_relative": relative(spec.path), "scenario": spec.scenario, "workload": spec.workload,
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
    results: Path | None
    """Where trial logs go; None: nowhere (a database study writes nothing under the current folder)."""
    total: int
    deadline: float | None
    progress: Progress = field(default_factory=Progress)
    claim: object = None
    """() -> a context manager held from ask to claiming a config (storage.claim_lock; default: a host lock)."""

    def run(self) -> None:
        launch.prestart()  # the warm trial server imports torch while the study gets ready
        self.fail_stale_trials()
        self.progress.started(self.counted(), self.total, self.spec.study)
        duplicates_in_a_row, space = 0, self.spec.space_size()
        while self.remaining():
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

    def remaining(self) -> bool:
        storage.fail_stale_trials(self.study)  # first: another host's dead worker's trial must not count as running
        return self.counted() < self.total

    def run_one(self) -> bool:
        """Ask, run (or reuse a measurement) and tell one trial. False when it was a duplicate."""
        done = self.counted()
        with self.claiming():
            trial = self.study.ask()
            config = trial.user_attrs.get("config") or self.spec.config(suggest(trial, self.spec))
            trial.set_user_attr("config", config)
            trial.set_user_attr("worker", worker_id())
            previous = self.measured_configs(besides=trial.number).get(config_key(config))
        if previous is not None and previous.number != trial.number:
            self.tell_duplicate(trial, previous)
            self.progress.duplicate(trial.number, previous.number, config)
            self.enqueue_unmeasured(trial.number)
            return False
        baseline = bool(trial.user_attrs.get("baseline"))
        self.progress.trial_started(trial.number, done, self.total, config, baseline)
        try:
            with storage.heartbeat(self.study, trial):
                rec = launch.run(self.job(config, trial.number),
                                 launch.Limits(self.spec.trial_timeout_s, self.spec.stall_s), self.log_path(trial.number),
                                 on_beat=self.progress.trial_phase)
        except KeyboardInterrupt as stop:
            self.tell_interrupted(trial, config, str(stop) or "interrupted by the user (Ctrl-C)")
            raise
        if (rec.get("error") or {}).get("type") == "FactoryImportError":  # every config would fail alike: stop
            self.tell_interrupted(trial, config, rec["error"]["message"])
            raise UserError(f"{self.spec.path}: workload.factory: {rec['error']['message']}; fix it and re-run "
                            f"(traceback in {self.log_path(trial.number)})")
        rec.update(number=trial.number, config=config)
        rec.setdefault("error", None)
        log = self.log_path(trial.number)
        rec["log"] = str(log.resolve()) if log else None  # readable from wherever `bench report` runs
        self.tell(trial, rec)
        self.progress.trial_finished(trial.number, rec, self.best_so_far())
        return True

    def job(self, config: dict, number: int, repeat: bool = False) -> dict:
        """Trial `number`'s job. With a results folder, trials share the study's reusable figures
        (harness.reuse) and each config keeps its compile cache, warm only for a `repeat` of a
        measured config (launch.compile_cache)."""
        job = dict(self.spec.job(self.device, config), trial=number, repeat=repeat)
        if self.results is not None:
            folder = study_dir(self.results, self.spec.study)
            digest = hashlib.sha256(repr(config_key(config)).encode()).hexdigest()[:16]
            job.update(reuse_dir=str(folder / "reuse"), compile_cache=str(folder / "inductor" / digest))
        return job

    def claiming(self):
        """Workers take turns from ask to claiming a config, and in recovering stale trials.

        Without it two workers can both claim one sampled config (each checks before the other
        has written its own), or both recover one stale trial (the second tell raises).
        """
        return (self.claim or storage.claim_lock(None, self.results, self.spec.study))()

    def log_path(self, number: int) -> Path | None:
        if self.results is None:
            return None
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
        """RUNNING trials whose sweep process died on this host (kill -9, reboot): interrupted, re-queued.

        In a database, another host's dead worker is found by Optuna's heartbeat (storage.requeue_stale).
        """
        with self.claiming():
            storage.fail_stale_trials(self.study)
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
                   if "duplicate_of" not in t.user_attrs and not interrupted(t))
        running = len(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))  # other workers'
        return done + running

    def measured_configs(self, besides: int | None = None) -> dict:
        """config key -> the trial that measured it (running ones too, so workers never run a config twice).

        `besides`: a trial just claimed, left out so that another worker's claim of its config is seen.
        """
        out = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)):
            if interrupted(t) or "duplicate_of" in t.user_attrs or t.number == besides:
                continue
            if "config" in t.user_attrs:
                out.setdefault(config_key(t.user_attrs["config"]), t)
        return out

    def best_so_far(self) -> dict | None:
        return pareto.choose(rows_of(self.study), self.spec.memory_budget, self.spec.headroom, self.spec.objective).best


def interrupted(t: optuna.trial.FrozenTrial) -> bool:
    """Stopped, never measured: by bench (Ctrl-C, a signal, a dead process) or by Optuna's heartbeat
    (a FAIL without bench's record: a database worker that stopped beating)."""
    return t.user_attrs.get("status") == record.INTERRUPTED or (t.state == TrialState.FAIL and "record" not in t.user_attrs
                                                                and "duplicate_of" not in t.user_attrs)


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
        elif interrupted(t) and not rec:
            rec = {"status": record.INTERRUPTED, "throughput": None, "peak_memory": None,
                   "error": {"type": "Interrupted", "message": "its worker stopped (no heartbeat); it runs again"}}
        rec.update(number=t.number, config=t.user_attrs.get("config", rec.get("config", {})),
                   baseline=bool(t.user_attrs.get("baseline")))
        rec.setdefault("status", t.user_attrs.get("status", "unknown"))
        rows.append(rec)
    return rows


def study_info(study: optuna.Study) -> dict:
    return {"name": study.study_name, **study.user_attrs}
