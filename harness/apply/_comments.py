"""Inline comments that a write makes stale: `batch_size: 32  # effective batch 32` still says 32
after the batch changed, `precision: bf16-true  # bf16 never tried` still says it was never tried.
bench keeps every comment byte as it was, so it says which ones now quote an old value or speak of
the knob's values (any spelling of any value of its key map, e.g. bf16, 16-mixed) without naming
the new one, or give a measured figure (`# 14% of a 24 GB card at this size`: a share, a size, a speed),
one line per key, and leaves the wording to the user."""
from __future__ import annotations

import re

from harness.apply._document import _Document
from harness.apply._edit import _replace_value
from harness.apply._keymaps import ABSENT


def stale_comments(doc: _Document, edits: list, new_text: str, effective: int | None = None,
                   written: str | None = None, old_effective: int | None = None) -> list[str]:
    """For each changed key whose line's comment quotes an old value of any changed key: one warning,
    with the line number in the new text (the provenance block above it shifts lines) of the file
    `written` (apply --to's; default the target's). `effective`: the
    global batch after the write (micro-batch x accumulation x processes, where that is not the
    micro-batch): an old value that equals it may be a comment on the global batch, still true.
    `old_effective`: the global batch before, where the write changes it: quoted, it is an old value too."""
    if doc.format != "yaml":
        return []
    olds = [(a.key, old) for a, old in edits if old is not ABSENT and not isinstance(old, bool)]
    name, out = written or doc.path.name, []
    for a, old in edits:
        if old is ABSENT:
            continue
        start, end, _ = _replace_value(doc, a.key, a.value)
        comment = _comment_after(doc.text, end)
        # a number with a unit is a figure, not a value quoted: the 16 of "fits a 16 GB card" is no batch 16
        words = FIGURE.sub(" ", comment or "")
        if not comment or (not isinstance(a.value, bool) and _quotes(words, a.value)):
            continue  # a comment that names the new value too lists the choices (`# 32-true | bf16-mixed`)
        quoted = next(((key, value) for key, value in olds if _quotes(words, value)), None)
        on_batch = old_effective is not None and "batch" in comment.lower()  # "16-bit" is no effective batch
        if quoted is None and on_batch and _quotes(words, old_effective):
            quoted = ("effective batch", old_effective)
        spoken = next((word for word in _vocabulary(a.map) if _quotes(comment, word)), None)
        figure = FIGURE.search(comment)
        line = _line_of(new_text, a.key.rpartition(".")[2], comment) or doc.text.count("\n", 0, start) + 1
        if quoted:
            whose = "its old value" if quoted[0] == a.key else f"the old {quoted[0]}"
            where = f"{name}:{line}: {a.key}: the comment {comment!r} quotes {quoted[1]}, {whose}"
            if effective is not None and quoted[1] == effective:
                if not ON_EFFECTIVE.search(comment):  # "# effective batch 32" at 16 x 2 still holds: nothing to say
                    out.append(f"{where}, and the new effective batch; check the comment still holds")
            else:
                out.append(f"{where}; update the comment")
        elif spoken:
            out.append(f"{name}:{line}: {a.key}: the comment {comment!r} speaks of {spoken}, not of the "
                       f"new value {a.value}; check the comment still holds")
        elif figure:
            out.append(f"{name}:{line}: {a.key}: the comment {comment!r} gives a figure ({figure.group(0)}) "
                       f"measured before the change from {str(old).lower() if isinstance(old, bool) else old}; "
                       "check the comment still holds")
    return out


ON_EFFECTIVE = re.compile(r"\b(effective|global|total)\b", re.I)
"""A comment that says it is about the effective batch (a number equal to the new one then still holds)."""
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:%|[KMGT]i?B\b|(?:samples|tokens|it)/s\b|s/it\b|ms\b)", re.I)
"""A share, a size or a speed in a comment: what someone measured at the old value (`14%`, `24 GB`, `310 samples/s`)."""


def _vocabulary(keymap) -> list[str]:
    """Words that name the knob's values: every spelling in its key map, and the parts of those with a
    digit (bf16 of bf16-mixed, 16 of 16-mixed), longest first."""
    words = set()
    for pair in (keymap.values or {}).items():
        for value in pair:
            if isinstance(value, str):
                words.add(value)
                words.update(part for part in value.split("-") if any(ch.isdigit() for ch in part))
    return sorted(words, key=len, reverse=True)


def _comment_after(text: str, end: int) -> str | None:
    line_end = text.find("\n", end)
    rest = text[end:line_end if line_end >= 0 else len(text)]
    if rest.strip().startswith("#"):
        return rest.strip()
    # in a flow mapping (`data: {batch_size: 8, workers: 2}  # ...`) the line's comment follows the other entries
    found = re.search(r"\s(#.*)$", rest)
    return found.group(1).strip() if found and not re.search(r"['\"]", rest[:found.start()]) else None


def _quotes(comment: str, value: object) -> bool:
    """The value as a whole token of the comment (32 in "batch 32", not in "320" or "3.2")."""
    token = str(value)
    return bool(token) and re.search(rf"(?<![\w.]){re.escape(token)}(?![\w]|\.\d)", comment) is not None


def _line_of(text: str, leaf: str, comment: str) -> int | None:
    """The written file's line of `leaf: ... comment`, its key bare or quoted ("depth": 4)."""
    key = re.compile(rf"\s*(['\"]?){re.escape(leaf)}\1\s*:")
    return next((i for i, line in enumerate(text.splitlines(), 1)
                 if key.match(line) and line.rstrip().endswith(comment)), None)
