"""Planning a write: the keys the chosen values put into the file (with the learning-rate and
DeepSpeed batch rules), the edited text with its provenance, checked by parsing it again, and the
diff to show before anything is written."""
from __future__ import annotations

import copy
import difflib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from harness.apply._comments import stale_comments
from harness.apply._document import _Document, _load_document, _lookup, _parse_data, _read_knobs, _same, _set
from harness.apply._edit import _insert_keys, _replace_value, written_at
from harness.apply._keymaps import ABSENT, FORMATS, PRESETS, ApplyTarget, KeyMap, LrRule, flatten
from harness.errors import UserError
from harness.units import size

PROVENANCE_MARK = "# bench apply:"
SIDECAR_SUFFIX = ".bench.json"


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
    warnings: tuple[str, ...] = ()
    """One line per changed key whose inline comment quotes an old value (see _comments)."""


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

    `provenance`: study, trial, device, throughput (in `unit`, samples/s unless given), peak_memory
    (bytes), vs_baseline (the speedup, its spread and whether it is a tie, in words), date,
    bench_version; any other keys are recorded as key=value. `current_values` (the knobs the
    learning-rate rule compares against) defaults to what the file holds now.
    """
    if to is not None and (str(to) in ("", ".") or Path(to).is_dir()):
        raise UserError(f"--to {str(to) or repr('')}: is a folder, not a file; give a file like {target.file.stem}.best{target.file.suffix}")
    destination = Path(to).resolve() if to is not None else target.file
    if FORMATS.get(destination.suffix.lower()) != target.format:
        raise UserError(f"--to {to}: must be a {target.format.upper()} file like {target.file.name}")
    if to is not None and destination.exists() and not destination.is_file():  # reading a FIFO waits forever
        raise UserError(f"--to {to}: not a regular file (a FIFO or device); give a file like "
                        f"{target.file.stem}.best{target.file.suffix}")
    doc = _load_document(target.file, target.format)
    assignments, lr_from = _assignments(target, values, doc, current_values)
    if lr_from is not None:  # the next apply rescales from it, not from this one's six figures
        provenance = {**provenance, "lr_from": f"{lr_from[0]!r} at effective batch {lr_from[1]}"}
    _refuse_auto(target, doc, [a.key for a in assignments])
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
    _verify(doc, new_text, [a for a, _ in edits])
    return Plan(source=target.file, path=destination, old_text=doc.bom + doc.text, new_text=doc.bom + new_text,
                diff=_diff(doc.text, new_text, target.file, destination), changes=changes,
                unmapped=unmapped, sidecar=sidecar, sidecar_text=sidecar_text,
                warnings=tuple(stale_comments(doc, edits, new_text, _written_effective_batch(values, current_values),
                                              destination.name, _old_effective_batch(values, current_values))))


def _assignments(target: ApplyTarget, values: dict, doc: _Document,
                 current_values: dict | None) -> tuple[list[_Assignment], tuple | None]:
    """Every key the chosen values put into the file, in key-map order, and the (lr, effective batch) the
    lr rule rescaled from (None without one)."""
    out, lr_from = [], None
    for knob, value in values.items():
        out += _knob_assignments(target, knob, value)
    if target.lr is None and target.preset != "deepspeed":
        return out, lr_from
    # Only these rules look at the current batch; reading it otherwise could refuse a file for
    # nothing (e.g. an interpolated `batch_size: ${data.bs}`).
    current = current_values if current_values is not None else \
        _read_knobs(target, doc, ("batch_size", "accumulation", "nproc"))
    if target.lr is not None:  # from the knobs written: one without a key leaves the file's value running
        written = {k: v for k, v in values.items() if target.keys.get(k)}
        rescaled, lr_from = _lr_assignment(target.lr, doc, written, current,
                                           [m.key for m in target.keys.get("batch_size", ())],
                                           [m.key for m in target.keys.get("nproc", ())])
        out += rescaled
    if target.preset == "deepspeed":
        out += _deepspeed_total(target, doc, values, current)
    return out, lr_from


def _refuse_auto(target: ApplyTarget, doc: _Document, keys: list[str]) -> None:
    """A DeepSpeed "auto" is the HF Trainer's to fill from its TrainingArguments, which must then agree
    with any number written there (or the Trainer refuses to start): the values go into those arguments."""
    if target.preset != "deepspeed":
        return
    auto = [key for key in keys if _lookup(doc.data, key) == "auto"]
    if auto:
        raise UserError(f"{target.file}: {', '.join(auto)} {'is' if len(auto) == 1 else 'are'} \"auto\", which the HF "
                        "Trainer fills from its TrainingArguments; point apply at that file (preset: hf), or write "
                        "numbers in place of \"auto\"")


def _knob_assignments(target: ApplyTarget, knob: str, value: object) -> list[_Assignment]:
    from_preset = target.keys.get(knob) == PRESETS[target.preset].get(knob)
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


def refuse_unwritable(target: ApplyTarget, searched: dict[str, list], shown: str) -> list[str]:
    """Before a sweep: what `bench apply` would refuse to write once it has run (hours later), refused now: a
    searched value your key map does not spell, a key whose line a YAML merge, alias or shared anchor
    supplies, a learning rate to rescale that is not a number in the file. A value a preset's map cannot
    spell (hf's gradient_checkpointing has no `selective`, which bench applies itself) is worth measuring
    still: said in the notes returned. `searched`: knob -> its values ([] where they are derived)."""
    notes = []
    rescales = target.lr is not None and {"batch_size", "accumulation", "nproc"} & set(searched)
    doc = _load_document(target.file, target.format)
    varied = [m.key for knob, values in searched.items() if len(values) != 1 for m in target.keys.get(knob, ())]
    try:
        _refuse_auto(target, doc, [m.key for knob in searched for m in target.keys.get(knob, ())])
        for key in varied + ([target.lr.key] if rescales else []):
            if _lookup(doc.data, key) is not ABSENT:  # a key the file lacks is the key check's (--create-keys)
                written_at(doc, key)
    except UserError as exc:
        raise UserError(f"{shown}: {exc}") from None
    for knob, values in searched.items():
        for value in values:
            try:
                _knob_assignments(target, knob, value)
            except UserError as exc:
                if target.keys.get(knob) != PRESETS[target.preset].get(knob):
                    raise UserError(f"{shown}: {exc}") from None
                notes.append(f"{knob}={value} is measured, but the preset {target.preset} cannot write it into "
                             f"{target.file.name}: `bench apply` of a config with it refuses (map it under "
                             f"apply.keys.{knob}.values to write it)")
    lr = _lookup(doc.data, target.lr.key) if rescales else 1.0
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise UserError(f"{shown}: apply.lr.key {target.lr.key} {_holds(lr)}, not a learning rate to rescale; "
                        f"fix apply.lr.key or remove apply.lr")
    return notes


def _holds(value: object) -> str:
    return "is not in the file" if value is ABSENT else f"holds {value!r}"


def _written_effective_batch(values: dict, current: dict | None) -> int | None:
    """The global batch after a write that changes the micro-batch, where it is not the micro-batch itself
    (accumulation or processes) and the file's values are known."""
    if "batch_size" not in values or current is None:
        return None
    total = _effective_batch(values, current)
    return total if isinstance(total, int) and total != values["batch_size"] else None


def _old_effective_batch(values: dict, current: dict | None) -> int | None:
    """The global batch before a write that changes it, where the file's values are known: a comment that
    quotes it (`lr: 3e-4  # tuned for an effective batch of 8`) goes stale though no key it names changed."""
    if current is None or ("nproc" in values and "nproc" not in current):  # processes the launcher decides: unknown
        return None
    old, new = _effective_batch(current, {}), _effective_batch(values, current)
    return old if old is not None and new is not None and old != new else None


def _effective_batch(knobs: dict, fallback: dict) -> int | None:
    """The global batch: micro-batch x accumulation x processes (nproc, 1 when neither says)."""
    batch = knobs.get("batch_size", fallback.get("batch_size"))
    if batch is None:
        return None
    return (batch * knobs.get("accumulation", fallback.get("accumulation", 1))
            * knobs.get("nproc", fallback.get("nproc", 1)))


def _lr_assignment(rule: LrRule, doc: _Document, values: dict, current: dict,
                   batch_keys: list[str], count_keys: list[str]) -> tuple[list[_Assignment], tuple | None]:
    """The learning rate rescaled for the new effective batch (nothing when that batch is unchanged), and
    the (lr, effective batch) it is rescaled from, for the provenance (None where nothing was rescaled)."""
    launcher = next(((k, v) for k in count_keys if (v := _lookup(doc.data, k)) is not ABSENT), None)
    if "nproc" in values and "nproc" not in current and launcher:  # "auto", a device list: the launcher decides
        raise UserError(f"{doc.path}: apply.lr: {launcher[0]} holds {launcher[1]!r}, not a count of processes, so the "
                        f"global batch it trains at is unknown and the learning rate cannot be rescaled from it; "
                        f"write the number of processes it runs on there, or remove apply.lr")
    if not batch_keys:  # batch_size is not written: the file's micro-batch stays, whatever it is, and cancels out
        current = {**current, "batch_size": 1}
    old_batch, new_batch = _effective_batch(current, {}), _effective_batch(values, current)
    if old_batch is None:
        held = next(((k, v) for k in batch_keys if (v := _lookup(doc.data, k)) is not ABSENT), None)
        where = f"{held[0]} holds {held[1]!r}, not a number" if held else f"no {' or '.join(batch_keys)} in the file"
        todo = ("write the batch size it runs at there" if held else
                "write that key into the file, map apply.keys.batch_size to the key your file uses")
        raise UserError(f"{doc.path}: apply.lr: the current batch size is unknown ({where}), so the learning rate "
                        f"cannot be rescaled from it; {todo}, or remove apply.lr")
    lr = _lookup(doc.data, rule.key)
    number = not isinstance(lr, bool) and isinstance(lr, (int, float))
    if new_batch == old_batch:  # the lr stays; where a previous apply rescaled it, its origin stays recorded
        return [], _lr_rescaled_from(rule, doc, lr, old_batch) if number else None
    if not number:
        raise UserError(f"{doc.path}: apply.lr.key {rule.key} {_holds(lr)}, not a learning rate to rescale; "
                        "fix apply.lr.key or remove apply.lr")
    origin = _lr_rescaled_from(rule, doc, lr, old_batch) or (lr, old_batch)
    value = _rescaled(rule, origin, new_batch)
    if not math.isfinite(value) or lr <= 0:  # NaN, or 1e308 scaled past the largest float
        raise UserError(f"{doc.path}: apply.lr.key {rule.key} holds {lr!r}, which rescaled is {value!r}; "
                        "a learning rate to rescale is a positive finite number: fix it, or remove apply.lr")
    return [_Assignment(KeyMap(rule.key), value, f"apply.lr ({rule.scale})")], origin


LR_FROM = re.compile(r"\blr_from=(\S+) at effective batch (\d+)")
"""The provenance's record of the lr a previous apply rescaled from, and at which effective batch."""


def _lr_rescaled_from(rule: LrRule, doc: _Document, lr: float, batch: int) -> tuple[float, int] | None:
    """The lr and effective batch a previous apply rescaled from, where the file still holds what that apply
    wrote (`lr` at `batch`): rescaling each apply's six-figure value drifted (1e-4 at batch 8, then 16, 48
    and 8 again, came back 9.99996e-05). None where none did, or you edited the lr since (it is yours)."""
    said = _lr_said(doc)
    return said if said is not None and _rescaled(rule, said, batch) == lr else None


def _rescaled(rule: LrRule, origin: tuple[float, int], batch: int) -> float:
    """The origin's lr at `batch`, to six figures; the origin's own value, unrounded, at its own batch."""
    lr, at = origin
    if batch == at:
        return lr
    factor = batch / at if rule.scale == "linear" else math.sqrt(batch / at)
    product = lr * factor
    return float(f"{product:.6g}") if math.isfinite(product) else product


def _lr_said(doc: _Document) -> tuple[float, int] | None:
    """(lr, effective batch) from the provenance a previous apply left: the YAML's block, or the sidecar."""
    if doc.format == "yaml":
        said = " ".join(line for line in doc.text.splitlines()[:64] if line.startswith(PROVENANCE_MARK))
    else:
        try:
            record = json.loads(doc.path.with_name(doc.path.name + SIDECAR_SUFFIX).read_text(encoding="utf-8"))
            said = f"lr_from={record['provenance']['lr_from']}"
        except (OSError, ValueError, KeyError, TypeError):
            return None
    found = LR_FROM.search(said)
    try:
        lr = float(found.group(1)) if found else math.nan
    except ValueError:
        return None
    return (lr, int(found.group(2))) if math.isfinite(lr) and lr > 0 and int(found.group(2)) > 0 else None


def _deepspeed_total(target: ApplyTarget, doc: _Document, values: dict, current: dict) -> list[_Assignment]:
    """DeepSpeed checks train_batch_size == micro * accumulation * world size: keep it true when present.

    The world size is the chosen config's nproc; a config without one runs as many processes as
    apply.world_size says."""
    if not isinstance(_lookup(doc.data, "train_batch_size"), int):  # absent or "auto": DeepSpeed derives it
        return []
    world = values.get("nproc", target.world_size)
    total = _effective_batch({**values, "nproc": world}, current)
    if total is None:
        return []
    return [_Assignment(KeyMap("train_batch_size"), total,
                        f"preset deepspeed (batch x accumulation x world size {world})")]


def _edits(doc: _Document, assignments: list[_Assignment], create_keys: bool,
           defaults_in: _Document | None = None) -> list[tuple[_Assignment, object]]:
    """The assignments that change the file, each with its old value (ABSENT: the key is created).

    `defaults_in`: the file whose missing key the program runs at its default (a Hydra profile's main
    config: a key the profile lacks runs at the main config's value); the file itself unless given."""
    edits, missing = [], []
    for a in assignments:
        if _lookup(doc.data, a.key) is ABSENT and _already_implied(defaults_in or doc, a):
            continue
        old = _lookup(doc.data, a.key)
        if old is ABSENT:
            missing.append(f"{a.key} (from {a.origin})")
        elif isinstance(old, (dict, list)):
            raise UserError(f"{doc.path}: {a.key} (from {a.origin}) holds a {type(old).__name__}, not a single value; "
                            "map the knob to the key inside it")
        elif _same(a.map.canonical(old), a.value):
            continue  # same setting, maybe spelled another way (Lightning `16` is "16-mixed")
        edits.append((a, old))
    if missing and not create_keys:  # all of them at once, not one per try
        keys = "; ".join(missing)
        them = "it" if len(missing) == 1 else "them"
        raise UserError(f"{doc.path}: {'key' if len(missing) == 1 else 'keys'} {keys} not in the file; add {them}, "
                        f"map the knob to the key your file uses (apply.keys.KNOB: null leaves it out), or pass "
                        f"--create-keys to add {them}")
    return edits


def _already_implied(doc: _Document, a: _Assignment) -> bool:
    """The key is missing and the program's default for it is the value: nothing to write."""
    return _lookup(doc.data, a.key) is ABSENT and _same(a.value, a.map.default)


def _apply_edits(doc: _Document, edits: list[tuple[_Assignment, object]]) -> str:
    """The edits as (start, end, replacement) splices on the original text, applied from the end
    backwards so that each splice leaves the offsets of the ones before it valid; splices at one offset
    land in the text in their list's order (the later one is applied first)."""
    splices = [_replace_value(doc, a.key, a.value) for a, old in edits if old is not ABSENT]
    splices += _insert_keys(doc, [(a.key, a.value) for a, old in edits if old is ABSENT])
    text = doc.text
    for _, (start, end, new) in sorted(enumerate(splices), key=lambda s: (s[1][0], s[0]), reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _verify(doc: _Document, new_text: str, edited: list[_Assignment]) -> None:
    """Parse the new text and check it holds the old values plus the edits, and nothing else (a value
    already there in another spelling, Lightning's `bf16`, is no edit and stays as written)."""
    expected = copy.deepcopy(doc.data)
    for a in edited:
        _set(expected, a.key, a.value)
    try:
        matches = _parse_data(new_text, doc.format, doc.path) == expected
    except UserError:
        matches = False
    if not matches:
        raise RuntimeError(f"bench apply: editing {doc.path} produced unexpected values; nothing was written. "
                           "This is a bench bug: please report it with the file.")


def _diff(old: str, new: str, source: Path, destination: Path) -> str:
    """A unified diff as `diff -u` prints it: a last line without a newline is marked, not run into the
    next ("-  precision: 16-mixed+  precision: 32-true")."""
    lines = difflib.unified_diff(_lines(old), _lines(new), fromfile=str(source), tofile=str(destination))
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _lines(text: str) -> list[str]:
    """Lines as diff and patch count them: split at "\n" only (str.splitlines also splits at U+2028
    and friends inside a comment, and put "no newline" markers mid-file)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


# ---------------------------------------------------------------------------------------------
# The training run the target describes (compile must pay back within it)

STEP_KEYS = ("max_steps",)
EPOCH_KEYS = ("max_epochs", "num_train_epochs", "epochs")
STEPS_PER_EPOCH_KEYS = ("steps_per_epoch", "limit_train_batches")


def run_length(target: ApplyTarget) -> tuple[int | None, str]:
    """Optimizer steps of the training run the target config describes, and where that number comes
    from: a positive `max_steps`, else epochs x steps per epoch where the file states both. None (with
    what the file does say) when it cannot tell: an epoch's length depends on the data set's size."""
    try:
        data = _load_document(target.file, target.format).data
    except UserError:
        return None, f"{target.file.name} could not be read"
    leaves = flatten(data)
    name = target.file.name

    def first(keys):
        return next(((k, v) for k, v in leaves.items() if k.rsplit(".", 1)[-1] in keys
                     and isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
    steps, epochs, per_epoch = first(STEP_KEYS), first(EPOCH_KEYS), first(STEPS_PER_EPOCH_KEYS)
    if steps:
        return steps[1], f"the {steps[1]:,}-step run {name} describes ({steps[0]})"
    if epochs and per_epoch:
        total, how = epochs[1] * per_epoch[1], f"{epochs[0]} x {per_epoch[0]}"
        accumulation = _accumulation(target, leaves)
        if per_epoch[0].rsplit(".", 1)[-1] == "limit_train_batches" and accumulation > 1:
            total, how = total // accumulation, f"{how} / {accumulation} micro-batches a step"  # Lightning counts batches there
        return total, f"the {total:,}-step run {name} describes ({how})"
    said = f"{name} says {epochs[0]} {epochs[1]} but not how many steps an epoch has" if epochs else \
        f"{name} names no max_steps"
    return None, said


def _accumulation(target: ApplyTarget, leaves: dict) -> int:
    """The micro-batches per optimizer step the file sets (at the accumulation knob's key), else 1."""
    found = (leaves.get(m.key) for m in target.keys.get("accumulation", ()))
    return next((v for v in found if isinstance(v, int) and not isinstance(v, bool) and v > 0), 1)


# ---------------------------------------------------------------------------------------------
# Provenance


def _provenance_lines(provenance: dict) -> list[str]:
    """E.g. "written by bench 0.1.0 on 2025-06-01 from study s1 trial 17" and
    "measured on NVIDIA H200, 1234.5 samples/s, peak memory 12.00 GiB"; other keys as key=value."""
    p = {k: v for k, v in provenance.items() if v is not None}
    written = ["written by bench", str(p.pop("bench_version", ""))]
    for key, form in (("date", "on {}"), ("study", "from study {}"), ("trial", "trial {}"), ("chosen", "({})")):
        if key in p:
            written.append(form.format(p.pop(key)))
    measured = []
    if "device" in p:
        measured.append(f"on {p.pop('device')}")
    if "throughput" in p:
        measured.append(f"{p.pop('throughput'):.1f} {p.pop('unit', 'samples/s')}")
    if "peak_memory" in p:
        measured.append(f"peak memory {size(p.pop('peak_memory'))}")
    lines = [" ".join(w for w in written if w)]
    if measured:
        lines.append("measured " + ", ".join(measured))
    if "vs_baseline" in p:
        trial = p.pop("baseline", None)
        lines.append(f"vs your config as swept{'' if trial is None else f' (trial {trial})'}: {p.pop('vs_baseline')}")
    if p:
        lines.append(", ".join(f"{k}={v}" for k, v in p.items()))
    return [f"{PROVENANCE_MARK} {line}" for line in lines]


def _with_provenance_comment(text: str, provenance: dict) -> str:
    """The text with the provenance block at the top, replacing the block a previous apply left."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    # A `#!` line works only as the first line, and Hydra reads `# @package ...` only from the leading
    # `# @` lines: both stay above the block
    header = 1 if lines and lines[0].startswith("#!") else 0
    while header < len(lines) and lines[header].startswith("# @"):
        header += 1
    body = lines[header:]
    if body and body[0].startswith(_provenance_lines({})[0]):  # bench's own block; a comment of yours stays
        while body and _written_by_bench(body[0]):
            body.pop(0)
    block = "".join(line + newline for line in _provenance_lines(provenance))
    return "".join(lines[:header]) + block + "".join(body)


def written_by_apply(path: Path) -> bool:
    """`path` holds a config bench apply wrote: its provenance block at the top, or its JSON sidecar."""
    if path.with_name(path.name + SIDECAR_SUFFIX).is_file():
        return True
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            head = [line for line, _ in zip(f, range(64))]
    except OSError:
        return False
    return any(line.startswith(PROVENANCE_MARK) for line in head)


def _written_by_bench(line: str) -> bool:
    """A line of the shapes _provenance_lines writes."""
    said = line[len(PROVENANCE_MARK):].strip() if line.startswith(PROVENANCE_MARK) else None
    return said is not None and (said.startswith(("written by bench", "measured ", "vs your config as swept"))
                                 or re.match(r"\w+=", said) is not None)


def _sidecar_json(destination: Path, provenance: dict, changes: list) -> str:
    record = {"file": destination.name, "provenance": provenance,
              "changes": [{"key": k, "old": old, "new": new} for k, old, new in changes]}
    return json.dumps(record, indent=2, default=str) + "\n"
