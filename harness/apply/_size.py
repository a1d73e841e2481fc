"""Does the target describe the model that was measured? A CPU preset's stand-in measured for a GPU
model's config is the usual way the numbers end up being for another model size."""
from __future__ import annotations

from collections.abc import Collection

from harness.apply._document import _load_document
from harness.apply._keymaps import ApplyTarget, flatten
from harness.errors import UserError


NOT_A_SIZE = frozenset({"lr", "samples", "dropout", "temperature", "aux_weight", "hard_fraction", "lora_dropout",
                        "topics", "seed"})
"""Params that set how the model trains or how much data it sees, not its size: a target's `lr` may differ."""


def other_model_size(target: ApplyTarget, workload: dict | None, searched: Collection[str]) -> str | None:
    """The target's numeric keys named like a measured workload parameter (model.d_model ~ d_model)
    that hold another value, as one warning; None when they agree or cannot be read. Searched knobs
    are left out: their values differ by design."""
    try:  # read as apply reads it: a JSON config, or a YAML one with `!ENV` tags, went unchecked
        tree = _load_document(target.file, target.format).data
    except UserError:
        return None
    if not workload or not isinstance(tree, dict):
        return None
    params = {k: v for k, v in (workload.get("params") or {}).items()
              if k not in searched and k not in NOT_A_SIZE and _number(v)}
    differ = [(key, value, params[key.rsplit(".", 1)[-1]]) for key, value in flatten(tree).items()
              if key.rsplit(".", 1)[-1] in params and _number(value) and value != params[key.rsplit(".", 1)[-1]]]
    if not differ:
        return None
    preset = f"preset {workload['preset']}" if workload.get("preset") else "the workload"
    theirs = ", ".join(f"{key} {value}" for key, value, _ in differ)
    ours = ", ".join(f"{key.rsplit('.', 1)[-1]} {measured}" for key, _, measured in differ)
    return (f"{target.file.name} describes {theirs}, but {preset} measured {ours}: these numbers are for "
            "another model size; sweep that size (e.g. on its device, or a preset that matches) before trusting them")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
