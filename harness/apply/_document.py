"""The user's config file as bench reads it: its text, its plain values and its positioned node tree,
and the knob values it holds now."""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, SequenceNode

from harness import knobs
from harness.apply._keymaps import ABSENT, ApplyTarget, KeyMap
from harness.errors import UserError
from harness.spec_yaml import top_level, where_yaml_failed

BOM = "\ufeff"


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
    bom: str = ""
    """A UTF-8 byte-order mark the file starts with (kept out of `text`, so marks and offsets agree)."""


def _load_document(path: Path, fmt: str) -> _Document:
    text = _read_text(path)
    bom = BOM if text.startswith(BOM) else ""
    text = text[len(bom):]
    if "\r" in text and "\n" not in text:  # every edit and comment is found by its line
        raise UserError(f"{path}: its lines end in CR alone (classic Mac OS), which bench does not edit; convert it "
                        f"to LF line ends (e.g. `sed -i 's/\\r/\\n/g' {path.name}`) and re-run")
    data = _parse_data(text, fmt, path)
    if data is None:
        raise UserError(f"{path}: the file holds no keys (it is empty, only comments, or null); bench writes into a "
                        "config of key: value pairs: write your config's keys in it, or point apply.file at your "
                        "config")
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level is {top_level(data)}, not a mapping of keys; "
                        "bench writes into a config of key: value pairs")
    try:
        root = YAML(typ="rt").compose(text)
    except YAMLError as e:  # valid JSON that YAML cannot place, e.g. duplicate keys
        raise UserError(f"{path}: cannot edit this file in place: {_problem(e, text)}") from None
    return _Document(path, fmt, text, data, root, bom)


def _read_text(path: Path) -> str:
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the read forever
        raise UserError(f"{path}: not a regular file; point apply.file at the YAML or JSON training config")
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
            return json.loads(text.lstrip(BOM), object_pairs_hook=_refuse_duplicates)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _reader().load(text)
    except (ValueError, YAMLError) as e:
        raise UserError(f"{path}: not valid {fmt.upper()}: {_problem(e, text)}; fix the file or point apply.file "
                        "at the training config") from None


def _reader() -> YAML:
    """Safe YAML that reads an application's tags (`!ENV ${DATA_DIR}`, `!include x.yaml`) as the plain value
    they tag: bench edits the keys around them, and their meaning is the application's."""
    yaml = YAML(typ="safe", pure=True)
    yaml.constructor.add_constructor(None, _untagged)
    return yaml


def _untagged(constructor, node):
    if isinstance(node, MappingNode):
        return constructor.construct_mapping(node, deep=True)
    if isinstance(node, SequenceNode):
        return constructor.construct_sequence(node, deep=True)
    return constructor.construct_scalar(node)


def _refuse_duplicates(pairs: list) -> dict:
    """JSON readers disagree on a repeated key (first or last wins): bench will not guess which."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice in one object; keep one")
        seen.add(key)
    return dict(pairs)


def _problem(error: Exception, text: str) -> str:
    """What the parser found wrong, and where (its message's first lines only name what it was inside). A file
    cut inside a [, { or quote fails past its last line, so there the words say its end and what was left open,
    as for a spec."""
    problem, mark = getattr(error, "problem", None), getattr(error, "problem_mark", None)
    if not problem:
        return (str(error).strip().splitlines() or [type(error).__name__])[0]
    if problem.startswith("but ") and getattr(error, "context", None):  # "but found another document"
        problem = f"{error.context}, {problem}"
    if mark is None:
        return problem
    if mark.index < len(text.rstrip()):
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    where = where_yaml_failed(error, text)
    return f"cut short{where}" if "never closed" in where else f"{problem}{where}"


def _lookup(data: object, key: str) -> object:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return ABSENT
        data = data[part]
    return data


def _set(data: dict, key: str, value: object) -> None:
    *parents, last = key.split(".")
    for part in parents:
        if data.get(part) is None:  # absent, or an empty section (`trainer:`) that the key fills
            data[part] = {}
        data = data[part]
    data[last] = value


# ---------------------------------------------------------------------------------------------
# Reading the user's current values


def read_current(target: ApplyTarget) -> dict:
    """The knob values the target file holds now, as bench values; knobs with no key there are left out."""
    return _read_knobs(target, _load_document(target.file, target.format), target.keys)


def _read_knobs(target: ApplyTarget, doc: _Document, names) -> dict:
    current = {}
    for knob in names:
        value = _read_knob(doc, knob, target.keys.get(knob, ()))
        if value is not ABSENT:
            current[knob] = value
    return current


# How a file spells running on several processes often says more than these knobs do (a device
# list, ZeRO stage 2, Lightning's "ddp_spawn"): what bench cannot read there is unknown, not an error.
_LENIENT_KNOBS = ("parallel", "reshard_after_forward")


def _read_knob(doc: _Document, knob: str, maps: tuple[KeyMap, ...]) -> object:
    if knob == "nproc":
        return _read_count(doc, maps)
    if knob in _LENIENT_KNOBS:
        try:
            return _read_strictly(doc, knob, maps)
        except UserError:
            return ABSENT
    return _read_strictly(doc, knob, maps)


def _read_strictly(doc: _Document, knob: str, maps: tuple[KeyMap, ...]) -> object:
    found = {m.key: _file_value(doc, m.key) for m in maps}
    if all(v is ABSENT for v in found.values()):
        return ABSENT
    if all(m.values is not None for m in maps):
        value = _decode(maps, found)
    else:  # a key that holds the bench value as is
        value = next((found[m.key] for m in maps if m.values is None and found[m.key] is not ABSENT), ABSENT)
        if value is ABSENT:
            return ABSENT
    return _checked_knob_value(doc, knob, found, value, decoded=all(m.values is not None for m in maps))


def _read_count(doc: _Document, maps: tuple[KeyMap, ...]) -> object:
    """nproc where the file spells a count; a device list, -1 or "auto" leave it to the launcher: unknown."""
    for m in maps:
        value = _lookup(doc.data, m.key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return ABSENT


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


def _checked_knob_value(doc: _Document, knob: str, found: dict[str, object], value: object,
                        decoded: bool = False) -> object:
    """`value` as a knob's; `decoded`: read through apply.keys' `values:` maps, which had no entry for what
    the file holds (value None): said of the map, not of the file's number (`batch_size: 8` is one)."""
    choices = knobs.CHOICES.get(knob)
    if knob in ("batch_size", "accumulation"):  # what a study records (spec's check_knob_number), so it can read it back
        valid = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= knobs.LIMITS[knob]
    else:
        valid = value is not None and (choices is None or value in choices)
    if not valid:
        shown = ", ".join(f"{k}: {json.dumps(v, default=str)}" for k, v in found.items() if v is not ABSENT)
        if knob in ("batch_size", "accumulation") and not (value is None and decoded):
            raise UserError(f"{doc.path}: {shown} is not a {knob} bench can read: write a whole number from 1 "
                            f"to {knobs.LIMITS[knob]:,}, unquoted (e.g. 8), or set apply.keys.{knob}: null to leave it out")
        raise UserError(f"{doc.path}: cannot tell which {knob} `{shown}` means; map its spelling under "
                        f"apply.keys.{knob}.values, or set apply.keys.{knob}: null to leave it out")
    return value


def _same(a: object, b: object) -> bool:
    """Equal as the file's reader sees it: True is not 1, "1" is not 1."""
    numbers = (int, float)
    return (type(a) in numbers and type(b) in numbers or type(a) is type(b)) and a == b
