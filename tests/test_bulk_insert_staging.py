"""Many memory rows at once go into SQLite in one INSERT … SELECT from a staging table
(db/queries.py insert_memory_rows): one statement per row made FTS5 write a segment per row at
each statement's savepoint, about half of an import's write. The rows must land exactly as a
direct insert puts them: same values and types, same order, every one found by the FTS."""

from __future__ import annotations

import time

from llmem.db import queries
from llmem.store import Store

STAGED = queries.STAGED_ROWS


def _rows(n: int) -> list[dict]:
    at = time.time()
    return [{"id": f"{i:016x}", "type": "fact", "content": "12345" if i == 7 else f"deploy step {i} uses parseConfig",
             "summary": None, "confidence": 0.5, "source": "import", "project": "/p", "session_id": None,
             "metadata": {"speaker": "ann"} if i % 2 else {}, "access_count": i, "created_at": at + i,
             "updated_at": at + i} for i in range(n)]


def _stored(path, rows, monkeypatch, staged_from: int) -> tuple[list, Store]:
    monkeypatch.setattr(queries, "STAGED_ROWS", staged_from)
    store = Store.open(path, vec_enabled=False)
    with store.db.atomic():
        store.insert_rows(rows)
    columns = [r[1] for r in store.db.execute_sql("PRAGMA table_info(memory)")]
    listed = ", ".join(f"{name}, typeof({name})" for name in columns)
    return store.db.execute_sql(f"SELECT {listed} FROM memory ORDER BY seq").fetchall(), store


def test_a_staged_insert_stores_what_a_direct_one_does_and_writes_one_fts_segment(tmp_path, monkeypatch):
    rows = _rows(300)
    direct, direct_store = _stored(tmp_path / "direct.db", rows, monkeypatch, staged_from=10**9)
    staged, store = _stored(tmp_path / "staged.db", rows, monkeypatch, staged_from=STAGED)
    assert staged == direct  # every value and its SQLite type, row by row, in the same order (seq)
    assert [r[0] for r in store.db.execute_sql("SELECT id FROM memory ORDER BY seq")] == \
        [row["id"] for row in rows]
    found = store.db.execute_sql("SELECT count(*) FROM memory_fts WHERE memory_fts MATCH 'deploy'").fetchone()[0]
    assert found == 299 and store.db.execute_sql(
        "SELECT count(*) FROM memory_fts WHERE memory_fts MATCH 'parse config'").fetchone()[0] == 299
    store.db.execute_sql("INSERT INTO memory_fts(memory_fts, rank) VALUES ('integrity-check', 1)")
    segments = "SELECT count(DISTINCT segid) FROM memory_fts_idx"
    assert store.db.execute_sql(segments).fetchone()[0] == 1  # the rows' terms written once
    assert direct_store.db.execute_sql(segments).fetchone()[0] > 1
    assert not store.db.execute_sql("SELECT name FROM sqlite_temp_master").fetchall()  # the staging table went


def test_a_failed_staged_insert_leaves_no_row_and_no_staging_table(tmp_path):
    import pytest

    store = Store.open(tmp_path / "memory.db", vec_enabled=False)
    rows = _rows(100)
    rows[50]["id"] = rows[10]["id"]  # the same id twice
    with pytest.raises(Exception, match="UNIQUE constraint failed: memory.id"), store.db.atomic():
        store.insert_rows(rows)
    assert store.db.execute_sql("SELECT count(*) FROM memory").fetchone()[0] == 0
    assert not store.db.execute_sql("SELECT name FROM sqlite_temp_master").fetchall()
    with store.db.atomic():  # and the next insert works
        store.insert_rows(_rows(100))
    assert store.db.execute_sql("SELECT count(*) FROM memory_fts WHERE memory_fts MATCH 'deploy'").fetchone()[0] == 99


def test_staged_embedding_upserts_insert_and_replace_as_direct_ones_and_log_each_change(tmp_path, monkeypatch):
    from llmem.db import bulk

    def upserted(path, staged_from: int):
        monkeypatch.setattr(queries, "STAGED_ROWS", staged_from)
        store = Store.open(path, vec_enabled=False)
        with store.db.atomic():
            store.insert_rows(_rows(200))
        first = [(f"{i:016x}", "m", 4, bytes([i % 256]) * 8, "h1", 1.0) for i in range(150)]
        again = [(f"{i:016x}", "m2", 4, bytes([(i + 1) % 256]) * 8, "h2", 2.0) for i in range(100, 200)]
        with store.db.atomic():
            bulk.upsert_embeddings(store.db, first)
        with store.db.atomic():
            bulk.upsert_embeddings(store.db, iter(again))  # any iterable, as before
        rows = store.db.execute_sql("SELECT memory_id, model, dim, vector, content_hash, created_at "
                                    "FROM embedding ORDER BY memory_id").fetchall()
        changes = store.db.execute_sql("SELECT count(*) FROM vector_change").fetchone()[0]
        return rows, changes, store

    direct, direct_changes, _ = upserted(tmp_path / "direct.db", 10**9)
    staged, staged_changes, store = upserted(tmp_path / "staged.db", STAGED)
    assert staged == direct and len(staged) == 200
    assert staged[120][1:] == ("m2", 4, bytes([121]) * 8, "h2", 2.0)  # replaced
    assert staged[10][1:] == ("m", 4, bytes([10]) * 8, "h1", 1.0)  # kept
    assert staged_changes == direct_changes >= 200  # every insert and replacement logged for the vector file
    assert not store.db.execute_sql("SELECT name FROM sqlite_temp_master").fetchall()
