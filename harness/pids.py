"""Which process a pid is: its start, counted in clock ticks since boot, tells it from a later process
given the same pid, and a clock step moves it not at all.

psutil's create_time() is that start tick plus the boot time, read again from /proc/stat on every call
and moved by every step of the wall clock (NTP, a VM migrated or resumed): one second of it made a live
sweep's trial read as a dead one's, run a second time by another worker, and its own end a traceback.
"""
from __future__ import annotations

import functools
from pathlib import Path


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat's 22nd field); None where it is
    gone, or where /proc cannot say (not Linux)."""
    try:
        after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(after_name[19])  # the fields after the command's name start at the 3rd
    except (OSError, IndexError, ValueError):
        return None


def start_of(pid: int) -> str | None:
    """'BOOT:TICKS' of process `pid`: a reboot, too, makes it another process. None as start_ticks."""
    ticks = start_ticks(pid)
    return None if ticks is None else f"{boot_id()}:{ticks}"


@functools.cache
def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
