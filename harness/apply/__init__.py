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

Inside, one module per step, each importing only the steps before it:
`_keymaps` (the spec's `apply:` section, presets) -> `_document` (the file: text, values, nodes;
current knob values) -> `_edit` (splicing values into the text) -> `_plan` (assignments, the new
text, provenance, verification, diff) -> `_write` (backup, atomic replace); `_comments` finds inline comments a plan makes stale; `_size` warns when the target describes
another model size than was measured; `_hydra` plans per-device
Hydra profiles from the same pieces.
"""
from __future__ import annotations

from harness.apply._document import read_current
from harness.apply._hydra import device_slug, write_hydra_profile
from harness.apply._keymaps import ApplyTarget, KeyMap, LrRule, flatten, misspelled, not_found, parse_apply_section
from harness.apply._plan import (PROVENANCE_MARK, SIDECAR_SUFFIX, Plan, plan, refuse_unwritable, run_length,
                                 written_by_apply)
from harness.apply._size import other_model_size
from harness.apply._write import BACKUP_INFIX, check, replace_file, write, write_together

__all__ = ["ApplyTarget", "check", "KeyMap", "LrRule", "Plan", "flatten", "misspelled", "not_found", "other_model_size", "parse_apply_section", "read_current", "plan", "refuse_unwritable", "replace_file",
           "run_length", "write", "written_by_apply", "write_together", "write_hydra_profile", "device_slug", "PROVENANCE_MARK", "BACKUP_INFIX",
           "SIDECAR_SUFFIX"]
