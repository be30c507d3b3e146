"""db/locks.py on Postgres: session-level advisory locks, keyed (llmem's class, the name's hash)."""

from __future__ import annotations

import hashlib

# The first of the two int4 keys: llmem's own space of advisory locks in the database, so a
# lock of ours never meets another application's single-key locks.
_LLMEM_CLASS = 0x6C6C6D  # "llm"


def _key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "big") & 0x7FFFFFFF


def take_server_lock(db, name: str) -> bool | None:
    return bool(db.execute_sql("SELECT pg_try_advisory_lock(?, ?)", (_LLMEM_CLASS, _key(name))).fetchone()[0])


def release_server_lock(db, name: str) -> None:
    db.execute_sql("SELECT pg_advisory_unlock(?, ?)", (_LLMEM_CLASS, _key(name)))


def server_lock_held(db, name: str) -> bool | None:
    # A two-key advisory lock shows in pg_locks as classid = key 1, objid = key 2, objsubid 2.
    row = db.execute_sql(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND classid = CAST(? AS oid) AND objid = CAST(? AS oid) AND objsubid = 2)",
        (_LLMEM_CLASS, _key(name))).fetchone()
    return bool(row[0])
