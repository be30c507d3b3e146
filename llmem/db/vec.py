"""Vector index: a sqlite-vec vec0 table mirroring the stored embeddings; the embedding reads.

The `embedding` table is canonical; `memory_vec` is derived state keyed by memory.seq and
rebuilt whenever the embedding model or dimension changes. It is maintained from Python,
not by triggers, because a connection without vec0 loaded fails on any statement that
touches a vec0 table. Searches scan the memory-mapped vector file instead (`vector_file.py`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .backend import per_backend
from .settings import get_setting, set_setting

if TYPE_CHECKING:  # numpy is imported lazily: FTS-only commands never pay for it
    import numpy as np

log = logging.getLogger(__name__)

VEC_TABLE = "memory_vec"
MAX_KNN = 4096  # vec0's limit on k


def to_blob(vector: np.ndarray) -> bytes:
    import numpy as np

    return np.asarray(vector, dtype=np.float32).tobytes()


def from_blob(blob: bytes) -> np.ndarray:
    import numpy as np

    return np.frombuffer(blob, dtype=np.float32)


@per_backend
def _vec_table_exists(db) -> bool:
    return db.execute_sql("SELECT 1 FROM sqlite_master WHERE name = ?", (VEC_TABLE,)).fetchone() is not None


def index_state(db) -> tuple[str | None, int | None]:
    """The (model, dim) the vector index was built for."""
    dim = get_setting(db, "vec_dim")
    return get_setting(db, "vec_model"), int(dim) if dim else None


def _bump_generation(db) -> None:
    set_setting(db, "vec_generation", str(int(get_setting(db, "vec_generation", "0")) + 1))


def ensure_index(db, model: str, dim: int) -> bool:
    """Make the index match (model, dim), rebuilding it on a change. Call inside a write txn.

    Returns True when the index was (re)built.
    """
    current_model, current_dim = index_state(db)
    same = current_model == model and current_dim == dim
    # A vec0 connection must also repair an index left dirty or missing by one without vec0.
    needs_repair = db.vec_loaded and (get_setting(db, "vec_dirty") == "1" or not _vec_table_exists(db))
    if same and not needs_repair:
        return False
    rebuild_index(db, model, dim)
    return True


@per_backend
def rebuild_index(db, model: str, dim: int) -> int:
    """Recreate memory_vec for (model, dim) from the embedding table; return rows indexed."""
    set_setting(db, "vec_model", model)
    set_setting(db, "vec_dim", str(dim))
    _bump_generation(db)
    if not db.vec_loaded:
        # Cannot touch vec0 here; the next connection that can load it rebuilds.
        set_setting(db, "vec_dirty", "1")
        return 0
    db.execute_sql(f"DROP TABLE IF EXISTS {VEC_TABLE}")
    db.execute_sql(f"CREATE VIRTUAL TABLE {VEC_TABLE} USING vec0("
                   f"seq INTEGER PRIMARY KEY, embedding float[{int(dim)}] distance_metric=cosine)")
    cursor = db.execute_sql(
        f"INSERT INTO {VEC_TABLE}(seq, embedding) SELECT m.seq, e.vector FROM embedding e "
        "JOIN memory m ON m.id = e.memory_id WHERE e.model = ? AND e.dim = ?", (model, dim))
    set_setting(db, "vec_dirty", "0")
    return cursor.rowcount


@per_backend
def put_vectors(db, rows: list[tuple[int, np.ndarray]]) -> None:
    """Mirror (seq, vector) pairs into memory_vec. Call inside a write transaction."""
    _bump_generation(db)
    if not rows:
        return
    if not db.vec_loaded:
        set_setting(db, "vec_dirty", "1")
        return
    seqs = [(seq,) for seq, _ in rows]
    db.execute_sql("SAVEPOINT vec_put")
    db.cursor().executemany(f"DELETE FROM {VEC_TABLE} WHERE seq = ?", seqs)
    db.cursor().executemany(f"INSERT INTO {VEC_TABLE}(seq, embedding) VALUES (?, ?)",
                            [(seq, to_blob(vec)) for seq, vec in rows])
    db.execute_sql("RELEASE vec_put")


@per_backend
def drop_vectors(db, seqs: list[int]) -> None:
    """Remove memories from memory_vec (their embedding rows go by cascade)."""
    _bump_generation(db)
    if not seqs:
        return
    if not db.vec_loaded:
        set_setting(db, "vec_dirty", "1")
        return
    if _vec_table_exists(db):
        db.cursor().executemany(f"DELETE FROM {VEC_TABLE} WHERE seq = ?", [(s,) for s in seqs])


@per_backend
def knn_vec0(db, query: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(seq, cosine distance) of the k nearest vectors, through vec0."""
    k = min(k, MAX_KNN)
    rows = db.execute_sql(
        f"SELECT seq, distance FROM {VEC_TABLE} WHERE embedding MATCH ? AND k = ? ORDER BY distance",
        (to_blob(query), k)).fetchall()
    return [(int(seq), float(dist)) for seq, dist in rows]


def stored_vector(db, seq: int, model: str, dim: int) -> np.ndarray | None:
    """The stored vector of memory `seq` from `model` at `dim` (None when it has none)."""
    row = db.execute_sql("SELECT e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id "
                         "WHERE m.seq = ? AND e.model = ? AND e.dim = ?", (seq, model, dim)).fetchone()
    return None if row is None else from_blob(row[0])


def sample_vectors(db, model: str, size: int) -> list[np.ndarray]:
    """Up to `size` vectors of valid memories under `model`, drawn at random (metrics)."""
    rows = db.execute_sql(
        "SELECT e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id "
        "WHERE e.model = ? AND m.invalidated_at IS NULL ORDER BY random() LIMIT ?",
        (model, size)).fetchall()
    return [from_blob(row[0]) for row in rows]


def current_embedding_count(db, model: str) -> int:
    """How many valid memories have an embedding from `model` of their current text."""
    return db.execute_sql("SELECT COUNT(*) FROM embedding e JOIN memory m ON m.id = e.memory_id "
                          "WHERE e.model = ? AND e.content_hash = m.embed_hash AND m.invalidated_at IS NULL",
                          (model,)).fetchone()[0]


def current_embeddings(db, model: str, dim: int, *, since: float | None = None):
    """A cursor over (seq, id, type, project, vector blob) of the valid memories embedded from
    their current text with `model` at `dim` (only those embedded after `since`), by seq.

    A cursor, not a list: a caller can stream the whole store in chunks (`fetchmany`).
    """
    sql = ("SELECT m.seq, m.id, m.type, m.project, e.vector "
           "FROM embedding e JOIN memory m ON m.id = e.memory_id "
           "WHERE e.model = ? AND e.dim = ? AND e.content_hash = m.embed_hash "
           "AND m.invalidated_at IS NULL")
    params: list = [model, dim]
    if since is not None:
        sql += " AND e.created_at > ?"
        params.append(since)
    return db.execute_sql(sql + " ORDER BY m.seq", params)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    import numpy as np

    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    return vectors / norms
