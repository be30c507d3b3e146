"""The dream lock: one row in the store's `setting` table, so it holds across processes.

The worker's periodic dream, the systemd timer and a user's `llmem dream --apply` may start
at the same moment; the first to take the row wins and the others are refused. A lock left
by a process that died (kill -9, power loss) is taken over: on this host we ask the kernel
whether its pid still lives; a lock from another host is trusted for STALE_AFTER seconds.
"""

from __future__ import annotations

import json
import os
import socket

from ..adapters.copilot import pid_is_alive
from ..db.settings import get_setting, set_setting
from ..errors import LlmemError
from ..times import now, to_iso

LOCK_KEY = "dream_lock"
STALE_AFTER = 6 * 3600.0


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


def lock_is_live(holder: dict | None) -> bool:
    """Whether a lock row belongs to a run that is still going."""
    if not holder:
        return False
    if holder.get("host") == socket.gethostname():
        return pid_is_alive(int(holder.get("pid", 0)))
    return now() - float(holder.get("started_at", 0)) < STALE_AFTER


class DreamLock:
    """Context manager holding the dream lock for one run."""

    def __init__(self, db, run_id: str, what: str = "dream"):
        self.db = db
        self.holder = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
                       "what": what, "started_at": now()}
        self.taken_over: dict | None = None

    def acquire(self) -> DreamLock:
        with self.db.atomic():
            current = read_lock(self.db)
            if current and lock_is_live(current) and not self._is_mine(current):
                raise DreamLocked(
                    f"another {current.get('what', 'dream')} run is in progress "
                    f"(run {current.get('run_id')}, pid {current.get('pid')} on {current.get('host')}, "
                    f"started {to_iso(current.get('started_at'))})",
                    hint="wait for it to finish; a lock left by a dead process is taken over automatically")
            self.taken_over = current if current and not self._is_mine(current) else None
            set_setting(self.db, LOCK_KEY, json.dumps(self.holder))
        return self

    def _is_mine(self, holder: dict) -> bool:
        return holder.get("pid") == self.holder["pid"] and holder.get("host") == self.holder["host"] \
            and holder.get("run_id") == self.holder["run_id"]

    def release(self) -> None:
        with self.db.atomic():
            current = read_lock(self.db)
            if current and self._is_mine(current):
                self.db.execute_sql("DELETE FROM setting WHERE key = ?", (LOCK_KEY,))

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
