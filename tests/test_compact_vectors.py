"""Each vector is stored once, compact: int8 and a scale in the table, the same in the vector
file, no sqlite-vec mirror; migration 0017 brings an older store there and gives the space back."""

import sqlite3
import struct

import numpy as np
import pytest
from fakes import FakeEmbedder
from test_vector_file import add_memories

from llmem.db import vec, vector_file
from llmem.search import Searcher, SearchOptions
from llmem.store import Store
from llmem.vectors import embed_pending, store_vectors

# A vector file's header before version 5 (magic, version, dim, count, change id, store
# token, model length, prefilter dims): what a version-1 file begins with.
OLD_HEADER = struct.Struct("<8sIIQQ32sII")

DIM = 64


pytestmark = pytest.mark.usefixtures("fresh_vector_indexes")


def unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def blob_lengths(db):
    return {r[0] for r in db.execute_sql("SELECT length(vector) FROM embedding")}


def test_a_vector_is_stored_once_compact_and_searched_from_the_same_encoding(tmp_path):
    store = Store.open(tmp_path / "memory.db")
    memories = add_memories(store, 200)
    vectors = unit(np.random.default_rng(3).normal(size=(200, DIM)))
    store_vectors(store, FakeEmbedder(dim=DIM), memories, vectors)
    assert blob_lengths(store.db) == {DIM + 4}
    assert store.db.execute_sql("SELECT name FROM sqlite_master WHERE name LIKE 'memory_vec%'").fetchall() == []
    stored = vec.stored_vector(store.db, memories[9].seq, FakeEmbedder(dim=DIM).identity, DIM)
    assert float(stored @ vectors[9]) > 0.999 and abs(float(np.linalg.norm(stored)) - 1.0) < 1e-5
    found = vector_file.nearest(store.db, vectors[9], 5, FakeEmbedder(dim=DIM).identity, DIM, "1", [])
    assert found[0] == (memories[9].seq, pytest.approx(1.0 - float(stored @ vectors[9]), abs=1e-5))
    store.close()


def test_the_encoding_round_trips_and_names_a_blob_it_cannot_read():
    rows = np.vstack([unit(np.arange(1, DIM + 1, dtype=np.float32)), np.zeros(DIM, np.float32),
                      3.0 * unit(np.ones(DIM))])
    blobs = vec.compact_blobs(rows)
    assert [len(b) for b in blobs] == [DIM + 4] * 3
    back = vec.decode_rows(blobs, DIM)
    assert np.allclose(back[1], 0.0)  # a zero row stays zero
    assert np.linalg.norm(back[2]) == pytest.approx(3.0, rel=1e-5)  # the length is kept
    assert float(back[0] @ rows[0]) > 0.9999
    # float32 blobs (an older store, an import) read as they are, mixed with compact ones
    mixed = vec.decode_rows([vec.to_blob(rows[0]), blobs[2]], DIM)
    assert np.array_equal(mixed[0], rows[0]) and np.allclose(mixed[1], back[2])
    ints, scales = vec.split_rows([vec.to_blob(rows[0])], DIM)
    assert ints.dtype == np.int8 and np.abs(ints).max() == 127 and scales.shape == (1,)
    with pytest.raises(ValueError, match="neither 68 .* nor 256"):
        vec.decode_rows([b"\0" * 10], DIM)


def _make_it_an_older_store(path, embedder, vectors):
    """Put back what llmem kept before migration 0017: float32 vectors in the table, the
    vec0 mirror beside them, a version-1 vector file, and no record of 0017."""
    store = Store.open(path)
    assert store.db.vec_loaded, "sqlite-vec must load on this machine"
    rows = list(store.db.execute_sql("SELECT m.seq, m.id FROM memory m JOIN embedding e ON e.memory_id = m.id "
                                     "ORDER BY m.seq"))
    store.db.execute_sql(f"CREATE VIRTUAL TABLE memory_vec USING vec0(seq INTEGER PRIMARY KEY, "
                         f"embedding float[{DIM}] distance_metric=cosine)")
    for (seq, memory_id), vector in zip(rows, vectors, strict=True):
        store.db.execute_sql("UPDATE embedding SET vector = ? WHERE memory_id = ?", (vec.to_blob(vector), memory_id))
        store.db.execute_sql("INSERT INTO memory_vec(seq, embedding) VALUES (?, ?)", (seq, vec.to_blob(vector)))
    store.db.execute_sql("DELETE FROM schema_migration WHERE name = '0017_compact_vectors'")
    store.close()
    old_file = path.with_suffix(".vectors")
    old_file.write_bytes(OLD_HEADER.pack(vector_file.MAGIC, 1, DIM, 0, 0, b"", 0, 0).ljust(4096, b"\0"))
    return old_file


def test_migration_0017_compacts_an_older_store_and_gives_the_space_back(tmp_path):
    path = tmp_path / "memory.db"
    embedder = FakeEmbedder(dim=DIM)
    store = Store.open(path)
    with store.db.atomic():  # one bulk insert: the rows, not how they were added, are the subject
        store.add_many([(f"note {i} about topic {i % 37} and the billing service", {}, "user")
                        for i in range(1500)], "fact", confidence=1.0, source="user",
                       project=None, session_id=None)
    embed_pending(store, embedder)
    vectors = vec.decode_rows([r[0] for r in store.db.execute_sql(
        "SELECT e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id ORDER BY m.seq")], DIM)
    store.close()
    old_file = _make_it_an_older_store(path, embedder, vectors)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT DISTINCT length(vector) FROM embedding").fetchall() == [(4 * DIM,)]
    before = path.stat().st_size

    store = Store.open(path)
    assert blob_lengths(store.db) == {DIM + 4}
    assert store.db.execute_sql("SELECT name FROM sqlite_master WHERE name LIKE 'memory_vec%'").fetchall() == []
    assert store.db.execute_sql("SELECT COUNT(*) FROM vector_change").fetchone()[0] == 0
    assert store.db.execute_sql("PRAGMA freelist_count").fetchone()[0] == 0  # vacuumed
    again = vec.decode_rows([r[0] for r in store.db.execute_sql(
        "SELECT e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id ORDER BY m.seq")], DIM)
    assert np.min(np.sum(again * vectors, axis=1)) > 0.999
    hits = Searcher(store, embedder).search("note 12 about topic 12", SearchOptions(mode="semantic", track=False)).hits
    assert hits and hits[0].memory.content.startswith("note 12 ")
    header = vector_file.HEADER.unpack_from(old_file.read_bytes(), 0)
    assert header[1] == vector_file.VERSION and header[3] == 1500  # the old file was rewritten
    store.close()
    # the float32 rows and the vec0 chunks (1024 rows preallocated each) are gone: at 64-d, a
    # vector was 2 x 256 bytes or more, and is 68 (the WAL is folded in at close)
    assert path.stat().st_size < 0.7 * before


def test_a_mirror_that_a_connection_without_vec0_left_goes_with_the_next_write(tmp_path):
    path = tmp_path / "memory.db"
    embedder = FakeEmbedder(dim=DIM)
    with Store.open(path) as store:
        for i in range(20):
            store.add(f"entry {i}")
        embed_pending(store, embedder)
        vectors = vec.decode_rows([r[0] for r in store.db.execute_sql(
            "SELECT e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id ORDER BY m.seq")], DIM)
    _make_it_an_older_store(path, embedder, vectors)
    with Store.open(path, vec_enabled=False) as plain:  # migrates, but cannot drop a vec0 table
        assert blob_lengths(plain.db) == {DIM + 4}
        assert vec.get_setting(plain.db, vec.LEGACY_KEY) == "1"
        hits = Searcher(plain, embedder).search("entry 7", SearchOptions(mode="semantic", track=False)).hits
        assert hits[0].memory.content == "entry 7"
    with Store.open(path) as store:
        store.add("entry 20")
        embed_pending(store, embedder)
        assert vec.get_setting(store.db, vec.LEGACY_KEY) == "0"
        assert store.db.execute_sql("SELECT 1 FROM sqlite_master WHERE name = 'memory_vec'").fetchone() is None


def test_float32_vectors_copied_in_whole_are_compacted_when_the_index_is_rebuilt(tmp_path):
    # `llmem store copy` from Postgres brings the embedding rows as they are there (float32),
    # then rebuilds the target's index.
    embedder = FakeEmbedder(dim=DIM)
    with Store.open(tmp_path / "memory.db") as store:
        memories = [store.add(f"copied {i}").memory for i in range(10)]
        vectors = unit(np.random.default_rng(5).normal(size=(10, DIM)))
        store_vectors(store, embedder, memories, vectors)
        for memory, vector in zip(memories, vectors, strict=True):
            store.db.execute_sql("UPDATE embedding SET vector = ? WHERE memory_id = ?", (vec.to_blob(vector), memory.id))
        assert blob_lengths(store.db) == {4 * DIM}
        assert vec.rebuild_index(store.db, embedder.identity, DIM) == 10
        assert blob_lengths(store.db) == {DIM + 4}
        found = vector_file.nearest(store.db, vectors[3], 1, embedder.identity, DIM, "1", [])
        assert found[0][0] == memories[3].seq
