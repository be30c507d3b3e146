"""The dream journal's rows (`dream_action`) and the plain rows an undo puts back."""

from __future__ import annotations

from typing import Any


def insert_action(db, run_id: str, phase: str, kind: str, op: str, memory_id: str | None,
                  before: str | None, after: str | None, at: float) -> None:
    """Record one applied action of a run with its before- and after-images (JSON texts)."""
    db.execute_sql("INSERT INTO dream_action(run_id, phase, kind, op, memory_id, before, after, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (run_id, phase, kind, op, memory_id, before, after, at))


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
    return [r[0] for r in db.execute_sql(
        "SELECT DISTINCT a.run_id FROM dream_action a JOIN dream_run r ON r.id = a.run_id "
        "WHERE r.started_at > ? AND r.status != 'undone' AND r.kind <> ? AND a.memory_id IN "
        "(SELECT memory_id FROM dream_action WHERE run_id = ? AND memory_id IS NOT NULL) ORDER BY 1",
        (started_at, except_kind, run_id))]


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
    return db.execute_sql("SELECT op, memory_id, before, after FROM dream_action WHERE run_id = ? "
                          "ORDER BY id DESC", (run_id,))


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
