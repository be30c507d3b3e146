"""Moments the watcher could not record, kept on this machine's disk until the store answers.

A laptop away from its store's server still sees its agents' turns finish: the watcher
(pipeline/watcher.py) hands each moment it could not record (idle, ending, compacting,
created) to the spool, which appends it to `spool.jsonl` in llmem's data folder (beside the
queue and the machine id) and fsyncs it before the watcher moves on. When the store answers
again, the moments are delivered in the order they were kept, each marked delivered (one
more fsynced line) once its event row is committed, and the file goes when nothing is left.

Exactly once: a moment is delivered through `record_event(since=…)` (pipeline/events.py), so
a delivery repeated after a crash between the commit and its mark — or the same moment seen
again by a watcher restarted during the outage — finds the event the first one recorded and
adds none. The file is llmem's own: 0600, never through a symlink, refused when another user
owns it or it has a second name; it is bounded (MAX_MOMENTS waiting), and past the bound the
watcher keeps retrying in memory as it does without a spool. A torn last line (a crash in
the middle of an append, before the watcher was told the moment was kept) is skipped.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from ..paths import default_paths, ensure_private_dir, open_own_file

log = logging.getLogger(__name__)

SPOOL_FILE = "spool.jsonl"
MAX_MOMENTS = 10_000  # waiting moments: a week offline of a busy machine is a few hundred
MAX_BYTES = 8 << 20  # … and the file, delivered marks included


@dataclass(frozen=True)
class SpooledMoment:
    """One moment kept for the store: what record_event needs, and which one it is."""

    id: str
    adapter: str
    session_id: str
    kind: str
    since: float  # epoch s: when its turn began (or when it was kept); an event since is it
    kept_at: float


def default_spool_path() -> Path:
    """This machine's spool, in the data folder (each LLMEM_HOME is its own machine)."""
    return default_paths().queue_path.parent / SPOOL_FILE


class Spool:
    """The spool file and its delivery through `deliver` (one moment → its event recorded)."""

    def __init__(self, path: Path, deliver: Callable[[SpooledMoment], None]):
        self.path = path
        self.deliver_one = deliver
        self._lock = threading.Lock()
        self._waiting: int | None = None  # known count of undelivered moments (None: read it)
        self._torn = False  # the file's last line was cut short (a crash mid-append)

    # ---- the file ----------------------------------------------------------------------

    @contextmanager
    def _locked(self):
        """This process's threads and any other process on the same home, one at a time."""
        import fcntl

        ensure_private_dir(self.path.parent)
        with self._lock:
            fd = open_own_file(self.path.with_name(SPOOL_FILE + ".lock"), os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _append(self, record: dict) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        if self._torn:  # end the torn line first, or this record would be glued to it
            line = b"\n" + line
        fd = open_own_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            _check_own(fd, self.path)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._torn = False

    def _read(self) -> tuple[list[SpooledMoment], int]:
        """(the moments not delivered yet, in order kept; the file's size)."""
        self._torn = False
        try:
            fd = open_own_file(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return [], 0
        try:
            _check_own(fd, self.path)
            with os.fdopen(fd, "rb", closefd=False) as fh:
                data = fh.read()
        finally:
            os.close(fd)
        kept: dict[str, SpooledMoment] = {}
        delivered: set[str] = set()
        lines = data.splitlines()
        self._torn = bool(data) and not data.endswith(b"\n")
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                if "delivered" in record:
                    delivered.add(str(record["delivered"]))
                else:
                    moment = SpooledMoment(**record["kept"])
                    kept[moment.id] = moment
            except (ValueError, TypeError, KeyError):
                # A torn last line: its moment was never reported kept, so the watcher still
                # holds it (or its restart catches it up); anything else is damage, said once.
                if line.strip() and not (self._torn and number == len(lines)):
                    log.warning("spool %s: line %d is damaged; skipped", self.path, number)
        return [moment for key, moment in kept.items() if key not in delivered], len(data)

    # ---- what the watcher calls --------------------------------------------------------

    def waiting(self) -> int:
        """How many moments wait for the store."""
        if self._waiting is None:
            with self._locked():
                self._waiting = len(self._read()[0])
        return self._waiting

    def keep(self, adapter: str, session_id: str, kind: str, *, since: float, now: float) -> bool:
        """Keep one moment for later (fsynced before this returns True). False when it cannot
        be kept: the spool is full, or the disk refuses (the caller keeps it in memory)."""
        moment = SpooledMoment(secrets.token_hex(8), adapter, session_id, kind, since, now)
        try:
            with self._locked():
                pending, size = self._read()
                if len(pending) >= MAX_MOMENTS or size >= MAX_BYTES:
                    log.warning("spool %s is full (%d moments waiting): holding the moment in memory",
                                self.path, len(pending))
                    return False
                self._append({"kept": asdict(moment)})
                self._waiting = len(pending) + 1
        except OSError as exc:
            log.warning("spool %s: cannot keep the moment: %s", self.path, exc)
            return False
        return True

    def deliver(self) -> int:
        """Deliver the waiting moments in order; return how many went. Stops at the first
        that fails (the store is still away), which is raised, the rest left for later."""
        delivered = 0
        with self._locked():
            pending, _ = self._read()
            try:
                for moment in pending:
                    self.deliver_one(moment)
                    self._append({"delivered": moment.id})
                    delivered += 1
            finally:
                left = len(pending) - delivered
                self._waiting = left
                if left == 0 and pending:
                    self.path.unlink(missing_ok=True)
        if delivered:
            log.info("spool: delivered %d kept moment(s) to the store%s", delivered,
                     f"; {len(pending) - delivered} still waiting" if delivered < len(pending) else "")
        return delivered


def _check_own(fd: int, path: Path) -> None:
    """OSError unless the open file is llmem's own: this user's, and under this one name."""
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise OSError(f"{path} belongs to another user (uid {info.st_uid}); llmem keeps its spool "
                      "only in a file of its own (remove it)")
    if info.st_nlink > 1:
        raise OSError(f"{path} has other names (hard links); llmem writes only files of its own "
                      "(remove it)")
