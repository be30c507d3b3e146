"""The memory-mapped vector file: exact over the stored vectors, one scan, caught up under
concurrent writers."""

import os
import threading

import numpy as np
import pytest
from fakes import FakeEmbedder

from llmem.db import vec, vector_file
from llmem.db.queries import memory_filter
from llmem.store import Store
from llmem.vectors import store_vectors

DIM = 16
MODEL = FakeEmbedder(dim=DIM).identity


pytestmark = pytest.mark.usefixtures("fresh_vector_indexes")


def unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def as_stored(rows):
    """The vectors as the store holds them (int8 and a scale, db/vec.py), as float32."""
    rows = np.atleast_2d(rows)
    return vec.decode_rows(vec.compact_blobs(rows), rows.shape[1])


def file_size(count):
    """Header, int8 rows (DIM is a multiple of 8), scales padded to 8 bytes, int64 seqs."""
    return vector_file.HEADER_BYTES + count * DIM + -(-count * 4 // 8) * 8 + count * 8


def add_memories(store, count, projects=None):
    """Memories `memory 0` .. `memory count-1` (memory i in project `projects(i)`), in order:
    added in bulk, one insert per project (`add` one at a time builds ~1 ms of queries a row);
    one already stored is found again, as `add` finds a duplicate."""
    texts = [f"memory {i}" for i in range(count)]
    scopes = [projects(i) if projects else None for i in range(count)]
    with store.db.atomic():
        for project in dict.fromkeys(scopes):
            store.add_many([(text, {}, "user") for text, scope in zip(texts, scopes, strict=True)
                            if scope == project],
                           "fact", confidence=0.7, source="user", project=project, session_id=None)
    Memory = store.models.Memory
    by_text = {(m.content, m.project): m for m in Memory.select().where(
        Memory.content.in_(texts) & Memory.invalidated_at.is_null())}
    return [by_text[text, scope] for text, scope in zip(texts, scopes, strict=True)]


def build(path, count, *, seed=1, projects=None):
    rng = np.random.default_rng(seed)
    store = Store.open(path)
    memories = add_memories(store, count, projects)
    vectors = unit(rng.normal(size=(count, DIM)))
    store_vectors(store, FakeEmbedder(dim=DIM), memories, vectors)
    return store, memories, as_stored(vectors)


def exact(store, vectors_by_seq, query, k, where="m.invalidated_at IS NULL", params=()):
    """The expected answer, computed from the table by brute force."""
    allowed = {r[0] for r in store.db.execute_sql(
        f"SELECT m.seq FROM memory m JOIN embedding e ON e.memory_id = m.id WHERE e.model = ? AND {where}",
        [MODEL, *params])}
    scored = sorted(((float(v @ query), s) for s, v in vectors_by_seq.items() if s in allowed),
                    key=lambda p: (-p[0], p[1]))
    return [s for _, s in scored[:k]]


def seqs_of(found):
    return [s for s, _ in found]


def test_the_file_is_written_beside_the_store_and_answers_exactly(tmp_path):
    store, memories, vectors = build(tmp_path / "memory.db", 400)
    query = unit(vectors[7] + 0.2)
    found = vector_file.nearest(store.db, query, 20, MODEL, DIM, "m.invalidated_at IS NULL", [])
    truth = exact(store, {m.seq: v for m, v in zip(memories, vectors, strict=True)}, query, 20)
    assert seqs_of(found) == truth
    assert found[0][1] == pytest.approx(1 - float(vectors[7] @ query), abs=1e-5)
    path = tmp_path / "memory.vectors"
    assert path.is_file() and path.stat().st_uid == os.getuid()
    assert path.stat().st_size == file_size(400)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    store.close()


def test_another_writer_is_seen_at_once_without_rewriting_the_file(tmp_path):
    path = tmp_path / "memory.db"
    reader, memories, vectors = build(path, 300)
    by_seq = {m.seq: v for m, v in zip(memories, vectors, strict=True)}
    query = unit(np.ones(DIM))
    vector_file.nearest(reader.db, query, 10, MODEL, DIM, "1", [])
    file_before = os.stat(tmp_path / "memory.vectors")

    writer = Store.open(path)  # a worker embedding while the server searches
    fresh = writer.add("a brand new memory").memory
    store_vectors(writer, FakeEmbedder(dim=DIM), [fresh], unit([query]))
    moved = memories[3]
    writer_moved = writer.models.Memory.get(writer.models.Memory.seq == moved.seq)
    store_vectors(writer, FakeEmbedder(dim=DIM), [writer_moved], unit([query + 0.01]))
    gone = memories[4]
    writer.models.Memory.delete().where(writer.models.Memory.id == gone.id).execute()
    writer.close()
    by_seq[fresh.seq] = as_stored(unit(query))[0]
    by_seq[moved.seq] = as_stored(unit(query + 0.01))[0]
    del by_seq[gone.seq]

    found = vector_file.nearest(reader.db, query, 10, MODEL, DIM, "1", [])
    assert set(seqs_of(found)[:2]) == {fresh.seq, moved.seq}
    assert seqs_of(found) == exact(reader, by_seq, query, 10, where="1")
    assert gone.seq not in seqs_of(vector_file.nearest(reader.db, unit(vectors[4]), 5, MODEL, DIM, "1", []))
    file_after = os.stat(tmp_path / "memory.vectors")
    assert (file_after.st_ino, file_after.st_mtime_ns) == (file_before.st_ino, file_before.st_mtime_ns)
    reader.close()


def test_a_large_overlay_is_folded_into_a_rebuilt_file_and_the_log_pruned(tmp_path, monkeypatch):
    monkeypatch.setattr(vector_file, "MIN_REBUILD_ROWS", 5)
    path = tmp_path / "memory.db"
    store, memories, vectors = build(path, 50)
    query = unit(vectors[0])
    vector_file.nearest(store.db, query, 5, MODEL, DIM, "1", [])
    other = Store.open(path)
    added = [other.add(f"later {i}").memory for i in range(6)]
    store_vectors(other, FakeEmbedder(dim=DIM), added, unit(np.tile(query, (6, 1)) + 0.001 * np.arange(6)[:, None]))
    other.close()
    before = os.stat(tmp_path / "memory.vectors").st_ino
    found = vector_file.nearest(store.db, query, 8, MODEL, DIM, "1", [])
    assert set(seqs_of(found)) >= {m.seq for m in added}
    assert os.stat(tmp_path / "memory.vectors").st_ino != before  # rebuilt, renamed into place
    assert store.db.execute_sql("SELECT COUNT(*) FROM vector_change").fetchone()[0] == 0
    store.close()


def test_a_process_whose_file_was_pruned_past_catches_up_from_the_new_file(tmp_path, monkeypatch):
    path = tmp_path / "memory.db"
    first, memories, vectors = build(path, 40)
    query = unit(vectors[1])
    vector_file.nearest(first.db, query, 5, MODEL, DIM, "1", [])
    stale = vector_file._indexes.copy()
    vector_file._indexes.clear()
    second = Store.open(path)
    late = second.add("late").memory
    store_vectors(second, FakeEmbedder(dim=DIM), [late], unit([query]))
    index = vector_file.index_for(second.db, MODEL, DIM)
    index._load(second.db, rebuild=True)  # another process rebuilds and prunes the log
    second.close()
    vector_file._indexes.clear()
    vector_file._indexes.update(stale)
    found = vector_file.nearest(first.db, query, 2, MODEL, DIM, "1", [])
    assert late.seq in seqs_of(found)
    first.close()


def test_a_selective_filter_is_a_mask_over_one_scan(tmp_path, monkeypatch):
    store, memories, vectors = build(tmp_path / "memory.db", 500,
                                     projects=lambda i: "rare" if i % 100 == 0 else "common")
    by_seq = {m.seq: v for m, v in zip(memories, vectors, strict=True)}
    scans = []
    real_scores = vector_file.VectorIndex.scores

    def counting(self, *args):
        scans.append(1)
        return real_scores(self, *args)

    monkeypatch.setattr(vector_file.VectorIndex, "scores", counting)
    rare = [m for m in memories if m.project == "rare"][0]
    query = unit(-vectors[memories.index(rare)])  # the rare project's rows rank last
    where = "m.project = ?"
    found = vector_file.nearest(store.db, query, 5, MODEL, DIM, where, ["rare"])
    assert seqs_of(found) == exact(store, by_seq, query, 5, where=where, params=["rare"])
    assert len(found) == 5 and len(scans) == 1
    store.close()


def test_the_search_filters_match_an_exact_scan(tmp_path):
    store, memories, vectors = build(tmp_path / "memory.db", 300,
                                     projects=lambda i: ["a", "b", None][i % 3])
    by_seq = {m.seq: v for m, v in zip(memories, vectors, strict=True)}
    for memory in memories[::5]:
        store.invalidate(memory.id, reason="test")
    where, params = memory_filter(memory_type=None, project="a", include_invalid=False,
                                  valid_only=False, at=0.0)
    query = unit(vectors[10])
    found = vector_file.nearest(store.db, query, 25, MODEL, DIM, where, params)
    assert seqs_of(found) == exact(store, by_seq, query, 25, where=where, params=params)
    store.close()


def test_vectors_of_another_model_are_never_compared(tmp_path):
    store, memories, vectors = build(tmp_path / "memory.db", 30)
    query = unit(vectors[2])
    vector_file.nearest(store.db, query, 5, MODEL, DIM, "1", [])
    other = FakeEmbedder(model="other", dim=DIM)
    store_vectors(store, other, memories[:10], unit(np.tile(query, (10, 1))))
    old_model = vector_file.nearest(store.db, query, 30, MODEL, DIM, "1", [])
    assert not {m.seq for m in memories[:10]} & set(seqs_of(old_model))
    new_model = vector_file.nearest(store.db, query, 30, other.identity, DIM, "1", [])
    assert set(seqs_of(new_model)) == {m.seq for m in memories[:10]}
    store.close()


def test_a_symlink_in_the_files_place_is_never_followed(tmp_path):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"not ours")
    (tmp_path / "memory.vectors").symlink_to(target)
    store, memories, vectors = build(tmp_path / "memory.db", 60)
    query = unit(vectors[9])
    found = vector_file.nearest(store.db, query, 10, MODEL, DIM, "1", [])
    assert seqs_of(found) == exact(store, {m.seq: v for m, v in zip(memories, vectors, strict=True)},
                                   query, 10, where="1")
    assert target.read_bytes() == b"not ours"
    assert (tmp_path / "memory.vectors").is_symlink()
    store.close()


def test_a_damaged_file_is_rebuilt(tmp_path):
    store, memories, vectors = build(tmp_path / "memory.db", 80)
    query = unit(vectors[3])
    vector_file.nearest(store.db, query, 5, MODEL, DIM, "1", [])
    path = tmp_path / "memory.vectors"
    with open(path, "r+b") as damaged:
        damaged.truncate(path.stat().st_size - 100)
    vector_file._indexes.clear()
    found = vector_file.nearest(store.db, query, 5, MODEL, DIM, "1", [])
    assert found[0][0] == memories[3].seq
    assert path.stat().st_size == file_size(80)
    store.close()


def test_a_store_recreated_in_place_never_reads_the_old_file(tmp_path):
    path = tmp_path / "memory.db"
    store, memories, vectors = build(path, 30, seed=1)
    vector_file.nearest(store.db, unit(vectors[0]), 5, MODEL, DIM, "1", [])
    store.close()
    for leftover in tmp_path.glob("memory.db*"):
        leftover.unlink()
    vector_file._indexes.clear()
    store, memories, vectors = build(path, 30, seed=2)  # same seqs, other vectors
    query = unit(vectors[11])
    found = vector_file.nearest(store.db, query, 3, MODEL, DIM, "1", [])
    assert found[0] == (memories[11].seq, pytest.approx(0.0, abs=1e-5))
    store.close()


def test_a_folder_not_ours_is_searched_from_memory(tmp_path, monkeypatch):
    store, memories, vectors = build(tmp_path / "memory.db", 70)
    monkeypatch.setattr(vector_file, "_own_folder", lambda folder: False)
    query = unit(vectors[20])
    found = vector_file.nearest(store.db, query, 10, MODEL, DIM, "1", [])
    assert seqs_of(found) == exact(store, {m.seq: v for m, v in zip(memories, vectors, strict=True)},
                                   query, 10, where="1")
    assert not (tmp_path / "memory.vectors").exists()
    store.close()


def test_embed_pending_leaves_the_file_written_for_the_next_search(tmp_path):
    from llmem.vectors import embed_pending

    store = Store.open(tmp_path / "memory.db")
    for i in range(5):
        store.add(f"note {i} about sqlite")
    assert embed_pending(store, FakeEmbedder(dim=DIM)) == 5
    path = tmp_path / "memory.vectors"
    assert path.stat().st_size == file_size(5)
    store.close()


@pytest.mark.parametrize("hidden_share", [0.0, 0.5, 0.99])
def test_the_sampled_top_k_is_the_exact_top_k(hidden_share):
    """_top_index's threshold from a sample holds the k best, also when most scores are -inf
    (a filter's mask) or tied, and it falls back to a full partition when it misjudges."""
    rng = np.random.default_rng(5)
    scores = rng.normal(size=20_000).astype(np.float32)
    scores[rng.random(len(scores)) < hidden_share] = -np.inf
    scores[:300] = 2.5  # a run of ties
    for k in (1, 50, 200, 1024):
        got = vector_file._top_index(scores, k)
        assert len(got) == k == len(set(got.tolist()))
        assert np.sort(scores[got])[::-1].tolist() == np.sort(scores)[::-1][:k].tolist()


def _large_matrix(rng):
    rows = rng.integers(-127, 128, size=(vector_file.SHARED_SCAN_ROWS + 101, 128), dtype=np.int8)
    return rows, rng.random(len(rows), dtype=np.float32), rng.normal(size=128).astype(np.float32)


def _wrapping_work(monkeypatch, wrap):
    """_in_blocks with each block's work passed through wrap(work, start, mine)."""
    real = vector_file._in_blocks
    monkeypatch.setattr(vector_file, "_in_blocks", lambda count, block_rows, cores, work, buffers: real(
        count, block_rows, cores, lambda start, mine: wrap(work, start, mine), buffers))


@pytest.mark.parametrize("by_index", [False, True])
def test_a_large_matrix_is_scored_on_two_threads_as_one_thread_would(monkeypatch, by_index):
    rows, scales, query = _large_matrix(np.random.default_rng(7))
    at = np.sort(np.random.default_rng(1).choice(len(rows), len(rows) - 50, replace=False)) if by_index else None
    alone = vector_file._scores(rows[at] if by_index else rows, scales[at] if by_index else scales, query)
    scored_by, helper_scored = [], threading.Event()

    def recording(work, start, mine):
        by_me = threading.current_thread() is threading.main_thread()
        if by_me and not scored_by:  # hold this thread's first block until the helper took one
            assert helper_scored.wait(10)
        work(start, mine)
        scored_by.append(by_me)
        if not by_me:
            helper_scored.set()

    _wrapping_work(monkeypatch, recording)
    shared = vector_file._scores(rows, scales[at] if by_index else scales, query, vector_file.Cores(free=True), at)
    assert True in scored_by and False in scored_by  # each thread scored blocks of its own
    assert len(scored_by) == -(-len(alone) // (vector_file.SCAN_ELEMENTS // 128))  # each block once
    assert np.array_equal(shared, alone)
    expected = (rows.astype(np.float64) @ query) * scales
    assert np.allclose(shared, expected[at] if by_index else expected, rtol=1e-4, atol=1e-3)


def test_a_scan_takes_the_second_core_once_it_is_free_and_not_before(monkeypatch):
    rows, scales, query = _large_matrix(np.random.default_rng(8))
    alone = vector_file._scores(rows, scales, query)
    cores = vector_file.Cores(free=False)
    handed = []
    real_share = vector_file._share
    monkeypatch.setattr(vector_file, "_share", lambda work, *args: handed.append(work) or real_share(work, *args))
    assert np.array_equal(vector_file._scores(rows, scales, query, cores), alone) and not handed

    blocks = []

    def freeing(work, start, mine):  # the caller comes to wait after the scan's third block
        blocks.append(start)
        cores.free = cores.free or len(blocks) == 3
        work(start, mine)

    _wrapping_work(monkeypatch, freeing)
    assert np.array_equal(vector_file._scores(rows, scales, query, cores), alone)
    assert handed == [vector_file._claim_blocks]


def test_a_helper_the_sharing_thread_never_took_up_is_not_waited_for():
    rows, scales, query = _large_matrix(np.random.default_rng(9))
    busy, release = threading.Event(), threading.Event()
    # The sharing thread busy with another search's work for the whole scan.
    occupied = vector_file._share(lambda: busy.set() or release.wait(10))
    assert busy.wait(10)
    try:
        shared = vector_file._scores(rows, scales, query, vector_file.Cores(free=True))
    finally:
        release.set()
    # Released, not timed out: the scan returned while the sharing thread was still busy (had it
    # waited for its queued helper, the busy work would have waited out its 10 s first).
    assert occupied.result() is True
    assert np.array_equal(shared, vector_file._scores(rows, scales, query))


def test_an_error_on_the_sharing_thread_is_raised_in_the_thread_that_waits():
    def failing():
        raise MemoryError("no room for the block")

    with pytest.raises(MemoryError, match="no room"):
        vector_file._share(failing).result()
    assert vector_file._share(lambda: None).result() is None  # the thread lives on


def test_a_table_below_the_threshold_is_searched_with_no_file_and_one_reaching_it_gets_one(tmp_path, monkeypatch):
    # Below FILE_MIN_ROWS the vectors are held once, in the table: no file beside the store.
    monkeypatch.setattr(vector_file, "FILE_MIN_ROWS", 300)
    store, memories, vectors = build(tmp_path / "memory.db", 299)
    path = tmp_path / "memory.vectors"
    by_seq = {m.seq: v for m, v in zip(memories, vectors, strict=True)}
    query = unit(vectors[3] + 0.2)
    found = vector_file.nearest(store.db, query, 20, MODEL, DIM, "m.invalidated_at IS NULL", [])
    assert seqs_of(found) == exact(store, by_seq, query, 20)
    assert not path.exists()
    # A new process, once the table reaches the threshold, writes the file and answers the same.
    more = [store.add(f"memory {i}").memory for i in range(299, 301)]
    extra = unit(np.random.default_rng(5).normal(size=(2, DIM)))
    store_vectors(store, FakeEmbedder(dim=DIM), more, extra)
    by_seq |= {m.seq: v for m, v in zip(more, as_stored(extra), strict=True)}
    vector_file._indexes.clear()
    found = vector_file.nearest(store.db, query, 20, MODEL, DIM, "m.invalidated_at IS NULL", [])
    assert seqs_of(found) == exact(store, by_seq, query, 20)
    assert path.is_file() and path.stat().st_size == file_size(301)
    store.close()
