"""Bulk writes: one prepared statement per batch (`executemany`), for the paths that write
thousands of rows at once (import, `embed --pending`, a dream's actions and their undo).

Building one peewee query per row cost 3–10× the database's own time on these paths (the import's
memory rows go through queries.insert_memory_rows the same way); here
the statement is prepared once and SQLite runs it for every row. Each function takes plain
Python values (already in their stored form, JSON as text) and returns nothing or plain rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .models import Memory
from .queries import insert_staged

# Rows per SELECT … IN (…): well under SQLite's variable limit (32766 since 3.32, 999 before).
READ_CHUNK = 500


def _column(name: str) -> str:
    return f'"{Memory._meta.fields[name].column_name}"'


def update_memory_rows(db, names: Sequence[str], rows: Iterable[Sequence[Any]],
                       where: Sequence[str] = (), key: str = "id") -> int:
    """UPDATE memory rows by id: each row is the values of field `names`, the id, then the
    values the fields `where` must still hold (a compare-and-set: a row holding anything else
    is left as it is; NULL matches NULL). `key` "seq": by the row's seq instead of its id
    (a caller that has read the rows: on SQLite the rowid itself, without a lookup in the id
    index first, half the statement's time).

    Bumps `version` like every write of a memory (store.py, queries.write_memory_columns).
    Returns how many rows were updated (missing ids and rows that failed `where` count 0).
    """
    assignments = ", ".join([f"{_column(n)} = ?" for n in names] + ['"version" = "version" + 1'])
    condition = "".join(f" AND {_column(n)} IS NOT DISTINCT FROM ?" for n in where)
    cursor = db.cursor()
    cursor.executemany(f"UPDATE memory SET {assignments} WHERE {_column(key)} = ?{condition}", rows)
    return cursor.rowcount


def memory_rows_by_id(db, names: Sequence[str], memory_ids: Sequence[str]) -> dict[str, tuple]:
    """memory id → the stored values of field `names` (in that order), for the ids that exist."""
    return _rows_by(db, "id", [_column(n) for n in names], memory_ids)


def memory_rows_by_seq(db, names: Sequence[str], seqs: Sequence[int]) -> dict[int, tuple]:
    """seq → (id, then the stored values of field `names`), for the seqs that exist: on
    SQLite the rowid itself, without a lookup in the id index first (84k rows: 0.4 -> 0.1 s)."""
    return _rows_by(db, "seq", ["id", *(_column(n) for n in names)], seqs)


def _rows_by(db, key: str, columns: list[str], keys: Sequence) -> dict:
    """key value → the row's `columns`, READ_CHUNK keys a query."""
    found: dict = {}
    for start in range(0, len(keys), READ_CHUNK):
        chunk = list(keys[start:start + READ_CHUNK])
        sql = f"SELECT {key}, {', '.join(columns)} FROM memory WHERE {key} IN ({', '.join('?' * len(chunk))})"
        for row in db.execute_sql(sql, chunk):
            found[row[0]] = tuple(row[1:])
    return found


def valid_memories_by_hash(db, hashes: Sequence[str]) -> dict[tuple[str, str | None], str]:
    """(content hash, project) → the id of the oldest valid memory with that text in that
    project, for the hashes among `hashes` that a valid memory has."""
    found: dict[tuple[str, str | None], str] = {}
    unique = list(dict.fromkeys(hashes))
    for start in range(0, len(unique), READ_CHUNK):
        chunk = unique[start:start + READ_CHUNK]
        sql = (f"SELECT id, content_hash, project FROM memory WHERE content_hash IN ({', '.join('?' * len(chunk))})"
               " AND invalidated_at IS NULL ORDER BY seq")
        for memory_id, text_hash, project in db.execute_sql(sql, chunk):
            found.setdefault((text_hash, project), memory_id)
    return found


def valid_confidences(db) -> dict[str, float]:
    """memory id → confidence of every valid memory (a dream's before/after histograms: with
    peewee building a tuple per row, reading 100k of them twice cost half a second)."""
    return dict(db.execute_sql("SELECT id, confidence FROM memory WHERE invalidated_at IS NULL").fetchall())


def valid_confidence_values(db) -> list[float]:
    """The confidence of every valid memory, in no order (a histogram's): without the ids,
    half the read of valid_confidences."""
    # The unary + keeps SQLite from walking the index on invalidated_at and looking every
    # valid row up in the table: one scan of the table in its order costs half (100k: 0.08 ->
    # 0.04 s, read twice a run). Postgres's + on a double is the value itself.
    return [confidence for (confidence,) in
            db.execute_sql("SELECT confidence FROM memory WHERE +invalidated_at IS NULL").fetchall()]


def existing_memory_ids(db, memory_ids: Sequence[str]) -> set[str]:
    """The ids among `memory_ids` that name a stored memory."""
    return set(memory_rows_by_id(db, (), memory_ids)) if memory_ids else set()


def upsert_embeddings(db, rows: Iterable[tuple[str, str, int, bytes, str, float]]) -> None:
    """INSERT or replace embedding rows (memory_id, model, dim, vector, content_hash, created_at)
    (staged on SQLite when they are many: queries.insert_staged)."""
    insert_staged(db, "embedding", "memory_id, model, dim, vector, content_hash, created_at", "?, ?, ?, ?, ?, ?",
                  rows if isinstance(rows, list) else list(rows),
                  "ON CONFLICT(memory_id) DO UPDATE SET model = excluded.model, dim = excluded.dim, "
                  "vector = excluded.vector, content_hash = excluded.content_hash, created_at = excluded.created_at")


def insert_relations(db, rows: Iterable[tuple[str, str, str, float]]) -> int:
    """INSERT relations (source_id, target_id, type, created_at) that do not exist yet; return
    how many were added."""
    cursor = db.cursor()
    # ON CONFLICT DO NOTHING, not SQLite's INSERT OR IGNORE: PostgreSQL knows only the former.
    cursor.executemany("INSERT INTO relation(source_id, target_id, type, created_at) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT DO NOTHING", rows)
    return cursor.rowcount


def delete_relations(db, rows: Sequence[tuple[str, str, str]]) -> int:
    """DELETE the relations (source_id, target_id, type); return how many were there."""
    if not rows:
        return 0
    cursor = db.cursor()
    cursor.executemany("DELETE FROM relation WHERE source_id = ? AND target_id = ? AND type = ?", rows)
    return cursor.rowcount


def insert_actions(db, rows: Iterable[tuple]) -> None:
    """INSERT dream journal rows (run_id, phase, kind, op, memory_id, before, after, created_at)."""
    db.cursor().executemany(
        "INSERT INTO dream_action(run_id, phase, kind, op, memory_id, before, after, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
