"""The watcher's per-session state rows (table `watch_session`, migrations 0009 and 0020).

Each machine's watcher keeps its own rows (llmem/machine.py): on a store several machines
share, one machine's state of a session it watches says nothing of another's.
"""

from __future__ import annotations

from ..machine import machine_id


def watch_session_rows(db) -> list[tuple]:
    """(adapter, session_id, idle_reply, compacting, ended, ended_turn, seen_compaction_id) of
    every watched session; compacting and ended are 0 or 1."""
    return db.execute_sql(
        "SELECT adapter, session_id, idle_reply, compacting, ended, ended_turn, seen_compaction_id "
        "FROM watch_session WHERE machine = ?", (machine_id(),)).fetchall()


def save_watch_session(db, adapter: str, session_id: str, *, idle_reply: str | None, compacting: bool,
                       ended: bool, ended_turn: str | None, seen_compaction_id: str | None, at: float) -> None:
    """Insert or replace one session's state row, stamped `at`."""
    db.execute_sql(
        "INSERT INTO watch_session (machine, adapter, session_id, idle_reply, compacting, ended, "
        "ended_turn, seen_compaction_id, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (machine, adapter, session_id) DO UPDATE SET idle_reply = excluded.idle_reply, "
        "compacting = excluded.compacting, ended = excluded.ended, "
        "ended_turn = excluded.ended_turn, seen_compaction_id = excluded.seen_compaction_id, "
        "updated_at = excluded.updated_at",
        (machine_id(), adapter, session_id, idle_reply, int(compacting), int(ended), ended_turn,
         seen_compaction_id, at))


def last_watch_session_update(db) -> float | None:
    """When any session's state row of this machine was last saved (None: no rows)."""
    return db.execute_sql("SELECT MAX(updated_at) FROM watch_session WHERE machine = ?",
                          (machine_id(),)).fetchone()[0]
