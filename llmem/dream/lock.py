"""The dream lock: one row in the store's `setting` table, so it holds across processes.

The worker's periodic dream, the systemd timer and a user's `llmem dream --apply` may start
at the same moment; the first to take the row wins and the others are refused. A lock left
by a process that died (kill -9, power loss) is taken over: on this host we ask the kernel
whether its pid still lives (and, where /proc tells, whether that process is the one that
took the lock rather than a later one given the same pid: the lock records the boot id and
the process's start tick, which no jump of the wall clock changes); a lock from another
host is trusted for STALE_AFTER seconds. On a PostgreSQL store, shared by several machines,
the run also holds the server's advisory lock (db/locks.py) on its connection, which the
server drops the moment the connection ends: there, who holds the lock is known exactly on
every host, and the row only says who it is. `llmem queue` and `llmem doctor` show a stale
lock, and `llmem queue --clear-stale-locks` removes it.
"""

from __future__ import annotations

import json
import os
import socket

from ..db.journal_rows import fail_running_run
from ..db.locks import release_server_lock, server_lock_held, take_server_lock
from ..db.settings import (
    claim_setting,
    delete_setting,
    delete_settings_before,
    get_setting,
    set_setting,
)
from ..db.visibility import store_author
from ..errors import LlmemError
from ..processes import process_identity, process_is, process_is_running
from ..times import now, to_iso

LOCK_KEY = "dream_lock"
STALE_AFTER = 6 * 3600.0
# The runs whose lock this process holds now. A lock row naming this process but none of
# these was left by a run whose release could not be written (a full disk): stale, so the
# long-lived worker's next dream takes it over instead of waiting for a restart.
_HELD_HERE: set[str] = set()


class DreamLocked(LlmemError):
    """Another dream (or undo) is running on this store."""


def read_lock(db) -> dict | None:
    raw = get_setting(db, LOCK_KEY)
    if not raw:
        return None
    try:
        holder = json.loads(raw)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def lock_is_live(holder: dict | None, db=None) -> bool:
    """Whether a lock row belongs to a run that is still going (asking the store's server,
    when `db` is given and its backend can tell)."""
    if not holder:
        return False
    if db is not None and (holder.get("host") != socket.gethostname() or holder.get("pid") != os.getpid()):
        held = server_lock_held(db, LOCK_KEY)
        if held is not None:  # the server knows, for every host
            return held
    return _owner_is_live(holder)


def _owner_is_live(holder: dict) -> bool:
    """Whether the process a lock row names is still the run that took it (on this host), or
    took it recently enough to be trusted (on another)."""
    try:
        pid, started_at = int(holder.get("pid", 0)), float(holder.get("started_at", 0))
    except (TypeError, ValueError):
        return False
    if holder.get("host") != socket.gethostname():
        # Another host's clock (or ours, after a jump) may run either way: a lock stamped
        # more than STALE_AFTER away from now, before or after, is stale.
        return abs(now() - started_at) < STALE_AFTER
    if pid == os.getpid() and holder.get("run_id") not in _HELD_HERE:
        return False  # this process, but no run of it holds the lock any more
    if holder.get("start_ticks") is not None:
        # Like with like: the boot and start tick recorded by the owner, against /proc's now.
        return process_is(pid, holder)
    # A lock written before identities were recorded: only a process already running when
    # the lock was taken can be the one that took it.
    return process_is_running(pid, started_at)


def stale_lock(db) -> dict | None:
    """The lock row when its owner is gone (it is taken over by the next run anyway)."""
    holder = read_lock(db)
    return holder if holder and not lock_is_live(holder, db) else None


def clear_stale_lock(db) -> dict | None:
    """Remove a dead owner's lock and mark its run failed; return the lock removed, if any."""
    with db.atomic():
        holder = stale_lock(db)
        if holder is None:
            return None
        delete_setting(db, LOCK_KEY)
        mark_run_interrupted(db, holder.get("run_id"))
    return holder


INTERRUPTED = "the process died during the run"


def mark_run_interrupted(db, run_id: str | None) -> None:
    """A run whose process died holding the lock never finished: say so in its row."""
    if run_id:
        fail_running_run(db, run_id, INTERRUPTED, now())


class DreamLock:
    """Context manager holding the dream lock for one run."""

    def __init__(self, db, run_id: str, what: str = "dream"):
        self.db = db
        self.holder = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
                       "what": what, "started_at": now(), **(process_identity(os.getpid()) or {})}
        self.taken_over: dict | None = None

    def acquire(self) -> DreamLock:
        server_lock = take_server_lock(self.db, LOCK_KEY)
        if server_lock is False:  # another connection, on whichever host, holds it
            raise self._locked(read_lock(self.db) or {})
        try:
            with self.db.atomic():
                current = read_lock(self.db)
                if current and not self._is_mine(current) and self._still_held(current, server_lock):
                    raise self._locked(current)
                self.taken_over = current if current and not self._is_mine(current) else None
                set_setting(self.db, LOCK_KEY, json.dumps(self.holder))
        except BaseException:
            if server_lock:
                release_server_lock(self.db, LOCK_KEY)
            raise
        _HELD_HERE.add(self.holder["run_id"])
        return self

    def _still_held(self, current: dict, server_lock: bool | None) -> bool:
        if server_lock is None:
            return lock_is_live(current, self.db)
        # The server's lock is ours now: a row of anyone else is left by a run that ended,
        # but for another run of this very process (advisory locks nest per connection).
        same_process = current.get("host") == self.holder["host"] and current.get("pid") == self.holder["pid"]
        return same_process and _owner_is_live(current)

    @staticmethod
    def _locked(current: dict) -> DreamLocked:
        return DreamLocked(
            f"another {current.get('what', 'dream')} run is in progress "
            f"(run {current.get('run_id')}, pid {current.get('pid')} on {current.get('host')}, "
            f"started {to_iso(current.get('started_at'))})",
            hint="wait for it to finish; a lock left by a dead process is taken over automatically")

    def _is_mine(self, holder: dict) -> bool:
        return holder.get("pid") == self.holder["pid"] and holder.get("host") == self.holder["host"] \
            and holder.get("run_id") == self.holder["run_id"]

    def release(self) -> None:
        # Not held any more whether or not the row's removal can be written: a row left
        # behind is stale at once (see lock_is_live).
        _HELD_HERE.discard(self.holder["run_id"])
        try:
            with self.db.atomic():
                current = read_lock(self.db)
                if current and self._is_mine(current):
                    delete_setting(self.db, LOCK_KEY)
        finally:
            release_server_lock(self.db, LOCK_KEY)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


SLOT_PREFIX = "dream_slot:"


def claim_scheduled_slot(db, slot: str, machine: str) -> str | None:
    """Claim the scheduled dream of `slot` (its minute, e.g. `2026-12-02T03:00+01:00`) for
    `machine`: None when claimed, else the machine that claimed it first.

    Every machine sharing a store runs the periodic dream at the same scheduled minute; the
    lock alone lets a second one run once the first is done (a small store dreams in a
    second), so the slot itself is claimed, and the night's dream runs once per store and
    user (on a team's store each user's dream sees their own private memories)."""
    mine = f"{SLOT_PREFIX}{store_author(db) or ''}:"
    key = mine + slot
    with db.atomic():
        if claim_setting(db, key, machine):
            delete_settings_before(db, mine, key)
            return None
    return get_setting(db, key) or "another machine"
