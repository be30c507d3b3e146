"""SQLite's plans for the queries a search runs on every call: a few candidates are looked up by
rowid, never found by walking an index on a filter column (the store has no ANALYZE figures,
so the planner takes an index on `invalidated_at` to be selective when nearly every row is
valid)."""

from __future__ import annotations

import re

import pytest
from dream_support import add, open_store

from llmem.db.queries import memory_filter, seqs_passing
from llmem.times import now

_READS_MEMORY = re.compile(r'FROM "?memory"?( |$)')


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
             for sql in statements if sql.lstrip().upper().startswith("SELECT") and _READS_MEMORY.search(sql)]
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


@pytest.mark.sqlite_only  # SQLite's query plan
def test_a_session_starts_reads_walk_their_index_in_order_and_stop(home):
    # Each kind's best memories, promoted first and the project's before the global ones,
    # by a walk of an index in order per (type, scope), not a sort of every match: at 1M
    # memories the sort cost 1.1 s a kind and `llmem context` took 2.5 s (now 0.15 s).
    from llmem.context import core_memories, state_memories

    store, _ = open_store(home)
    Memory = store.models.Memory
    made = {}
    for i, (kind, project, confidence) in enumerate([
            ("procedure", "/p/a", 0.6), ("procedure", None, 0.99), ("procedure", "/p/a", 0.9),
            ("preference", "/p/a", 0.7), ("procedure", "/p/b", 0.95), ("fact", "/p/a", 0.5),
            ("decision", "/p/a", 0.5), ("decision", None, 0.5), ("project_state", "/p/a", 0.5),
            ("procedure", "/p/a", 0.8)]):
        made[i] = add(store, f"memory {i}", kind, project=project, confidence=confidence)
        Memory.update(updated_at=1000.0 + i).where(Memory.id == made[i].id).execute()
    Memory.update(promoted_at=5.0).where(Memory.id == made[5].id).execute()  # a promoted fact
    store.invalidate(made[9].id, "test")
    at = now()
    core, core_plans = _plans(store, lambda: core_memories(store, "/p/a", at, limit=10, types=("procedure", "preference")))
    state, state_plans = _plans(store, lambda: state_memories(store, "/p/a", at, limit=10))
    few, _ = _plans(store, lambda: core_memories(store, "/p/a", at, limit=2, types=("procedure",)))
    store.close()
    # promoted; then the project's by confidence over both types; then the global ones
    assert [m.content for m in core] == ["memory 5", "memory 2", "memory 3", "memory 0", "memory 1"]
    assert [m.content for m in few] == ["memory 5", "memory 2"]
    # newest first, the project's before the global ones
    assert [m.content for m in state] == ["memory 8", "memory 6", "memory 7"]
    for plan in core_plans + state_plans:
        assert "TEMP B-TREE" not in plan and "memory_current_type" not in plan, plan
    assert any("memory_promoted" in plan for plan in core_plans), core_plans
    assert sum("memory_core_rank" in plan for plan in core_plans) == 4, core_plans
    assert sum("memory_state_recent" in plan for plan in state_plans) == 4, state_plans
