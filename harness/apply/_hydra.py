"""Hydra: one profile per device in a config group, holding the chosen values of the keys the
main config already has."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from harness.apply._document import BOM, _Document, _load_document, _lookup, _parse_data, _set
from harness.apply._edit import _block_lines
from harness.apply._keymaps import ABSENT, ApplyTarget, KeyMap
from harness.apply._plan import (Plan, _already_implied, _apply_edits, _Assignment, _assignments, _diff, _edits,
                                 _provenance_lines, _verify, _with_provenance_comment)
from harness.errors import UserError

PACKAGE = "# @package _global_"


def write_hydra_profile(target: ApplyTarget, values: dict, device_name: str, provenance: dict,
                        current_values: dict | None = None) -> Plan:
    """Plan `<group_dir>/<device-slug>.yaml` holding the mapped keys (pass the Plan to write()).

    The profile is `# @package _global_` so its keys land where they are in the main config; pick
    it with `hardware=h200` (for group_dir conf/hardware). Keys must exist in the target file, as
    Hydra refuses to override keys the main config lacks. The learning rate is rescaled against
    the target's current values (`current_values`: as read before the main config was planned, so a
    profile planned beside it rescales from the same batch). A profile already there (one you wrote,
    or edited) is edited as the main config is: only the mapped keys change, every other byte stays.
    """
    if target.hydra_group_dir is None:
        raise UserError("apply.hydra is not set in the spec; add apply: {hydra: {group_dir: conf/hardware}}")
    doc = _load_document(target.file, target.format)
    assignments, _ = _assignments(target, values, doc, current_values=current_values)
    _refuse_keys_the_main_config_lacks(target, doc, assignments)
    profile = {}
    for a in assignments:
        if not _already_implied(doc, a):
            _set(profile, a.key, a.value)
    path = target.hydra_group_dir / f"{device_slug(device_name)}.yaml"
    # as bytes decoded, not read_text: its newline translation would make a CRLF profile never match
    # the file again when write() checks it is unchanged
    old_text = path.read_bytes().decode("utf-8") if path.exists() else ""
    unmapped = [knob for knob in values if knob not in target.keys]
    if old_text.strip(BOM + " \t\r\n"):
        plan = _edited_profile(path, old_text, target, doc, assignments, profile, provenance, unmapped)
    else:
        lines = [PACKAGE, *_provenance_lines(provenance), *_block_lines(profile, 0, 2, "yaml")]
        new_text = "".join(line + "\n" for line in lines)
        plan = Plan(source=path if old_text else None, path=path, old_text=old_text, new_text=new_text,
                    diff=_diff(old_text, new_text, path, path), changes=_created(assignments, profile), unmapped=unmapped)
    overridden = _overridden_by_the_main_config(target, doc)
    return replace(plan, warnings=plan.warnings + ((overridden,) if overridden else ()))


def _refuse_keys_the_main_config_lacks(target: ApplyTarget, main: _Document, assignments: list[_Assignment]) -> None:
    """The profile holds only keys the main config has (Hydra refuses to override others); --create-keys, which
    would add them to the main config, does not help here: said in the refusal."""
    _edits(main, assignments, create_keys=True)  # a key that holds a list or a mapping: refused as plan() does
    missing = [a.key for a in assignments if _lookup(main.data, a.key) is ABSENT and not _already_implied(main, a)]
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise UserError(f"{target.file}: {'key' if len(missing) == 1 else 'keys'} {', '.join(missing)} not in the file, "
                        f"and the apply.hydra profile can only hold keys the main config has (Hydra overrides no "
                        f"others; --create-keys does not add {them} where apply.hydra is set): add {them} to "
                        f"{target.file.name}, or map the knob to the key your file uses (apply.keys.KNOB: null "
                        "leaves it out)")


def _overridden_by_the_main_config(target: ApplyTarget, doc: _Document) -> str | None:
    """Hydra 1.1 and later compose the main config at its defaults list's `_self_` (at the end where the list
    has none): a group entry before it is overridden by the main config's own values, so `hardware=h200`
    would change nothing of what bench wrote. No defaults list: `+hardware=h200` comes after the config."""
    defaults = doc.data.get("defaults")
    if not isinstance(defaults, list):
        return None
    folder = Path(target.hydra_group_dir).resolve()
    group = folder.relative_to(target.file.resolve().parent).as_posix() \
        if folder.is_relative_to(target.file.resolve().parent) else folder.name
    names = [(next(iter(e)) if isinstance(e, dict) and e else str(e)) for e in defaults]
    names = [re.sub(r"^(override|optional)\s+|@.*$", "", n).strip().lstrip("/") for n in names]
    at = next((i for i, n in enumerate(names) if n == group), None)
    self_at = names.index("_self_") if "_self_" in names else len(names)
    if at is None or at > self_at:
        return None
    where = "before _self_" if "_self_" in names else "and no _self_ (which Hydra 1.1 and later read as last)"
    return (f"{target.file.name}: its defaults list has {group} {where}, so your config's own values override "
            f"the {group} profile's and `{group}=...` changes nothing bench wrote; put `- _self_` above "
            f"`- {group}: ...` for the profile to apply")


def _edited_profile(path: Path, old_text: str, target: ApplyTarget, main: _Document, assignments: list[_Assignment],
                    new_keys: dict, provenance: dict, unmapped: list[str]) -> Plan:
    """The profile there with the mapped keys spliced in, as plan() edits the main config; a key it lacks
    is added as a new profile would hold it (not where the main config lacks it and runs at its default)."""
    _refuse_other_package(path, old_text)
    if _parse_data(old_text.lstrip(BOM), "yaml", path) is None:
        return _keys_below_comments(path, old_text, new_keys, assignments, provenance, unmapped)
    profile = _load_document(path, "yaml")
    edits = _edits(profile, _resetting_lr(target, main, profile, assignments), create_keys=True, defaults_in=main)
    new_text = _with_provenance_comment(_apply_edits(profile, edits), provenance)
    _verify(profile, new_text, [a for a, _ in edits])
    return Plan(source=path, path=path, old_text=profile.bom + profile.text, new_text=profile.bom + new_text,
                diff=_diff(profile.text, new_text, path, path),
                changes=[(a.key, None if old is ABSENT else old, a.value) for a, old in edits], unmapped=unmapped)


def _keys_below_comments(path: Path, old_text: str, new_keys: dict, assignments: list[_Assignment],
                         provenance: dict, unmapped: list[str]) -> Plan:
    """A profile of comments only (no keys to splice into): the keys go below its lines."""
    bom, text = (BOM, old_text[1:]) if old_text.startswith(BOM) else ("", old_text)
    newline = "\r\n" if "\r\n" in text else "\n"
    text += "" if text.endswith("\n") else newline
    text += "".join(line + newline for line in _block_lines(new_keys, 0, 2, "yaml"))
    new_text = bom + _with_provenance_comment(text, provenance)
    return Plan(source=path, path=path, old_text=old_text, new_text=new_text,
                diff=_diff(old_text, new_text, path, path), changes=_created(assignments, new_keys), unmapped=unmapped)


def _created(assignments: list[_Assignment], keys: dict) -> list[tuple]:
    """The plan's changes where the profile held none of `keys` before: (key, None, new value)."""
    return [(a.key, None, a.value) for a in assignments if _lookup(keys, a.key) is not ABSENT]


def _refuse_other_package(path: Path, text: str) -> None:
    """Hydra reads `# @package` from the `# @` lines at the top only: without `_global_` there, the keys
    bench splices in would land under the group's name and override nothing."""
    for line in text.lstrip(BOM).splitlines():
        if not line.strip():
            continue
        if not re.match(r"\s*#\s*@", line):
            break
        if re.fullmatch(r"\s*#\s*@package\s+_global_\s*", line):
            return
    raise UserError(f"{path}: has no '{PACKAGE}' line at its top, so Hydra would put the keys bench writes "
                    f"under {path.parent.name}. and they would override nothing; add that line as its first, "
                    "or move the file aside for bench to write its own")


def _resetting_lr(target: ApplyTarget, main: _Document, profile: _Document,
                  assignments: list[_Assignment]) -> list[_Assignment]:
    """No lr assignment means the batch is the main config's again: a learning rate the profile holds,
    rescaled for another batch by an earlier apply, goes back to the main config's."""
    if target.lr is None or any(a.key == target.lr.key for a in assignments):
        return assignments
    lr = _lookup(main.data, target.lr.key)
    if lr is ABSENT or _lookup(profile.data, target.lr.key) is ABSENT:
        return assignments
    return [*assignments, _Assignment(KeyMap(target.lr.key), lr, "apply.lr (the main config's batch)")]


def device_slug(device_name: str) -> str:
    """"NVIDIA H200" -> "h200", "NVIDIA GeForce RTX 4090" -> "rtx-4090", "cpu" -> "cpu"."""
    words = re.findall(r"[a-z0-9]+", device_name.lower())
    words = [w for w in words if w not in ("nvidia", "geforce", "tesla", "amd", "radeon", "corporation")]
    return "-".join(words) or "device"
