"""What one search reads of the store: its candidates' rows in one statement, recalls and
successors in another, the results' memories from raw rows, the document frequencies once,
and a vector removed while its scan ran is never returned."""

import random
import re

import numpy as np
import pytest
from fakes import FakeEmbedder

from llmem.db import vector_file
from llmem.db.fts import common_words, counted_words, document_frequencies, index_tokens, stem_words
from llmem.db.models import USER_ORIGINS
from llmem.db.queries import candidate_rows, memories_from_rows, memory_rows, rank_signals
from llmem.search import Searcher, SearchOptions
from llmem.store import Store
from llmem.vectors import embed_memories, store_vectors

DIM = 16


pytestmark = pytest.mark.usefixtures("fresh_vector_indexes")


@pytest.fixture
def store(store_url):
    s = Store.open(store_url)
    yield s
    s.close()


def test_memories_made_from_rows_are_the_selected_ones(store):
    first = store.add("the deploy pipeline runs on merge", "procedure", project="/p/a",
                      metadata={"file": "ci.yml", "tags": ["ci", "deploy"]}).memory
    second = store.add("billing invoices go out nightly", "fact", summary="nightly invoices").memory
    Memory = store.models.Memory
    made = {m.seq: m for m in memories_from_rows(Memory, memory_rows(store.db, [first.seq, second.seq]))}
    for selected in Memory.select().where(Memory.seq.in_([first.seq, second.seq])):
        memory = made[selected.seq]
        assert type(memory) is Memory
        assert memory.__data__ == selected.__data__  # every field, the metadata decoded
        assert not memory._dirty
    memory = made[first.seq]
    assert memory.metadata == {"file": "ci.yml", "tags": ["ci", "deploy"]} and memory.project == "/p/a"
    memory.confidence = 0.95
    memory.save()  # an instance made so is a loaded one: it saves what changed
    assert Memory.get(Memory.seq == first.seq).confidence == 0.95


def test_candidate_rows_say_which_pass_the_filters(store):
    kept = store.add("kept in the project", "fact", project="/p/a").memory
    other = store.add("another project's", "fact", project="/p/b").memory
    gone = store.add("invalidated", "fact", project="/p/a").memory
    store.invalidate(gone.id, "replaced")
    where = "(m.project = ? OR m.project IS NULL) AND m.invalidated_at IS NULL"
    rows = {r[0]: r for r in candidate_rows(store.db, [kept.seq, other.seq, gone.seq, 10**6], where, ["/p/a"])}
    assert set(rows) == {kept.seq, other.seq, gone.seq}  # a seq with no memory has no row
    assert {seq: row[-1] for seq, row in rows.items()} == {kept.seq: 1, other.seq: 0, gone.seq: 0}
    assert rows[kept.seq][1:7] == (kept.id, "fact", kept.confidence, kept.created_at, kept.source,
                                   "kept in the project")
    assert rows[other.seq][6:9] == rows[gone.seq][6:9] == (None, None, None)  # no text read for what fails
    assert {r[-1] for r in candidate_rows(store.db, [kept.seq, other.seq], "1", [])} == {1}


def test_rank_signals_count_chosen_recalls_and_name_the_newest_valid_successor(store):
    old = store.add("the service runs python 3.10", "decision").memory
    newer = store.add("the service runs python 3.11", "decision").memory
    newest = store.add("the service runs python 3.12", "decision").memory
    dropped = store.add("the service runs python 4 (withdrawn)", "decision").memory
    alone = store.add("an unrelated fact", "fact").memory
    for source in (newer, newest, dropped):
        store.relate(source.id, old.id, "supersedes")
    Relation, RecallEvent = store.models.Relation, store.models.RecallEvent
    for at, source in ((100.0, newer), (200.0, newest), (300.0, dropped)):
        Relation.update(created_at=at).where(Relation.source == source.id).execute()
    store.invalidate(dropped.id, "withdrawn")  # an invalid successor does not count
    for rank, origin in ((1, "search"), (3, "mcp"), (4, "search"), (1, "context")):
        RecallEvent.create(memory=alone.id, query_hash=f"q{rank}{origin}", rank=rank, score=0.5,
                           origin=origin, created_at=1.0)
    uses, successors = rank_signals(store.db, [old.id, newer.id, alone.id], USER_ORIGINS)
    assert uses == {alone.id: 2}  # the top three of a search or an MCP call; not rank 4, not context
    assert successors == {old.id: newest.id}
    assert rank_signals(store.db, [], USER_ORIGINS) == ({}, {})


def test_common_words_from_the_frequencies_a_search_reads_are_the_counted_ones(store):
    for i in range(30):
        store.add(f"alice talked about {'pottery' if i % 3 else 'chess'} club number {i}", "conversation")
    for text in ("When did alice start pottery class?", "alice club", "chess e 7", "nothing here"):
        words = counted_words(text)
        frequencies = document_frequencies(store.db, stem_words(store.db, words))
        for share in (0.10, 0.5, 0.95):
            counted = common_words(store.db, text, share=share, min_docs=5)
            assert common_words(store.db, text, share=share, min_docs=5, frequencies=frequencies) == counted
    assert common_words(store.db, "alice club", share=0.10, min_docs=5) == {"alice", "club"}


@pytest.mark.parametrize("seed", range(5))
def test_ascii_tokens_are_the_regex_tokens(seed):
    rng = random.Random(seed)
    alphabet = "abcXYZ019_-./:'\"\t\n\x0b\x1c\x1f ()[]{}é"[:-1]  # ASCII only: the fast path
    text = "".join(rng.choice(alphabet) for _ in range(400))
    assert index_tokens(text, None, "") == [w.lower() for w in re.findall(r"[^\W_]+", text)]


def test_a_hybrid_search_reads_the_store_in_few_statements(store):
    """Statements per search on a store whose counts are kept: the frequencies (2), the index
    state (2), the change id, the FTS query, the change log, the candidates, their recalls
    and successors, the results' rows. It was 15: the vector candidates' filter check, the
    rerank's rows, recalls, successors, a peewee select of the results, the common words and
    the frequencies apart."""
    for i in range(60):
        store.add(f"note {i}: the billing service retries {i % 5} times on a timeout")
    embedder = FakeEmbedder(dim=DIM)
    embed_memories(store, embedder, list(store.models.Memory.select()))
    searcher = Searcher(store, embedder)
    opts = SearchOptions(track=False, min_relevance=0.0)
    searcher.search("billing retries timeout", opts)
    searcher.search("billing retries timeout", opts)  # anything the first one wrote is behind
    statements = []
    run = store.db.execute_sql

    def counted(sql, params=None, *args, **kwargs):
        statements.append(sql)
        return run(sql, params, *args, **kwargs)

    store.db.execute_sql = counted
    try:
        result = searcher.search("billing retries timeout", opts)
    finally:
        del store.db.execute_sql
    assert result.mode == "hybrid" and len(result.hits) == 10
    assert any(h.vec_rank for h in result.hits) and any(h.fts_rank for h in result.hits)  # both channels ran
    assert len(statements) <= 11, "\n".join(statements)


def _vector_store(path, count=40):
    store = Store.open(path)
    memories = [store.add(f"memory {i}").memory for i in range(count)]
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(count, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store_vectors(store, FakeEmbedder(dim=DIM), memories, vectors)
    return store, memories, vectors


MODEL = FakeEmbedder(dim=DIM).identity


def test_a_vector_removed_while_its_scan_ran_is_not_returned(tmp_path):
    store, memories, vectors = _vector_store(tmp_path / "memory.db")
    pending = vector_file.begin_nearest(store.db, vectors[7], 5, MODEL, DIM)
    store.models.Embedding.delete().where(store.models.Embedding.memory == memories[7].id).execute()
    found = [seq for seq, _ in pending.finish(store.db, "1", [])]
    assert memories[7].seq not in found and len(found) == 5
    store.close()


def test_when_the_log_was_pruned_past_the_scan_each_candidate_is_checked(tmp_path):
    """Another process rebuilt its file and pruned the log past this scan's snapshot: the
    change log cannot tell what changed, so the candidates' embedding rows are read."""
    store, memories, vectors = _vector_store(tmp_path / "memory.db")
    pending = vector_file.begin_nearest(store.db, vectors[7], 5, MODEL, DIM)
    store.models.Embedding.delete().where(store.models.Embedding.memory == memories[7].id).execute()
    upto = vector_file.change_id(store.db)
    vector_file._prune_log(store.db, upto)  # the removal is no longer in the log
    seen = []
    found = [seq for seq, _ in pending.finish(store.db, "1", [], passing=lambda seqs: seen.append(seqs) or set(seqs))]
    assert memories[7].seq not in found and len(found) == 5
    assert not seen  # the caller's check cannot say whether a vector is still there
    store.close()


def test_the_callers_check_decides_which_candidates_pass(tmp_path):
    store, memories, vectors = _vector_store(tmp_path / "memory.db")
    banned = {memories[7].seq, memories[3].seq}
    asked = []

    def passing(seqs):
        asked.append(list(seqs))
        return set(seqs) - banned

    pending = vector_file.begin_nearest(store.db, vectors[7], 5, MODEL, DIM)
    found = [seq for seq, _ in pending.finish(store.db, "1", [], passing=passing)]
    assert asked and not banned & set(found) and len(found) == 5
    store.close()


def test_stored_vectors_are_each_memorys_stored_vector(store):
    from llmem.db import vec

    memories = [store.add(f"memory number {i}").memory for i in range(6)]
    embedder = FakeEmbedder(dim=DIM)
    embed_memories(store, embedder, memories[:4])
    model, dim = vec.index_state(store.db)
    seqs = [m.seq for m in memories]
    found = vec.stored_vectors(store.db, seqs, model, dim)
    assert set(found) == {m.seq for m in memories[:4]}  # the two not embedded have none
    for seq in seqs[:4]:
        assert np.array_equal(found[seq], vec.stored_vector(store.db, seq, model, dim))
    assert vec.stored_vectors(store.db, seqs, "another:model", dim) == {} == vec.stored_vectors(store.db, [], model, dim)


@pytest.mark.backend
def test_postgres_asks_whether_its_vector_index_is_there_once_per_generation(servers):
    """knn_vec0 checks the table and its HNSW index once per index generation: not again on
    each search, and again after anything that can drop them (every such write bumps it)."""
    from llmem.db import vec

    store = Store.open(servers.fresh_database())
    memories = [store.add(f"memory number {i}").memory for i in range(30)]
    embedder = FakeEmbedder(dim=DIM)
    embed_memories(store, embedder, memories)
    searcher = Searcher(store, embedder)
    opts = SearchOptions(track=False, min_relevance=0.0, mode="semantic")
    statements = []
    run = store.db.execute_sql

    def counted(sql, params=None, *args, **kwargs):
        statements.append(sql)
        return run(sql, params, *args, **kwargs)

    def checks() -> int:
        statements.clear()
        assert searcher.search("memory number 7", opts).hits
        return sum("to_regclass" in sql for sql in statements)

    store.db.execute_sql = counted
    try:
        assert checks() == 1
        assert checks() == 0
        vec.rebuild_index(store.db, *vec.index_state(store.db))  # dropped and made again
        assert checks() == 1
        assert checks() == 0
    finally:
        del store.db.execute_sql
        store.close()


def test_a_selective_filter_masks_by_the_memory_rows_and_still_drops_a_removed_vector(tmp_path):
    """The mask of a filter that keeps few is read from the memory rows alone (the planner's
    index on the filter's column); a masked row whose vector went since the scan stays out."""
    store, memories, vectors = _vector_store(tmp_path / "memory.db", count=60)
    rare = memories[5::20]  # 3 of 60
    with store.db.atomic():
        for memory in rare:
            store.db.execute_sql("UPDATE memory SET project = '/p/rare' WHERE seq = ?", (memory.seq,))
    pending = vector_file.begin_nearest(store.db, vectors[25], 5, MODEL, DIM)
    store.models.Embedding.delete().where(store.models.Embedding.memory == rare[1].id).execute()
    found = [seq for seq, _ in pending.finish(store.db, "m.project = ?", ["/p/rare"])]
    assert sorted(found) == sorted(m.seq for m in rare if m is not rare[1])
    store.close()


def test_a_selective_filter_ranks_the_keyword_matches_in_two_passes_at_most(store, monkeypatch):
    """The FTS side with a filter that keeps 1 match in 25: the top matches that pass, as a
    ranking of every match would give them, found by going as deep as that share needs at once."""
    from llmem import search as search_module
    from llmem.db.queries import memory_filter
    from llmem.times import now

    for i in range(250):
        store.add(f"deploy note {i}: " + "deploy " * (1 + i % 7) + f"runbook {i % 11}",
                  project="/p/x" if i % 25 == 0 else "/p/other")
    searcher = Searcher(store, None)
    where, params = memory_filter(memory_type=None, project="/p/x", include_invalid=False, valid_only=False,
                                  at=now())
    everything = searcher.fts_candidates("deploy runbook", 250, "1", [])
    passing = {m.seq for m in store.models.Memory.select().where(store.models.Memory.project == "/p/x")}
    passes = []
    ranked = search_module.ranked_matches

    def counted(*args, **kwargs):
        passes.append(args[3])
        return ranked(*args, **kwargs)

    monkeypatch.setattr(search_module, "ranked_matches", counted)
    found = searcher.fts_candidates("deploy runbook", 8, where, params)
    assert found == [(seq, score) for seq, score in everything if seq in passing][:8]
    assert len(passes) == 2, passes  # 20 ranked, 0-1 kept: then as deep as 1 in 25 needs
