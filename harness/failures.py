"""A sweep that cannot succeed: every trial fails with the same error, in the user's code.

A config that does not fit fails with an OOM, which is a result; an error that the first few
configs all raise alike (a module that reads something bench did not give it, a typo in a batch
function) will be raised by every other config too. The sweep stops on it with one line, and the
report names it instead of blaming memory. Parent side: reads records, never imports torch.
"""
from __future__ import annotations

import re
from pathlib import Path

from harness import record

SAME_ERROR_STOPS_AFTER = 3
"""Trials that failed alike, and none trained, before the sweep stops."""

IN_FLIGHT_OR_NOT_RUN = (None, "running", record.INTERRUPTED, record.SKIPPED)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_NOT_USERS = (str(Path(__file__).parent), "site-packages", "dist-packages", "/lib/python", "<frozen", "<string>")


def common_error(rows: list[dict]) -> dict | None:
    """The error every measured trial failed with, when none trained and they all failed alike."""
    measured = [r for r in rows if r.get("status") not in IN_FLIGHT_OR_NOT_RUN]
    if not measured or any(r["status"] != record.ERROR for r in measured):
        return None
    signatures = {signature(r.get("error") or {}) for r in measured}
    return measured[-1].get("error") if len(signatures) == 1 else None


def hopeless(rows: list[dict], enough: int = SAME_ERROR_STOPS_AFTER) -> dict | None:
    """common_error, once `enough` trials have failed alike that the rest would too, or at once when the
    trial marked it `every_config` (a mistake in the workload that no knob value changes)."""
    measured = [r for r in rows if r.get("status") not in IN_FLIGHT_OR_NOT_RUN]
    same = common_error(rows)
    return same if same and (len(measured) >= enough or same.get("every_config")) else None


def signature(error: dict) -> tuple:
    """The error's type and first line with its numbers blanked: a shape error names each batch size."""
    return error.get("type"), re.sub(r"\d+", "#", first_line(error))


def first_line(error: dict) -> str:
    return (str(error.get("message") or "").strip().splitlines() or [""])[0]


def users_frame(error: dict) -> str | None:
    """'file:line' of the innermost traceback frame in the user's code (not bench's, not a library's)."""
    frames = _FRAME.findall(error.get("traceback") or "")
    for path, line, _ in reversed(frames):
        if not any(part in path for part in _NOT_USERS):
            return f"{path}:{line}"
    return None


def describe(error: dict) -> str:
    """The error as one line: type, message, and where in the user's code it was raised (bench's own
    refusals, UserFacingError, are their message alone: the type names bench's class, not your bug)."""
    at = users_frame(error)
    head = first_line(error) if error.get("type") == "UserFacingError" else f"{error.get('type')}: {first_line(error)}"
    return record.error_words({**error, "message": head}, at=at)


def stop_message(error: dict, failed: int, log: str | None) -> str:
    fix = "fix it there" if users_frame(error) else "fix the cause the traceback shows"
    which = (f"the first {failed} trials all failed" if failed > 1
             else "the first trial failed" if error.get("every_config") else "the only config failed")
    alike = "" if error.get("hint") else "; every config would fail the same way"  # a hint names the configs it fits
    return (f"stopped: {which} with {describe(error)}{alike}: {fix} and re-run the same command"
            f"{f' (traceback: {log})' if log else ''}")
