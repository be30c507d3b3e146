"""`embed --pending` stores what it embedded in few transactions, each of whole rows (a kill
mid-run leaves the store as one of them left it, and the next run embeds the rest), and the
vector file it leaves is written from the vectors it stored, read back only where another
writer changed the table meanwhile."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeEmbedder

from llmem import vectors
from llmem.db import vector_file
from llmem.errors import EmbedderUnavailable
from llmem.store import Store
from llmem.vectors import embed_pending, pending_query, store_vectors

pytestmark = pytest.mark.usefixtures("fresh_vector_indexes")

DIM = 16


class ClockedEmbedder(FakeEmbedder):
    """A FakeEmbedder that takes `seconds` of an explicit clock per call, and runs `before(n)`
    ahead of its n-th call (1, 2, ...): another writer's work, or its failure."""

    def __init__(self, seconds: float = 0.0, before=None):
        super().__init__(dim=DIM)
        self.time, self.seconds, self.before, self.calls = 0.0, seconds, before, 0

    def clock(self) -> float:
        return self.time

    def _embed(self, texts):
        self.calls += 1
        if self.before:
            self.before(self.calls)
        self.time += self.seconds
        return super()._embed(texts)


def add_memories(store, count: int, start: int = 0) -> list:
    return [store.add(f"memory {i} about the release train").memory for i in range(start, start + count)]


def stored_hashes_are_current(store, identity: str) -> bool:
    return store.db.execute_sql(
        "SELECT COUNT(*) FROM embedding e JOIN memory m ON m.id = e.memory_id "
        "WHERE e.model = ? AND e.content_hash IS DISTINCT FROM m.embed_hash", (identity,)).fetchone()[0] == 0


def test_a_fast_embedder_has_its_vectors_stored_once_enough_are_held(store_url, monkeypatch):
    monkeypatch.setattr(vectors, "WRITE_ROWS", 10)
    store = Store.open(store_url)
    add_memories(store, 25)
    embedder, told = ClockedEmbedder(), []
    assert embed_pending(store, embedder, batch=4, progress=told.append, clock=embedder.clock) == 25
    assert told == [12, 24, 25]  # three transactions, not one per batch of 4
    assert pending_query(store, embedder.identity).count() == 0
    assert stored_hashes_are_current(store, embedder.identity)
    store.close()


def test_a_slow_embedder_has_each_batch_stored_as_it_comes(store_url):
    store = Store.open(store_url)
    add_memories(store, 10)
    embedder, told = ClockedEmbedder(seconds=vectors.WRITE_SECONDS), []
    assert embed_pending(store, embedder, batch=4, progress=told.append, clock=embedder.clock) == 10
    assert told == [4, 8, 10]
    store.close()


def test_what_was_embedded_before_the_embedder_went_away_is_stored(store_url):
    def away(call):
        if call == 3:
            raise EmbedderUnavailable("the model server went away")

    store = Store.open(store_url)
    add_memories(store, 10)
    embedder, told = ClockedEmbedder(before=away), []
    with pytest.raises(EmbedderUnavailable):
        embed_pending(store, embedder, batch=4, progress=told.append, clock=embedder.clock)
    assert told == [8]
    assert pending_query(store, embedder.identity).count() == 2
    assert stored_hashes_are_current(store, embedder.identity)
    assert embed_pending(store, ClockedEmbedder(), batch=4) == 2
    store.close()


READ_ROWS = vector_file._read_rows  # what a file written from the table alone holds


def assert_file_holds(path: Path, store, identity: str) -> None:
    """The vector file holds the table's vectors of `identity`, to the bit."""
    _, seqs, matrix, scales, _, _ = vector_file._map_file(store.db, path, identity, DIM)
    expected = READ_ROWS(store.db, identity, DIM)
    assert np.array_equal(seqs, expected[0]) and np.array_equal(matrix, expected[1])
    assert np.array_equal(scales, expected[2])


@pytest.mark.sqlite_only  # the vector file
@pytest.mark.parametrize("meanwhile", ["nothing", "another writer", "another writer, its file pruned the log"])
def test_the_vector_file_is_written_from_the_stored_vectors_as_the_table_holds_them(tmp_path, monkeypatch, meanwhile):
    monkeypatch.setattr(vectors, "WRITE_ROWS", 8)
    path = tmp_path / "memory.db"
    store = Store.open(path)
    old = add_memories(store, 6)
    store_vectors(store, FakeEmbedder(dim=DIM), old[:3], FakeEmbedder(dim=DIM).embed_documents(["an older text"] * 3))
    fresh = add_memories(store, 20, start=6)
    other = Store.open(path)  # another process's connection

    def another_writer(call):
        if call != 4 or meanwhile == "nothing":
            return
        # Between the stored batches: one of this run's vectors and an older one replaced,
        # one of this run's memories deleted, one memory added with its vector.
        moved = [fresh[0], old[0]]
        store_vectors(other, FakeEmbedder(dim=DIM), moved, FakeEmbedder(dim=DIM).embed_documents(["moved"] * 2))
        other.delete(fresh[1].id)
        late = add_memories(other, 1, start=99)
        store_vectors(other, FakeEmbedder(dim=DIM), late, FakeEmbedder(dim=DIM).embed_documents(["late"]))
        if meanwhile.endswith("pruned the log"):
            vector_file._prune_log(other.db, vector_file.change_id(other.db))

    read_rows, reads = vector_file._read_rows, []
    monkeypatch.setattr(vector_file, "_read_rows", lambda *args: reads.append(args) or read_rows(*args))
    embedder = ClockedEmbedder(before=another_writer)
    assert embed_pending(store, embedder, batch=4, clock=embedder.clock) == 23  # 20 new, 3 never embedded
    # Every row read back from the table only when the log could not say what changed.
    assert bool(reads) == meanwhile.endswith("pruned the log")
    assert_file_holds(tmp_path / "memory.vectors", store, embedder.identity)
    other.close()
    store.close()


@pytest.mark.sqlite_only  # a kill inside SQLite's transaction
def test_a_kill_inside_a_write_leaves_whole_batches_and_the_next_run_finishes(tmp_path):
    path = tmp_path / "memory.db"
    store = Store.open(path)
    add_memories(store, 20)
    store.close()
    # The second transaction is killed after its rows went in, before its commit.
    child = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from fakes import FakeEmbedder
        from llmem import vectors
        from llmem.db import bulk
        from llmem.store import Store

        upsert, calls = bulk.upsert_embeddings, []
        def upsert_then_die(db, rows):
            upsert(db, rows)
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        bulk.upsert_embeddings = upsert_then_die
        vectors.WRITE_ROWS = 8
        vectors.embed_pending(Store.open({str(path)!r}), FakeEmbedder(dim={DIM}), batch=4)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    store = Store.open(path)
    embedder = FakeEmbedder(dim=DIM)
    assert store.db.execute_sql("SELECT COUNT(*) FROM embedding").fetchone()[0] == 8  # the first batch, whole
    assert stored_hashes_are_current(store, embedder.identity)
    assert embed_pending(store, embedder, batch=4) == 12
    assert pending_query(store, embedder.identity).count() == 0
    assert_file_holds(tmp_path / "memory.vectors", store, embedder.identity)
    store.close()


@pytest.mark.sqlite_only  # the vector file
def test_a_process_that_searched_before_rebuilds_its_file_from_the_stored_vectors(tmp_path, monkeypatch):
    # The worker: its index is mapped when a catch-up embeds a large share of the store.
    monkeypatch.setattr(vector_file, "MIN_REBUILD_ROWS", 20)
    path = tmp_path / "memory.db"
    store = Store.open(path)
    embedder = ClockedEmbedder()
    old = add_memories(store, 4)
    store_vectors(store, embedder, old, embedder.embed_documents([m.content for m in old]))
    vector_file.index_for(store.db, embedder.identity, DIM)
    add_memories(store, 30, start=4)
    for name in ("_read_rows", "_changed_rows"):  # neither every row nor the changed ones read back
        monkeypatch.setattr(vector_file, name, lambda *args, name=name: pytest.fail(f"{name} was read"))
    assert embed_pending(store, embedder, clock=embedder.clock) == 30
    monkeypatch.undo()
    index = vector_file.index_for(store.db, embedder.identity, DIM)
    assert not index.overlay and len(index.seqs) == 34
    assert_file_holds(tmp_path / "memory.vectors", store, embedder.identity)
    store.close()
