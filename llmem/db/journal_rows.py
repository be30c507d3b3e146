"""The dream journal's rows (`dream_action`) and the plain rows an undo puts back."""

from __future__ import annotations

import json
from typing import Any

# The op of a backfill's session actions (dream/backfill.py): `after` maps each kind of memory
# the sessions created ("add", "episode") to [id, updated_at] pairs in the order they were
# made, `before` lists the session cursors the backfill moved, in the order read, each as
# [adapter, session_id, row as it was], and a run of sessions of one adapter that had no
# cursor before as [adapter, [session_id, ...]] (most of a first backfill's sessions: the
# adapter said once and no null for each is a sixth of `before`, which with `after` decides
# whether a small backfill's action fits in one page or spills onto a second). Older actions
# hold [adapter, session_id, null] each, and an older store's action of one session one whole
# `row` image. A row per memory, with its two index
# entries, was ~0.2x the text a store holds, and a row per session 0.2x a small one's
# (issue 18): a run's sessions share an action until its images pass SESSION_ACTION_BYTES.
# Undo reads it as the `create`s and the `row`s it stands for (actions_newest_first).
SESSION_OP = "session"
CURSOR_TABLE = "session_cursor"  # the table of the cursors a session action puts back
_COMPACT = (",", ":")  # JSON without the spaces: a session action is ids and numbers mostly
# An action is rewritten whole as each session joins it (every write of a backfill is
# journaled in the session's own transaction): at this size, a few pages a session.
SESSION_ACTION_BYTES = 8192


def insert_action(db, run_id: str, phase: str, kind: str, op: str, memory_id: str | None,
                  before: str | None, after: str | None, at: float) -> None:
    """Record one applied action of a run with its before- and after-images (JSON texts)."""
    db.execute_sql("INSERT INTO dream_action(run_id, phase, kind, op, memory_id, before, after, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (run_id, phase, kind, op, memory_id, before, after, at))


def insert_session_action(db, run_id: str, phase: str, before: str | None, after: str, at: float) -> int:
    """Record a session action (SESSION_OP) of a run; its id, for the sessions that join it."""
    return db.execute_sql("INSERT INTO dream_action(run_id, phase, kind, op, memory_id, before, after, created_at) "
                          "VALUES (?, ?, 'session', ?, NULL, ?, ?, ?) RETURNING id",
                          (run_id, phase, SESSION_OP, before, after, at)).fetchone()[0]


def rewrite_images(db, action_id: int, before: str | None, after: str) -> None:
    """Replace the images of session action `action_id` (another session joined it)."""
    db.execute_sql("UPDATE dream_action SET before = ?, after = ? WHERE id = ?", (before, after, action_id))


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
                          cursors_before: list[tuple[str, str, dict[str, Any] | None]]) -> tuple[str | None, str]:
    """The (before, after) JSON texts of a session action: `created` maps a kind to its
    (id, updated_at) pairs; `cursors_before` are the moved cursors, (adapter, session_id,
    row as it was or None)."""
    return (json.dumps(_grouped_cursors(cursors_before), ensure_ascii=False, separators=_COMPACT)
            if cursors_before else None,
            json.dumps({kind: [list(pair) for pair in pairs] for kind, pairs in created.items() if pairs},
                       ensure_ascii=False, sort_keys=True, separators=_COMPACT))


def _grouped_cursors(cursors_before) -> list[list]:
    """`before`'s entries: a cursor with a row image as [adapter, session_id, row]; each run
    of sessions of one adapter that had none as [adapter, [session_id, ...]]."""
    entries: list[list] = []
    for adapter, session_id, row in cursors_before:
        if row is not None:
            entries.append([adapter, session_id, row])
        elif entries and entries[-1][0] == adapter and isinstance(entries[-1][1], list):
            entries[-1][1].append(session_id)
        else:
            entries.append([adapter, [session_id]])
    return entries


def moved_cursors(before) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(adapter, session_id, row as it was or None) of each cursor a session action's list
    `before` (JSON text or parsed) names, in the order read."""
    held = json.loads(before) if isinstance(before, str) else before
    moved: list[tuple[str, str, dict[str, Any] | None]] = []
    for entry in held or ():
        if isinstance(entry[1], list):
            moved.extend((entry[0], session_id, None) for session_id in entry[1])
        else:
            moved.append((entry[0], entry[1], entry[2]))
    return moved


def cursor_images(before) -> list[dict[str, Any]]:
    """The `row` images ({table, key, row}) of the cursors a session action's `before`
    (JSON text or parsed) puts back."""
    held = json.loads(before) if isinstance(before, str) else before
    if not held:
        return []
    if isinstance(held, dict):  # an older action of one session: its image whole
        return [held]
    return [{"table": CURSOR_TABLE, "key": {"adapter": adapter, "session_id": session_id}, "row": row}
            for adapter, session_id, row in moved_cursors(held)]


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
    first: the cursors' `row`s (journaled last), then a `create` per memory, the last made first."""

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
                held.extend(("row", None, json.dumps(image), None) for image in reversed(cursor_images(before)))
                held.extend(("create", created, None, json.dumps({"updated_at": stamp}))
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
