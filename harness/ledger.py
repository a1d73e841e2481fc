"""The study as bench's ledger: opening, creating and resuming it, writing configs into it, and
reading it back as one row per trial for every view.

Optuna's study is the store: each trial's user attributes hold bench's full record, the study's
hold what the sweep was asked and its confirmation runs, so the study alone is enough to report and
apply. Where a study lives is harness/storage.py; the loop that fills it is harness/study.py.
"""
from __future__ import annotations

import datetime
import json
import warnings
from dataclasses import replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from harness import __version__, record, search
from harness.errors import UserError
from harness.spec import SPEC_KEYS, Spec, all_configs
from harness.storage import JOURNAL, REQUEUE_KEEPS, NoStudy, existing_storage, is_stale, redact


# ---- opening a study -------------------------------------------------------------------------

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
        names = sorted(s.study_name for s in storage.get_all_studies())
        held = ("it holds none; run `bench sweep` first" if not names else f"it holds {names[0]!r}; name it"
                if len(names) == 1 else f"it holds {', '.join(map(repr, names))}; name one of them")
        raise NoStudy(f"no study named {name!r} in that storage: {held}") from None


def relative(path: Path) -> str | None:
    """The spec's path relative to the sweep's folder, when inside it: how another machine's checkout finds it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return None


def spec_file(info: dict, project: Path | None = None) -> str | None:
    """The study's spec on this machine: at its path relative to the sweep's folder inside `project`
    (the folder holding the study's results: a copy of the project, whose own apply target is the one
    to write), else in the current folder where the swept one is gone (another machine's checkout),
    else where it was swept. None for a study `bench sweep` did not make."""
    relative, swept = info.get("spec_relative"), info.get("spec_path")
    if relative and project is not None and (project / relative).is_file():
        return str(project / relative)
    if relative and Path(relative).is_file() and (not swept or not Path(swept).exists()):
        return relative
    return swept


def make_sampler(spec: Spec) -> optuna.samplers.BaseSampler:
    samplers = {
        # multivariate+group: compile is searched only in a later phase, so trials' spaces differ;
        # constant_liar: several workers do not all sample the same point.
        "tpe": lambda: optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=min(5, max(spec.trials // 3, 1)),
                                                  multivariate=True, group=True, constant_liar=True),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=spec.seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=spec.seed),
        "grid": lambda: optuna.samplers.RandomSampler(seed=spec.seed),  # the grid itself is enqueued (enqueue_grid)
    }
    return samplers[spec.sampler]()


def has_header(storage, name: str) -> bool:
    """A study named `name` is in `storage` with its header written whole (`create` writes `spec_path` last)."""
    try:
        return "spec_path" in optuna.load_study(study_name=name, storage=storage).user_attrs
    except KeyError:
        return False


def create(spec: Spec, storage, device: str, hardware: str | None = None) -> optuna.Study:
    """The study `spec` names, made on first use with its header (what it measures, where, under what
    budget); `hardware`: the device's model, which a resume compares (resumed)."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:  # loaded first: a resume writes nothing before `resumed` has agreed to it
        study = optuna.load_study(study_name=spec.study, storage=storage, sampler=make_sampler(spec))
    except KeyError:
        study = optuna.create_study(study_name=spec.study, storage=storage, load_if_exists=True,
                                    directions=["maximize", "minimize"], sampler=make_sampler(spec))
    if "spec_path" not in study.user_attrs:  # written last: a header cut off while written is written again, whole
        attrs = {"spec_relative": relative(spec.path), "scenario": spec.scenario, "workload": spec.workload,
                 "memory_budget": spec.memory_budget, "headroom": spec.headroom, "device": device,
                 "hardware": hardware, "objective": spec.objective, "measure": dict(spec.measure.__dict__),
                 # what the sampler's params index (ordinal knobs are suggested as positions): a resume keeps it
                 "choices": {knob: list(spec.sampled.get(knob, dim.choices)) for knob, dim in spec.search.items()
                             if dim.choices},
                 "smoke": spec.smoke, "created": datetime.datetime.now().isoformat(timespec="seconds"),
                 "bench": __version__, "spec_path": str(spec.path)}
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    elif study.user_attrs.get("smoke", False) != spec.smoke and not study.get_trials(deepcopy=False):
        study.set_user_attr("smoke", spec.smoke)  # a study with no trial yet is what first runs in it
    return study


def resumed(spec: Spec, study: optuna.Study, device: str, hardware: str | None = None, check_only: bool = False) -> Spec:
    """The spec as the study it resumes ran it; refused when the runs would not be comparable.

    Optuna refuses a categorical knob whose choices change within a study, so a resume's sampler keeps
    the choices the study was sampled with (they include the first run's baseline value, which a later
    `bench apply best` may have replaced) while its search is the spec's: a value the spec dropped is
    never run (Sweep.set_aside). A new choice, another memory budget, another kind of device or
    another model of it (`hardware`, read as `create` read it; none for studies from before) would mix
    unlike measurements in one study: that needs a new study, as a smoke run (BENCH_QUICK) beside a
    real sweep does, either way round. Another objective does too, once a trial was measured in the
    old one, and another workload once one ran it; before that the new one is recorded (and the
    trials that failed before training set aside), the only writes here, left out with `check_only`
    (a sweep of several scenarios checks each one's study before the first trial of any).
    """
    info, name = study.user_attrs, spec.study
    # --study names one study, so a spec of several scenarios needs the one named too
    hint = f"resume with the study's settings, or start a new study with {scenario_flag(spec)}--study NAME"
    # a built-in workload's smoke run is another workload (its tiny preset); one's own factory is not
    if info.get("smoke", False) and not spec.smoke:
        raise UserError(f"study {name!r} is a BENCH_QUICK smoke run, whose short measurements are not ones to act "
                        "on; start the real sweep in a new study with --study NAME, or delete the smoke study's folder")
    if spec.smoke and not info.get("smoke", False):
        raise UserError(f"study {name!r} holds real measurements, and BENCH_QUICK is set: a smoke run would add its "
                        "short ones to them; unset BENCH_QUICK, or give the smoke run its own study with --study NAME")
    if info.get("memory_budget") != spec.memory_budget:
        raise UserError(f"study {name!r} measured under memory budget {_budget(info.get('memory_budget'))}, this run "
                        f"asks for {_budget(spec.memory_budget)}; {hint}")
    if "device" in info and info["device"].split(":")[0] != device.split(":")[0]:
        raise UserError(f"study {name!r} ran on {info['device']}, this run is on {device}; {hint}")
    if hardware and info.get("hardware") and info["hardware"] != hardware:
        raise UserError(f"study {name!r} was measured on {info['hardware']}, this run is on {hardware}: their "
                        f"figures would not compare; {hint}")
    # nothing measured yet in the old objective (its first trial found the workload has no tokens): nothing to mix
    retarget = info.get("objective", spec.objective) != spec.objective
    if retarget and any((t.user_attrs.get("record") or {}).get("status") in (record.OK, record.DIVERGED)
                        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))):
        raise UserError(f"study {name!r} optimizes {info['objective']}/s, this run asks for {spec.objective}/s; {hint}")
    changed = workload_changes(info.get("workload"), spec.workload)
    if changed and not ran_the_workload(study) and not check_only:
        # "cannot import faulty:buidl; fix it and re-run": nothing of the old one ran, so nothing to mix
        study.set_user_attr("workload", json.loads(json.dumps(spec.workload, default=str)))
        trials = study.get_trials(deepcopy=False)
        # its trials are set aside: the interrupted ones' configs are queued already, the failed ones' the
        # sweep queues again (Sweep.retry_what_stopped_the_last_sweep)
        failed = {t.number for t in trials if t.user_attrs.get("status") == record.ERROR}
        if failed:
            study.set_user_attr("stopped_on_error", sorted(set(study.user_attrs.get("stopped_on_error") or []) | failed))
        supersede(study, [t.number for t in trials if t.user_attrs.get("status") == record.INTERRUPTED])
    elif changed and ran_the_workload(study):
        raise UserError(f"study {name!r} measured another workload ({'; '.join(changed)}): its trials and this "
                        f"run's would not be comparable; {hint}")
    sampled = {knob: tuple(choices) for knob, choices in (info.get("choices") or {}).items()}
    for trial in study.get_trials(deepcopy=False):  # studies from before "choices" was kept
        for knob, dist in trial.distributions.items():
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                sampled.setdefault(knob, tuple(dist.choices))
    kept = {}
    for knob, choices in sampled.items():
        dim = spec.search.get(knob)
        if dim is None or not dim.choices:
            continue
        new = [c for c in dim.choices if c not in choices]
        if new:
            raise UserError(f"study {name!r}: search.{knob} now has {', '.join(map(str, new))}, which the study's "
                            f"space ({', '.join(map(str, choices))}) lacks; Optuna cannot change a study's choices: "
                            f"start a new study with {scenario_flag(spec)}--study NAME")
        if tuple(dim.choices) != choices:
            kept[knob] = choices
    if retarget and not check_only:
        study.set_user_attr("objective", spec.objective)
    return replace(spec, sampled=kept)


def rechosen(spec: Spec, study: optuna.Study) -> str | None:
    """A resume with another memory.headroom: written into the header, so that `bench report` and `bench apply`
    choose with the headroom this sweep chose with (they read the header's; the sweep reads its spec's), and said.
    Not refused as another budget is: trials are measured alike under either, only the choice among them moves.
    None where the headroom is the study's."""
    was = study.user_attrs.get("headroom")
    if was is None or was == spec.headroom:
        return None
    study.set_user_attr("headroom", spec.headroom)
    return (f"memory.headroom {was:g} -> {spec.headroom:g}: best now leaves {spec.headroom:.0%} of the capacity free, "
            "in this sweep and in `bench report` and `bench apply` (what was measured stays)")


def scenario_flag(spec: Spec) -> str:
    return f"--scenario {spec.scenario} " if spec.scenario else ""


def measuring_changes(spec: Spec, study: optuna.Study) -> list[str]:
    """`trial.KEY was -> now` for each setting of how a trial is measured that this resume changes
    (none for studies from before the header kept them). Not refused as another workload is: the
    figures measure the same thing, only more or less closely, so the user is told and both are ranked."""
    stored = study.user_attrs.get("measure")
    if not isinstance(stored, dict):
        return []
    return [f"{SPEC_KEYS.get(f'measure.{key}', f'trial.{key}')} {stored[key]} -> {now}"
            for key, now in spec.measure.__dict__.items() if key in stored and stored[key] != now]


WORKLOAD_IDENTITY = ("name", "preset", "params", "factory", "model", "loss", "batch", "lightning", "hf", "loop")
"""What makes two studies' workloads one: the model, its size and how a step runs (not where it lives
on disk, nor the training arguments a step does not read)."""


def ran_the_workload(study: optuna.Study) -> bool:
    """A trial of the study got as far as running the workload: it measured, ran out of memory, hung or
    crashed (not an error in the user's code before it trained, nor a trial stopped from outside)."""
    return any(t.user_attrs.get("status") not in (None, record.ERROR, record.INTERRUPTED)
               for t in study.get_trials(deepcopy=False))


def workload_changes(stored: dict | None, workload: dict) -> list[str]:
    """`workload.KEY: was -> now` for each identity key that differs (none for studies from before the
    workload was kept)."""
    if stored is None:
        return []
    now = json.loads(json.dumps(workload, default=str))
    return [f"workload.{key}: {stored.get(key)} -> {now.get(key)}" for key in WORKLOAD_IDENTITY
            if stored.get(key) != now.get(key)]


def _budget(size) -> str:
    return f"{size / 2**30:.3g} GiB" if size else "none"


# ---- writing configs into it -----------------------------------------------------------------

def suggest(trial: optuna.Trial, spec: Spec, eager_only: bool = False) -> dict:
    """Knob values for `trial`. Numeric choices (batch size, seq_len) are ordinal: the sampler
    draws an index into the sorted list with suggest_int, so TPE's kernel knows 16 lies between
    8 and 32 (a categorical would not). In the eager phase compile is held off, not searched."""
    params = {}
    for name, dim in spec.search.items():
        choices = spec.sampled.get(name, dim.choices)
        if name == "compile" and eager_only:
            params[name] = "off"
        elif search.is_ordinal(choices):
            values = search.ordered(choices)
            params[name] = values[trial.suggest_int(name, 0, len(values) - 1)]
        elif choices:
            params[name] = trial.suggest_categorical(name, list(choices))
        else:
            with warnings.catch_warnings():  # your config's value below or above the range, enqueued as the baseline
                warnings.filterwarnings("ignore", message=f"Fixed parameter {name} with value .* is out of range")
                params[name] = trial.suggest_int(name, dim.low, dim.high)
    return params


def sampler_params(spec: Spec, config: dict) -> dict:
    """The params a sampler stores for `config` (ordinal knobs as indices): what enqueue_trial takes."""
    params = {}
    for name, dim in spec.search.items():
        if name in config:
            value, choices = config[name], spec.sampled.get(name, dim.choices)
            params[name] = search.ordered(choices).index(value) if search.is_ordinal(choices) else value
    return params


def including(spec: Spec, config: dict) -> Spec:
    """The spec whose sampler can hold the user's current config, so that it can be enqueued as the
    baseline. A value outside a knob's list joins only the sampler's choices: your config runs as it is,
    and the search stays the spec's (a current fp32 beside `precision: [bf16-mixed]` was searched in
    every family, and batch 4 beside a 16..32 range made it 4..32). One outside a range needs nothing
    here: Optuna takes an enqueued value outside the range as it is (suggest)."""
    sampled = dict(spec.sampled)
    for name, value in config.items():
        dim = spec.search.get(name)
        if dim is not None and dim.choices and value not in sampled.get(name, dim.choices):
            sampled[name] = (*sampled.get(name, dim.choices), value)
    return replace(spec, sampled=sampled)


def baseline_config(study: optuna.Study) -> dict | None:
    """The config the study measures as your config: that of its first sweep, whatever the file says now."""
    return next((t.user_attrs.get("config") for t in study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")), None)


def mark_unsearched(study: optuna.Study, spec: Spec) -> dict[str, list[str]]:
    """Record, for a resume, each measured config this sweep does not search (a list narrowed, a knob taken
    out of the search, another effective_batch, an nproc this machine cannot run): `bench apply best` must
    not write back a compile=default the user took out. Your config is exempt: it is measured as it is,
    inside the search or not. Written whole at every sweep, so a value put back is choosable again.
    Returns trial number -> the config's `knob=value`s the search does not hold."""
    unsearched = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        config = t.user_attrs.get("config")
        measured = (t.user_attrs.get("record") or {}).get("status") == record.OK and not not_run_itself(t)
        if measured and config and not t.user_attrs.get("baseline") and not spec.contains(config):
            unsearched[str(t.number)] = unsearched_values(spec, config)
    if unsearched or study.user_attrs.get("unsearched"):
        study.set_user_attr("unsearched", unsearched)
    return unsearched


def unsearched_values(spec: Spec, config: dict) -> list[str]:
    """`knob=value` for each value of `config` the spec's search does not make: unheld, or other than the
    config its searched values make (a knob no longer searched, a derived accumulation)."""
    made = spec.config({name: config.get(name) for name in spec.search})
    unheld = set(spec.unheld(config))
    differ = [f"{k}={v}" for k, v in config.items() if k in unheld or k not in made or made[k] != v]
    return differ or [f"no {k}" for k in made if k not in config]  # a knob the spec now sets that it never had


def enqueue_baseline(study: optuna.Study, spec: Spec, config: dict) -> None:
    """Measure the user's current config first (once per study)."""
    if any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False)):
        return
    study.enqueue_trial(sampler_params(spec, config), user_attrs={"baseline": True, "config": config},
                        skip_if_exists=False)


def enqueue_grid(study: optuna.Study, spec: Spec) -> None:
    """sampler: grid — every config once, in order (Optuna's grid samplers call stop(), which ask/tell forbids).

    One write per config: a sweep killed (or stopped by Ctrl-C) while queueing the grid left only its
    first configs queued, so the resume queues the ones no grid trial holds yet, not nothing."""
    if spec.sampler != "grid":
        return
    queued = {search.key(t.user_attrs["config"]) for t in study.get_trials(deepcopy=False)
              if t.user_attrs.get("grid") and t.user_attrs.get("config")}
    for config in all_configs(spec):
        if search.key(config) not in queued:
            study.enqueue_trial(sampler_params(spec, config), user_attrs={"config": config, "grid": True})


def requeue(study: optuna.Study, spec: Spec, config: dict, attrs: dict) -> None:
    """`config` queued to run again, keeping of its old trial's `attrs` what it is and why it runs again
    (its params from the config: a trial stopped inside suggest() holds only some of them)."""
    keep = {k: v for k, v in attrs.items() if k in REQUEUE_KEEPS}
    study.enqueue_trial(sampler_params(spec, config), user_attrs={**keep, "config": config}, skip_if_exists=False)


def confirm_key(number: int, round_: int) -> str:
    """The study attribute holding trial `number`'s confirmation run `round_` (claimed, then done)."""
    return f"confirm:{number}:{round_}"


# ---- reading it back -------------------------------------------------------------------------

def interrupted(t: optuna.trial.FrozenTrial) -> bool:
    """Stopped, never measured: by bench (Ctrl-C, a signal, a dead process) or by Optuna's heartbeat
    (a FAIL without bench's record: a database worker that stopped beating)."""
    return t.user_attrs.get("status") == record.INTERRUPTED or (t.state == TrialState.FAIL and "record" not in t.user_attrs
                                                                and not not_run_itself(t))


def still_running(study: optuna.Study, trial: optuna.Trial) -> bool:
    """The trial's state as stored now (Optuna has no public read of one trial by its handle)."""
    return study._storage.get_trial(trial._trial_id).state == TrialState.RUNNING


def not_run_itself(t: optuna.trial.FrozenTrial) -> bool:
    """A duplicate (its config's measurement is another trial's) or a config set aside (Sweep.set_aside)."""
    return "duplicate_of" in t.user_attrs or "outside_space" in t.user_attrs


def confirm_slots(attrs: dict) -> list[tuple[int, int, object]]:
    """(trial number, round, slot) of every confirm:NUMBER:ROUND attribute (confirm_key), by number then
    round; an attribute of another shape (a hand edit) is none."""
    slots = []
    for key, slot in attrs.items():
        parts = key.split(":")
        if len(parts) == 3 and parts[0] == "confirm" and parts[1].isdigit() and parts[2].isdigit():
            slots.append((int(parts[1]), int(parts[2]), slot))
    return sorted(slots, key=lambda s: s[:2])


def confirmation_runs(attrs: dict) -> dict[str, list[dict]]:
    """Trial number (str) -> its recorded confirmation runs, in round order: confirm:* records, after
    the runs of a study from before them (one `repeats` attribute)."""
    runs = {number: list(done) for number, done in (attrs.get("repeats") or {}).items()}
    for number, round_, slot in confirm_slots(attrs):
        if not isinstance(slot, dict):
            continue
        if slot.get("state") == "done":
            runs.setdefault(str(number), []).append({**slot["run"], "round": round_})
        elif isinstance(slot.get("kept"), dict):  # a busy run to be made again: it stands until the new one is
            runs.setdefault(str(number), []).append({**slot["kept"], "round": round_})
    return runs


def superseded(study: optuna.Study, trials: list | None = None) -> set[int]:
    """Trials set aside: one that stopped a sweep with an error in the user's code (listed by
    Sweep.retry_what_stopped_the_last_sweep when it queues it again), and one measured on a busy machine
    or noisy once its re-measurement is recorded (Sweep.remeasure_what_ran_busy): read from the new
    trial's record, so a sweep stopped before it was measured keeps the old measurement standing."""
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    replaced = {t.user_attrs["remeasures"] for t in trials
                if "remeasures" in t.user_attrs and t.user_attrs.get("record") and not interrupted(t)}
    return set(study.user_attrs.get("superseded") or []) | replaced


def remeasured(trials: list) -> set[int]:
    """Trials whose config is queued, running or measured again on a quiet machine (their counting
    place is the new trial's)."""
    return {t.user_attrs["remeasures"] for t in trials if "remeasures" in t.user_attrs}


def supersede(study: optuna.Study, numbers) -> None:
    """Set trials `numbers` aside: no view shows them, their configs' new trials stand in."""
    study.set_user_attr("superseded", sorted(set(study.user_attrs.get("superseded") or []) | set(numbers)))


def why_not_shown(study: optuna.Study, number: int) -> str | None:
    """Why trial `number` has no row (rows_of leaves out a repeat, a config outside the space and a trial
    set aside), said so `bench apply NUMBER` can name what stands in for it; None where it has a row or
    no such trial exists."""
    trials = study.get_trials(deepcopy=False)
    trial = next((t for t in trials if t.number == number), None)
    if trial is None:
        return None
    if "duplicate_of" in trial.user_attrs:
        original = trial.user_attrs["duplicate_of"]
        return f"its config was already measured as trial {original}; say `bench apply {original}`"
    if "outside_space" in trial.user_attrs:
        return "its config is outside what the spec searches now, so it never ran; `bench report` lists the trials"
    if number in superseded(study, trials):
        config = trial.user_attrs.get("config")
        again = [t for t in trials
                 if t.number > number and config and t.user_attrs.get("config") == config and not not_run_itself(t)]
        measured = [t.number for t in again if t.user_attrs.get("record") and not interrupted(t)]
        waiting = [t.number for t in again if t.state in (TrialState.WAITING, TrialState.RUNNING)]
        instead = (f"; its config ran again as trial {measured[0]}" if measured else
                   f"; its config is queued to run again as trial {waiting[0]}" if waiting else
                   ", its config queued to run again")
        return f"it was set aside{instead}; `bench report` lists the trials that stand"
    return None


UNCLAIMED_AFTER_S = 600
"""A trial asked and not claimed this long ago was asked by a sweep that died: a claim takes milliseconds
(minutes only while a database outage is ridden out)."""


def never_claimed(trial: optuna.trial.FrozenTrial) -> bool:
    """Asked, given its config, and never claimed by a worker (`kill -9` in between): no worker's process
    can be checked, so its age tells. The next sweep recovers it under the claim lock at once."""
    started = trial.datetime_start
    return "worker" not in trial.user_attrs and started is not None and \
        (datetime.datetime.now() - started).total_seconds() > UNCLAIMED_AFTER_S


def rows_of(study: optuna.Study) -> list[dict]:
    """One row per trial for reports: the stored record plus number, baseline and duplicate marks."""
    trials = study.get_trials(deepcopy=False)
    rows, repeats, aside = [], confirmation_runs(study.user_attrs), superseded(study, trials)
    unsearched = study.user_attrs.get("unsearched") or {}
    for t in trials:
        if t.state in (TrialState.WAITING,) or t.number in aside:
            continue
        rec = dict(t.user_attrs.get("record") or {})
        if not_run_itself(t):
            continue  # a duplicate's measurement is in the table under its own number
        if not t.user_attrs.get("config") and not rec.get("config") and rec.get("status") in (None, record.INTERRUPTED):
            continue  # asked, and the sweep killed before it drew a config: nothing to show, nothing runs again
        if t.state == TrialState.RUNNING and not rec and (is_stale(t.user_attrs.get("worker")) or never_claimed(t)):
            rec = {"status": record.INTERRUPTED, "throughput": None, "peak_memory": None, "error": {
                   "type": "Interrupted", "message": "its bench process died; the next `bench sweep` runs it again"}}
        elif t.state == TrialState.RUNNING and not rec:
            rec = {"status": "running", "throughput": None, "peak_memory": None, "error": None}
        elif interrupted(t) and not rec:
            rec = {"status": record.INTERRUPTED, "throughput": None, "peak_memory": None,
                   "error": {"type": "Interrupted", "message": "its worker stopped (no heartbeat); it runs again"}}
        rec.update(number=t.number, config=t.user_attrs.get("config", rec.get("config", {})),
                   baseline=bool(t.user_attrs.get("baseline")))
        rec.setdefault("status", t.user_attrs.get("status", "unknown"))
        if str(t.number) in repeats and rec.get("status") == record.OK:
            rec["repeats"] = repeats[str(t.number)]
        if unsearched.get(str(t.number)) and not rec["baseline"]:
            rec["unsearched"] = unsearched[str(t.number)]
        rows.append(rec)
    if any(r["baseline"] and r["status"] != record.INTERRUPTED for r in rows):
        for r in rows:  # the baseline is the trial that measured it; an interrupted try is only a try
            r["baseline"] = r["baseline"] and r["status"] != record.INTERRUPTED
    return rows


def study_info(study: optuna.Study) -> dict:
    return {"name": study.study_name, **study.user_attrs}
