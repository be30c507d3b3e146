"""Bulk writes (issue 22): a dream's update leaves FTS alone unless the text changed, its
journal holds what changed, undo puts it back through the bulk path, the Dreams page scores
only the candidates that matter, and `dream --json` does not print every action."""

from __future__ import annotations

import json
import random

import pytest
from dream_support import add, open_store, recall, run_cli

from llmem.dream.journal import Journal, start_run, undo_run
from llmem.dream.promote import candidates, ranked_top
from llmem.times import now


def fts_segments(store) -> tuple:
    """The FTS index's own rows: any re-index of a memory adds to them."""
    return tuple(store.db.execute_sql("SELECT count(*), max(rowid) FROM memory_fts_data").fetchone())


def test_a_decay_writes_no_fts_row_and_journals_only_what_changed(home):
    store, _ = open_store(home)
    memories = [add(store, f"the handleRequest parser of service {i} speaks gRPC", age_days=40,
                    metadata={"speaker": "ana"}) for i in range(5)]
    segments = fts_segments(store)
    run = start_run(store, "dream", ["deep"])
    with store.db.atomic():
        Journal(store, run).update_many([("deep", "decay", m.id, {"confidence": 0.5, "metadata": {"decayed_at": 1.0}})
                                         for m in memories])
    assert fts_segments(store) == segments  # hints unchanged: the FTS index was not rewritten
    Memory = store.models.Memory
    for memory in memories:
        row = Memory.get(Memory.id == memory.id)
        assert row.confidence == 0.5 and row.metadata == {"speaker": "ana", "decayed_at": 1.0}
        assert row.version == memory.version + 1
        assert row.hints == memory.hints
    actions = store.db.execute_sql("SELECT before, after FROM dream_action WHERE run_id = ?", (run.id,)).fetchall()
    assert len(actions) == 5
    for before, after in actions:
        assert set(json.loads(before)) == {"confidence", "metadata", "updated_at"}  # no content, no whole row
        assert json.loads(after)["confidence"] == 0.5
    # A change of what FTS indexes (descriptive metadata) does re-index.
    with store.db.atomic():
        Journal(store, run).update("deep", "retag", memories[0].id, {"metadata": {"speaker": "bo"}})
    assert fts_segments(store) != segments
    assert "bo" in Memory.get(Memory.id == memories[0].id).hints
    store.close()


def test_undo_through_the_bulk_path_restores_each_row_and_bumps_its_version(home):
    store, _ = open_store(home)
    memories = [add(store, f"fact number {i} about the cache", age_days=10) for i in range(4)]
    run = start_run(store, "dream", ["deep"])
    journal = Journal(store, run)
    at = now()
    with store.db.atomic():
        # Two writes of one memory in a run: undo must put back the oldest image.
        journal.update_many([("deep", "decay", m.id, {"confidence": 0.4, "metadata": {"decayed_at": at}})
                             for m in memories])
        journal.update_many([("deep", "invalidate", memories[0].id,
                              {"invalidated_at": at, "metadata": {"invalidation_reason": "x"}})])
    store.models.DreamRun.update(status="done").where(store.models.DreamRun.id == run.id).execute()
    Memory = store.models.Memory
    edited = store.update(memories[3].id, content="fact number 3, edited by hand since")
    result = undo_run(store, run.id)
    assert result.restored == 4 and result.skipped_memories == [memories[3].id]
    for memory in memories[:3]:
        row = Memory.get(Memory.id == memory.id)
        assert (row.confidence, row.metadata, row.invalidated_at) == (memory.confidence, memory.metadata, None)
        assert row.updated_at == memory.updated_at
        assert row.version == memory.version + (3 if memory is memories[0] else 2)
    kept = Memory.get(Memory.id == memories[3].id)
    assert kept.content == edited.content and kept.confidence == 0.4
    store.close()


def test_the_pages_top_candidates_and_counts_are_those_of_scoring_every_one(home):
    store, config = open_store(home)
    cfg = config.dream
    rnd = random.Random(5)
    for i in range(90):
        memory = add(store, f"memory {i} on topic {rnd.choice('abcdefgh')} with words {i * 7}", age_days=30)
        queries = [f"q{rnd.randrange(6)}" for _ in range(rnd.randint(1, 7))]
        recall(store, memory, queries, score=rnd.uniform(0.2, 1.0),
               days_ago=[rnd.uniform(0, 20) for _ in queries])
    promoted = add(store, "an already promoted memory")
    recall(store, promoted, ["a", "b", "c"])
    store.models.Memory.update(promoted_at=now()).where(store.models.Memory.id == promoted.id).execute()
    every = candidates(store, cfg)
    for top in (1, 7, 30, 200):
        ranked = ranked_top(store, cfg, top=top)
        assert [c.memory_id for c in ranked.top] == [c.memory_id for c in every[:top]]
        assert ranked.total == len(every) == 90
        assert ranked.ready == sum(1 for c in every if c.passes) > 0


def test_kept_promotion_bounds_give_the_fresh_ranking_after_every_kind_of_write(store_url):
    """The viewer keeps the bounds (reading them aggregates every recall) while the store's
    promotion_generation holds; each write that can move a bound bumps it (triggers of
    0019_viewer_indexes, pg0005_viewer_indexes), so the kept ranking is always the one a
    fresh read gives."""
    from llmem.config import section_type
    from llmem.db.queries import promotion_generation
    from llmem.store import Store

    store = Store.open(store_url)
    cfg = section_type("dream")(min_recall_count=2, min_unique_queries=2, min_score=0.3)
    memories = [add(store, f"memory {i} about the deploy of service {i}", age_days=10) for i in range(12)]
    for i, memory in enumerate(memories):
        recall(store, memory, [f"q{k}" for k in range(1 + i % 4)], score=0.5 + i / 40)
    kept: dict = {}
    Memory = store.models.Memory

    def same_as_fresh(expect_new_generation: bool) -> None:
        before = kept.get("entry", (None,))[0]
        at = now()
        ranked = ranked_top(store, cfg, top=5, at=at, kept=kept)
        fresh = ranked_top(store, cfg, top=5, at=at)
        assert [c.memory_id for c in ranked.top] == [c.memory_id for c in fresh.top]
        assert (ranked.total, ranked.ready) == (fresh.total, fresh.ready)
        assert (kept["entry"][0] != before) == expect_new_generation

    same_as_fresh(True)
    same_as_fresh(False)  # nothing written: the kept bounds serve
    recall(store, memories[0], ["q1", "q2", "q3", "q4", "q5"])  # a recall added
    same_as_fresh(True)
    store.invalidate(memories[11].id, "wrong")  # a memory invalidated
    same_as_fresh(True)
    Memory.update(promoted_at=now()).where(Memory.id == memories[10].id).execute()  # promoted
    same_as_fresh(True)
    store.delete(memories[9].id)  # deleted, its recalls with it
    same_as_fresh(True)
    generation = promotion_generation(store.db)
    Memory.update(confidence=0.2, metadata={"decayed_at": 1.0}).where(Memory.id == memories[1].id).execute()
    store.update(memories[2].id, content="memory 2 about the release of service 2")  # scored fresh
    assert promotion_generation(store.db) == generation  # no bound moved
    same_as_fresh(False)
    store.close()


def test_dream_json_lists_a_bounded_number_of_actions_unless_asked(home):
    store, _ = open_store(home)
    for i in range(12):
        add(store, f"an idle fact number {i} nobody reads", age_days=80 + i)
    store.close()
    code, out, err = run_cli("dream", "--json", "--actions", "5")
    assert code == 0, err
    data = json.loads(out)
    assert data["actions_total"] >= 12 and data["actions_listed"] == len(data["actions"]) == 5
    code, out, err = run_cli("dream", "--json", "--all-actions")
    data = json.loads(out)
    assert data["actions_listed"] == len(data["actions"]) == data["actions_total"] >= 12


def test_embed_pending_writes_every_vector_in_batches(home):
    from fakes import FakeEmbedder

    from llmem.db import vec
    from llmem.vectors import embed_pending, pending_query

    store, _ = open_store(home)
    for i in range(30):
        add(store, f"memory {i}", metadata={"speaker": "ana"} if i % 2 else None)
    embedder = FakeEmbedder(dim=16)
    assert embed_pending(store, embedder, batch=7) == 30
    assert pending_query(store, embedder.identity).count() == 0
    assert vec.current_embedding_count(store.db, embedder.identity) == 30
    store.close()


@pytest.mark.sqlite_only  # SQLite's query plan
def test_embed_pending_reads_its_batches_by_seq_not_through_a_validity_index(home):
    # Each batch is `seq > last LIMIT n`: read through an index led by invalidated_at, every
    # batch went through every valid memory again (embed --pending at 100k: 6.8x its floor).
    from llmem.vectors import pending_query

    store, _ = open_store(home)
    Memory = store.models.Memory
    sql, params = pending_query(store, "model").select(Memory.seq).where(Memory.seq > 0).limit(2000).sql()
    plan = " | ".join(row[3] for row in store.db.execute_sql("EXPLAIN QUERY PLAN " + sql, params))
    store.close()
    assert "USING INTEGER PRIMARY KEY (rowid>?)" in plan, plan
