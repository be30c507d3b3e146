"""The stored vectors: how a vector is encoded in the `embedding` table, and its reads.

The `embedding` table is the truth for every vector. On SQLite each is stored compact:
int8 components and one float32 scale (VECTOR_SCALE), dim + 4 bytes instead of 4 x dim,
and searches scan the same encoding in the memory-mapped vector file (`vector_file.py`).
Measured on 11.6k MiniLM vectors of the bench's conversations against their 1.2k questions
(bench/quantization.py), the int8 scan's top 10 is float32's with recall@10 0.996 (float16:
0.9998, at twice the bytes); on 100k random vectors, the worst case, 0.985 (bench/search.py). On Postgres the table keeps float32 and pgvector's `memory_vec` is the
index (db/postgres/vec.py).

There is no sqlite-vec mirror any more: searches stopped reading it when the vector file
came, and its chunks (1024 vectors preallocated each) were most of a small store. Migration
0017 drops it from older stores (`drop_legacy_index`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .backend import per_backend
from .settings import get_setting, set_setting

if TYPE_CHECKING:  # numpy is imported lazily: FTS-only commands never pay for it
    import numpy as np

log = logging.getLogger(__name__)

VEC_TABLE = "memory_vec"  # the legacy vec0 mirror (SQLite); pgvector's index on Postgres
MAX_KNN = 4096  # the deepest KNN asked of an index
# An int8 vector is dim signed bytes, then this little-endian float32: the length of the
# dequantised vector over the length of the int8 one, so q * scale has the original length.
VECTOR_SCALE = "<f4"
LEGACY_KEY = "vec0_legacy"  # "1": a vec0 table is left for a connection with vec0 to drop


def to_blob(vector: np.ndarray) -> bytes:
    """float32 bytes of a vector (Postgres's stored form, and the export format)."""
    import numpy as np

    return np.asarray(vector, dtype=np.float32).tobytes()


def quantize(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scales) of float rows: each row scaled so its largest component is
    +-127, and its scale restoring the row's length (a zero row stays zero)."""
    import numpy as np

    rows = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
    peak = np.abs(rows).max(axis=1, keepdims=True)
    peak[peak == 0] = 1.0
    ints = np.rint(rows * (127.0 / peak)).astype(np.int8)
    int_norms = np.linalg.norm(ints.astype(np.float32), axis=1)
    int_norms[int_norms == 0] = 1.0
    scales = (np.linalg.norm(rows, axis=1) / int_norms).astype(np.float32)
    return ints, scales


def compact_blobs(vectors: np.ndarray) -> list[bytes]:
    """The int8 + scale bytes of each row (SQLite's stored form).

    Laid out side by side in one buffer and cut into rows as bytes: two `tobytes` and a
    concatenation per row were most of `embed --pending`'s own work (100k rows: 0.68 s)."""
    import numpy as np

    ints, scales = quantize(vectors)
    count, dim = ints.shape
    width = dim + 4
    rows = np.empty((count, width), dtype=np.uint8)
    rows[:, :dim] = ints.view(np.uint8)
    rows[:, dim:] = scales.astype(VECTOR_SCALE).view(np.uint8).reshape(count, 4)
    data = rows.tobytes()
    return [data[at:at + width] for at in range(0, count * width, width)]


@per_backend
def vector_blobs(db, vectors: np.ndarray) -> list[bytes]:
    """How each row of `vectors` is stored in the embedding table on this backend."""
    return compact_blobs(vectors)


def decode_rows(blobs: list[bytes], dim: int) -> np.ndarray:
    """The float32 rows of stored vectors, compact or float32 (told apart by their length:
    a float32 one is returned as it is)."""
    import numpy as np

    compact = dim + 4
    if all(len(b) == compact for b in blobs):
        ints, scales = split_rows(blobs, dim)
        return ints.astype(np.float32) * scales[:, None]
    rows = np.empty((len(blobs), dim), dtype=np.float32)
    for i, blob in enumerate(blobs):
        if len(blob) == 4 * dim:
            rows[i] = np.frombuffer(blob, dtype="<f4")
        else:
            ints, scales = split_rows([blob], dim)
            rows[i] = ints[0].astype(np.float32) * scales[0]
    return rows


def decode(blob: bytes, dim: int) -> np.ndarray:
    """The float32 vector of one stored blob."""
    return decode_rows([bytes(blob)], dim)[0]


def split_rows(blobs: list[bytes], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 matrix, float32 scales) of stored vectors; a float32 one (a store written before
    migration 0017, or an import) is quantised on the way."""
    import numpy as np

    compact = dim + 4
    if all(len(b) == compact for b in blobs):
        raw = np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), compact)
        return (raw[:, :dim].view(np.int8).copy(),
                raw[:, dim:].copy().view(VECTOR_SCALE).reshape(len(blobs)).astype(np.float32))
    ints = np.empty((len(blobs), dim), dtype=np.int8)
    scales = np.empty(len(blobs), dtype=np.float32)
    for i, blob in enumerate(blobs):
        if len(blob) == compact:
            ints[i] = np.frombuffer(blob, dtype=np.int8, count=dim)
            scales[i] = np.frombuffer(blob, dtype=VECTOR_SCALE, offset=dim)[0]
        elif len(blob) == 4 * dim:
            q, s = quantize(np.frombuffer(blob, dtype="<f4"))
            ints[i], scales[i] = q[0], s[0]
        else:
            raise ValueError(f"a stored vector of {len(blob)} bytes is neither {compact} (int8, dim {dim}) "
                             f"nor {4 * dim} (float32)")
    return ints, scales


@per_backend
def _vec_table_exists(db) -> bool:
    return db.execute_sql("SELECT 1 FROM sqlite_master WHERE name = ?", (VEC_TABLE,)).fetchone() is not None


def index_state(db) -> tuple[str | None, int | None]:
    """The (model, dim) the vector index was built for (one statement: each search asks).

    The index's generation, read with them, is kept on the connection's state: a PostgreSQL
    search then knows its index is there without asking again (db/postgres/vec.py knn_vec0)."""
    values = dict(db.execute_sql("SELECT key, value FROM setting "
                                 "WHERE key IN ('vec_model', 'vec_dim', 'vec_generation')").fetchall())
    db._state.llmem_vec_generation = values.get("vec_generation")
    dim = values.get("vec_dim")
    return values.get("vec_model"), int(dim) if dim else None


def _bump_generation(db) -> None:
    set_setting(db, "vec_generation", str(int(get_setting(db, "vec_generation", "0")) + 1))


def ensure_index(db, model: str, dim: int) -> bool:
    """Make the index state match (model, dim). Call inside a write txn.

    Returns True when the index was (re)built.
    """
    if get_setting(db, LEGACY_KEY) == "1":
        drop_legacy_index(db)
    if index_state(db) == (model, dim) and not _index_missing(db):
        return False
    rebuild_index(db, model, dim)
    return True


@per_backend
def _index_missing(db) -> bool:
    """Whether the index must be rebuilt although its state matches: never on SQLite, whose
    vector file is checked and rewritten by each search."""
    return False


@per_backend
def rebuild_index(db, model: str, dim: int) -> int:
    """Record (model, dim) as the one searched; return how many vectors it has.

    Nothing is copied on SQLite: the vector file of the new (model, dim) is written from the
    table by the next search (`vector_file.py`). Float32 vectors that came in whole (`store
    copy` from Postgres) are re-encoded compact first."""
    compact_stored_vectors(db)
    set_setting(db, "vec_model", model)
    set_setting(db, "vec_dim", str(dim))
    return db.execute_sql("SELECT COUNT(*) FROM embedding WHERE model = ? AND dim = ?",
                          (model, dim)).fetchone()[0]


def drop_legacy_index(db) -> None:
    """Drop the vec0 mirror an older llmem kept (nothing reads it). A vec0 table can only be
    dropped by a connection that loaded sqlite-vec: without it the drop is left for the next
    one that did (ensure_index)."""
    if not _vec_table_exists(db):
        set_setting(db, LEGACY_KEY, "0")
        return
    if not db.vec_loaded:
        set_setting(db, LEGACY_KEY, "1")
        return
    db.execute_sql(f"DROP TABLE {VEC_TABLE}")
    set_setting(db, LEGACY_KEY, "0")


def compact_stored_vectors(db, batch: int = 2000) -> int:
    """Rewrite every float32 vector of the embedding table in the compact encoding (migration
    0017); return how many were rewritten."""
    done = 0
    last = ""
    while True:
        rows = db.execute_sql(
            "SELECT memory_id, dim, vector FROM embedding WHERE memory_id > ? AND length(vector) = 4 * dim "
            "ORDER BY memory_id LIMIT ?", (last, batch)).fetchall()
        if not rows:
            return done
        updates = []
        for dim in {r[1] for r in rows}:
            same = [r for r in rows if r[1] == dim]
            blobs = compact_blobs(decode_rows([bytes(r[2]) for r in same], dim))
            updates += [(blob, r[0]) for blob, r in zip(blobs, same, strict=True)]
        db.cursor().executemany("UPDATE embedding SET vector = ? WHERE memory_id = ?", updates)
        done += len(rows)
        last = rows[-1][0]


@per_backend
def put_vectors(db, rows: list[tuple[int, np.ndarray]]) -> None:
    """Index (seq, vector) pairs just stored. Call inside a write transaction.

    Nothing to do on SQLite: the embedding table's triggers log the change, from which every
    process's vector file catches up (vector_file.py)."""


@per_backend
def drop_vectors(db, seqs: list[int]) -> None:
    """Remove memories from the index (their embedding rows go by cascade). Nothing to do
    on SQLite, as for put_vectors."""


def stored_vector(db, seq: int, model: str, dim: int) -> np.ndarray | None:
    """The stored vector of memory `seq` from `model` at `dim` (None when it has none)."""
    row = db.execute_sql("SELECT e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id "
                         "WHERE m.seq = ? AND e.model = ? AND e.dim = ?", (seq, model, dim)).fetchone()
    return None if row is None else decode(row[0], dim)


def stored_vectors(db, seqs: list[int], model: str, dim: int) -> dict[int, np.ndarray]:
    """{seq: stored vector} of the memories of `seqs` embedded with `model` at `dim`, in one
    statement (a search compares the vectors of its few conflicting results)."""
    if not seqs:
        return {}
    marks = ",".join("?" * len(seqs))
    rows = db.execute_sql("SELECT m.seq, e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id "
                          f"WHERE m.seq IN ({marks}) AND e.model = ? AND e.dim = ?", [*seqs, model, dim]).fetchall()
    if not rows:
        return {}
    decoded = decode_rows([bytes(blob) for _, blob in rows], dim)
    return {int(seq): vector for (seq, _), vector in zip(rows, decoded, strict=True)}


def sample_vectors(db, model: str, size: int) -> list[np.ndarray]:
    """Up to `size` vectors of valid memories under `model`, drawn at random (metrics)."""
    rows = db.execute_sql(
        "SELECT e.vector, e.dim FROM embedding e JOIN memory m ON m.id = e.memory_id "
        "WHERE e.model = ? AND m.invalidated_at IS NULL ORDER BY random() LIMIT ?",
        (model, size)).fetchall()
    return [decode(blob, dim) for blob, dim in rows]


def current_embedding_count(db, model: str) -> int:
    """How many valid memories have an embedding from `model` of their current text."""
    return db.execute_sql("SELECT COUNT(*) FROM embedding e JOIN memory m ON m.id = e.memory_id "
                          "WHERE e.model = ? AND e.content_hash = m.embed_hash AND m.invalidated_at IS NULL",
                          (model,)).fetchone()[0]


# The valid memories embedded from their current text with a model at a dim. The unary + keeps
# SQLite from entering by the memory index on invalidated_at, which looked every embedding up
# at random (100k: 0.9 s of CPU to find 1,001 new ones); it scans the embedding table instead
# and looks each memory up by id (0.2 s).
_CURRENT = ("FROM embedding e JOIN memory m ON m.id = e.memory_id "
            "WHERE e.model = ? AND e.dim = ? AND e.content_hash = m.embed_hash AND +m.invalidated_at IS NULL")


def current_embeddings(db, model: str, dim: int, *, since: float | None = None):
    """A cursor over (seq, id, type, project, vector blob) of the valid memories embedded from
    their current text with `model` at `dim` (only those embedded after `since`), by seq.
    The blobs are stored vectors: `decode_rows` makes them float32.

    A cursor, not a list: a caller can stream the whole store in chunks (`fetchmany`).
    """
    sql = f"SELECT m.seq, m.id, m.type, m.project, e.vector {_CURRENT}"
    params: list = [model, dim]
    if since is not None:
        sql += " AND e.created_at > ?"
        params.append(since)
    return db.execute_sql(sql + " ORDER BY m.seq", params)


def current_embedding_scopes(db, model: str, dim: int):
    """A cursor over (seq, type, project) of the memories `current_embeddings` yields, by seq,
    without their vectors (a comparison reads those from the vector file)."""
    return db.execute_sql(f"SELECT m.seq, m.type, m.project {_CURRENT} ORDER BY m.seq", [model, dim])


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    import numpy as np

    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    return vectors / norms
