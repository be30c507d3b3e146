"""SQLite's plans for the queries a search runs on every call: a few candidates are looked up by
rowid, never found by walking an index on a filter column (the store has no ANALYZE figures,
so the planner takes an index on `invalidated_at` to be selective when nearly every row is
valid)."""

from __future__ import annotations

import pytest
from dream_support import add, open_store

from llmem.db.queries import memory_filter, seqs_passing
from llmem.times import now


def _plans(store, call) -> tuple[object, list[str]]:
    """What `call()` returns and the query plan of each SELECT it ran on `memory`."""
    statements: list[str] = []
    connection = store.db.connection()
    connection.set_trace_callback(statements.append)
    try:
        result = call()
    finally:
        connection.set_trace_callback(None)
    plans = [" | ".join(row[3] for row in connection.execute("EXPLAIN QUERY PLAN " + sql))
             for sql in statements if sql.lstrip().upper().startswith("SELECT") and "memory m" in sql]
    return result, plans


@pytest.mark.sqlite_only  # SQLite's query plan
@pytest.mark.parametrize("filters", [
    {},
    {"project": "/p/rare"},
    {"memory_type": "decision"},
    {"project": "/p/rare", "valid_only": True},
])
def test_seqs_passing_looks_its_candidates_up_by_rowid(home, filters):
    # At 1M memories the plain filter's query walked the covering index on invalidated_at,
    # every valid row of it, for 26 candidates: 74 ms of a 127 ms KNN.
    store, _ = open_store(home)
    memories = [add(store, f"memory {i}", "decision" if i % 3 else "fact",
                    project="/p/rare" if i % 5 == 0 else "/p/common") for i in range(40)]
    store.invalidate(memories[10].id, "test")
    seqs = [m.seq for m in memories[::2]]
    where, params = memory_filter(memory_type=filters.get("memory_type"), project=filters.get("project"),
                                  include_invalid=False, valid_only=filters.get("valid_only", False), at=now())
    passing, plans = _plans(store, lambda: seqs_passing(store.db, seqs, where, params))
    expected = {m.seq for m in memories[::2] if m.seq != memories[10].seq
                and (filters.get("project") is None or m.project == filters["project"])
                and (filters.get("memory_type") is None or m.type == filters["memory_type"])}
    store.close()
    assert passing == expected
    assert plans, "seqs_passing ran no SELECT on memory"
    for plan in plans:
        first = plan.split(" | ")[0]
        assert "SEARCH m USING INTEGER PRIMARY KEY (rowid=?)" in first, plan
