"""The rows of `llmem store copy` (llmem/transfer.py): each table read in batches in its key
order from one store and written into another, with a progress mark committed beside each
batch, and each table's identity hash for the check at the end. Portable SQL: the same on
both backends (row values, ON CONFLICT ... DO NOTHING).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .models import Memory
from .settings import get_setting, set_setting

BATCH = 2000
PROGRESS_PREFIX = "store_copy:"
# Settings that belong to the source's processes or are derived: never copied.
TRANSIENT_SETTINGS = ("vec_", "vector_change", "dream_lock", "dream_slot:", "worker_", "watcher_alive",
                      PROGRESS_PREFIX)


@dataclass(frozen=True)
class Table:
    """How one table is copied: its columns, the key it is read in order of, the key that
    makes an insert a no-op when the row is already there (None: rows have only a surrogate
    id, and the progress mark alone keeps a resumed copy from adding one twice), and what
    identifies a row for the final check."""

    name: str
    columns: tuple[str, ...]
    order: str
    conflict: str | None
    identity: tuple[str, ...]


_MEMORY_COLUMNS = tuple(f.column_name for f in Memory._meta.sorted_fields if f.name not in ("seq", "author"))
TABLES = (
    Table("memory", _MEMORY_COLUMNS, "seq", "id", ("id", "content_hash", "type", "project")),
    Table("relation", ("source_id", "target_id", "type", "created_at"), "id", "source_id, target_id, type",
          ("source_id", "target_id", "type")),
    Table("embedding", ("memory_id", "model", "dim", "vector", "content_hash", "created_at"), "memory_id",
          "memory_id", ("memory_id", "model", "dim", "content_hash")),
    Table("recall_query", ("query_hash", "text", "created_at"), "query_hash", "query_hash", ("query_hash",)),
    Table("recall_event", ("memory_id", "query_hash", "rank", "score", "origin", "created_at", "staged_by"),
          "id", None, ("memory_id", "query_hash", "origin", "created_at")),
    Table("dream_run", ("id", "kind", "phases", "status", "started_at", "finished_at", "undone_at", "summary",
                        "error"), "id", "id", ("id", "status")),
    Table("dream_action", ("run_id", "phase", "kind", "op", "memory_id", "before", "after", "created_at"), "id",
          None, ("run_id", "phase", "kind", "op", "memory_id")),
    Table("session_cursor", ("adapter", "session_id", "project", "cursor", "introspect_cursor", "episode_cursor",
                             "messages_read", "status", "updated_at"), "id", "adapter, session_id",
          ("adapter", "session_id", "cursor", "episode_cursor")),
    Table("event", ("adapter", "session_id", "kind", "status", "attempts", "last_error", "detected_at",
                    "started_at", "finished_at", "not_before", "result", "machine"), "id", None,
          ("adapter", "session_id", "kind", "status")),
    Table("watch_session", ("machine", "adapter", "session_id", "idle_reply", "compacting", "ended", "ended_turn",
                            "seen_compaction_id", "updated_at"), "machine, adapter, session_id",
          "machine, adapter, session_id", ("machine", "adapter", "session_id")),
    Table("llm_usage", ("time", "day", "task", "provider", "model", "prompt_tokens", "completion_tokens"), "id",
          None, ("time", "task", "model")),
    Table("shared_project", ("project", "shared_at"), "project", "project, author", ("project",)),
    Table("setting", ("key", "value"), "key", "key", ("key", "value")),
)


def _rows(db, table: Table, after: Any) -> list[tuple]:
    """The next batch of `table` after the key `after` (a list of the order columns' values)."""
    keys = [k.strip() for k in table.order.split(",")]
    columns = ", ".join(dict.fromkeys([*keys, *table.columns]))
    where, params = "", []
    if after is not None:
        # Row-value comparison (SQLite 3.15+, Postgres): the keyset of a composite order.
        where = f" WHERE ({', '.join(keys)}) > ({', '.join('?' * len(keys))})"
        params = list(after)
    return db.execute_sql(f"SELECT {columns} FROM {table.name}{where} ORDER BY {table.order} LIMIT {BATCH}",
                          params).fetchall()


def _identity(row) -> tuple:
    return tuple(None if v is None else str(_portable(v)) for v in row)


def copy_table(source_db, target_db, table: Table, mark: str, progress, *, merge: bool) -> int:
    """Copy one table in batches; return how many rows were inserted."""
    keys = [k.strip() for k in table.order.split(",")]
    selected = list(dict.fromkeys([*keys, *table.columns]))
    at = [selected.index(c) for c in table.columns]
    key_at = [selected.index(k) for k in keys]
    ident_at = [selected.index(c) for c in table.identity]
    # Merged into a store that holds rows of its own, a row with only a surrogate id is
    # added unless the target holds one alike (a second merge of one source adds none).
    held = ({_identity(r) for r in target_db.execute_sql(f"SELECT {', '.join(table.identity)} FROM {table.name}")}
            if merge and table.conflict is None else set())
    saved = get_setting(target_db, mark)
    after = json.loads(saved) if saved else None
    conflict = f" ON CONFLICT ({table.conflict}) DO NOTHING" if table.conflict else ""
    sql = (f"INSERT INTO {table.name} ({', '.join(table.columns)}) "
           f"VALUES ({', '.join('?' * len(table.columns))}){conflict}")
    copied = 0
    while True:
        rows = _rows(source_db, table, after)
        if not rows:
            break
        batch = [[_portable(row[i]) for i in at] for row in rows
                 if (table.name != "setting" or not str(row[0]).startswith(TRANSIENT_SETTINGS))
                 and _identity(row[i] for i in ident_at) not in held]
        after = [_portable(rows[-1][i]) for i in key_at]
        # The rows and the mark of how far they go commit together: a copy killed here
        # resumes after the last batch that landed, and redoes none.
        with target_db.atomic():
            if batch:
                cursor = target_db.cursor()
                cursor.executemany(sql, batch)
                copied += cursor.rowcount if cursor.rowcount >= 0 else len(batch)
            set_setting(target_db, mark, json.dumps(after))
        if progress:
            progress(table.name, copied)
        if len(rows) < BATCH:
            break
    return copied


def _portable(value: Any) -> Any:
    """A value as both drivers take it (psycopg returns bytea as memoryview)."""
    return bytes(value) if isinstance(value, memoryview) else value


def identity_hash(db, table: Table) -> tuple[int, str]:
    """(rows, a hash of what identifies each row, in a fixed order) of `table`."""
    digest = hashlib.blake2b(digest_size=16)
    rows = 0
    where = ""
    if table.name == "setting":
        where = " WHERE " + " AND ".join(f"key NOT LIKE '{p}%'" for p in TRANSIENT_SETTINGS)
    identities = [_identity(r) for r in db.execute_sql(f"SELECT {', '.join(table.identity)} FROM {table.name}{where}")]
    for row in sorted(identities, key=lambda r: tuple("" if v is None else v for v in r)):
        digest.update(json.dumps(row).encode())
        rows += 1
    return rows, digest.hexdigest()




def has_mark(db, mark: str) -> bool:
    return get_setting(db, mark) is not None


def clear_marks(db, marks: list[str]) -> None:
    for mark in marks:
        db.execute_sql("DELETE FROM setting WHERE key = ?", (mark,))
