"""The dream journal's rows (`dream_action`) and the plain rows an undo puts back."""

from __future__ import annotations

import json
from typing import Any

# The op of a backfill's one action per session (dream/backfill.py): `after` maps each kind
# of memory it created ("add", "episode") to [id, updated_at] pairs in the order they were
# made, `before` is the session cursor as it was (a `row` image; null: unchanged). A row per
# memory, with its two index entries, was ~0.2x the text a store holds (issue 18). Undo
# reads it as the `create`s and the `row` it stands for (actions_newest_first).
SESSION_OP = "session"


def insert_action(db, run_id: str, phase: str, kind: str, op: str, memory_id: str | None,
                  before: str | None, after: str | None, at: float) -> None:
    """Record one applied action of a run with its before- and after-images (JSON texts)."""
    db.execute_sql("INSERT INTO dream_action(run_id, phase, kind, op, memory_id, before, after, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (run_id, phase, kind, op, memory_id, before, after, at))


# The later runs (started after ?, not undone, not of kind ?) with an action on a memory IN …
_LATER_RUNS_ON = ("SELECT DISTINCT a.run_id FROM dream_action a JOIN dream_run r ON r.id = a.run_id "
                  "WHERE r.started_at > ? AND r.status != 'undone' AND r.kind <> ? AND a.memory_id IN ")


def later_runs_on_same_memories(db, run_id: str, started_at: float,
                                except_kind: str = "") -> list[str]:
    """The ids of the runs started after `started_at`, not undone, that changed a memory run
    `run_id` changed, sorted; runs of `except_kind` left out."""
    # The later runs first (usually none: an undo of the last night), so the journal of a
    # run of 100k actions is not joined with itself for nothing (1.5 s at 100k).
    later = [r[0] for r in db.execute_sql(
        "SELECT id FROM dream_run WHERE started_at > ? AND status != 'undone' AND kind <> ? ORDER BY 1",
        (started_at, except_kind))]
    if not later:
        return []
    found = {r[0] for r in db.execute_sql(
        _LATER_RUNS_ON + "(SELECT memory_id FROM dream_action WHERE run_id = ? AND memory_id IS NOT NULL)",
        (started_at, except_kind, run_id))}
    # The memories a backfill's session actions created (no memory_id of their own).
    created = [memory_id for (after,) in db.execute_sql(
                   "SELECT after FROM dream_action WHERE run_id = ? AND op = ?", (run_id, SESSION_OP))
               for memory_id, _ in _created_pairs(after)]
    for start in range(0, len(created), 500):
        chunk = created[start:start + 500]
        found.update(r[0] for r in db.execute_sql(
            _LATER_RUNS_ON + f"({', '.join('?' * len(chunk))})", (started_at, except_kind, *chunk)))
    return sorted(found)


def _created_pairs(after_text: str | None) -> list[tuple[str, float]]:
    """(memory id, updated_at) of every memory a session action created, in the order made."""
    created = json.loads(after_text) if after_text else {}
    return [(memory_id, stamp) for pairs in created.values() for memory_id, stamp in pairs]


def session_action_images(created: dict[str, list[tuple[str, float]]],
                          cursor_before: dict[str, Any] | None) -> tuple[str | None, str]:
    """The (before, after) JSON texts of a session action: `created` maps a kind to its
    (id, updated_at) pairs; `cursor_before` is the cursor's `row` image (None: unchanged)."""
    return (None if cursor_before is None else json.dumps(cursor_before, ensure_ascii=False, sort_keys=True),
            json.dumps({kind: [list(pair) for pair in pairs] for kind, pairs in created.items() if pairs},
                       ensure_ascii=False, sort_keys=True))


def created_in_session_actions(db, memory_id: str) -> list[tuple[int, str]]:
    """(action id, kind) of the session actions that created `memory_id` (its history)."""
    rows = db.execute_sql("SELECT id, after FROM dream_action WHERE op = ? AND after LIKE ?",
                          (SESSION_OP, f'%"{memory_id}"%')).fetchall()
    return [(action_id, kind) for action_id, after in rows
            for kind, pairs in json.loads(after or "{}").items()
            if any(pair[0] == memory_id for pair in pairs)]


def forget_images(db, memory_id: str) -> int:
    """Empty the before- and after-images the journal holds of a memory deleted for good (its
    text and metadata must not outlive it there); the rows stay, saying what was done when.
    An undo finds nothing to restore for it, as for any memory that is gone."""
    cursor = db.execute_sql("UPDATE dream_action SET before = '{}', after = '{}' "
                            "WHERE memory_id = ? AND op = 'update'", (memory_id,))
    return cursor.rowcount


def actions_newest_first(db, run_id: str):
    """A cursor over (op, memory_id, before, after) of a run's actions, newest first.

    A cursor, not a list: a big night journals ~100k actions with before-images, so the
    caller reads it in chunks (`fetchmany`).
    """
    return _Expanded(db.execute_sql("SELECT op, memory_id, before, after FROM dream_action WHERE run_id = ? "
                                    "ORDER BY id DESC", (run_id,)))


class _Expanded:
    """A cursor of actions that reads each session action as what it stands for, newest
    first: the cursor's `row` (journaled last), then a `create` per memory, the last made first."""

    def __init__(self, cursor):
        self._cursor = cursor
        self._held: list[tuple] = []

    def fetchmany(self, size: int) -> list[tuple]:
        while len(self._held) < size:
            rows = self._cursor.fetchmany(size)
            if not rows:
                break
            held = self._held
            for row in rows:
                if row[0] != SESSION_OP:
                    held.append(row)  # as read: most of a night's 100k actions
                    continue
                _, _, before, after = row
                if before is not None:
                    self._held.append(("row", None, before, None))
                self._held.extend(("create", created, None, json.dumps({"updated_at": stamp}))
                                  for created, stamp in reversed(_created_pairs(after)))
        out, self._held = self._held[:size], self._held[size:]
        return out


def replace_row(db, table: str, columns: tuple[str, ...], key: dict[str, Any],
                row: dict[str, Any] | None) -> None:
    """Delete `table`'s row at `key`, then insert `row` (when given), both over `columns` only.

    `table` and `columns` come from the caller's fixed list, never from stored data.
    """
    key_sql = " AND ".join(f"{k} = ?" for k in key if k in columns)
    db.execute_sql(f"DELETE FROM {table} WHERE {key_sql}", [key[k] for k in key if k in columns])
    if row:
        names = [c for c in columns if c in row]
        db.execute_sql(f"INSERT INTO {table}({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                       [row[c] for c in names])


def fail_running_run(db, run_id: str, error: str, at: float) -> None:
    """Mark run `run_id` failed with `error` at `at`, if it is still marked running."""
    db.execute_sql("UPDATE dream_run SET status = 'failed', error = ?, finished_at = ? "
                   "WHERE id = ? AND status = 'running'", (error, at, run_id))
