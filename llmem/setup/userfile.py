"""Reading and replacing a config file that belongs to the user or to an agent, safely.

An installer is handed paths from the environment and the config (CLAUDE_CONFIG_DIR, CODEX_HOME,
session.*), so a path may be anything: a symlink to /dev/null or /etc/passwd, a FIFO that
blocks the first read, a socket, a file of another user, a read-only file. So a config path is
checked before it is read, and again before it is written:

- a symlink is followed only when its target stays inside the folder that holds the link (the
  agent's folder); a link leaving it, a dangling link and a loop are refused;
- anything but a regular file (a device, FIFO, socket, folder) is refused, and a FIFO is never
  opened blocking;
- a file of another user, or one without the owner's write bit (0444), is refused before
  anything is written (as root every write succeeds, so the bits are read, not tried);
- writes never go through a link: the temp file, the backup and the rename all happen in the
  real file's folder, which is inside the agent's folder.

Every refusal is a UsageError (exit 2) naming the file and why, with nothing written.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import UsageError
from ..times import file_stamp

BACKUP_MARK = ".llmem-backup-"
# Backups of one file looked at for a copy of the same bytes or for the original to restore.
BACKUPS_LOOKED_AT = 20

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refuse(path: Path, why: str, hint: str | None = None) -> UsageError:
    return UsageError(f"{path} {why}; nothing was changed",
                      hint=hint or "fix or move the file away, then run the install again")


def real_path(path: Path) -> Path:
    """The file to read and write for the config path `path` (itself, or the target of a link
    that stays in its folder): UsageError for a link that leaves the folder, dangles or loops,
    and for anything that exists but is not a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:  # a loop or a non-folder in the parents
        raise _refuse(path, f"cannot be looked at ({exc.strerror})") from None
    real = path
    if stat.S_ISLNK(info.st_mode):
        try:
            real = path.resolve(strict=True)
        except FileNotFoundError:
            raise _refuse(path, f"is a symlink to {os.readlink(path)}, which does not exist",
                          "remove the link (or create its target), then run the install again") from None
        except (OSError, RuntimeError):  # ELOOP (RuntimeError before Python 3.13)
            raise _refuse(path, "is a symlink loop", "remove the link, then run the install again") from None
        folder = path.parent.resolve()
        if not real.is_relative_to(folder):
            raise _refuse(path, f"is a symlink to {real}, outside {folder}; llmem does not write "
                                "through a link that leaves the agent's folder",
                          "replace the link with a copy of the file, then run the install again")
        info = os.lstat(real)
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, f"is {_kind(info.st_mode)}, not a config file")
    return real


def read_text(path: Path) -> str | None:
    """The text of the config file at `path` (a checked real path), byte for byte: CRLF stays
    CRLF. None when there is no file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "became a symlink while llmem was reading it") from None
        raise _refuse(path, f"cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # swapped since real_path looked
            raise _refuse(path, f"is {_kind(os.fstat(fh.fileno()).st_mode)}, not a config file")
        data = fh.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(path, "is not UTF-8 text") from None


def check_writable(path: Path) -> None:
    """UsageError unless llmem may replace the existing file `path`: the user's own, writable."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if info.st_uid != os.geteuid():
        raise _refuse(path, f"belongs to another user (uid {info.st_uid}); llmem edits only your own files",
                      "run the install as the file's owner")
    if not info.st_mode & stat.S_IWUSR:
        raise _refuse(path, f"is read-only (mode {stat.S_IMODE(info.st_mode):04o}); llmem leaves it as it is",
                      f"make it writable (chmod u+w {path}) to let llmem edit it, or add llmem by hand")


def make_folder(path: Path) -> None:
    """Create the folder of the new file `path` (private when new): UsageError when it cannot
    be made (a dangling link in its place, a file there), never a folder through a link."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        what = "a symlink to a missing folder" if folder.is_symlink() else (exc.strerror or str(exc))
        raise _refuse(path, f"cannot be written: its folder {folder} cannot be created ({what})",
                      "create the folder (or fix the link in its place), then run the install again") from None


def backups_of(path: Path) -> list[Path]:
    """llmem's backups of `path`, newest first (regular files only: a link there is not ours)."""
    found = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    for name in names:
        if name.startswith(path.name + BACKUP_MARK):
            candidate = path.parent / name
            if stat.S_ISREG(os.lstat(candidate).st_mode):
                found.append(candidate)
    return sorted(found, key=lambda p: (os.lstat(p).st_mtime_ns, p.name), reverse=True)[:BACKUPS_LOOKED_AT]


def read_backup(backup: Path) -> str | None:
    try:
        return backup.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def back_up(path: Path, text: str) -> Path:
    """A backup of `text` (the file's current content) beside `path`, and the only one: an
    existing backup with the same bytes is reused and the older ones go, so however many
    times llmem runs there is one backup per original. Created exclusively and without
    following links, mode 0600."""
    data = text.encode("utf-8")
    for existing in backups_of(path):
        try:
            if existing.read_bytes() == data:
                _drop_backups_but(path, existing)
                return existing
        except OSError:
            continue
    made = _new_backup(path, data)
    _drop_backups_but(path, made)
    return made


def _drop_backups_but(path: Path, kept: Path) -> None:
    """Remove llmem's other backups of `path` (regular files named as llmem names them)."""
    for backup in backups_of(path):
        if backup != kept:
            try:
                backup.unlink()
            except OSError:
                pass  # one left over is litter, not a failure of the install


def _new_backup(path: Path, data: bytes) -> Path:
    stamp = file_stamp()
    for n in range(1, 1000):
        candidate = path.with_name(f"{path.name}{BACKUP_MARK}{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return candidate
    raise _refuse(path, "has too many backups beside it", "remove old *.llmem-backup-* files")


def file_mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)
