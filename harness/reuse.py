"""Figures a trial need not measure again: measured once per study for one model build and shape.

The FLOP count of a micro-batch, the fp32 reference loss and the memory breakdown depend on the
workload's build and the batch's shape (and, for the breakdown, on the knobs that change what is
stored: precision, checkpointing, optimizer), never on how fast a step runs. The first trial that
needs one measures it and files it under the study's folder (`reuse/`), keyed on everything it
depends on; later trials with the same key take it from there, and their record says so (`reused`:
which figure, measured in which trial), so a reused figure is never shown as measured in this trial.
Files are written atomically, so workers sharing a study folder read whole figures or none.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path


class Figures:
    """The study's filed figures (none when the job has no reuse folder: every figure is measured)."""

    def __init__(self, folder: str | None, trial: int | None):
        self.folder = Path(folder) if folder else None
        self.trial = trial
        self.reused: dict[str, dict] = {}
        """figure -> where it came from ({"trial": N}), for the record."""

    def get(self, figure: str, key: dict, measure, found_by_all=lambda found: found):
        """The filed figure for `key`, or `measure()`'s result, filed for the next trial. Over several
        processes `found_by_all` says whether every rank found it: where measuring takes a step (a gradient
        all-reduce), a rank that took the file would skip a collective the others run."""
        path = self._path(figure, key)
        filed = _read(path) if path else None
        if found_by_all(filed is not None):
            self.reused[figure] = {"trial": filed.get("trial"), "key": filed["key"]}
            return filed["value"]
        value = measure()
        if path is not None and value is not None:
            try:
                _write(path, {"key": key, "value": value, "trial": self.trial})
            except OSError as exc:  # read-only or full: the figure is measured, only not shared
                print(f"note: {figure} is not filed for later trials: {path.parent} cannot be written "
                      f"({exc.strerror or exc}); each trial measures it itself", file=sys.stderr, flush=True)
        return value

    def _path(self, figure: str, key: dict) -> Path | None:
        if self.folder is None:
            return None
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
        return self.folder / f"{figure}-{digest}.json"


def _read(path: Path) -> dict | None:
    try:
        filed = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return filed if isinstance(filed, dict) and "value" in filed and "key" in filed else None


def _write(path: Path, content: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(content, default=str))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written temp file behind
        raise
