"""The vector file's prefilter: the vectors' centred leading principal components in int8, whose
best candidates are rescored exactly from the int8 rows; and the scan run beside the FTS query."""

import numpy as np
import pytest
from fakes import FakeEmbedder
from test_vector_file import add_memories, as_stored, exact, seqs_of, unit

from llmem.db import vector_file
from llmem.db.fts import index_tokens
from llmem.search import Searcher, SearchOptions
from llmem.store import Store
from llmem.vectors import store_vectors

DIM = 48  # a prefilter of 16 components (DIM // 3)
MODEL = FakeEmbedder(dim=DIM).identity
ROWS = 300


@pytest.fixture(autouse=True)
def small_prefilter(monkeypatch):
    """A prefilter for a store this small, passing on few enough candidates that it chooses."""
    monkeypatch.setattr(vector_file, "PREFILTER_MIN_ROWS", 100)
    monkeypatch.setattr(vector_file, "BESIDE_MIN_ROWS", 0)
    monkeypatch.setattr(vector_file, "PREFILTER_MIN_CANDIDATES", 20)
    vector_file._indexes.clear()
    yield
    vector_file._indexes.clear()


def embedding_like(rng, count):
    """Vectors whose variance lies in a few directions, as a sentence embedder's does."""
    spread = np.r_[np.full(8, 3.0), np.full(DIM - 8, 0.05)]
    return unit(rng.normal(size=(count, DIM)) * spread)


def build(path, vectors, projects=None):
    store = Store.open(path)
    memories = add_memories(store, len(vectors), projects)
    store_vectors(store, FakeEmbedder(dim=DIM), memories, vectors)
    return store, memories, {m.seq: v for m, v in zip(memories, as_stored(vectors), strict=True)}


def header(path):
    return vector_file.HEADER.unpack_from(path.read_bytes(), 0)


def test_the_prefilter_is_written_and_its_candidates_answer_exactly(tmp_path):
    rng = np.random.default_rng(3)
    store, _, by_seq = build(tmp_path / "memory.db", embedding_like(rng, ROWS))
    vector_file.nearest(store.db, unit(rng.normal(size=DIM)), 10, MODEL, DIM, "1", [])
    path = tmp_path / "memory.vectors"
    pdims = header(path)[7]
    assert pdims == 16
    assert path.stat().st_size == vector_file._layout(ROWS, DIM, pdims)[3]
    index = vector_file.index_for(store.db, MODEL, DIM)
    assert index.prefilter is not None and vector_file.candidate_count(ROWS) == 20
    for query in embedding_like(rng, 20):
        found = vector_file.nearest(store.db, query, 10, MODEL, DIM, "1", [])
        assert seqs_of(found) == exact(store, by_seq, query, 10, where="1")
        best = next(iter(seqs_of(found)))
        assert found[0][1] == pytest.approx(1 - float(by_seq[best] @ query), abs=1e-5)  # rescored exactly
    store.close()


def test_a_large_files_prefilter_reads_its_leading_components_first_and_answers_exactly(tmp_path, monkeypatch):
    """The first pass reads 8 of the 16 components (those holding the variance here) and passes
    a fifth of the rows on: its survivors get the rest and the best are rescored, unfiltered and
    under a filter that masks the first pass's scores."""
    monkeypatch.setattr(vector_file, "PREFILTER_LEAD_MIN_ROWS", 100)
    monkeypatch.setattr(vector_file, "PREFILTER_LEAD_DIMS", 8)
    monkeypatch.setattr(vector_file, "PREFILTER_LEAD_SHARE", 0.2)
    rng = np.random.default_rng(10)
    vectors = embedding_like(rng, ROWS)
    store, _, by_seq = build(tmp_path / "memory.db", vectors, projects=lambda i: "rare" if i % 30 == 0 else "common")
    assert vector_file.lead_dims(ROWS, 16) == 8 and vector_file.lead_count(ROWS) == 60
    for query in embedding_like(rng, 20):
        found = vector_file.nearest(store.db, query, 10, MODEL, DIM, "1", [])
        assert seqs_of(found) == exact(store, by_seq, query, 10, where="1")
        best = next(iter(seqs_of(found)))
        assert found[0][1] == pytest.approx(1 - float(by_seq[best] @ query), abs=1e-5)
    query = unit(-vectors[0])
    found = vector_file.nearest(store.db, query, 8, MODEL, DIM, "m.project = ?", ["rare"])
    assert seqs_of(found) == exact(store, by_seq, query, 8, where="m.project = ?", params=["rare"])
    store.close()


def test_vectors_without_dominant_directions_get_no_prefilter_and_an_exact_scan(tmp_path):
    rng = np.random.default_rng(4)
    store, _, by_seq = build(tmp_path / "memory.db", unit(rng.normal(size=(ROWS, DIM))))
    query = unit(rng.normal(size=DIM))
    found = vector_file.nearest(store.db, query, 10, MODEL, DIM, "1", [])
    assert header(tmp_path / "memory.vectors")[7] == 0  # 16 of 48 random directions hold a third
    assert vector_file.index_for(store.db, MODEL, DIM).prefilter is None
    assert seqs_of(found) == exact(store, by_seq, query, 10, where="1")
    store.close()


def test_rows_changed_after_the_file_are_found_and_deleted_ones_never(tmp_path):
    rng = np.random.default_rng(5)
    vectors = embedding_like(rng, ROWS)
    store, memories, _ = build(tmp_path / "memory.db", vectors)
    query = vectors[11]
    assert seqs_of(vector_file.nearest(store.db, query, 1, MODEL, DIM, "1", [])) == [memories[11].seq]
    moved = memories[200]
    store_vectors(store, FakeEmbedder(dim=DIM), [moved], query[None, :])  # now the query's twin
    store.delete(memories[11].id)
    found = seqs_of(vector_file.nearest(store.db, query, 5, MODEL, DIM, "1", []))
    assert found[0] == moved.seq and memories[11].seq not in found
    store.close()


def test_a_selective_filter_masks_the_prefilters_scores(tmp_path):
    rng = np.random.default_rng(6)
    vectors = embedding_like(rng, ROWS)
    store, memories, by_seq = build(tmp_path / "memory.db", vectors,
                                    projects=lambda i: "rare" if i % 30 == 0 else "common")
    query = unit(-vectors[0])  # the rare project's rows are far from it
    where = "m.project = ?"
    found = vector_file.nearest(store.db, query, 8, MODEL, DIM, where, ["rare"])
    assert seqs_of(found) == exact(store, by_seq, query, 8, where=where, params=["rare"])
    assert len(found) == 8
    store.close()


def test_the_scan_beside_the_fts_query_answers_as_the_scan_after_it(tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    store = Store.open(tmp_path / "memory.db")
    memories = [store.add(f"note {i} on {'billing' if i % 3 else 'search'} service {i % 17}").memory
                for i in range(ROWS)]
    vectors = embedding_like(rng, ROWS)
    store_vectors(store, FakeEmbedder(dim=DIM), memories, vectors)

    class Fixed(FakeEmbedder):
        def embed_query(self, text):
            return vectors[42]

    searcher = Searcher(store, Fixed(dim=DIM))
    opts = SearchOptions(limit=10, track=False, min_relevance=0.0)
    hits = searcher.search("billing service 4", opts).hits
    beside = [h.seq for h in hits]
    assert any(h.vec_rank for h in hits)  # the KNN ran
    real_begin = vector_file.begin_nearest
    backgrounds = []

    def in_this_thread(db, query, depth, model, dim, *, background=False):
        backgrounds.append(background)
        return real_begin(db, query, depth, model, dim)

    monkeypatch.setattr(vector_file, "begin_nearest", in_this_thread)
    after = [h.seq for h in searcher.search("billing service 4", opts).hits]
    assert backgrounds == [True] and beside == after
    store.close()


def test_a_small_files_scan_runs_in_the_callers_thread(tmp_path, monkeypatch):
    rng = np.random.default_rng(9)
    store, _, _ = build(tmp_path / "memory.db", embedding_like(rng, 50))
    monkeypatch.setattr(vector_file, "BESIDE_MIN_ROWS", 51)
    pending = vector_file.begin_nearest(store.db, embedding_like(rng, 1)[0], 5, MODEL, DIM, background=True)
    assert pending._done is None and len(pending.finish(store.db, "1", [])) == 5  # scanned in this thread
    store.close()


def test_a_failed_scan_fails_the_search_in_its_own_thread(tmp_path, monkeypatch):
    rng = np.random.default_rng(8)
    store, _, _ = build(tmp_path / "memory.db", embedding_like(rng, 50))

    def broken(self, view, query, depth, cores):
        raise MemoryError("scan failed")

    monkeypatch.setattr(vector_file.VectorIndex, "scores", broken)
    pending = vector_file.begin_nearest(store.db, embedding_like(rng, 1)[0], 5, MODEL, DIM, background=True)
    assert pending._done is not None  # it ran on the scanning thread
    with pytest.raises(MemoryError, match="scan failed"):
        pending.finish(store.db, "1", [])
    store.close()


@pytest.mark.parametrize("text", ["Handle_Request in handler.py: E0502, v2.14.3", "Café İstanbul straße ǅemal",
                                  "--no-verify :8443 TF_WORKSPACE_42", ""])
def test_index_tokens_lowercase_as_token_by_token(text):
    import re

    assert index_tokens(text, None, text.upper()) == [w.lower() for t in (text, text.upper())
                                                       for w in re.findall(r"[^\W_]+", t)]


def test_a_scan_shares_its_products_unless_it_runs_beside_the_keyword_query_until_the_caller_waits(tmp_path, monkeypatch):
    rng = np.random.default_rng(9)
    store, _, _ = build(tmp_path / "memory.db", embedding_like(rng, 50))
    query = embedding_like(rng, 1)[0]
    own = vector_file.begin_nearest(store.db, query, 5, MODEL, DIM)
    assert own._done is None and own._cores.free  # the caller's own scan: the caller waits for it
    monkeypatch.setattr(vector_file, "BESIDE_MIN_ROWS", 1)
    pending = vector_file.begin_nearest(store.db, query, 5, MODEL, DIM, background=True)
    assert pending._done is not None and not pending._cores.free  # beside the caller: one core ...
    assert len(pending.finish(store.db, "1", [])) == 5
    assert pending._cores.free  # ... until the caller came to wait for it
    store.close()
