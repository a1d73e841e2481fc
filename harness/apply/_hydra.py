"""Hydra: one profile per device in a config group, holding the chosen values of the keys the
main config already has."""
from __future__ import annotations

import re

from harness.apply._document import _load_document, _lookup, _parse_data, _set
from harness.apply._edit import _block_lines
from harness.apply._keymaps import ABSENT, ApplyTarget
from harness.apply._plan import Plan, _already_implied, _assignments, _diff, _edits, _provenance_lines
from harness.errors import UserError


def write_hydra_profile(target: ApplyTarget, values: dict, device_name: str, provenance: dict,
                        current_values: dict | None = None) -> Plan:
    """Plan `<group_dir>/<device-slug>.yaml` holding the mapped keys (pass the Plan to write()).

    The profile is `# @package _global_` so its keys land where they are in the main config; pick
    it with `hardware=h200` (for group_dir conf/hardware). Keys must exist in the target file, as
    Hydra refuses to override keys the main config lacks. The learning rate is rescaled against
    the target's current values (`current_values`: as read before the main config was planned, so a
    profile planned beside it rescales from the same batch).
    """
    if target.hydra_group_dir is None:
        raise UserError("apply.hydra is not set in the spec; add apply: {hydra: {group_dir: conf/hardware}}")
    doc = _load_document(target.file, target.format)
    assignments = _assignments(target, values, doc, current_values=current_values)
    _edits(doc, assignments, create_keys=False)  # refuses keys the main config lacks
    profile = {}
    for a in assignments:
        if not _already_implied(doc, a):
            _set(profile, a.key, a.value)
    path = target.hydra_group_dir / f"{device_slug(device_name)}.yaml"
    # as bytes decoded, not read_text: its newline translation would make a CRLF profile never match
    # the file again when write() checks it is unchanged
    old_text = path.read_bytes().decode("utf-8") if path.exists() else ""
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
