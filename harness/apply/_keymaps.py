"""What the spec's `apply:` section says: the target file, where each knob lives in it (a preset's
key maps with `keys:` laid over them), the learning-rate rule and the Hydra group folder."""
from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness import knobs  # values read from a file must land in the registry's
from harness.errors import UserError, as_written

FORMATS = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}
LR_SCALES = ("linear", "sqrt")


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

# ---------------------------------------------------------------------------------------------
# Presets: the keys each framework's config uses for the knobs (values read as "bench -> file").

_NO_YES = {"fp32": False, "tf32": False, "bf16-mixed": False, "fp16-mixed": False}
_YAML11_BOOLS = {word: value for words, value in (("yes on", True), ("no off", False))
                 for w in words.split() for word in (w, w.title(), w.upper())}
"""transformers reads a YAML file with PyYAML (YAML 1.1), where `bf16: no` is false; bench reads YAML 1.2."""

PRESETS: dict[str, dict[str, tuple[KeyMap, ...]]] = {
    # The registry's plain keys: only knobs whose name is unambiguous at a file's top level (a
    # top-level `optimizer:` or `seq_len:` in an arbitrary file too often means something else).
    "plain": {k.name: (KeyMap(k.plain_key, default=ABSENT if k.core else k.default),)
              for k in knobs.KNOBS if k.plain_key},
    # LightningCLI config. The batch size lives in the datamodule. Every key is also found in the
    # `class_path` + `init_args` form: `data.batch_size` reads and writes `data.init_args.batch_size`
    # where the file's `data:` section has a class_path (see _in_file_form).
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
        # Lightning's "fsdp" strategy; it cannot say reshard_after_forward in one string (left unmapped).
        "nproc": (KeyMap("trainer.devices"),),
        "parallel": (KeyMap("trainer.strategy", values={"none": "auto", "ddp": "ddp", "fsdp": "fsdp"}, default="auto"),),
    },
    # transformers.TrainingArguments as YAML/JSON. Precision spreads over three booleans; `tf32`
    # only says something for fp32/tf32 and is left alone otherwise. No bf16-true, no selective
    # checkpointing: choosing those is refused rather than silently written as something else.
    "hf": {
        "batch_size": (KeyMap("per_device_train_batch_size", default=8),),
        "accumulation": (KeyMap("gradient_accumulation_steps", default=1),),
        "precision": (
            KeyMap("bf16", values={**_NO_YES, "bf16-mixed": True}, default=False, aliases=_YAML11_BOOLS),
            KeyMap("fp16", values={**_NO_YES, "fp16-mixed": True}, default=False, aliases=_YAML11_BOOLS),
            KeyMap("tf32", values={"fp32": False, "tf32": True}, default=False, aliases=_YAML11_BOOLS),
        ),
        "checkpointing": (KeyMap("gradient_checkpointing", values={"none": False, "full": True}, default=False,
                                 aliases=_YAML11_BOOLS),),
        "compile": (
            KeyMap("torch_compile", values={"off": False, "default": True, "reduce-overhead": True,
                                            "max-autotune": True}, default=False, aliases=_YAML11_BOOLS),
            KeyMap("torch_compile_mode", values={m: m for m in ("default", "reduce-overhead", "max-autotune")},
                   default="default", aliases={None: "default"}),
        ),
        "num_workers": (KeyMap("dataloader_num_workers", default=0),),
        "pin_memory": (KeyMap("dataloader_pin_memory", default=True, aliases=_YAML11_BOOLS),),
        # The process count is the launcher's (torchrun, accelerate), not TrainingArguments'; DDP is
        # what the Trainer does under several processes unless `fsdp` says otherwise.
        "parallel": (KeyMap("fsdp", values={"none": "", "ddp": "", "fsdp": "full_shard"}, default=""),),
        "reshard_after_forward": (KeyMap("fsdp_config.reshard_after_forward", default=True),),
    },
    # DeepSpeed config JSON. `train_batch_size`, when present, is kept equal to
    # micro * accumulation * processes (DeepSpeed refuses a config where it is not): nproc when the
    # config has it, else apply.world_size. Sharding is ZeRO: stage 3 shards what FSDP shards.
    "deepspeed": {
        "batch_size": (KeyMap("train_micro_batch_size_per_gpu"),),
        "accumulation": (KeyMap("gradient_accumulation_steps", default=1),),
        "precision": (
            KeyMap("bf16.enabled", values={**_NO_YES, "bf16-mixed": True}, default=False),
            KeyMap("fp16.enabled", values={**_NO_YES, "fp16-mixed": True}, default=False),
        ),
        "parallel": (KeyMap("zero_optimization.stage", values={"none": 0, "ddp": 0, "fsdp": 3}, default=0),),
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
    try:
        file = (Path(base_dir) / _text(section["file"], f"{where}: apply.file")).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop (RuntimeError before Python 3.13)
        raise UserError(f"{where}: apply.file: cannot resolve {section['file']} ({e}); point it at the "
                        "training config itself") from None
    fmt = FORMATS.get(file.suffix.lower())
    if fmt is None:
        raise UserError(f"{where}: apply.file: {file.name} is neither YAML (.yaml, .yml) nor JSON (.json); "
                        "point it at the training config")
    preset = section.get("preset", "plain")
    if not isinstance(preset, str) or preset not in PRESETS:  # `preset:` with nothing after it is null
        hint = _did_you_mean(preset, PRESETS) if isinstance(preset, str) else ""
        raise UserError(f"{where}: apply.preset: unknown preset {preset!r}{hint}; use one of {', '.join(PRESETS)}")
    keys = dict(PRESETS[preset])
    for knob, entry in _mapping(section.get("keys", {}), f"{where}: apply.keys").items():
        _check_knob_name(knob, known_knobs, f"{where}: apply.keys.{knob}")
        keys[knob] = _parse_knob_entry(knob, entry, f"{where}: apply.keys.{knob}")
        _check_told_apart(knob, keys[knob], f"{where}: apply.keys.{knob}")
    data = _plain_data(file)
    keys = _in_file_form(keys, data)
    lr = _parse_lr(section["lr"], f"{where}: apply.lr") if section.get("lr") is not None else None
    if lr is not None and data is not None:
        lr = LrRule(key=cli_path(data, lr.key), scale=lr.scale)
    _check_one_key_each(keys, lr, where)
    return ApplyTarget(
        file=file, format=fmt, preset=preset,
        keys={knob: maps for knob, maps in keys.items() if maps},
        lr=lr,
        hydra_group_dir=(_parse_hydra(section["hydra"], base_dir, f"{where}: apply.hydra")
                         if section.get("hydra") else None),
        world_size=_positive_int(section.get("world_size", 1), f"{where}: apply.world_size"),
    )


def _check_one_key_each(keys: dict, lr: LrRule | None, where: str) -> None:
    """Two knobs (or a knob and the lr) written to one key would overwrite each other: accumulation
    mapped to batch_size wrote `batch_size: 1` for a batch-8 trial."""
    owner: dict[str, str] = {}
    named = [(knob, m.key) for knob, maps in keys.items() for m in maps] + ([("lr", lr.key)] if lr else [])
    for knob, key in named:
        other = owner.setdefault(key, knob)
        if other != knob:
            first, second = ("apply.lr" if k == "lr" else f"apply.keys.{k}" for k in (other, knob))
            raise UserError(f"{where}: {first} and {second} both name {key}: each would overwrite the other; "
                            "give each its own key")


def _plain_data(file: Path) -> dict | None:
    """The target's content as plain values, or None when it is not there (yet) or not a mapping;
    apply itself reports a broken file when it reads it."""
    if not file.is_file():
        return None
    import yaml  # JSON is YAML too
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):  # thousands of levels deep
        return None
    return data if isinstance(data, dict) else None


def _in_file_form(keys: dict, data: dict | None) -> dict:
    """Each key as the file spells it: LightningCLI's `init_args` level put in where a section has a
    class_path (data.batch_size -> data.init_args.batch_size), so the baseline is read where the
    value is, and apply writes it back there."""
    if data is None:
        return keys
    return {knob: tuple(_replace_key(m, cli_path(data, m.key)) for m in maps) for knob, maps in keys.items()}


def _replace_key(m: KeyMap, key: str) -> KeyMap:
    return m if key == m.key else KeyMap(key, values=m.values, default=m.default, aliases=m.aliases)


def cli_path(data: dict, key: str) -> str:
    """`key` with `init_args` inserted below every class_path section it passes through, unless the
    section holds the key's next part itself."""
    node, out = data, []
    for part in key.split("."):
        cli_section = isinstance(node, dict) and isinstance(node.get("class_path"), str)
        if cli_section and part not in node and part != "init_args":
            out.append("init_args")
            node = node.get("init_args") if isinstance(node.get("init_args"), dict) else {}
        out.append(part)
        node = node.get(part) if isinstance(node, dict) else None
    return ".".join(out)


def not_found(target: ApplyTarget, current: Mapping, names) -> dict[str, str]:
    """One line per knob whose current value the target does not hold (and whose key has no default
    the program assumes): the key looked for, so the user sees why the baseline takes another value."""
    lines = {}
    for knob in names:
        maps = target.keys.get(knob, ())
        if knob in current or any(m.default is not ABSENT for m in maps):
            continue
        lines[knob] = (f"{knob}: looked for {' / '.join(m.key for m in maps)} in {target.file.name}, not there" if maps
                       else f"{knob}: no key of {target.file.name} holds it (preset {target.preset}); map it under "
                            "apply.keys")
    return lines


def misspelled(target: ApplyTarget, missing: Collection[str]) -> tuple[str, str, str] | None:
    """(knob, key, the file's key) for one of the `missing` knobs (not_found's) whose key is not in the
    file but one spelled almost like it is (data_loader.batchsize for data_loader.batch_size): a typo,
    which would have the sweep measure as "your config" a baseline that is not."""
    data = _plain_data(target.file) if missing else None
    leaves = list(flatten(data)) if data else []
    for knob in missing:
        for m in target.keys.get(knob, ()):
            close = difflib.get_close_matches(m.key, leaves, n=1, cutoff=0.9)
            if close:
                return knob, m.key, close[0]
    return None


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested mapping as {"a.b.c": leaf}: the dotted keys apply's key maps use."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def _check_knob_name(knob: object, known_knobs: Collection[str] | None, where: str) -> None:
    if not isinstance(knob, str) or not knob:
        raise UserError(f"{where}: a knob name must be a non-empty string")
    if known_knobs is not None and knob not in known_knobs:
        raise UserError(f"{where}: the workload has no knob {knob!r}{_did_you_mean(knob, known_knobs)}; "
                        f"its knobs: {', '.join(sorted(known_knobs))}")
    squashed = {re.sub(r"[^a-z0-9]", "", k): k for k in knobs.UNIVERSAL}
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


def _check_told_apart(knob: str, maps: tuple[KeyMap, ...], where: str) -> None:
    """Two of a knob's values written alike in every key (`{none: false, full: false}`, a one-letter slip):
    apply wrote a trial of `full` as `false`, said "already holds these values", and the file trains `none`.
    (A preset may map two values alike where the file cannot tell them apart: Lightning's fp32 and tf32.)"""
    valued = [m for m in maps if m.values]
    seen: dict[tuple, str] = {}
    for value in dict.fromkeys(v for m in valued for v in m.values):
        written = tuple(repr(m.values.get(value, ABSENT)) for m in valued)
        if written in seen:
            shown = ", ".join(f"{m.key}: {as_written(m.values[value])}" for m in valued if value in m.values)
            raise UserError(f"{where}: {seen[written]} and {value} are both written as {shown}, so the file could "
                            f"not tell a trial of {value} from one of {seen[written]}; give each its own value")
        seen[written] = value


def _parse_value_map(knob: str, raw: object, where: str) -> dict[str, object]:
    choices = knobs.CHOICES.get(knob)
    if not isinstance(raw, dict):
        example = "{fp32: 32-true, bf16-mixed: bf16-mixed}" if knob == "precision" else "{BENCH_VALUE: YOUR_FILE'S_VALUE}"
        raise UserError(f"{where}: expected a mapping from bench's values to your file's, e.g. {example}; "
                        f"got {type(raw).__name__} {raw!r}")
    values = {}
    for bench_value, file_value in raw.items():
        # A YAML 1.1 loader reads an unquoted `off:` as False; it can only have meant "off".
        if choices and bench_value is False:
            bench_value = "off"
        if choices and bench_value not in choices:
            close = _did_you_mean(str(bench_value), choices)
            raise UserError(f"{where}: {bench_value!r} is not a {knob} value{close}; use {', '.join(choices)}")
        if isinstance(file_value, (list, dict)):
            raise UserError(f"{where}.{bench_value}: {file_value!r} is not a value a key holds; give the number, "
                            "string or boolean your file writes for it")
        if isinstance(file_value, float) and not math.isfinite(file_value):  # YAML's .nan, .inf: never a setting
            raise UserError(f"{where}.{bench_value}: {file_value!r} is not a finite number; give the value your file "
                            "writes for it")
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
        raise UserError(f"{where}: expected a non-empty string, got {as_written(raw)}")
    return raw


def _positive_int(raw: object, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise UserError(f"{where}: expected a positive whole number, got {as_written(raw)}")
    return raw


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
