"""Nearest vectors on Postgres: pgvector's HNSW index is the server's own shared index, so
there is no vector file to map (db/vector_file.py is the SQLite store's); the filters are
checked on the candidates, going deeper into the index when too few pass."""

from __future__ import annotations

from collections.abc import Callable

from .queries import seqs_passing
from .vec import build_pending_index, knn_vec0

# How much deeper than asked the index is read when filters may drop candidates, per try.
_WIDENINGS = (4, 16)


def index_for(db, model: str, dim: int, written: None = None) -> None:
    """The server keeps its index current with every write; after a bulk load (which loads
    the table bare, db/postgres/vec.py) this is where its index is built."""
    build_pending_index(db)


def written_vectors(db, model: str, dim: int) -> None:
    """No record of a bulk embedding's vectors is kept: there is no vector file to write."""
    return None


def nearest(db, query, depth: int, model: str, dim: int, where: str, params: list,
            passing: Callable[[list[int]], set[int]] | None = None) -> list[tuple[int, float]]:
    """(seq, cosine distance) of the `depth` nearest vectors passing `where` (memory_vec holds
    only the (model, dim) of the index state, which the caller checked); `passing` (seqs →
    those that pass `where`) lets the caller check them in a query it needs anyway."""
    found: list[tuple[int, float]] = []
    # Unfiltered, only the row-level policies can drop a candidate: the depth asked is read
    # first (HNSW's work grows with it), deeper only when some were not this role's to see.
    for widening in (1, *_WIDENINGS) if where == "1" else _WIDENINGS:
        candidates = knn_vec0(db, query, depth * widening)
        seqs = [seq for seq, _ in candidates]
        allowed = passing(seqs) if passing is not None else seqs_passing(db, seqs, where, params)
        found = [(seq, distance) for seq, distance in candidates if seq in allowed]
        if len(found) >= depth or len(candidates) < depth * widening:
            break
    return found[:depth]


class NearestSearch:
    """A KNN begun by `begin_nearest`: the server runs it, all of it when it is finished."""

    def __init__(self, query, depth: int, model: str, dim: int):
        self.query, self.depth, self.model, self.dim = query, depth, model, dim

    def finish(self, db, where: str, params: list,
               passing: Callable[[list[int]], set[int]] | None = None) -> list[tuple[int, float]]:
        return nearest(db, self.query, self.depth, self.model, self.dim, where, params, passing)


def begin_nearest(db, query, depth: int, model: str, dim: int, *, background: bool = False) -> NearestSearch:
    """The KNN, run by `finish` (one connection: no query can run beside the keyword one)."""
    return NearestSearch(query, depth, model, dim)
