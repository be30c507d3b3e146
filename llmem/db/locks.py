"""Locks the database server holds for a connection, where the backend has them.

SQLite has none that several processes can see: the dream lock (dream/lock.py) is a row
written in a write transaction, and WAL refuses a writer whose snapshot is stale, so two
takers cannot both win; whether the row's owner still lives is asked of the kernel on this
host, and a row from another host is trusted for hours. On PostgreSQL several machines share
one store: a session-level advisory lock is held by the connection of the run that took it,
and the server drops it the moment that connection ends, however and wherever its process
died, so the lock holds across hosts with no guess at all.
"""

from __future__ import annotations

from .backend import per_backend


@per_backend
def take_server_lock(db, name: str) -> bool | None:
    """Take the server-held lock `name` for this connection: True when taken, False when
    another connection holds it, None when the backend has no such lock."""
    return None


@per_backend
def release_server_lock(db, name: str) -> None:
    """Release what take_server_lock took on this connection."""
    return None


@per_backend
def server_lock_held(db, name: str) -> bool | None:
    """Whether any connection holds the lock `name` now (None: the backend cannot tell)."""
    return None
