"""Sweep specs: load a YAML file, validate every field, and describe the search space.

A spec says which workload to train, which knobs to search over, how to measure a trial, the
memory budget, and where the chosen config goes (`apply:`). Everything wrong in it is reported as
one UserError line naming the file and the field, with a "did you mean" for misspelt keys.
"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import errno
import importlib.util
import itertools
import math
import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness import apply, knobs
from harness.errors import UserError, as_written, did_you_mean
from harness.spec_own import (FORMS, check_defined, check_loop_form, check_trainer_config, check_trainer_knobs,
                              own_form)
from harness.spec_yaml import SpecLoader, read_yaml  # noqa: F401 (spec.read_yaml: API)
from harness.units import parse_duration, parse_size
from harness.workloads import WORKLOADS, resolve_preset

SAMPLERS = ("tpe", "nsga2", "random", "grid")  # no GPSampler: it runs torch in the parent
_BOOLS = (*(k.name for k in knobs.KNOBS if k.kind is bool), *(f for info in WORKLOADS.values() for f in info.flags))
_POSITIVE_INTS = (*(k.name for k in knobs.KNOBS if k.positive),  # and a built-in workload's counts (seq_len)
                  *(k for info in WORKLOADS.values() for k in info.knobs - info.flags))

TOP_KEYS = ("study", "workload", "search", "objective", "trials", "timeout", "trial", "memory", "sampler", "seed",
            "apply", "scenarios")
OBJECTIVES = ("samples", "tokens")
WORKLOAD_KEYS = ("name", "factory", "model", "loss", "batch", "lightning", "hf", "path", "preset", "params",
                 "params_from", "loop")
TRIAL_KEYS = ("timeout", "stall", "warmup_steps", "window", "min_windows", "max_windows", "target_cv",
              "max_seconds", "loss_tolerance", "start")
MEMORY_KEYS = ("budget", "headroom")


@dataclass(frozen=True)
class Dimension:
    """One knob of the search space: a list of choices, or an integer range low..high."""

    name: str
    choices: tuple = ()
    low: int | None = None
    high: int | None = None

    def size(self) -> int:
        return len(self.choices) if self.choices else self.high - self.low + 1

    def admits(self, value) -> bool:
        return value in self.choices if self.choices else isinstance(value, int) and self.low <= value <= self.high


@dataclass(frozen=True)
class Measure:
    """How a trial is measured (see harness.trial)."""

    warmup_steps: int = 2
    """Optimizer steps after the first (compile) step that are run but not timed; at least 1, the last of
    which regrows the cache the steady window emptied (and records a CUDA graph), untimed."""
    window_s: float = 0.5
    """Target length of one timed window; steps per window follow from the warm-up step time."""
    min_windows: int = 3
    max_windows: int = 12
    target_cv: float = 0.02
    """Stop measuring once the windows' coefficient of variation is below this."""
    max_seconds: float = 20.0
    """Stop measuring after this long even if the spread is still large."""
    loss_tolerance: float = 0.25
    """Relative distance from the fp32 reference loss at step 0 beyond which a config is diverged."""
    start: str = "auto"
    """auto: fork trials from the warm trial server where safe (harness.zygote); fresh: a new
    interpreter per trial, for a factory that must import before torch or cannot be forked."""


@dataclass(frozen=True)
class Spec:
    """A validated sweep spec; `scenario` is applied already."""

    path: Path
    study: str
    """Study name: the spec's `study:` (default: file stem), suffixed with `-<scenario>`."""
    scenario: str | None
    workload: dict
    """{name, preset, params} for a built-in workload; for the user's own {factory|model+loss+batch|
    lightning|hf, path, params} (see harness.spec_own)."""
    search: dict[str, Dimension]
    fixed: dict
    """Knobs the spec pins to one value."""
    effective_batch: int | None
    """When set, accumulation = effective_batch / batch_size instead of being searched."""
    trials: int
    timeout_s: float | None
    """Wall-clock limit of the whole sweep: no new trial starts after it."""
    trial_timeout_s: float
    stall_s: float
    measure: Measure
    memory_budget: int | None
    headroom: float
    sampler: str
    seed: int
    apply: apply.ApplyTarget | None
    scenarios: tuple = field(default=())
    objective: str = "samples"
    """Throughput to maximize: samples/s, or tokens/s (fair when a knob like seq_len changes a sample)."""
    notes: tuple = ()
    """What loading left out of the search (batch sizes that do not divide effective_batch), said before a sweep."""
    smoke: bool = False
    """A BENCH_QUICK smoke run (harness.cli.quick): its figures are not ones to act on, so its study is never
    a real sweep's (harness.ledger.resumed)."""
    sampled: dict = field(default_factory=dict)
    """A resumed study's choices for a knob whose list the spec has since narrowed: Optuna cannot change a
    study's choices, so its sampler keeps drawing (and indexing) from these, while the search is `search`."""

    @property
    def shown(self) -> str:
        """The spec's path as messages name it: from the current directory where it lies under it, as
        the user typed it (s.yaml, not /home/.../s.yaml)."""
        try:
            return str(self.path.relative_to(Path.cwd()))
        except ValueError:
            return str(self.path)

    def space_size(self) -> int:
        n = 1
        for dim in self.search.values():
            n *= dim.size()
        return n

    def contains(self, config: dict) -> bool:
        """`config` is a point of this spec's search space (a resumed study may hold some that are not):
        the config its searched values make is itself (fixed knobs, derived and dropped ones included)."""
        params = {name: config.get(name) for name in self.search}
        return (all(dim.admits(params[name]) for name, dim in self.search.items())
                and self.config(params) == config)

    def unheld(self, config: dict) -> list[str]:
        """The knobs whose value in `config` the spec does not search (a list's or a range's) or hold (a fixed value)."""
        return [name for name in self.knob_names() if name in config
                and not (self.search[name].admits(config[name]) if name in self.search
                         else self.fixed.get(name, config[name]) == config[name])]

    def outside(self, config: dict) -> list[str]:
        """`knob value` for each of your config's values the spec does not search: measured as it is and
        never searched. A batch that does not divide effective_batch is said otherwise (its own note); an
        accumulation that makes another effective batch, here."""
        inexact = not keeps_effective_batch(self, config)
        said_otherwise = ("batch_size", "nproc") if inexact else ()
        out = [f"{name} {config[name]}" for name in self.unheld(config) if name not in said_otherwise]
        if self.effective_batch and not inexact:
            per_step = int(config["batch_size"]) * int(config.get("nproc", 1))
            if (accumulation := int(config.get("accumulation", 1))) * per_step != self.effective_batch:
                out.append(f"accumulation {accumulation} (an effective batch of {accumulation * per_step}, "
                           f"not effective_batch {self.effective_batch})")
        return out

    def knob_names(self) -> list[str]:
        names = [*self.search, *self.fixed]
        return names + (["accumulation"] if self.effective_batch and "accumulation" not in names else [])

    def config(self, params: dict) -> dict:
        """A full trial config from the sampled params: fixed knobs, derived accumulation, defaults."""
        config = {**self.fixed, **params}
        if config.get("parallel", "none") == "fsdp":
            config.setdefault("reshard_after_forward", knobs.DEFAULTS["reshard_after_forward"])
        else:  # resharding means nothing without FSDP: one config, not two
            config.pop("reshard_after_forward", None)
        if self.effective_batch:  # the global batch: micro-batch x accumulation x processes
            per_step = int(config["batch_size"]) * int(config.get("nproc", 1))
            config["accumulation"] = max(self.effective_batch // per_step, 1)
        for knob in ("accumulation", "precision", "checkpointing", "compile"):
            config.setdefault(knob, knobs.DEFAULTS[knob])
        return config

    def job(self, device: str, config: dict) -> dict:
        """What a trial child needs to run `config` on `device` (see harness.trial)."""
        return {"workload": self.workload_for(device, config), "config": config, "device": device,
                "memory_budget": self.memory_budget, "measure": self.measure.__dict__, "seed": self.seed}

    def held(self, current: dict, device: str) -> dict:
        """Knobs your config file sets (read from the apply target) that the spec neither searches nor
        pins: every trial runs them as your file has them, and apply leaves them so. Not the process
        knobs (this machine may not have your devices) nor a value this device cannot run: those are
        measured at bench's defaults and never written."""
        return {k: v for k, v in current.items()
                if k not in self.search and k not in self.fixed and k not in NOT_HELD
                and not (k == "accumulation" and self.effective_batch) and refusal(k, v, device) is None}

    def holding(self, current: dict, device: str) -> "Spec":
        return dataclasses.replace(self, fixed={**self.fixed, **self.held(current, device)})

    def baseline(self, current: dict) -> dict:
        """The user's current config (knob values read from the apply target) as a trial config;
        knobs the target does not set take their defaults, or the first value of the search."""
        known = {k: v for k, v in current.items() if k in self.knob_names()}
        params = {name: known.get(name, knobs.DEFAULTS.get(name, dim.choices[0] if dim.choices else dim.low))
                  for name, dim in self.search.items()}
        config = self.config({**params, **{k: v for k, v in known.items() if k in self.fixed}})
        if "accumulation" in known:  # the user's own, even where the spec derives it from effective_batch
            config["accumulation"] = known["accumulation"]
        return config

    def workload_for(self, device: str, config: dict) -> dict:
        """The child's workload section: preset resolved for the device, workload knobs as params."""
        params = {}
        if "name" in self.workload:
            info = WORKLOADS[self.workload["name"]]
            preset = resolve_preset(info, self.workload.get("preset", "auto"), device)
            params.update(info.presets[preset])
        params.update(self.workload.get("params") or {})
        params.update({k: v for k, v in config.items() if k not in knobs.UNIVERSAL})
        section = {k: v for k, v in self.workload.items() if k not in ("params", "preset", "origins")}
        if "strict" in section:  # searched params are the user's too: none may go unused
            section["strict"] = list(dict.fromkeys([*section["strict"], *(k for k in config if k not in knobs.UNIVERSAL)]))
        if "name" in self.workload:
            section["preset"] = preset
        return {**section, "params": params}


NOT_HELD = ("nproc", "parallel", "reshard_after_forward")
"""Knobs a sweep does not take from your file when it does not search them (Spec.held)."""


# ---- loading --------------------------------------------------------------------------------------

def load(path: Path | str, scenario: str | None = None) -> Spec:
    path = Path(path)
    raw = read_yaml(path, "sweep spec")
    check_keys(raw, TOP_KEYS, f"{path}")
    scenarios = {} if raw.get("scenarios") is None else raw["scenarios"]
    if not isinstance(scenarios, dict):  # `scenarios: 0` or `[]` is no mapping, however empty
        raise UserError(f"{path}: scenarios must be a mapping of name -> overrides, like "
                        f"`scenarios: {{24gb: {{memory: {{budget: 24GiB}}}}}}`; got {scenarios!r}")
    # `24: {...}` is a name as --scenario 24 gives it; the YAML key is a number
    scenarios = {str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v for k, v in scenarios.items()}
    for name in scenarios:  # `null:`, `true:`, `1.5:` or `2026-12-04:`: YAML kept no name to run or show
        if not isinstance(name, str):
            kind = {type(None): "null", bool: "a boolean", float: "a number"}.get(type(name), f"a {type(name).__name__}")
            raise UserError(f"{path}: scenarios: {name!r} reads as {kind} in YAML, not a name; quote the name "
                            "as you mean it, e.g. '24gb': {memory: {budget: 24GiB}}")
    if scenario is not None:
        if scenario not in scenarios:
            raise UserError(f"{path}: no scenario {scenario!r}{did_you_mean(scenario, scenarios)}; "
                            f"scenarios: {', '.join(map(printable, scenarios)) or 'none'}")
        overrides = scenarios[scenario]
        if not isinstance(overrides, dict):
            raise UserError(f"{path}: scenarios.{printable(scenario)} must be a mapping of overrides")
        check_keys(overrides, [k for k in TOP_KEYS if k not in ("scenarios", "study")],
                   f"{path}: scenarios.{printable(scenario)}")
        raw = deep_merge(raw, overrides)
    try:
        return build(raw, path, scenario, tuple(scenarios))
    except UserError as exc:  # "search.batch_size: must be at least 1" sent the user to the top-level search
        said, head = str(exc), f"{path}: "
        if scenario is None or not said.startswith(head) or not sets(overrides, said[len(head):].split(":")[0]):
            raise
        raise UserError(f"{head}scenarios.{printable(scenario)}.{said[len(head):]}") from None
    except ValueError as exc:  # os and pathlib refuse a NUL in a path before any file is touched
        if "null byte" not in str(exc):
            raise
        raise UserError(f"{path}: a path in the spec holds a NUL character (\\x00); remove it") from None
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        raise UserError(f"{path}: a path in the spec has a name longer than the file system allows "
                        f"({exc.filename}); shorten it") from None


def sets(overrides: dict, dotted: str) -> bool:
    """The scenario's overrides write the key `dotted` names (search.batch_size, memory)."""
    node = overrides
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def printable(name) -> str:
    """A name as a one-line message can show it: quoted when it holds a newline or other control."""
    return str(name) if str(name).isprintable() else repr(name)


def build(raw: dict, path: Path, scenario: str | None, scenarios: tuple) -> Spec:
    where = str(path)
    study = raw.get("study", path.stem)
    if study is None:  # `study:` with nothing after it
        raise UserError(f"{where}: study is empty; name the study (e.g. study: {path.stem}), or leave the key out "
                        "for the file's name")
    if isinstance(study, (float, bool, datetime.date)):  # YAML read `study: 1.50` as 1.5: its spelling is gone
        kind, shown = ("a boolean", str(study).lower()) if isinstance(study, bool) else \
            ("a number", study) if isinstance(study, float) else ("a date", study)
        raise UserError(f"{where}: study {shown} reads as {kind} in YAML; quote the name as you "
                        f"mean it, e.g. study: \"{shown}\"")
    study = check_name(str(study) if isinstance(study, int) and not isinstance(study, bool) else study,
                       f"{where}: study")  # `study: 2024` is YAML's integer, and a fine name
    workload = parse_workload(raw.get("workload"), where, path.parent, raw.get("apply"))
    search, fixed, effective = parse_search(raw.get("search"), workload, where)
    check_trainer_knobs(workload, search, fixed, where)
    trial = as_mapping(raw.get("trial", {}), f"{where}: trial")
    check_keys(trial, TRIAL_KEYS, f"{where}: trial")
    memory = as_mapping(raw.get("memory", {}), f"{where}: memory")
    check_keys(memory, MEMORY_KEYS, f"{where}: memory")
    headroom = memory.get("headroom", 0.1)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise UserError(f"{where}: memory.headroom must be a fraction in [0, 1), like 0.1, got {headroom!r}")
    sampler = raw.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise UserError(f"{where}: sampler {sampler!r} unknown{did_you_mean(sampler, SAMPLERS)}; use one of {', '.join(SAMPLERS)}")
    objective = raw.get("objective", "samples")
    if objective not in OBJECTIVES:
        raise UserError(f"{where}: objective {objective!r} unknown{did_you_mean(str(objective), OBJECTIVES)}; "
                        "use samples (samples/s) or tokens (tokens/s)")
    spec = Spec(
        path=path.resolve(), study=check_name(f"{study}-{scenario}", f"{where}: scenarios.{printable(scenario)}")
        if scenario else study, scenario=scenario,
        workload=workload, search=search, fixed=fixed, effective_batch=effective,
        notes=tuple(dropped_for_effective_batch(raw.get("search"), search, fixed, effective)),
        trials=spec_trials(raw.get("trials", 12), where),
        timeout_s=parse_duration(raw["timeout"], f"{where}: timeout") if raw.get("timeout") is not None else None,
        trial_timeout_s=parse_duration(trial.get("timeout", "5m"), f"{where}: trial.timeout"),
        stall_s=parse_duration(trial.get("stall", "60s"), f"{where}: trial.stall"),
        measure=parse_measure(trial, where),
        memory_budget=parse_size(memory["budget"], f"{where}: memory.budget") if memory.get("budget") is not None else None,
        headroom=float(headroom), sampler=sampler,
        seed=int_value(raw.get("seed", 0), f"{where}: seed"),
        apply=apply.parse_apply_section(with_origin_keys(raw["apply"], workload, {**search, **fixed}), path.parent, where,
                                        known_knobs=supported_knobs(workload))
        if raw.get("apply") is not None else None,
        scenarios=scenarios, objective=objective,
    )
    check_numbers(spec, where)
    if spec.apply is not None and same_path(spec.apply.file, path):
        raise UserError(f"{where}: apply.file names this spec itself; point it at the training config apply writes")
    return spec


def same_path(a: Path, b: Path) -> bool:
    """One file by path, link or inode."""
    try:
        return Path(a).resolve() == Path(b).resolve() or os.path.samefile(a, b)
    except OSError:  # either is not there (yet)
        return False


def parse_workload(raw, where: str, base_dir: Path, raw_apply=None) -> dict:
    wl = as_mapping(raw, f"{where}: workload")
    check_keys(wl, WORKLOAD_KEYS, f"{where}: workload")
    check_loop_form(wl, where)
    if sum(form in wl for form in FORMS) != 1:
        raise UserError(f"{where}: workload needs exactly one of `name` (built-in: {', '.join(WORKLOADS)}), "
                        "`factory` (\"package.module:function\"), `model` (+ `loss`, `batch`), `lightning` or `hf`; "
                        "see README, \"Bring your own model\"")
    params = as_mapping({} if wl.get("params") is None else wl["params"], f"{where}: workload.params")
    if any(form in wl for form in ("model", "lightning", "hf")):
        paths = import_paths(wl.get("path", []), base_dir, where)

        def check_ref(ref, at):
            check_factory(ref, paths, where, at)
            return ref
        return {**own_form(wl, where, base_dir, raw_apply, check_ref), "path": paths}
    if "params_from" in wl or any(isinstance(v, dict) and set(v) == {"from"} for v in params.values()):
        raise UserError(f"{where}: workload.params_from and `from:` params work with the model, lightning and hf "
                        "forms; a factory or built-in workload takes plain params")
    if "factory" in wl:
        paths = import_paths(wl.get("path", []), base_dir, where)
        check_factory(wl["factory"], paths, where)
        return {"factory": wl["factory"], "path": paths, "params": params}
    name = wl["name"]
    if not isinstance(name, str) or name not in WORKLOADS:  # a list or mapping here cannot even be looked up
        raise UserError(f"{where}: workload.name: unknown workload {name!r}{did_you_mean(name, WORKLOADS)}; "
                        f"built-in: {', '.join(WORKLOADS)} (or use `factory:` for your own model)")
    preset = wl.get("preset", "auto")
    info = WORKLOADS[name]
    if preset != "auto" and (not isinstance(preset, str) or preset not in info.presets):
        raise UserError(f"{where}: workload.preset: {name} has no preset {preset!r}"
                        f"{did_you_mean(preset, info.presets)}; presets: auto, {', '.join(info.presets)}")
    check_builtin_params(name, params, f"{where}: workload.params")
    return {"name": name, "preset": preset, "params": params}


def check_builtin_params(name: str, params: dict, where: str) -> None:
    """A built-in workload's params are its own, of its presets' types: a typo or a negative size failed
    inside torch, trial after trial (or measured `ok` on a model with no layers)."""
    info = WORKLOADS[name]
    for key, value in params.items():
        at = f"{where}.{key}"
        if key not in info.params():
            raise UserError(f"{at}: {name} takes no param {key!r}{did_you_mean(str(key), info.params())}; "
                            f"its params: {', '.join(sorted(info.params()))}")
        example = info.example(key)
        if key in info.flags or isinstance(example, bool):
            if not isinstance(value, bool):
                raise UserError(f"{at}: takes true or false, got {as_written(value)}")
        elif isinstance(example, int):
            positive_int(value, at)
        elif isinstance(example, (list, dict)):
            kind = "a list" if isinstance(example, list) else "a mapping"
            if not isinstance(value, type(example)) or not value:
                raise UserError(f"{at}: must be {kind} like its presets' {example!r}, got {as_written(value)}")
            for item in (value if isinstance(value, list) else value.values()):
                positive_int(item, at)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            like = f" (like its presets' {example!r})" if example is not None else ""
            raise UserError(f"{at}: must be a number >= 0{like}, got {as_written(value)}")
        elif key.endswith("dropout") and value >= 1:  # 1 drops every activation: a model that learns nothing
            raise UserError(f"{at}: a dropout probability is below 1, like 0.1; got {as_written(value)}")


def import_paths(raw, base_dir: Path, where: str) -> list[str]:
    """workload.path: folders (relative to the spec file) put on the import path for the factory."""
    folders = raw if isinstance(raw, list) else [raw]
    out = []
    for folder in folders:
        if not isinstance(folder, str):
            raise UserError(f"{where}: workload.path must be a folder or a list of folders, got {folder!r}")
        path = (base_dir / folder).resolve()
        if not path.is_dir():
            raise UserError(f"{where}: workload.path: {path} is not a folder; give it relative to the spec file")
        out.append(str(path))
    return out


def check_factory(factory, paths: list[str], where: str, at: str = "workload.factory") -> None:
    """The factory's module must exist; it is imported (user code runs) only in the trial child."""
    if not isinstance(factory, str) or factory.count(":") != 1 or not all(factory.split(":")):
        raise UserError(f"{where}: {at} must look like \"package.module:function\", got {factory!r}")
    name, function = factory.split(":")
    if "/" in name or "\\" in name or name.endswith(".py"):  # a file's path, not a module's name
        dotted = ".".join(p for p in name.removesuffix(".py").replace("\\", "/").split("/") if p not in ("", "."))
        raise UserError(f"{where}: {at}: {name!r} is a file's path; name the module, like "
                        f"\"{dotted}:{function}\", with its folder in workload.path")
    module = name.partition(".")[0]  # finding a submodule imports its package: user code
    saved = list(sys.path)
    sys.path[:0] = paths
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path[:] = saved
    if found is None:
        near = did_you_mean(module, [p.stem for folder in paths for p in Path(folder).glob("*.py")])
        raise UserError(f"{where}: {at}: cannot find module {module!r}{near}; set workload.path to its folder "
                        "(relative to the spec), install your package, or add its folder to PYTHONPATH")
    check_defined(factory, paths, f"{where}: {at}")


def workload_label(workload: dict) -> str:
    """How messages name the workload: the built-in's name, else the user's factory or class."""
    for key in ("name", "factory", "model"):
        if workload.get(key):
            return workload[key]
    if workload.get("lightning"):
        return workload["lightning"]["model"]
    return f"hf {Path(workload['hf']['config']).name}"


def with_origin_keys(raw_apply, workload: dict, search: dict) -> dict:
    """A searched param read from the apply target is written back where it was read."""
    origins = workload.get("origins") or {}
    searched = {k: v for k, v in origins.items() if k in search}
    if not searched or not isinstance(raw_apply, dict):
        return raw_apply
    keys = raw_apply.get("keys") if isinstance(raw_apply.get("keys"), dict) else {}
    return {**raw_apply, "keys": {**searched, **keys}}


def supported_knobs(workload: dict) -> frozenset:
    if "name" in workload:
        return WORKLOADS[workload["name"]].supported_knobs()
    return knobs.UNIVERSAL | frozenset(workload["params"])


def parse_search(raw, workload: dict, where: str):
    search = as_mapping(raw, f"{where}: search")
    if not search:
        raise UserError(f"{where}: search is empty; give at least batch_size, e.g. `batch_size: [8, 16, 32]`")
    allowed = supported_knobs(workload)
    dims, fixed, effective = {}, {}, None
    for name, value in search.items():
        at = f"{where}: search.{name}"
        if name not in allowed:
            label = workload_label(workload)
            own = "" if "name" in workload else \
                f"; a param of your model is searched once workload.params holds its default ({name}: ...)"
            raise UserError(f"{at}: {label} has no knob {name!r}{did_you_mean(name, allowed)}; "
                            f"its knobs: {', '.join(sorted(allowed))}{own}")
        if name == "accumulation" and isinstance(value, dict) and not set(value) <= {"low", "high"}:
            check_keys(value, ("effective_batch",), at)  # {efective_batch: 64} gets its did-you-mean
            effective = positive_int(value["effective_batch"], f"{at}.effective_batch")
            continue
        dim = parse_dimension(name, value, at)
        check_like_param(name, dim, workload, at)
        if dim.size() == 1:
            fixed[name] = dim.choices[0] if dim.choices else dim.low
        else:
            dims[name] = dim
    if "batch_size" not in dims and "batch_size" not in fixed:
        raise UserError(f"{where}: search.batch_size is required, e.g. `batch_size: [8, 16, 32]`")
    check_parallel(dims, fixed, where)
    if effective:
        asked = search.get("batch_size")
        auto_low = (dims["batch_size"].choices[0] if "batch_size" in dims else fixed["batch_size"]) \
            if isinstance(asked, dict) and asked.get("high") == "auto" else None
        dims, fixed = restrict_to_effective_batch(dims, fixed, effective, where, auto_low)
    return dims, fixed, effective


def check_like_param(name: str, dim: Dimension, workload: dict, at: str) -> None:
    """`search: {width: [a, 3]}` beside `params: {width: 32}`: the trial of `a` (your baseline, the first
    value) failed inside your model's __init__; `--set width=a` is refused as well (check_like_held)."""
    held = workload["params"].get(name) if "name" not in workload and name not in knobs.UNIVERSAL else None
    wrong = [v for v in dim.choices if not is_number(v)] if is_number(held) else []
    if wrong:
        origin = (workload.get("origins") or {}).get(name)
        source = f"the apply target's {origin}" if origin else f"workload.params.{name}"
        raise UserError(f"{at}: {as_written(wrong[0])} is not a number; {name} takes a number, as {source} "
                        f"({held}) shows")


def knob_values(name: str, dims: dict, fixed: dict) -> tuple:
    """Every value a knob can take in this search (its default when the search leaves it out)."""
    if name in fixed:
        return (fixed[name],)
    if name in dims:
        dim = dims[name]
        return dim.choices or tuple(range(dim.low, dim.high + 1))
    return (knobs.DEFAULTS[name],)


def check_parallel(dims: dict, fixed: dict, where: str) -> None:
    """Several processes must share one model (ddp, fsdp); resharding is a knob of fsdp alone."""
    most, parallels = max(knob_values("nproc", dims, fixed)), knob_values("parallel", dims, fixed)
    if most > 1 and "none" in parallels:
        raise UserError(f"{where}: search.parallel: none with nproc {most} would train {most} unrelated copies; "
                        "search parallel over ddp and fsdp, or keep nproc at 1")
    if ("reshard_after_forward" in dims or "reshard_after_forward" in fixed) and "fsdp" not in parallels:
        raise UserError(f"{where}: search.reshard_after_forward only means something with parallel: fsdp; "
                        "add fsdp to search.parallel or remove it")


AUTO_BATCH_TOP = 2**16
"""`batch_size: {low: N, high: auto}` searches up to here, or to the memory wall long before."""


def batch_ladder(low: int, top: int = AUTO_BATCH_TOP) -> tuple:
    """The batch sizes of `high: auto`: the powers of two from `low`, the multiples of 8 between 16 and 64,
    and above that eighths of each octave (multiples of 8, as GPU kernels like), so that the search can
    close in on the wall; from the octave `low` is in (low 20 starts 20, 24, 32)."""
    sizes, power = {low}, 1 << (low.bit_length() - 1)
    while power <= top:
        sizes.add(power)
        if power >= 64:
            sizes.update(range(power + power // 8, min(2 * power, top + 1), power // 8))
        elif power >= 16:
            sizes.update(range(power + 8, min(2 * power, top + 1), 8))
        power *= 2
    return tuple(sorted(b for b in sizes if low <= b <= top))


def parse_dimension(name: str, value, at: str) -> Dimension:
    if name == "batch_size" and isinstance(value, dict) and value.get("high") == "auto":
        check_keys(value, ("low", "high"), at)
        low = positive_int(value.get("low", 1), f"{at}.low")
        if low > AUTO_BATCH_TOP:
            raise UserError(f"{at}.low: must be at most {AUTO_BATCH_TOP} (where `high: auto` stops), got {low}; "
                            "give a list of batch sizes instead")
        return Dimension(name, choices=batch_ladder(low))
    if isinstance(value, dict):
        check_keys(value, ("low", "high"), at)
        if name == "batch_size" and isinstance(value.get("high"), str):  # `AUTO`, `autox`: the one word it takes
            raise UserError(f"{at}.high: a whole number or auto (lower case), got {value['high']!r}")
        low, high = int_value(value.get("low"), f"{at}.low"), int_value(value.get("high"), f"{at}.high")
        if low > high:
            raise UserError(f"{at}: low {low} is above high {high}; the range is empty")
        for v in (low, high):
            check_value(name, v, at)
        return Dimension(name, low=low, high=high)
    choices = value if isinstance(value, list) else [value]
    if not choices:
        raise UserError(f"{at}: no values to try; give a list like [8, 16] or a single value")
    for v in choices:
        check_value(name, v, at)
    if len(set(map(repr, choices))) != len(choices):
        raise UserError(f"{at}: repeated values in {choices}; list each value once")
    return Dimension(name, choices=tuple(choices))


def check_value(name: str, value, at: str) -> None:
    if name in knobs.CHOICES and value not in knobs.CHOICES[name]:
        article = "an" if name[0] in "aeiou" else "a"
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as YAML spells it: false, not False
        mixed = f"{value}-mixed"  # Lightning reads a bare "bf16" as bf16-mixed; the nearest spelling is bf16-true
        near = (f" (did you mean {mixed!r}?)" if mixed in knobs.CHOICES[name]
                else did_you_mean(str(value), knobs.CHOICES[name]))
        raise UserError(f"{at}: {shown} is not {article} {name}{near}; use one of {', '.join(knobs.CHOICES[name])}")
    if name in _BOOLS and not isinstance(value, bool):
        raise UserError(f"{at}: {name} takes true or false, got {as_written(value)}")
    if name in _POSITIVE_INTS:
        positive_int(value, at)
    if name == "num_workers" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise UserError(f"{at}: num_workers takes whole numbers >= 0, got {as_written(value)}")
    if not isinstance(value, (str, int, float, bool)):
        raise UserError(f"{at}: values must be plain numbers, strings or booleans, got {as_written(value)}")


def restrict_to_effective_batch(dims, fixed, effective: int, where: str, auto_low: int | None = None):
    """With a fixed effective batch only batch sizes that divide it make sense; under `high: auto` (from
    `auto_low`) every one of them is searched (the ladder's multiples of 8 miss 12 of 12 and 25 of 100)."""
    if "accumulation" in dims or "accumulation" in fixed:
        raise UserError(f"{where}: search.accumulation is derived from effective_batch; give one or the other")
    if "batch_size" in dims and not dims["batch_size"].choices:
        raise UserError(f"{where}: with effective_batch, give batch_size as a list of sizes, not a range")
    if auto_low is not None and auto_low > effective:
        raise UserError(f"{where}: search.batch_size.low {auto_low} is above effective_batch {effective}; "
                        "give a low up to it")
    given = tuple(b for b in range(auto_low, effective + 1) if effective % b == 0) if auto_low is not None \
        else dims["batch_size"].choices if "batch_size" in dims else (fixed["batch_size"],)
    sizes = tuple(b for b in given if b <= effective)
    if not sizes:
        raise UserError(f"{where}: search.batch_size: every size ({', '.join(map(str, given))}) is above "
                        f"effective_batch {effective}; give sizes up to it")
    nprocs = knob_values("nproc", dims, fixed)  # effective_batch is global: every process count must divide it
    keep = tuple(b for b in sizes if all(effective % (b * n) == 0 for n in nprocs))
    if not keep:
        per = f" x nproc {', '.join(map(str, nprocs))}" if nprocs != (1,) else ""
        raise UserError(f"{where}: no batch_size in {list(given)}{per} divides effective_batch {effective}; "
                        "pick sizes that divide it")
    dims = dict(dims)
    if len(keep) == 1:
        dims.pop("batch_size", None)
        fixed = {**fixed, "batch_size": keep[0]}
    else:
        dims["batch_size"] = Dimension("batch_size", choices=keep)
    return dims, fixed


def dropped_for_effective_batch(raw_search, search: dict, fixed: dict, effective: int | None) -> list[str]:
    """A note for the searched batch sizes restrict_to_effective_batch left out."""
    asked = raw_search.get("batch_size") if isinstance(raw_search, dict) and effective else None
    if not isinstance(asked, list):
        return []
    kept = search["batch_size"].choices if "batch_size" in search else (fixed.get("batch_size"),)
    dropped = [b for b in asked if b not in kept]
    return [f"search.batch_size: {', '.join(map(str, dropped))} left out: "
            f"{'they do' if len(dropped) > 1 else 'it does'} not divide effective_batch {effective} "
            "(times each nproc)"] if dropped else []


def parse_measure(trial: dict, where: str) -> Measure:
    m = Measure()
    values = {}
    for key, attr in (("warmup_steps", "warmup_steps"), ("min_windows", "min_windows"), ("max_windows", "max_windows")):
        if key in trial:
            values[attr] = int_value(trial[key], f"{where}: trial.{key}", minimum=1)
    for key in ("target_cv", "loss_tolerance"):
        if key in trial:
            v = trial[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise UserError(f"{where}: trial.{key} must be a positive number, got {as_written(v)}")
            values[key] = float(v)
    if "start" in trial:
        if trial["start"] not in ("auto", "fresh"):
            raise UserError(f"{where}: trial.start must be auto or fresh, got {trial['start']!r}")
        values["start"] = trial["start"]
    if "window" in trial:
        values["window_s"] = parse_duration(trial["window"], f"{where}: trial.window")
    if "max_seconds" in trial:
        values["max_seconds"] = parse_duration(trial["max_seconds"], f"{where}: trial.max_seconds")
    m = Measure(**{**m.__dict__, **values})
    if m.min_windows > m.max_windows:
        raise UserError(f"{where}: trial.min_windows ({m.min_windows}) is above max_windows ({m.max_windows})")
    return m


# ---- device and overrides -------------------------------------------------------------------------

def for_device(spec: Spec, device: str) -> tuple[Spec, list[str]]:
    """The spec as `device` can run it, and a note per search value it drops.

    A knob that means nothing on the device, or a value it cannot honour set as the only choice,
    is refused; a searched value it cannot honour is dropped from the search, with a note saying
    why (never silently run as something else).
    """
    for knob, value in spec.fixed.items():
        check_knob(knob, value, device, f"{spec.shown}: {knob}")
    spec, notes = fit_shapes(spec, device)
    search = dict(spec.search)
    for knob, dim in spec.search.items():
        if knob in knobs.CUDA_ONLY and True in (dim.choices or (True,)):
            check_knob(knob, True, device, f"{spec.shown}: search.{knob}")
        dropped = [v for v in dim.choices if refusal(knob, v, device)]
        if not dropped:
            continue
        if len(dropped) == len(dim.choices):
            check_knob(knob, dropped[0], device, f"{spec.shown}: search.{knob}")
        search[knob] = dataclasses.replace(dim, choices=tuple(v for v in dim.choices if v not in dropped))
        notes.extend(f"search.{knob}: {v} left out on {device}: {refusal(knob, v, device)}" for v in dropped)
    return dataclasses.replace(spec, search=search), [*spec.notes, *notes]


def fit_shapes(spec: Spec, device: str) -> tuple[Spec, list[str]]:
    """A built-in workload's params as the device's preset makes them, through its shape rules: a searched
    value of a workload knob the model cannot take (seq_len over block_size) is dropped with a note;
    a problem every value has (heads that do not divide d_model) is refused."""
    if "name" not in spec.workload:
        return spec, []
    info = WORKLOADS[spec.workload["name"]]
    searched = {k: dim for k, dim in spec.search.items() if k in info.knobs}
    first = {**spec.fixed, **{k: dim.choices[0] if dim.choices else dim.low for k, dim in searched.items()}}
    found = {(k, v): info.problems(spec.workload_for(device, {**first, k: v})["params"])
             for k, dim in searched.items() for v in (dim.choices or (dim.low, dim.high))}
    found = found or {None: info.problems(spec.workload_for(device, first)["params"])}
    everywhere = [p for p in next(iter(found.values())) if all(p in others for others in found.values())]
    if everywhere:
        raise UserError(f"{spec.shown}: workload.params: {everywhere[0]}")
    search, notes = dict(spec.search), []
    for knob, dim in searched.items():
        bad = [v for v in (dim.choices or (dim.low, dim.high)) if found[knob, v]]
        if bad and (len(bad) == len(dim.choices) or not dim.choices):  # nothing left to search, or a range's end
            raise UserError(f"{spec.shown}: search.{knob}: {found[knob, bad[0]][0]}")
        search[knob] = dataclasses.replace(dim, choices=tuple(v for v in dim.choices if v not in bad))
        notes.extend(f"search.{knob}: {v} left out: {found[knob, v][0]}" for v in bad)
    return dataclasses.replace(spec, search=search), notes


def check_shapes(spec: Spec, config: dict, device: str, where: str) -> None:
    """One trial config's workload params through the built-in workload's shape rules (`bench trial --set`)."""
    found = WORKLOADS[spec.workload["name"]].problems(spec.workload_for(device, config)["params"]) \
        if "name" in spec.workload else []
    if found:
        raise UserError(f"{where}: {found[0]}")


def check_config(config: dict, device: str, where: str, available: int) -> None:
    """One trial config against the device (`bench trial --set ...`), which has `available` devices."""
    for knob, value in config.items():
        check_knob(knob, value, device, f"{where} {knob}")
    nproc = int(config.get("nproc", 1))
    if nproc > 1 and config.get("parallel", "none") == "none":
        raise UserError(f"{where} nproc={nproc}: parallel is none, so {nproc} processes would train unrelated copies; "
                        "add --set parallel=ddp (or fsdp)")
    if nproc > available:
        raise UserError(f"{where} nproc={nproc}: needs {nproc} {devices_word(device)} (one per process), "
                        f"but {device} has {available}; lower nproc or run where there are more")


def devices_word(device: str) -> str:
    """What one rank needs on `device`: a GPU, or (gloo on CPU) a core, since more ranks than cores
    would measure the cores' contention, not the parallel configuration."""
    return "GPUs" if device.startswith("cuda") else "CPU cores"


def fit_nproc(spec: Spec, device: str, available: int) -> tuple[Spec, list[str]]:
    """The spec with the process counts `device` has devices for, and a note per searched value dropped."""
    has = f"{device} has {available} {devices_word(device)}" if device != "cpu" else \
        f"this machine has {available} CPU cores"
    values = knob_values("nproc", spec.search, spec.fixed)
    too_many = [n for n in values if n > available]
    if not too_many:
        return spec, []
    if len(too_many) == len(values):
        where = f"{spec.shown}" + (f" scenario {spec.scenario}" if spec.scenario else "")
        other = ", or run another scenario (--scenario NAME)" if spec.scenario else ""
        raise UserError(f"{where}: nproc {min(too_many)} needs {min(too_many)} {devices_word(device)} "
                        f"(one per process), but {has}; lower nproc or run where there are more{other}")
    kept = tuple(n for n in values if n <= available)
    search = {**spec.search, "nproc": Dimension("nproc", choices=kept)}
    return dataclasses.replace(spec, search=search), [f"search.nproc: {n} left out: {has}" for n in too_many]


def refusal(knob: str, value, device: str) -> str | None:
    """Why `device` cannot honour knob=value, or None when it can."""
    if device.startswith("cuda"):
        return None
    if knob in knobs.CUDA_ONLY and value is True:
        return f"{knob} only means something on a CUDA GPU"
    return knobs.CUDA_ONLY_VALUES.get((knob, value))


def check_knob(knob: str, value, device: str, where: str) -> None:
    why = refusal(knob, value, device)
    if why:
        shown = str(value).lower() if isinstance(value, bool) else value  # as the YAML or --set wrote it
        raise UserError(f"{where}: {shown} cannot run on {device}: {why}; remove it or run with --device cuda")


def with_preset(spec: Spec, preset: str) -> Spec:
    """The spec with another preset of its built-in workload (`bench trial --preset tiny`)."""
    if "name" not in spec.workload:
        raise UserError(f"--preset {preset}: presets belong to built-in workloads; {spec.shown} brings its own "
                        f"model ({workload_label(spec.workload)}): set its size in workload.params")
    info = WORKLOADS[spec.workload["name"]]
    if preset != "auto" and preset not in info.presets:
        raise UserError(f"--preset {preset}: {spec.workload['name']} has no such preset{did_you_mean(preset, info.presets)}; "
                        f"presets: auto, {', '.join(info.presets)}")
    return dataclasses.replace(spec, workload={**spec.workload, "preset": preset})


def parse_overrides(pairs: tuple[str, ...], spec: Spec) -> dict:
    """`--set batch_size=64 --set precision=bf16-mixed` -> a validated partial config."""
    allowed = supported_knobs(spec.workload)
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--set {pair!r}: write it as KNOB=VALUE, e.g. --set batch_size=64")
        if not text.strip():  # YAML reads nothing as null, which every knob's check would call "None"
            raise UserError(f"--set {key}=: no value; write one after the =, as in --set batch_size=64")
        if key not in allowed:
            raise UserError(f"--set {key}: unknown knob{did_you_mean(key, allowed)}; knobs: {', '.join(sorted(allowed))}")
        if key in out:
            raise UserError(f"--set {key}: given twice; set each knob once")
        try:
            value = yaml.load(text, Loader=SpecLoader)
        except yaml.YAMLError:
            value = text
        check_value(key, value, f"--set {key}")
        check_knob_number(key, value, f"--set {key}")  # the spec's bounds: a child is not started to learn them
        check_like_held(key, value, spec)
        out[key] = value
    return out


def check_like_held(key: str, value, spec: Spec) -> None:
    """A param of your own model given a number where the spec or your file holds one: `--set width=abc`
    (config.yaml: `width: 8`) would start a trial only to fail inside your model's __init__."""
    if key in knobs.UNIVERSAL or "name" in spec.workload:
        return
    held = held_values(key, spec)
    if held and all(map(is_number, held)) and not is_number(value):
        origin = spec.workload.get("origins", {}).get(key)
        source = f"{spec.apply.file.name}'s {origin}" if origin and spec.apply else f"the spec's {key}"
        raise UserError(f"--set {key}: {value!r} is not a number; {key} takes a number, as {source} "
                        f"({held[0]}) shows")


def held_values(key: str, spec: Spec) -> tuple:
    """The values the spec holds for `key`: its searched values, its fixed one, or its workload param's."""
    if key in spec.search:
        return spec.search[key].choices or (spec.search[key].low, spec.search[key].high)
    if key in spec.fixed:
        return (spec.fixed[key],)
    return (spec.workload["params"][key],) if key in spec.workload.get("params", {}) else ()


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def trial_config(spec: Spec, overrides: dict) -> dict:
    """One config for `bench trial`: overrides, else the first choice of every searched knob."""
    params = {name: dim.choices[0] if dim.choices else dim.low for name, dim in spec.search.items()}
    params.update(overrides)
    config = spec.config(params)
    check_trainer_config(spec.workload, config)
    if spec.effective_batch and "accumulation" in overrides:
        raise UserError(f"--set accumulation: the spec derives it from effective_batch {spec.effective_batch} "
                        "(effective_batch / batch_size / nproc); leave it out, or set batch_size")
    if "accumulation" in overrides:
        config["accumulation"] = overrides["accumulation"]
    if "reshard_after_forward" in overrides and config.get("parallel") != "fsdp":
        raise UserError("--set reshard_after_forward: only means something with parallel=fsdp; "
                        "add --set parallel=fsdp or leave it out")
    return config


def keeps_effective_batch(spec: Spec, config: dict) -> bool:
    """batch_size x nproc divides the spec's effective_batch (or it names none): accumulation makes it exact."""
    return not spec.effective_batch or spec.effective_batch % (int(config["batch_size"]) * int(config.get("nproc", 1))) == 0


def check_effective_batch(spec: Spec, config: dict) -> None:
    """`bench trial --set` keeps the spec's effective batch, as a sweep does: a size that does not divide
    it silently measured another batch (batch 3 under 64 ran accumulation 21)."""
    if not keeps_effective_batch(spec, config):
        per_step = config["batch_size"] * config.get("nproc", 1)
        ranks = config.get("nproc", 1) > 1
        what = f"batch_size {config['batch_size']}" + (f" x nproc {config['nproc']} ({per_step})" if ranks else "")
        raise UserError(f"--set: {what} does not divide the spec's effective_batch "
                        f"{spec.effective_batch}; pick a size that does")


def all_configs(spec: Spec):
    """Every point of a finite search space (used to know when a sweep has measured them all)."""
    names = list(spec.search)
    values = [d.choices if d.choices else range(d.low, d.high + 1) for d in spec.search.values()]
    for combo in itertools.product(*values):
        yield spec.config(dict(zip(names, combo)))


# ---- names and numbers: checked once, on the built spec ------------------------------------------

_NOT_IN_A_NAME = re.compile(r"[/\\\x00-\x1f\x7f$`*?<>|;&()!'\"]")
_INVISIBLE = re.compile(r"[\u034f\u115f\u1160\u2800\u3164\uffa0\ufe00-\ufe0f]")
"""Letters and marks that draw nothing (Hangul fillers, the blank braille cell, variation selectors)."""


def check_name(name, where: str) -> str:
    """A study name becomes a folder under results/: a name, never a path (no '/', not '.' or '..'),
    and one a shell and a listing show as it is: no leading '-' (read as an option), no blank at either
    end, no invisible or direction-changing characters (U+202E shows "evil.yaml" as "lmay.live"), not hidden
    (a leading '.': `ls results` leaves it out), nothing a shell reads specially in the path bench prints
    (`$(...)`, a backquote, `*`, `?`, redirections, `;`, `&`, `|`, parentheses, `!`, quotes; `[`, a glob only
    where a file matches, stays: `run[1]` is a name people write)."""
    if isinstance(name, str) and len(name) > 200:  # a folder name is at most 255 bytes; bench adds to it
        raise UserError(f"{where}: the name is {len(name)} characters long; a study name is at most 200 "
                        "(it names a folder under results/): shorten it")
    if flaw := name_flaw(name):
        raise UserError(f"{where}: {as_written(name)} is not a plain name ({flaw}; it names a folder under results/); "
                        "use letters, digits, '-', '_', '.', '+', '=', ',', '@', '%' and inner spaces: no '/', nothing "
                        "a shell reads specially ($ ` * ? < > | ; & ( ) ! or a quote), no leading '-' or '.', no "
                        "blank at either end, no invisible character")
    return name


def name_flaw(name) -> str | None:
    """What keeps `name` from being a study's folder name, in words; None where nothing does."""
    if not isinstance(name, str) or not name.strip():
        return "it is not a name" if not isinstance(name, str) else "it is blank"
    if bad := _NOT_IN_A_NAME.search(name):
        return f"it holds {bad.group()!r}"
    if name.startswith((".", "-")):
        return f"it starts with {name[0]!r}"
    if name != name.strip():
        return "it has a blank at an end"
    if (_INVISIBLE.search(name) or unicodedata.category(name[0]).startswith("M")  # a mark joins what precedes it
            or any(unicodedata.category(c) in ("Cf", "Cc", "Cs", "Zl", "Zp") for c in name)):
        return "it holds a character that draws nothing or turns the text around"
    return None


DAY = 86400.0
LIMITS = {
    # field of Spec (or of its Measure): (lowest, highest). A comparison with NaN is false, so NaN fails too.
    "trials": (1, 1_000_000),
    "timeout_s": (1.0, 366 * DAY),  # a sweep shorter than a second starts no trial
    "trial_timeout_s": (1.0, 7 * DAY),  # shorter, every trial ends in its own start-up
    "stall_s": (1.0, 7 * DAY),
    "memory_budget": (1, 2**50),
    "headroom": (0.0, 0.99),
    "seed": (0, 2**32 - 1),  # what numpy's generators (Optuna's samplers) take
    "effective_batch": (1, 2**24),
    "measure.warmup_steps": (1, 1_000_000),  # the last one regrows the cache the steady window emptied, untimed
    "measure.window_s": (0.001, 3600.0),
    "measure.min_windows": (1, 100_000),
    "measure.max_windows": (1, 100_000),
    "measure.target_cv": (0.000001, 10.0),
    "measure.max_seconds": (0.001, 7 * DAY),
    "measure.loss_tolerance": (0.000001, 1_000_000.0),
}
SPEC_KEYS = {"timeout_s": "timeout", "trial_timeout_s": "trial.timeout", "stall_s": "trial.stall",
             "memory_budget": "memory.budget", "headroom": "memory.headroom",
             "effective_batch": "search.accumulation.effective_batch", "measure.window_s": "trial.window"}


MAX_CONFIGS = 1_000_000
"""The most configs a search space may hold (the planner scores them all before every trial)."""
MAX_VALUES = 512
"""The most values of the knobs other than batch_size and accumulation, together: the planner's model
fits one term per value (harness.model.knob_levels), solved as a dense least-squares problem, so its
time grows with their cube (513 values of seq_len planned in a second, 1,025 in a minute, 2,041 not in
four; 99,993 asked numpy for 298 GiB)."""


def seconds_words(seconds: float) -> str:
    """A duration limit as the spec would write it: 366 days, 1 s."""
    return f"{seconds / DAY:g} days" if seconds >= DAY else f"{seconds:g} s"


def short_timeout(timeout_s: float, spec: Spec) -> str | None:
    """Why a trial timeout would stop every trial while it measures (the spec's and `bench trial --timeout`'s rule)."""
    if timeout_s > spec.measure.max_seconds:
        return None
    return (f"must be longer than trial.max_seconds ({spec.measure.max_seconds:g} s), the longest a trial measures, "
            "with room for its build, compile and warm-up")


def check_numbers(spec: Spec, where: str) -> None:
    """Every number of the spec finite and in range (LIMITS, knobs.LIMITS): one line naming the field."""
    for name, (low, high) in LIMITS.items():
        owner, _, attr = name.rpartition(".")
        value = getattr(spec.measure if owner else spec, attr)
        if value is not None and not low <= value <= high:
            key = SPEC_KEYS.get(name, name.replace("measure.", "trial."))
            if name == "memory_budget" and value > high:  # said in TiB, as --memory-budget says it, not in bytes
                raise UserError(f"{where}: {key}: a memory budget is at most {high / 1024**4:g} TiB; give one like 24GiB")
            if name.endswith("_s"):  # said as durations: "1e+20 s, over 366 days", not 31622400.0
                raise UserError(f"{where}: {key} must be between {seconds_words(low)} and {seconds_words(high)}, "
                                f"got {seconds_words(value)}")
            raise UserError(f"{where}: {key} must be between {low!r} and {high!r}, got {as_written(value)}")
    window = spec.measure.window_s
    if window * 2 > spec.stall_s:  # a window ends with one whole step more than its target
        raise UserError(f"{where}: trial.window ({window:g} s) must be at most half of trial.stall ({spec.stall_s:g} s): "
                        "a trial reports progress once per window, so every trial would read as a hang; "
                        "shorten trial.window (default 0.5s) or raise trial.stall")
    if why := short_timeout(spec.trial_timeout_s, spec):  # `timeout: 5` is seconds: every trial timed out
        raise UserError(f"{where}: trial.timeout ({spec.trial_timeout_s:g} s) {why}: raise trial.timeout (default 5m; "
                        "durations: 90s, 10m) or lower trial.max_seconds")
    for knob, dim in spec.search.items():
        values = dim.choices or [v for v in (dim.low, dim.high) if isinstance(v, int)]  # high may be `auto`
        for value in values:
            check_knob_number(knob, value, f"{where}: search.{knob}")
        if not dim.choices and all(isinstance(v, int) for v in (dim.low, dim.high)) and dim.size() > 1_000_000:
            raise UserError(f"{where}: search.{knob}: the range {dim.low}..{dim.high} holds over a million values; "
                            "narrow it or give a list")
    counted = [dim.size() for dim in spec.search.values() if dim.choices or isinstance(dim.high, int)]
    if math.prod(counted) > MAX_CONFIGS:  # the planner predicts every config of the space before each trial
        raise UserError(f"{where}: search: the space holds {math.prod(counted):,} configs, over {MAX_CONFIGS:,}; "
                        "narrow an integer range, give a list, or use batch_size: {low: N, high: auto}")
    levels = {knob: dim.size() for knob, dim in spec.search.items() if knob not in ("batch_size", "accumulation")}
    if sum(levels.values()) > MAX_VALUES:
        knob = max(levels, key=levels.get)
        raise UserError(f"{where}: search.{knob}: {levels[knob]:,} values ({sum(levels.values()):,} with the other "
                        f"knobs'), over the {MAX_VALUES} that knobs other than batch_size and accumulation may have "
                        "together (the planner models each value); give a list of the values worth measuring, "
                        f"e.g. {few_of(spec.search[knob])}")
    for knob, value in spec.fixed.items():
        check_knob_number(knob, value, f"{where}: search.{knob}")


def few_of(dim: Dimension) -> str:
    """Four values spread over a dimension, as a list to write in its place (`num_workers` was offered
    [128, 256, 512, 1024])."""
    if dim.choices:
        picked = [dim.choices[round(i * (len(dim.choices) - 1) / 3)] for i in range(4)]
    else:
        picked = [dim.low + i * (dim.high - dim.low) // 3 for i in range(4)]
    return "[" + ", ".join(map(str, dict.fromkeys(picked))) + "]"


def check_knob_number(knob: str, value, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    highest = knobs.LIMITS.get(knob, 2**31 - 1)
    if not -(2**31) <= value <= highest:  # NaN and infinities fail this too
        raise UserError(f"{where}: {as_written(value)} is out of range; {knob} values must be finite and at most {highest}")


# ---- small validators ---------------------------------------------------------------------------

def check_keys(mapping: dict, allowed, where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise UserError(f"{where}: unknown key {key!r}{did_you_mean(str(key), allowed)}; "
                            f"allowed: {', '.join(allowed)}")


def as_mapping(value, where: str) -> dict:
    if value is None:
        raise UserError(f"{where}: missing or empty; it must be a mapping of keys")
    if not isinstance(value, dict):
        raise UserError(f"{where}: must be a mapping of keys, got {type(value).__name__} {value!r}")
    return value


def int_value(value, where: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{where}: must be a whole number, got {as_written(value)}")
    if minimum is not None and value < minimum:
        raise UserError(f"{where}: must be at least {minimum}, got {value}")
    return value


def spec_trials(value, where: str) -> int:
    """The spec's `trials`: the most a sweep runs. `auto` is how the command line stops earlier (its
    default), not a cap, so it is refused with what to write instead."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        raise UserError(f"{where}: trials: auto is the command line's default (`bench sweep --trials auto` stops on "
                        "its own); the spec's trials is its cap: give a whole number, e.g. trials: 12")
    return positive_int(value, f"{where}: trials")


def positive_int(value, where: str) -> int:
    return int_value(value, where, minimum=1)


def deep_merge(base: dict, overrides: dict) -> dict:
    """Scenario overrides: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
