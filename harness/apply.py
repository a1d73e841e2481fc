"""`bench apply`: write the chosen knob values back into the user's own training config.

The spec's `apply:` section names the config file and a key map: which dotted key of that file
holds each knob and how its values are spelled there (presets cover PyTorch Lightning, Hugging Face
TrainingArguments and DeepSpeed; `keys:` overrides them per knob).

Edits are made in the text, not by re-dumping a parsed tree. The file is parsed twice: into plain
values (what the training program will read) and into a ruamel node tree that knows the character
span of every scalar. Each changed value is spliced into its span, and new keys are inserted after
the last line of their parent mapping. Every other byte (comments, blank lines, indentation,
alignment, quoting, flow style, CRLF line ends) stays as it was, which a ruamel round-trip dump
does not guarantee (it re-indents, folds long lines and normalises spacing). The result is parsed
again and compared with the expected values before anything is written.

Provenance (which study, trial, device and measurement the values come from):
- YAML: a comment block at the top of the file, lines starting with PROVENANCE_MARK; a re-apply
  replaces the block instead of stacking a new one above it.
- JSON cannot hold comments, and the programs that read these files (DeepSpeed, HfArgumentParser)
  reject unknown keys, so provenance goes to a sidecar `<file>.bench.json`, overwritten per apply.

Writing is atomic (temp file in the same folder, fsync, os.replace) and keeps a backup of the file
it replaces as `<file>.bench-backup-YYYYmmdd-HHMMSS` (plus `-2`, `-3`, ... within one second), so
every apply can be undone, not only the last one.
"""
from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import stat
import tempfile
import time
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness.errors import UserError
from harness.units import gib
from harness.workloads import UNIVERSAL_KNOBS

PROVENANCE_MARK = "# bench apply:"
BACKUP_INFIX = ".bench-backup-"
SIDECAR_SUFFIX = ".bench.json"

FORMATS = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}
LR_SCALES = ("linear", "sqrt")

# Knobs with a closed set of values: values read from a file must land in these.
KNOB_CHOICES = {
    "precision": ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-true"),
    "checkpointing": ("none", "full", "selective"),
    "compile": ("off", "default", "reduce-overhead", "max-autotune"),
}
CORE_KNOBS = ("batch_size", "accumulation", "precision", "checkpointing", "compile")


class _Absent:
    """Marks a key that is not in the file (None is a real YAML/JSON value)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


# ---------------------------------------------------------------------------------------------
# What the spec says


@dataclass(frozen=True)
class KeyMap:
    """Where one knob lives in the target file and how its values are spelled there."""

    key: str
    """Dotted path of the key in the file, e.g. "trainer.precision"."""
    values: Mapping[str, object] | None = None
    """bench value -> file value. None writes the bench value as is. A bench value missing here
    leaves this key alone, so one knob can spread over several keys (HF `bf16` and `fp16`)."""
    default: object = ABSENT
    """What the training program assumes when the key is missing. Writing that value to a missing
    key is skipped (no need for --create-keys to write `fp16: false`); ABSENT when unknown."""
    aliases: Mapping[object, object] = field(default_factory=dict)
    """Other spellings the program accepts for a file value (Lightning `16` = "16-mixed")."""

    def canonical(self, file_value: object) -> object:
        """The file value with aliases resolved, for comparing against mapped values."""
        try:
            return self.aliases.get(file_value, file_value)
        except TypeError:  # unhashable: a list or mapping is never an alias
            return file_value


@dataclass(frozen=True)
class LrRule:
    """Rescale the learning rate when the effective batch (batch_size * accumulation) changes."""

    key: str
    """Dotted path of the learning rate in the file."""
    scale: str
    """"linear" (lr * new/old) or "sqrt" (lr * sqrt(new/old))."""


@dataclass(frozen=True)
class ApplyTarget:
    """The parsed `apply:` section of a sweep spec."""

    file: Path
    """Absolute path of the user's config file (it need not exist until it is read)."""
    format: str
    """"yaml" or "json", from the file's extension."""
    preset: str
    """"plain", "lightning", "hf" or "deepspeed": where the key map's defaults came from."""
    keys: Mapping[str, tuple[KeyMap, ...]]
    """knob -> the keys it is written to: the preset's maps with the spec's `keys:` laid over
    them. A knob absent here is reported as unmapped and never written."""
    lr: LrRule | None = None
    """Learning-rate rule, or None to leave the learning rate alone."""
    hydra_group_dir: Path | None = None
    """Absolute path of a Hydra config group folder for per-device profiles, or None."""
    world_size: int = 1
    """Processes that train together; only DeepSpeed's `train_batch_size` uses it."""


@dataclass(frozen=True)
class Plan:
    """A write that has been computed and can be shown (diff) before it is made."""

    source: Path | None
    """File the old text was read from; write() refuses if it changed since. None: a new file."""
    path: Path
    """Where write() puts new_text."""
    old_text: str
    new_text: str
    diff: str
    """Unified diff from the source's text to new_text."""
    changes: list[tuple[str, object, object]]
    """(dotted key, old value or None when created, new value) for every key that changes."""
    unmapped: list[str]
    """Knobs of the chosen config that the key map does not place anywhere."""
    sidecar: Path | None = None
    """JSON targets: the provenance file written next to `path`."""
    sidecar_text: str | None = None


# ---------------------------------------------------------------------------------------------
# Presets: the keys each framework's config uses for the knobs (values read as "bench -> file").

_NO_YES = {"fp32": False, "tf32": False, "bf16-mixed": False, "fp16-mixed": False}

PRESETS: dict[str, dict[str, tuple[KeyMap, ...]]] = {
    # A knob name is its own top-level key; only the core knobs, since a top-level `optimizer:`
    # or `seq_len:` in an arbitrary file too often means something else.
    "plain": {knob: (KeyMap(knob),) for knob in CORE_KNOBS},
    # LightningCLI config. The batch size lives in the datamodule: `data.batch_size` is the usual
    # spelling when the datamodule is fixed; map `batch_size` yourself for `data.init_args.batch_size`.
    "lightning": {
        "batch_size": (KeyMap("data.batch_size"),),
        "accumulation": (KeyMap("trainer.accumulate_grad_batches", default=1),),
        "precision": (KeyMap(
            "trainer.precision",
            values={"fp32": "32-true", "tf32": "32-true", "bf16-mixed": "bf16-mixed",
                    "fp16-mixed": "16-mixed", "bf16-true": "bf16-true"},
            default="32-true",
            aliases={32: "32-true", "32": "32-true", 16: "16-mixed", "16": "16-mixed", "bf16": "bf16-mixed"},
        ),),
    },
    # transformers.TrainingArguments as YAML/JSON. Precision spreads over three booleans; `tf32`
    # only says something for fp32/tf32 and is left alone otherwise. No bf16-true, no selective
    # checkpointing: choosing those is refused rather than silently written as something else.
    "hf": {
        "batch_size": (KeyMap("per_device_train_batch_size", default=8),),
        "accumulation": (KeyMap("gradient_accumulation_steps", default=1),),
        "precision": (
            KeyMap("bf16", values={**_NO_YES, "bf16-mixed": True}, default=False),
            KeyMap("fp16", values={**_NO_YES, "fp16-mixed": True}, default=False),
            KeyMap("tf32", values={"fp32": False, "tf32": True}, default=False),
        ),
        "checkpointing": (KeyMap("gradient_checkpointing", values={"none": False, "full": True}, default=False),),
        "compile": (
            KeyMap("torch_compile", values={"off": False, "default": True, "reduce-overhead": True,
                                            "max-autotune": True}, default=False),
            KeyMap("torch_compile_mode", values={m: m for m in ("default", "reduce-overhead", "max-autotune")},
                   default="default", aliases={None: "default"}),
        ),
        "num_workers": (KeyMap("dataloader_num_workers", default=0),),
        "pin_memory": (KeyMap("dataloader_pin_memory", default=True),),
    },
    # DeepSpeed config JSON. `train_batch_size`, when present, is kept equal to
    # micro * accumulation * world_size (DeepSpeed refuses a config where it is not).
    "deepspeed": {
        "batch_size": (KeyMap("train_micro_batch_size_per_gpu"),),
        "accumulation": (KeyMap("gradient_accumulation_steps", default=1),),
        "precision": (
            KeyMap("bf16.enabled", values={**_NO_YES, "bf16-mixed": True}, default=False),
            KeyMap("fp16.enabled", values={**_NO_YES, "fp16-mixed": True}, default=False),
        ),
    },
}


# ---------------------------------------------------------------------------------------------
# Parsing the spec's `apply:` section

_SECTION_KEYS = ("file", "preset", "keys", "lr", "hydra", "world_size")


def parse_apply_section(raw: object, base_dir: Path, where: str, *,
                        known_knobs: Collection[str] | None = None) -> ApplyTarget:
    """Validate the spec's `apply:` mapping; `where` names the spec (messages read "<where>: apply.x: ...").

    `file` and `hydra.group_dir` are relative to `base_dir`, the spec's folder. The file need not
    exist yet: it is checked when it is read. `known_knobs` (the workload's supported knobs) makes
    any other knob name under `keys:` an error; without it only a misspelt universal knob
    ("batchsize", "Batch-Size") is caught, since a workload may bring knobs of its own.
    """
    section = _mapping(raw, f"{where}: apply", _SECTION_KEYS)
    if "file" not in section:
        raise UserError(f"{where}: apply: `file` is missing; name the training config to write, e.g. file: config.yaml")
    file = (Path(base_dir) / _text(section["file"], f"{where}: apply.file")).resolve()
    fmt = FORMATS.get(file.suffix.lower())
    if fmt is None:
        raise UserError(f"{where}: apply.file: {file.name} is neither YAML (.yaml, .yml) nor JSON (.json); "
                        "point it at the training config")
    preset = section.get("preset", "plain")
    if preset not in PRESETS:
        raise UserError(f"{where}: apply.preset: unknown preset {preset!r}{_did_you_mean(preset, PRESETS)}; "
                        f"use one of {', '.join(PRESETS)}")
    keys = dict(PRESETS[preset])
    for knob, entry in _mapping(section.get("keys", {}), f"{where}: apply.keys").items():
        _check_knob_name(knob, known_knobs, f"{where}: apply.keys.{knob}")
        keys[knob] = _parse_knob_entry(knob, entry, f"{where}: apply.keys.{knob}")
    return ApplyTarget(
        file=file, format=fmt, preset=preset,
        keys={knob: maps for knob, maps in keys.items() if maps},
        lr=_parse_lr(section["lr"], f"{where}: apply.lr") if section.get("lr") is not None else None,
        hydra_group_dir=(_parse_hydra(section["hydra"], base_dir, f"{where}: apply.hydra")
                         if section.get("hydra") else None),
        world_size=_positive_int(section.get("world_size", 1), f"{where}: apply.world_size"),
    )


def _check_knob_name(knob: object, known_knobs: Collection[str] | None, where: str) -> None:
    if not isinstance(knob, str) or not knob:
        raise UserError(f"{where}: a knob name must be a non-empty string")
    if known_knobs is not None and knob not in known_knobs:
        raise UserError(f"{where}: the workload has no knob {knob!r}{_did_you_mean(knob, known_knobs)}; "
                        f"its knobs: {', '.join(sorted(known_knobs))}")
    squashed = {re.sub(r"[^a-z0-9]", "", k): k for k in UNIVERSAL_KNOBS}
    twin = squashed.get(re.sub(r"[^a-z0-9]", "", knob.lower()))
    if twin is not None and twin != knob:
        raise UserError(f"{where}: unknown knob {knob!r} (did you mean {twin!r}?); use the knob's exact name")


def _parse_knob_entry(knob: str, entry: object, where: str) -> tuple[KeyMap, ...]:
    """`dotted.key`, `{key, values}`, a list of those (one knob, several keys), or null (never write it)."""
    if entry is None:
        return ()
    entries = entry if isinstance(entry, list) else [entry]
    return tuple(_parse_key_map(knob, e, f"{where}[{i}]" if isinstance(entry, list) else where)
                 for i, e in enumerate(entries))


def _parse_key_map(knob: str, entry: object, where: str) -> KeyMap:
    if isinstance(entry, str):
        return KeyMap(_dotted_key(entry, where))
    spec = _mapping(entry, where, ("key", "values"))
    if "key" not in spec:
        raise UserError(f"{where}: `key` is missing; write e.g. {{key: trainer.precision, values: {{...}}}}")
    values = spec.get("values")
    if values is None:
        return KeyMap(_dotted_key(spec["key"], f"{where}.key"))
    return KeyMap(_dotted_key(spec["key"], f"{where}.key"), values=_parse_value_map(knob, values, f"{where}.values"))


def _parse_value_map(knob: str, raw: object, where: str) -> dict[str, object]:
    choices = KNOB_CHOICES.get(knob)
    values = {}
    for bench_value, file_value in _mapping(raw, where).items():
        # A YAML 1.1 loader reads an unquoted `off:` as False; it can only have meant "off".
        if choices and bench_value is False:
            bench_value = "off"
        if choices and bench_value not in choices:
            close = _did_you_mean(str(bench_value), choices)
            raise UserError(f"{where}: {bench_value!r} is not a {knob} value{close}; use {', '.join(choices)}")
        values[bench_value] = file_value
    return values


def _parse_lr(raw: object, where: str) -> LrRule:
    spec = _mapping(raw, where, ("key", "scale"))
    if "key" not in spec:
        raise UserError(f"{where}: `key` is missing; write e.g. lr: {{key: optimizer.lr, scale: linear}}")
    scale = spec.get("scale", "linear")
    if scale not in LR_SCALES:
        close = _did_you_mean(str(scale), LR_SCALES)
        raise UserError(f"{where}.scale: unknown scale {scale!r}{close}; use linear or sqrt")
    return LrRule(key=_dotted_key(spec["key"], f"{where}.key"), scale=scale)


def _parse_hydra(raw: object, base_dir: Path, where: str) -> Path:
    spec = _mapping(raw, where, ("group_dir",))
    if "group_dir" not in spec:
        raise UserError(f"{where}: `group_dir` is missing; write e.g. hydra: {{group_dir: conf/hardware}}")
    return (Path(base_dir) / _text(spec["group_dir"], f"{where}.group_dir")).resolve()


def _mapping(raw: object, where: str, allowed: tuple[str, ...] | None = None) -> dict:
    """`raw` as a dict; with `allowed`, an unknown key is an error that suggests the closest one."""
    if not isinstance(raw, Mapping):
        raise UserError(f"{where}: expected a mapping, got {type(raw).__name__} {raw!r}")
    for key in raw:
        if allowed is not None and key not in allowed:
            raise UserError(f"{where}: unknown key {key!r}{_did_you_mean(str(key), allowed)}; "
                            f"allowed: {', '.join(allowed)}")
    return dict(raw)


def _dotted_key(raw: object, where: str) -> str:
    key = _text(raw, where)
    if any(not part.strip() for part in key.split(".")):
        raise UserError(f"{where}: {key!r} is not a dotted key; write it like trainer.precision")
    return key


def _text(raw: object, where: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise UserError(f"{where}: expected a non-empty string, got {raw!r}")
    return raw


def _positive_int(raw: object, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise UserError(f"{where}: expected a positive whole number, got {raw!r}")
    return raw


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------------------------------------
# Reading the user's current values


def read_current(target: ApplyTarget) -> dict:
    """The knob values the target file holds now, as bench values; knobs with no key there are left out."""
    return _read_knobs(target, _load_document(target.file, target.format), target.keys)


def _read_knobs(target: ApplyTarget, doc: _Document, knobs) -> dict:
    current = {}
    for knob in knobs:
        value = _read_knob(doc, knob, target.keys.get(knob, ()))
        if value is not ABSENT:
            current[knob] = value
    return current


def _read_knob(doc: _Document, knob: str, maps: tuple[KeyMap, ...]) -> object:
    found = {m.key: _file_value(doc, m.key) for m in maps}
    if all(v is ABSENT for v in found.values()):
        return ABSENT
    if all(m.values is not None for m in maps):
        value = _decode(maps, found)
    else:  # a key that holds the bench value as is
        value = next((found[m.key] for m in maps if m.values is None and found[m.key] is not ABSENT), ABSENT)
        if value is ABSENT:
            return ABSENT
    return _checked_knob_value(doc, knob, found, value)


def _file_value(doc: _Document, key: str) -> object:
    """The value at a dotted key, ABSENT when missing. null and "auto" (DeepSpeed/HF: filled in at
    launch) count as missing: the file leaves the value to someone else."""
    value = _lookup(doc.data, key)
    if isinstance(value, (dict, list)):
        raise UserError(f"{doc.path}: {key} holds a {type(value).__name__}, not a single value; "
                        "map the knob to the key inside it that holds the value")
    return ABSENT if value is None or value == "auto" else value


def _decode(maps: tuple[KeyMap, ...], found: dict[str, object]) -> object:
    """The first bench value every key agrees with (a missing key counts as its default)."""
    candidates = dict.fromkeys(v for m in maps for v in m.values)
    for candidate in candidates:
        if all(_agrees(m, found[m.key], candidate) for m in maps):
            return candidate
    return None  # reported by _checked_knob_value


def _agrees(m: KeyMap, file_value: object, candidate: str) -> bool:
    if candidate not in m.values:
        return True  # this key says nothing about the candidate
    if file_value is ABSENT:
        file_value = m.default
        if file_value is ABSENT:
            return True
    return _same(m.canonical(file_value), m.values[candidate])


def _checked_knob_value(doc: _Document, knob: str, found: dict[str, object], value: object) -> object:
    choices = KNOB_CHOICES.get(knob)
    if knob in ("batch_size", "accumulation"):
        valid = isinstance(value, int) and not isinstance(value, bool) and value > 0
    else:
        valid = value is not None and (choices is None or value in choices)
    if not valid:
        shown = ", ".join(f"{k}: {json.dumps(v, default=str)}" for k, v in found.items() if v is not ABSENT)
        raise UserError(f"{doc.path}: cannot tell which {knob} `{shown}` means; map its spelling under "
                        f"apply.keys.{knob}.values, or set apply.keys.{knob}: null to leave it out")
    return value


# ---------------------------------------------------------------------------------------------
# Planning a write


@dataclass(frozen=True)
class _Assignment:
    """One key the plan wants to hold one value."""

    map: KeyMap
    value: object
    """The file value (already spelled through map.values)."""
    origin: str
    """The part of the spec that asked for it, for messages."""

    @property
    def key(self) -> str:
        return self.map.key


def plan(target: ApplyTarget, values: dict, provenance: dict, *, to: Path | None = None,
         create_keys: bool = False, current_values: dict | None = None) -> Plan:
    """The new text of the target (or of `to`) holding `values`; nothing is written.

    `provenance`: study, trial, device, throughput (samples/s), peak_memory (bytes), date,
    bench_version; any other keys are recorded as key=value. `current_values` (the knobs the
    learning-rate rule compares against) defaults to what the file holds now.
    """
    destination = Path(to).resolve() if to is not None else target.file
    if FORMATS.get(destination.suffix.lower()) != target.format:
        raise UserError(f"--to {destination.name}: must be a {target.format.upper()} file like {target.file.name}")
    doc = _load_document(target.file, target.format)
    assignments = _assignments(target, values, doc, current_values)
    edits = _edits(doc, assignments, create_keys)
    body = _apply_edits(doc, edits)
    changes = [(a.key, None if old is ABSENT else old, a.value) for a, old in edits]
    unmapped = [knob for knob in values if knob not in target.keys]
    if target.format == "yaml":
        new_text, sidecar, sidecar_text = _with_provenance_comment(body, provenance), None, None
    else:
        new_text = body
        sidecar = destination.with_name(destination.name + SIDECAR_SUFFIX)
        sidecar_text = _sidecar_json(destination, provenance, changes)
    _verify(doc, new_text, assignments)
    return Plan(source=target.file, path=destination, old_text=doc.text, new_text=new_text,
                diff=_diff(doc.text, new_text, target.file, destination), changes=changes,
                unmapped=unmapped, sidecar=sidecar, sidecar_text=sidecar_text)


def _assignments(target: ApplyTarget, values: dict, doc: _Document,
                 current_values: dict | None) -> list[_Assignment]:
    """Every key the chosen values put into the file, in key-map order."""
    out = []
    for knob, value in values.items():
        out += _knob_assignments(target, knob, value)
    if target.lr is None and target.preset != "deepspeed":
        return out
    # Only these rules look at the current batch; reading it otherwise could refuse a file for
    # nothing (e.g. an interpolated `batch_size: ${data.bs}`).
    current = current_values if current_values is not None else _read_knobs(target, doc, ("batch_size", "accumulation"))
    if target.lr is not None:
        out += _lr_assignment(target.lr, doc, values, current)
    if target.preset == "deepspeed":
        out += _deepspeed_total(target, doc, values, current)
    return out


def _knob_assignments(target: ApplyTarget, knob: str, value: object) -> list[_Assignment]:
    from_preset = target.keys.get(knob) is PRESETS[target.preset].get(knob)
    origin = f"preset {target.preset}, knob {knob}" if from_preset else f"apply.keys.{knob}"
    out = []
    for m in target.keys.get(knob, ()):
        if m.values is None:
            out.append(_Assignment(m, value, origin))
        elif value in m.values:
            out.append(_Assignment(m, m.values[value], origin))
    if knob in target.keys and not out:
        keys = ", ".join(m.key for m in target.keys[knob])
        raise UserError(f"{target.file}: {knob}={value} cannot be written: {origin} has no spelling for it in {keys}; "
                        f"add one under apply.keys.{knob}.values, or leave {value} out of the sweep")
    return out


def _effective_batch(knobs: dict, fallback: dict) -> int | None:
    batch = knobs.get("batch_size", fallback.get("batch_size"))
    if batch is None:
        return None
    return batch * knobs.get("accumulation", fallback.get("accumulation", 1))


def _lr_assignment(rule: LrRule, doc: _Document, values: dict, current: dict) -> list[_Assignment]:
    """The learning rate rescaled for the new effective batch; nothing when that batch is unchanged."""
    old_batch, new_batch = _effective_batch(current, {}), _effective_batch(values, current)
    if old_batch is None:
        raise UserError(f"{doc.path}: apply.lr: the current batch size is unknown (no batch_size key in the file), "
                        "so the learning rate cannot be rescaled; map batch_size or remove apply.lr")
    if new_batch == old_batch:
        return []
    lr = _lookup(doc.data, rule.key)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise UserError(f"{doc.path}: apply.lr.key {rule.key} must hold a number to rescale, found {lr!r}; "
                        "fix apply.lr.key or remove apply.lr")
    ratio = new_batch / old_batch
    factor = ratio if rule.scale == "linear" else math.sqrt(ratio)
    return [_Assignment(KeyMap(rule.key), float(f"{lr * factor:.6g}"), f"apply.lr ({rule.scale})")]


def _deepspeed_total(target: ApplyTarget, doc: _Document, values: dict, current: dict) -> list[_Assignment]:
    """DeepSpeed checks train_batch_size == micro * accumulation * world size: keep it true when present."""
    if not isinstance(_lookup(doc.data, "train_batch_size"), int):  # absent or "auto": DeepSpeed derives it
        return []
    per_process = _effective_batch(values, current)
    if per_process is None:
        return []
    return [_Assignment(KeyMap("train_batch_size"), per_process * target.world_size,
                        f"preset deepspeed (batch x accumulation x world_size {target.world_size})")]


def _edits(doc: _Document, assignments: list[_Assignment], create_keys: bool) -> list[tuple[_Assignment, object]]:
    """The assignments that change the file, each with its old value (ABSENT: the key is created)."""
    edits = []
    for a in assignments:
        if _already_implied(doc, a):
            continue
        old = _lookup(doc.data, a.key)
        if old is ABSENT:
            if not create_keys:
                raise UserError(f"{doc.path}: key {a.key} (from {a.origin}) is not in the file; add it, map the knob "
                                "to the key your file uses, or pass --create-keys to add it")
        elif isinstance(old, (dict, list)):
            raise UserError(f"{doc.path}: {a.key} (from {a.origin}) holds a {type(old).__name__}, not a single value; "
                            "map the knob to the key inside it")
        elif _same(a.map.canonical(old), a.value):
            continue  # same setting, maybe spelled another way (Lightning `16` is "16-mixed")
        edits.append((a, old))
    return edits


def _already_implied(doc: _Document, a: _Assignment) -> bool:
    """The key is missing and the program's default for it is the value: nothing to write."""
    return _lookup(doc.data, a.key) is ABSENT and _same(a.value, a.map.default)


def _same(a: object, b: object) -> bool:
    """Equal as the file's reader sees it: True is not 1, "1" is not 1."""
    numbers = (int, float)
    return (type(a) in numbers and type(b) in numbers or type(a) is type(b)) and a == b


def _verify(doc: _Document, new_text: str, assignments: list[_Assignment]) -> None:
    """Parse the new text and check it holds the old values plus the assignments, and nothing else."""
    expected = copy.deepcopy(doc.data)
    for a in assignments:
        if not _already_implied(doc, a):
            _set(expected, a.key, a.value)
    try:
        matches = _parse_data(new_text, doc.format, doc.path) == expected
    except UserError:
        matches = False
    if not matches:
        raise RuntimeError(f"bench apply: editing {doc.path} produced unexpected values; nothing was written. "
                           "This is a bench bug: please report it with the file.")


def _diff(old: str, new: str, source: Path, destination: Path) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=str(source), tofile=str(destination)))


# ---------------------------------------------------------------------------------------------
# Provenance


def _provenance_lines(provenance: dict) -> list[str]:
    """E.g. "written by bench 0.1.0 on 2025-06-01 from study s1 trial 17" and
    "measured on NVIDIA H200, 1234.5 samples/s, peak memory 12.00 GiB"; other keys as key=value."""
    p = {k: v for k, v in provenance.items() if v is not None}
    written = ["written by bench", str(p.pop("bench_version", ""))]
    for key, form in (("date", "on {}"), ("study", "from study {}"), ("trial", "trial {}")):
        if key in p:
            written.append(form.format(p.pop(key)))
    measured = []
    if "device" in p:
        measured.append(f"on {p.pop('device')}")
    if "throughput" in p:
        measured.append(f"{p.pop('throughput'):.1f} samples/s")
    if "peak_memory" in p:
        measured.append(f"peak memory {gib(p.pop('peak_memory'))}")
    lines = [" ".join(w for w in written if w)]
    if measured:
        lines.append("measured " + ", ".join(measured))
    if p:
        lines.append(", ".join(f"{k}={v}" for k, v in p.items()))
    return [f"{PROVENANCE_MARK} {line}" for line in lines]


def _with_provenance_comment(text: str, provenance: dict) -> str:
    """The text with the provenance block at the top, replacing the block a previous apply left."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    header = 0  # Hydra reads `# @package ...` only from the leading `# @` lines: keep them first
    while header < len(lines) and lines[header].startswith("# @"):
        header += 1
    body = lines[header:]
    while body and body[0].startswith(PROVENANCE_MARK):
        body.pop(0)
    block = "".join(line + newline for line in _provenance_lines(provenance))
    return "".join(lines[:header]) + block + "".join(body)


def _sidecar_json(destination: Path, provenance: dict, changes: list) -> str:
    record = {"file": destination.name, "provenance": provenance,
              "changes": [{"key": k, "old": old, "new": new} for k, old, new in changes]}
    return json.dumps(record, indent=2, default=str) + "\n"


# ---------------------------------------------------------------------------------------------
# The document: text, plain values and positioned nodes


@dataclass(frozen=True)
class _Document:
    path: Path
    format: str
    text: str
    data: dict
    """Plain values, as the training program reads them."""
    root: MappingNode
    """ruamel node tree whose marks give every scalar's character span in `text`."""


def _load_document(path: Path, fmt: str) -> _Document:
    text = _read_text(path)
    data = _parse_data(text, fmt, path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level is a {type(data).__name__}, not a mapping of keys; "
                        "bench writes into a config of key: value pairs")
    try:
        root = YAML(typ="rt").compose(text)
    except YAMLError as e:  # valid JSON that YAML cannot place, e.g. duplicate keys
        raise UserError(f"{path}: cannot edit this file in place: {_first_line(e)}") from None
    return _Document(path, fmt, text, data, root)


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found; check apply.file in the spec") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file; point apply.file at the YAML or JSON training config"
                        ) from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror}); check the path and its permissions") from None


def _parse_data(text: str, fmt: str, path: Path | None = None) -> object:
    try:
        if fmt == "json":
            return json.loads(text.lstrip("\ufeff"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return YAML(typ="safe", pure=True).load(text)
    except (ValueError, YAMLError) as e:
        raise UserError(f"{path}: not valid {fmt.upper()}: {_first_line(e)}; fix the file or point apply.file "
                        "at the training config") from None


def _first_line(error: Exception) -> str:
    return " ".join(str(error).split("\n")[:2]).strip()


def _lookup(data: object, key: str) -> object:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return ABSENT
        data = data[part]
    return data


def _set(data: dict, key: str, value: object) -> None:
    *parents, last = key.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[last] = value


# ---------------------------------------------------------------------------------------------
# Text edits: (start, end, replacement) splices on the original text


def _apply_edits(doc: _Document, edits: list[tuple[_Assignment, object]]) -> str:
    splices = [_replace_value(doc, a.key, a.value) for a, old in edits if old is not ABSENT]
    splices += _insert_keys(doc, [(a.key, a.value) for a, old in edits if old is ABSENT])
    text = doc.text
    for start, end, new in sorted(splices, key=lambda s: s[0], reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _child(node: Node, name: str) -> tuple[ScalarNode, Node] | None:
    """The (key node, value node) written under `name` in a mapping node; None if not written there."""
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == name:
                return key_node, value_node
    return None


def _replace_value(doc: _Document, key: str, value: object) -> tuple[int, int, str]:
    node = doc.root
    for part in key.split("."):
        pair = _child(node, part)
        if pair is None:
            raise UserError(f"{doc.path}: {key} comes from a YAML merge (<<) or alias, not from a line bench can "
                            "edit; write the key out in the file")
        key_node, node = pair
        _refuse_shared(doc, key, node)
    start, end = _scalar_span(doc.text, key_node, node)
    old_token = doc.text[start:end]
    rendered = _render(value, doc.format, old_token, node.style)
    if start == end:  # `key:` with no value: the null's mark sits after the line break
        return start, end, " " + rendered
    line_breaks = old_token[len(old_token.rstrip("\r\n")):]
    if line_breaks:  # a block scalar (|, >) ends with its line break(s)
        return start, end, rendered + line_breaks
    gap = re.compile(r"[ ]+(?=#)").match(doc.text, end)
    if gap:  # keep an aligned end-of-line comment in its column where the new value leaves room
        end = gap.end()
        rendered += " " * max(1, len(gap.group()) - (len(rendered) - len(old_token)))
    return start, end, rendered


def _refuse_shared(doc: _Document, key: str, node: Node) -> None:
    """An anchored value (&x) is also every *x: changing it here would change those places too."""
    if node.anchor:
        raise UserError(f"{doc.path}: {key} goes through the YAML anchor &{node.anchor}, so changing it would "
                        "change every *alias too; write the value out at this key")


def _scalar_span(text: str, key_node: ScalarNode, node: ScalarNode) -> tuple[int, int]:
    start, end = node.start_mark.index, node.end_mark.index
    if start == end:
        colon = text.index(":", key_node.end_mark.index)
        return colon + 1, colon + 1
    if text[start] == "!":  # keep a tag (!!float) in front of the value
        start = re.compile(r"\S+\s+").match(text, start).end()
    return start, end


def _insert_keys(doc: _Document, new_keys: list[tuple[str, object]]) -> list[tuple[int, int, str]]:
    """Splices adding the missing keys: all keys under one existing mapping go in one place."""
    groups: dict[int, tuple[MappingNode, dict]] = {}
    for key, value in new_keys:
        node, rest = _deepest_mapping(doc, key)
        _, tree = groups.setdefault(id(node), (node, {}))
        _set(tree, ".".join(rest), value)
    return [_flow_insertion(doc, node, tree) if node.flow_style else _block_insertion(doc, node, tree)
            for node, tree in groups.values()]


def _deepest_mapping(doc: _Document, key: str) -> tuple[MappingNode, list[str]]:
    """The deepest mapping on the key's path that exists, and the parts of the key below it."""
    node, parts = doc.root, key.split(".")
    for i, part in enumerate(parts):
        pair = _child(node, part)
        if pair is None:
            return node, parts[i:]
        child = pair[1]
        if not isinstance(child, MappingNode):
            raise UserError(f"{doc.path}: cannot create {key}: {'.'.join(parts[:i + 1])} is not a mapping")
        _refuse_shared(doc, key, child)
        node = child
    raise AssertionError(f"{key} exists; it is replaced, not created")


def _block_insertion(doc: _Document, node: MappingNode, tree: dict) -> tuple[int, int, str]:
    """New `key: value` lines after the mapping's last line, at the indentation of its keys."""
    text, newline = doc.text, "\r\n" if "\r\n" in doc.text else "\n"
    at = _end_of_line(text, _last_end(node))
    indent = node.value[0][0].start_mark.column
    lines = _block_lines(tree, indent, _indent_step(doc.root), doc.format)
    lead = newline if at == len(text) and text and not text.endswith("\n") else ""
    return at, at, lead + "".join(line + newline for line in lines)


def _block_lines(tree: dict, indent: int, step: int, fmt: str) -> list[str]:
    lines = []
    for key, value in tree.items():
        if isinstance(value, dict):
            lines.append(f"{' ' * indent}{_render(key, fmt)}:")
            lines += _block_lines(value, indent + step, step, fmt)
        else:
            lines.append(f"{' ' * indent}{_render(key, fmt)}: {_render(value, fmt)}")
    return lines


def _flow_insertion(doc: _Document, node: MappingNode, tree: dict) -> tuple[int, int, str]:
    """New entries after the last entry of a `{...}` mapping (every JSON object is one)."""
    entries = _flow_entries(tree, doc.format)
    if not node.value:
        at = node.start_mark.index + 1
        return at, at, ", ".join(entries)
    last_key, last_value = node.value[-1]
    if last_key.start_mark.line > node.start_mark.line:  # one entry per line: follow that layout
        line_start = doc.text.rfind("\n", 0, last_key.start_mark.index) + 1
        newline = "\r\n" if "\r\n" in doc.text else "\n"
        separator = "," + newline + re.match(r"[ \t]*", doc.text[line_start:]).group()
    else:
        separator = ", "
    at = last_value.end_mark.index
    return at, at, "".join(separator + entry for entry in entries)


def _flow_entries(tree: dict, fmt: str) -> list[str]:
    return [f"{_render(k, fmt)}: " + ("{" + ", ".join(_flow_entries(v, fmt)) + "}" if isinstance(v, dict)
                                       else _render(v, fmt))
            for k, v in tree.items()]


def _last_end(node: Node) -> int:
    """Where the node's text ends; for a block collection, where its last value ends."""
    if isinstance(node, (MappingNode, SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        return _last_end(last[1] if isinstance(last, tuple) else last)
    return node.end_mark.index


def _end_of_line(text: str, index: int) -> int:
    """The start of the next line (a trailing comment stays with its key)."""
    if index == 0 or text[index - 1] == "\n":
        return index
    newline = text.find("\n", index)
    return len(text) if newline < 0 else newline + 1


def _indent_step(root: MappingNode) -> int:
    """How far the file indents a nested block mapping (2 when it has none)."""
    for key, value in root.value:
        if isinstance(value, MappingNode) and not value.flow_style and value.value:
            return value.value[0][0].start_mark.column - key.start_mark.column
    return 2


# ---------------------------------------------------------------------------------------------
# Spelling values


def _render(value: object, fmt: str, old_token: str = "", old_style: str | None = None) -> str:
    """The value as text, readable as the same value by YAML 1.1 (PyYAML), YAML 1.2 and JSON,
    in the old token's style where it had one (quotes, True vs true, 3.0e-4 vs 0.0003)."""
    if isinstance(value, bool):
        word = "true" if value else "false"
        if fmt == "yaml" and old_token[:1].isupper():
            word = word.upper() if old_token.isupper() else word.capitalize()
        return word
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value, scientific="e" in old_token.lower())
    if not isinstance(value, str):
        raise UserError(f"cannot write {type(value).__name__} value {value!r} into a config; only single values")
    if fmt == "yaml" and old_style == "'":
        return "'" + value.replace("'", "''") + "'"
    if fmt == "yaml" and old_style != '"' and _plain_is_safe(value):
        return value
    return json.dumps(value, ensure_ascii=False)  # a JSON string is also a YAML double-quoted scalar


def _float_text(value: float, scientific: bool) -> str:
    """The shortest exact spelling; an exponent gets a dot in the mantissa and a sign, without
    which PyYAML (YAML 1.1) reads `1e-05` as a string."""
    text = repr(value)
    if not scientific and "e" not in text:
        return text
    mantissa, exponent = format(Decimal(text).normalize(), "e").split("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{int(exponent):+d}"


_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+/-]*")


def _plain_is_safe(text: str) -> bool:
    """A string can go unquoted when YAML 1.1 and 1.2 both read it back as that string
    ("32-true" can, "off", "1e3" and "null" cannot)."""
    if not _PLAIN.fullmatch(text):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for version in ((1, 1), (1, 2)):
            reader = YAML(typ="safe", pure=True)
            reader.version = version
            if reader.load(text) != text:
                return False
    return True


# ---------------------------------------------------------------------------------------------
# Writing


def write(plan: Plan) -> Path | None:
    """Write the plan atomically; return the backup of the file it replaced (None for a new file).

    Refuses, leaving every file as it was, when the source changed or vanished since the plan, or
    when the destination or its folder is read-only (by mode bits, so even root respects them).
    """
    destination = plan.path.resolve()  # through a symlink: the link keeps pointing at the edited file
    _check_source_unchanged(plan)
    _check_writable(destination)
    backup = _backup(destination) if destination.exists() else None
    try:
        _atomic_write(destination, plan.new_text.encode("utf-8"), _mode_for(destination))
    except OSError as e:
        if backup is not None:
            backup.unlink(missing_ok=True)
        raise UserError(f"{destination}: could not write it ({e.strerror}); the file is unchanged") from None
    if plan.sidecar is not None:
        try:
            _atomic_write(plan.sidecar, plan.sidecar_text.encode("utf-8"), _mode_for(plan.sidecar))
        except OSError as e:
            raise UserError(f"{destination} was written, but its provenance file {plan.sidecar} could not be "
                            f"({e.strerror})") from None
    return backup


def _check_source_unchanged(plan: Plan) -> None:
    if plan.source is None:
        return
    try:
        now = plan.source.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{plan.source}: the file vanished after the plan was made; nothing was written") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{plan.source}: cannot read it again ({e}); nothing was written") from None
    if now != plan.old_text:
        raise UserError(f"{plan.source}: the file changed after the plan was made; run bench apply again")


def _check_writable(destination: Path) -> None:
    folder = destination.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)  # a new Hydra group folder, or a --to folder
    except OSError as e:
        raise UserError(f"{folder}: cannot create the folder ({e.strerror}); create it or write elsewhere "
                        "with --to") from None
    for path, what in ((destination, "file"), (folder, "folder")):
        if path.exists() and not _writable(path):
            raise UserError(f"{path}: the {what} is read-only; make it writable (chmod u+w) or write elsewhere "
                            "with --to")


def _writable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IWUSR) and os.access(path, os.W_OK)


def _backup(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup, n = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}"), 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}-{n}")
    try:
        _atomic_write(backup, path.read_bytes(), _mode_for(path))
    except OSError as e:
        raise UserError(f"{path}: could not write the backup {backup.name} ({e.strerror}); "
                        "the file is unchanged") from None
    return backup


def _mode_for(path: Path) -> int:
    """The existing file's permission bits, or what a new file gets under the current umask."""
    if path.exists():
        return stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Readers see the old bytes or the new ones, never a mix; a crash leaves the old file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power loss
    finally:
        os.close(folder)


# ---------------------------------------------------------------------------------------------
# Hydra: one profile per device in a config group


def write_hydra_profile(target: ApplyTarget, values: dict, device_name: str, provenance: dict) -> Plan:
    """Plan `<group_dir>/<device-slug>.yaml` holding the mapped keys (pass the Plan to write()).

    The profile is `# @package _global_` so its keys land where they are in the main config; pick
    it with `hardware=h200` (for group_dir conf/hardware). Keys must exist in the target file, as
    Hydra refuses to override keys the main config lacks. The learning rate is rescaled against
    the target's current values.
    """
    if target.hydra_group_dir is None:
        raise UserError("apply.hydra is not set in the spec; add apply: {hydra: {group_dir: conf/hardware}}")
    doc = _load_document(target.file, target.format)
    assignments = _assignments(target, values, doc, current_values=None)
    _edits(doc, assignments, create_keys=False)  # refuses keys the main config lacks
    profile = {}
    for a in assignments:
        if not _already_implied(doc, a):
            _set(profile, a.key, a.value)
    path = target.hydra_group_dir / f"{device_slug(device_name)}.yaml"
    old_text = path.read_text(encoding="utf-8") if path.exists() else ""
    old_data = _parse_data(old_text, "yaml", path) if old_text else {}
    lines = ["# @package _global_", *_provenance_lines(provenance), *_block_lines(profile, 0, 2, "yaml")]
    new_text = "".join(line + "\n" for line in lines)
    changes = [(a.key, _none_if_absent(_lookup(old_data, a.key)), a.value)
               for a in assignments if _lookup(profile, a.key) is not ABSENT]
    return Plan(source=path if old_text else None, path=path, old_text=old_text, new_text=new_text,
                diff=_diff(old_text, new_text, path, path), changes=changes,
                unmapped=[knob for knob in values if knob not in target.keys])


def _none_if_absent(value: object) -> object:
    return None if value is ABSENT else value


def device_slug(device_name: str) -> str:
    """"NVIDIA H200" -> "h200", "NVIDIA GeForce RTX 4090" -> "rtx-4090", "cpu" -> "cpu"."""
    words = re.findall(r"[a-z0-9]+", device_name.lower())
    words = [w for w in words if w not in ("nvidia", "geforce", "tesla", "amd", "radeon", "corporation")]
    return "-".join(words) or "device"
