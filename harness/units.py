"""Parsing and printing sizes and durations (GiB = 1024**3 bytes)."""
from __future__ import annotations

import math
import os
import re

from harness.errors import UserError, as_written

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_DURATION_UNITS = {"": 1, "ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
MAX_SIZE = 2**60
MIN_SIZE = 2**20
"""Every size parsed is a memory budget, and no model trains in under a MiB."""
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def is_whole(text: str) -> bool:
    """Digits 0-9 only: str.isdigit() also takes "²" and "١", which int() then refuses or reads."""
    return text.isascii() and text.isdigit()


def parse_size(value: object, where: str) -> int:
    """'24GiB', '512MiB', '2GB' or a plain number of bytes -> bytes."""
    number, unit = _number_and_unit(value, where, "size", _SIZE_UNITS, "24GiB", "24GiB, 512MiB or 2GB")
    if number * _SIZE_UNITS[unit] > MAX_SIZE:
        raise UserError(f"{where}: size {value!r} is beyond any machine (over 1 EiB); write it like 24GiB")
    size = int(number * _SIZE_UNITS[unit])
    if size <= 0:
        raise UserError(f"{where}: size must be positive, got {as_written(value)}")
    if size < MIN_SIZE:  # a memory budget: `12` is 12 bytes, and 12GiB was meant
        fix = "write the unit, like 12GiB" if unit in ("", "b") else "a memory budget is at least 1MiB"
        exact = number * _SIZE_UNITS[unit]  # `1.5` is 1.5 bytes as written, not the 1 it rounds to
        as_read = f"{int(exact):,}" if exact == int(exact) else f"{exact:,}"
        raise UserError(f"{where}: size {value!r} is {as_read} byte{'' if as_read == '1' else 's'}, "
                        f"too small for any model; {fix}")
    return size


def parse_duration(value: object, where: str) -> float:
    """'500ms', '90s', '10m', '1.5h', '2d' or a plain number of seconds -> seconds."""
    number, unit = _number_and_unit(value, where, "duration", _DURATION_UNITS, "10m", "90s, 10m or 1.5h")
    seconds = number * _DURATION_UNITS[unit]
    if seconds <= 0:
        raise UserError(f"{where}: duration must be positive, got {as_written(value)}")
    return seconds


def _number_and_unit(value: object, where: str, what: str, units: dict, one: str, examples: str) -> tuple[float, str]:
    """A number and its unit (lower case, "" for none) as written: `value` is what YAML or the command
    line gave, so a bool or a null is refused as what it was, not read as 1, 0 or "None"."""
    if isinstance(value, bool):
        raise UserError(f"{where}: expected a {what} like {one}, got {as_written(value)}")
    if value is None:  # YAML's null (or nothing after the colon): Python's None is not what was written
        raise UserError(f"{where}: is empty; write a {what} like {examples}")
    if isinstance(value, (int, float)):
        return _finite(value, where, what), ""
    m = _NUMBER_UNIT.match(str(value))
    if not m or m.group(2).lower() not in units:
        raise UserError(f"{where}: cannot read {what} {value!r}; write it like {examples}")
    return float(m.group(1)), m.group(2).lower()


ENV_MOST_S = 7 * 86400.0
"""The longest any BENCH_* seconds variable may say: past a week it is a typo (and past 2**63 ns, Python's clocks overflow)."""


def env_seconds(name: str, default: float, least: float = 0.0) -> float:
    """Seconds from the environment variable `name` ('120', '90s', '2m'), `default` where it is unset:
    a typo there is bad input like any other, said in one line before anything is written."""
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    m = _NUMBER_UNIT.match(value)
    if not m or m.group(2).lower() not in _DURATION_UNITS:
        raise UserError(f"{name}={value!r}: cannot read a duration; set it like 120 or 2m (seconds), or unset it")
    seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    if not least <= seconds <= ENV_MOST_S:
        raise UserError(f"{name}={value!r}: must be {least:g} s to {ENV_MOST_S:g} s; set it so, or unset it for {default:g} s")
    return seconds


def _finite(value: int | float, where: str, what: str) -> float:
    """A plain number as a float, refused when it is NaN or infinite (NaN compares false with every limit)."""
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise UserError(f"{where}: {what} must be a finite number, got {as_written(value)}")
    return number


def count(n: int, noun: str) -> str:
    """"1 run", "3 runs": a count with its noun (regular plurals only)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def fixed(value: float, decimals: int) -> str:
    """`value` to `decimals` places, or to two significant digits where those places would leave fewer
    (a table column in one unit: 3 MiB reads 0.0029 GiB, not 0.00; 0.04 samples/s not 0.0)."""
    if value and abs(value) < 10 ** (1 - decimals):
        return f"{value:.2g}"
    return f"{value:.{decimals}f}"


def gib(n_bytes: float | None) -> str:
    """Bytes as GiB for people; '-' when unknown."""
    return "-" if n_bytes is None else f"{n_bytes / 1024**3:.2f} GiB"


def size(n_bytes: float | None) -> str:
    """Bytes for people, MiB below 1 GiB so small parts do not read as 0.00 GiB; '-' when unknown."""
    if n_bytes is None:
        return "-"
    mib = n_bytes / 1024**2
    return f"{mib:.1f} MiB" if abs(round(mib, 1)) < 1024 else gib(n_bytes)  # 1 GiB less a byte: not "1024.0 MiB"
