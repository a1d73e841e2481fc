"""Writing a plan: atomic replace, a backup of the file it replaces, its permission bits kept, and
refusals that leave every file as it was."""
from __future__ import annotations

import contextlib
import glob
import os
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path

from harness.apply._plan import Plan
from harness.errors import UserError

BACKUP_INFIX = ".bench-backup-"
KEEP_BACKUPS = 5
"""Backups kept per file: the newest ones, besides the oldest (one per apply would grow without bound)."""
STALE_TMP_S = 60
"""A temp file of ours older than this is left from a crashed write (a live one lasts milliseconds)."""


def write(plan: Plan) -> Path | None:
    """Write the plan atomically; return the backup of the file it replaced (None for a new file).

    Refuses, leaving every file as it was, when the source changed or vanished since the plan, or
    when the destination or its folder is read-only (by mode bits, so even root respects them).
    """
    check(plan)
    destination = plan.path.resolve()  # through a symlink: the link keeps pointing at the edited file
    _make_folder(destination.parent)
    backup = _backup(destination) if destination.exists() else None
    in_place = backup is not None and destination.stat().st_nlink > 1
    try:
        if in_place:
            _write_in_place(destination, plan.new_text.encode("utf-8"))
        else:
            _atomic_write(destination, plan.new_text.encode("utf-8"), _mode_for(destination), _owner(destination))
    except OSError as e:
        if in_place:  # not atomic: the file may hold part of the new text until the backup is put back
            try:
                _write_in_place(destination, backup.read_bytes())
            except OSError:
                raise UserError(f"{destination}: could not write it ({e.strerror}) and it may be partly written; "
                                f"its backup {backup} holds what it held: copy it back") from None
        if backup is not None:
            backup.unlink(missing_ok=True)
        raise UserError(f"{destination}: could not write it ({e.strerror}); the file is unchanged") from None
    _tidy(destination)
    if plan.sidecar is not None:
        try:
            _atomic_write(plan.sidecar, plan.sidecar_text.encode("utf-8"), _mode_for(plan.sidecar),
                          _owner(plan.sidecar))
        except OSError as e:
            raise UserError(f"{destination} was written, but its provenance file {plan.sidecar} could not be "
                            f"({e.strerror})") from None
    return backup


def write_together(*plans: Plan) -> list[Path | None]:
    """Write every plan or none: all are checked before any is written, and where a later one cannot be
    written (a full disk, or Ctrl-C), those written before it are put back, so a main config and its Hydra
    profile never disagree. Returns each plan's backup."""
    check(*plans)
    written = []
    with _signals_held() as held:  # a Ctrl-C that lands inside a write (after its rename) must not leave it unknown
        for plan in plans:
            if held:
                break
            sidecar = plan.sidecar.read_bytes() if plan.sidecar is not None and plan.sidecar.exists() else None
            try:
                backup = write(plan)
            except UserError as e:
                raise UserError(str(e) + "".join(_put_back(*done) for done in reversed(written))) from None
            except KeyboardInterrupt:  # raised by other means than the signals held: the ones written put back too
                for done in reversed(written):
                    _put_back(*done)
                raise
            written.append((plan, backup, sidecar))
        if held:  # Ctrl-C, SIGTERM or SIGHUP during the writes: every file as it was, then the signal acts
            for done in reversed(written):
                _put_back(*done)
    return [backup for _, backup, _ in written]


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C, SIGTERM and SIGHUP held (their numbers collected in the list it yields) while the files are
    written and, where one came, put back; then delivered again under the handlers they had. A signal
    ignored before stays ignored; off the main thread (where none can be set) nothing is held."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) not in (signal.SIG_IGN, None):
            previous[signum] = signal.signal(signum, lambda number, frame: held.append(number))
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])


def _put_back(plan: Plan, backup: Path | None, sidecar: bytes | None) -> str:
    """Undo write(plan): the file as its backup holds it (a new one removed), its sidecar as it was;
    the words the error adds."""
    destination = plan.path.resolve()
    try:
        if backup is None:
            destination.unlink(missing_ok=True)
        elif destination.stat().st_nlink > 1:
            _write_in_place(destination, backup.read_bytes())
        else:
            _atomic_write(destination, backup.read_bytes(), _mode_for(destination), _owner(destination))
        if plan.sidecar is not None and sidecar is None:
            plan.sidecar.unlink(missing_ok=True)
        elif plan.sidecar is not None:
            _atomic_write(plan.sidecar, sidecar, _mode_for(plan.sidecar), _owner(plan.sidecar))
    except OSError as e:
        return (f"; {destination} was written and could not be put back ({e.strerror})"
                + (f": its backup {backup} holds what it held" if backup else ""))
    if backup is not None:
        backup.unlink(missing_ok=True)
    return f"; {destination} is put back as it was"


def check(*plans: Plan) -> None:
    """Every refusal write() would make, for each plan, before any of them is written: a Hydra profile
    whose folder is read-only must leave the main config unwritten too. Creates nothing."""
    for plan in plans:
        _check_source_unchanged(plan)
        _check_writable(plan.path.resolve())


def _check_source_unchanged(plan: Plan) -> None:
    if plan.source is None:
        return
    try:
        now = plan.source.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{plan.source}: the file vanished after the plan was made; nothing was written") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{plan.source}: cannot read it again ({e}); nothing was written") from None
    if now != plan.old_text:
        raise UserError(f"{plan.source}: the file changed after the plan was made; run bench apply again")


def _check_writable(destination: Path) -> None:
    """Without creating anything: a folder not there yet (a new Hydra group; the CLI refuses a missing
    --to folder) is checked in the nearest one that is, where it would be made."""
    folder = next(p for p in (destination.parent, *destination.parent.parents) if p.exists())
    if not folder.is_dir():
        raise UserError(f"{destination.parent}: cannot create the folder ({folder} is a file); create it or "
                        "write elsewhere with --to")
    if destination.exists() and not destination.is_file():  # a FIFO or device: the backup's read would block
        raise UserError(f"{destination}: not a regular file; write to a file (or elsewhere with --to)")
    for path, what in ((destination, "file"), (folder, "folder")):
        if path.exists() and not _writable(path):
            raise UserError(f"{path}: the {what} is read-only; make it writable (chmod u+w) or write elsewhere "
                            "with --to")


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{folder}: cannot create the folder ({e.strerror}); create it or write elsewhere "
                        "with --to") from None


def _writable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IWUSR) and os.access(path, os.W_OK)


def _backup(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup, n = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}"), 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}-{n}")
    try:
        _atomic_write(backup, path.read_bytes(), _mode_for(path), _owner(path))
    except OSError as e:
        raise UserError(f"{path}: could not write the backup {backup.name} ({e.strerror}); "
                        "the file is unchanged") from None
    return backup


def _tidy(path: Path) -> None:
    """Prune backups between the oldest and the newest KEEP_BACKUPS, and temp files a crashed write left
    beside the file. The oldest is your file as it was before bench first wrote it: six applies had
    pruned it, and no backup held the config you started from."""
    name = glob.escape(path.name)  # cfg[1].yaml as a pattern matches cfg1.yaml: another file's backups
    backups = sorted(path.parent.glob(f"{name}{BACKUP_INFIX}*"), key=lambda p: (p.stat().st_mtime, p.name))
    stale = [p for p in path.parent.glob(f".{name}.*.tmp") if time.time() - p.stat().st_mtime > STALE_TMP_S]
    for old in backups[1:-KEEP_BACKUPS] + stale:
        old.unlink(missing_ok=True)


def replace_file(path: Path, data: bytes) -> None:
    """`path` (a regular file, or none yet) replaced atomically, keeping its mode and owner: for files
    bench writes besides the apply target (`bench report --out`)."""
    _atomic_write(path, data, _mode_for(path), _owner(path))


def _mode_for(path: Path) -> int:
    """The existing file's permission bits, or what a new file gets under the current umask."""
    if path.exists():
        return stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _owner(path: Path) -> tuple[int, int] | None:
    """The existing file's owner and group, which the new file keeps (root applying to a user's file)."""
    if not path.exists():
        return None
    st = path.stat()
    return st.st_uid, st.st_gid


def _write_in_place(path: Path, data: bytes) -> None:
    """A file with other hard links is rewritten in place, as editors do: a rename would leave the other
    names holding the old text. Not atomic, so the backup taken just before is the way back."""
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())


def _atomic_write(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    """Readers see the old bytes or the new ones, never a mix; a crash leaves the old file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                with contextlib.suppress(OSError):  # only root may give a file away; some filesystems never
                    os.fchown(f.fileno(), *owner)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power loss
    finally:
        os.close(folder)
