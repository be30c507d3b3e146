"""An applied dream of a few thousand memories, then its undo, leaves the store as it was: every
row of the memories (FTS index included), relations, vectors, their freshness log and recalls
(issue 22: the bulk apply and undo paths must be exact, not only fast)."""

from __future__ import annotations

import random
import uuid

from dream_support import DAY, open_store, recall
from fakes import FakeEmbedder

from llmem.db import vec, vector_file
from llmem.db.backend import is_postgres
from llmem.dream import run_dream, undo_run
from llmem.times import now
from llmem.vectors import store_vectors

CONFIG = "dream:\n  auto_link_threshold: 0.9\n"
WORDS = ["deploy", "cache", "index", "vector", "query", "schema", "migration", "token", "session",
         "worker", "queue", "lock", "journal", "handleRequest", "parseConfig", "sqlite", "adapter"]
# Tables whose rows the dream writes and undo puts back; `version` is bumped by every write,
# the undo's included (a reader holding a version must see the row changed), so it is left out.
TABLES = {"memory": "seq", "relation": "source_id, target_id, type", "embedding": "memory_id",
          "recall_event": "id"}
SQLITE_TABLES = {"vector_change": "id"}  # the vector file's freshness log (Postgres has none)
LEFT_OUT = {"version"}


def build(store, count: int) -> None:
    rnd = random.Random(5)
    at = now()
    rows = []
    for i in range(count):
        kind = "self_assessment" if i % 150 == 0 else rnd.choice(("fact", "decision", "procedure"))
        words = " ".join(rnd.choice(WORDS) for _ in range(10))
        content = (f"Category: NULL_SAFETY\nWhat_happened: {words} #{i}\nIteration_count: 2"
                   if kind == "self_assessment" else f"{words} #{i}")
        created = at - rnd.uniform(1, 120) * DAY
        rows.append({"id": str(uuid.uuid4()), "type": kind, "content": content, "summary": None,
                     "confidence": rnd.choice((0.31, 0.5, 0.7, 0.9)), "source": "extraction",
                     "project": f"/work/p{i % 3}", "session_id": None,
                     "metadata": {"speaker": "ana", "topic": "t"} if i % 4 == 0 else {},
                     "access_count": 0, "created_at": created, "updated_at": created})
    # Near-duplicates of the first memories, new since the last run (light pairs them, deep merges).
    for i in range(40):
        twin = dict(rows[i], id=str(uuid.uuid4()), content=rows[i]["content"] + " again",
                    created_at=at - 60, updated_at=at - 60)
        rows.append(twin)
    with store.db.atomic():
        store.insert_rows(rows)
    Memory = store.models.Memory
    memories = list(Memory.select().order_by(Memory.seq))
    embedder = FakeEmbedder(dim=64)
    store_vectors(store, embedder, memories, embedder.embed_documents([m.content for m in memories]),
                  [m.content for m in memories])
    # The vector file as `llmem embed` leaves it (light compares from it: writing it prunes the log).
    vector_file.index_for(store.db, *vec.index_state(store.db))
    for memory in memories[100:130]:
        recall(store, memory, [f"q{k}" for k in range(6)], days_ago=[0, 0, 1, 1, 2, 3])


def state(store) -> dict[str, list]:
    """Every row of TABLES (ordered), and on SQLite the FTS index's own content: each term
    instance and each row's sizes."""
    db = store.db
    out = {}
    tables = TABLES if is_postgres(db) else {**TABLES, **SQLITE_TABLES}
    for table, order in tables.items():
        cursor = db.execute_sql(f"SELECT * FROM {table} ORDER BY {order}")
        names = [d[0] for d in cursor.description]
        keep = [k for k, name in enumerate(names) if name not in LEFT_OUT]
        out[table] = [tuple(bytes(row[k]) if isinstance(row[k], memoryview) else row[k] for k in keep)
                      for row in cursor.fetchall()]
    if not is_postgres(db):
        db.execute_sql("CREATE VIRTUAL TABLE IF NOT EXISTS temp.fts_terms USING fts5vocab(main, memory_fts, instance)")
        out["fts_terms"] = db.execute_sql("SELECT * FROM temp.fts_terms ORDER BY 1, 2, 3, 4").fetchall()
        out["fts_sizes"] = db.execute_sql("SELECT * FROM memory_fts_docsize ORDER BY id").fetchall()
    return out


def careful_updates(monkeypatch) -> list[int]:
    """How many update actions each call of undo's careful path (the one that reads rows) got."""
    from llmem.dream import journal

    seen, careful = [], journal._undo_actions
    monkeypatch.setattr(journal, "_undo_actions", lambda store, chunk, *rest: seen.append(
        sum(op == "update" for op, *_ in chunk)) or careful(store, chunk, *rest))
    return seen


def test_apply_and_undo_of_thousands_leave_every_row_as_it_was(home, store_url, monkeypatch):
    store, config = open_store(home, CONFIG, store_url)
    build(store, 3000)
    before = state(store)
    versions = dict(store.db.execute_sql("SELECT id, version FROM memory").fetchall())

    outcome = run_dream(store, config, apply=True, use_llm=False)
    counts = outcome.action_counts()
    assert counts["deep"]["decay"] > 1000 and counts["deep"].get("merge") and counts["deep"].get("invalidate")
    assert counts["rem"].get("insight")
    assert state(store) != before

    careful = careful_updates(monkeypatch)
    result = undo_run(store, outcome.run_id)
    assert result.deleted and result.restored > 1000 and not result.skipped_memories
    assert sum(careful) < result.restored / 10  # most rows put back by compare-and-set, unread
    after = state(store)
    for table in before:
        assert after[table] == before[table], table
    changed = {r for r, v in store.db.execute_sql("SELECT id, version FROM memory").fetchall() if v != versions[r]}
    # Each memory the run wrote: one write by the run (or a few), one by its undo.
    assert len(changed) > 1000
    store.close()


def test_a_memory_edited_since_the_run_is_left_and_every_other_row_restored(home, store_url, monkeypatch):
    """The compare-and-set restore meets the edited row: its chunk goes the careful way."""
    store, config = open_store(home, CONFIG, store_url)
    build(store, 3000)
    before = state(store)
    outcome = run_dream(store, config, apply=True, use_llm=False)
    decayed = store.db.execute_sql("SELECT memory_id FROM dream_action WHERE run_id = ? AND kind = 'decay' "
                                   "ORDER BY id LIMIT 1", (outcome.run_id,)).fetchone()[0]
    store.update(decayed, confidence=0.95)
    careful = careful_updates(monkeypatch)
    result = undo_run(store, outcome.run_id)
    assert result.skipped_memories == [decayed] and max(careful) > 1000
    assert store.get(decayed).confidence == 0.95
    after = state(store)
    edited = {row[0] for row in before["memory"]} and [k for k, row in enumerate(before["memory"]) if row[1] == decayed]
    for table in ("relation", "embedding", "recall_event"):
        assert after[table] == before[table], table
    assert [row for k, row in enumerate(after["memory"]) if k not in edited] == \
        [row for k, row in enumerate(before["memory"]) if k not in edited]
    store.close()
