"""The vector index on Postgres: `memory_vec(seq, embedding vector(dim))` under an HNSW
cosine index, derived from the `embedding` table as vec0's table is on SQLite (db/vec.py
keeps the index state in settings, and its reads of the embedding table run here as they are).

Vectors go in by binary COPY. An HNSW index costs each insert a walk of its graph (~2 ms at
384-d: 460 vectors/s), so a bulk load into a (nearly) empty table — the first `embed --all`,
`store copy`, `import` — loads the table bare and builds the index after, in one pass:
`rebuild_index` does so, and a large batch of `put_vectors` on a table smaller than the batch
drops the index first; `build_pending_index` makes it again at the end of `embed` (db/vec.py
callers: vector_file.index_for) or at the next search. Only the table's owner may drop or
build an index: another role's loads go through the index as before, and without an index a
search is an exact scan (right, only slower).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..settings import set_setting
from .connection import SESSION_EF_SEARCH

log = logging.getLogger(__name__)

VEC_TABLE = "memory_vec"
VEC_INDEX = f"{VEC_TABLE}_hnsw"
# A batch this large into a table holding fewer vectors than it is loaded bare (see above).
BULK_ROWS = 1000
# HNSW visits ef_search candidates (pgvector's default 40): a search that asks for k
# nearest asks for at least k (pgvector caps it at 1000), and iterative scans go past it.
MAX_EF_SEARCH = 1000


def vector_literal(vector) -> str:
    """pgvector's text form of a vector: `[x,y,…]` (float32 values, in full)."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def _vec_table_exists(db) -> bool:
    return db.execute_sql("SELECT to_regclass(?) IS NOT NULL", (VEC_TABLE,)).fetchone()[0]


def _index_exists(db) -> bool:
    return db.execute_sql("SELECT to_regclass(?) IS NOT NULL", (VEC_INDEX,)).fetchone()[0]


def _own_table(db) -> bool:
    """Whether this role owns memory_vec (may drop and create its index)."""
    row = db.execute_sql("SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass(?)",
                         (VEC_TABLE,)).fetchone()
    return bool(row and row[0])


# The most maintenance_work_mem an index build asks for on its own; a server configured
# with more (for a million vectors, whose graph needs ~2.6 GB) keeps its own setting.
BUILD_ROOM_CAP_MB = 1024


def build_room_mb(db, rows: int, dim: int) -> int:
    """maintenance_work_mem for building the graph of `rows` vectors: room for all of them
    (up to BUILD_ROOM_CAP_MB), never less than the server's own setting."""
    wanted = min(max(64, int(rows * (4 * dim + 256) * 1.5) >> 20), BUILD_ROOM_CAP_MB)
    configured = db.execute_sql("SELECT pg_size_bytes(current_setting('maintenance_work_mem'))").fetchone()[0]
    return max(wanted, int(configured) >> 20)


def _create_index(db) -> None:
    """Build the HNSW index (inside the caller's transaction). Its graph is built in memory
    while it fits in maintenance_work_mem and far slower on disk after: the build gets room
    for the vectors it indexes (build_room_mb), and no statement timeout (100k vectors took
    over the 60 s every other statement gets, on a loaded 2-core machine)."""
    started = time.perf_counter()
    rows, dim = db.execute_sql(f"SELECT count(*), max(vector_dims(embedding)) FROM {VEC_TABLE}").fetchone()
    room_mb = build_room_mb(db, rows, dim or 0)
    with db.atomic():  # SET LOCAL needs a transaction: the caller's, or this one
        db.execute_sql(f"SET LOCAL maintenance_work_mem = '{room_mb}MB'")
        db.execute_sql("SET LOCAL statement_timeout = 0")
        db.execute_sql(f"CREATE INDEX IF NOT EXISTS {VEC_INDEX} ON {VEC_TABLE} USING hnsw (embedding vector_cosine_ops)")
    log.info("vector index of %d vectors built in %.1f s", rows, time.perf_counter() - started)


def build_pending_index(db) -> bool:
    """Build the HNSW index a bulk load left to be built (True when it did): by its owner,
    in a transaction of its own (the build takes a lock that blocks writes meanwhile)."""
    if not _vec_table_exists(db) or _index_exists(db) or not _own_table(db):
        return False
    _create_index(db)
    return True


def _index_missing(db) -> bool:
    from ..settings import get_setting

    return get_setting(db, "vec_dirty") == "1" or not _vec_table_exists(db)


def vector_blobs(db, vectors) -> list[bytes]:
    """float32 bytes: pgvector's index is built from them at full precision."""
    from ..vec import to_blob

    return [to_blob(vector) for vector in vectors]


def rebuild_index(db, model: str, dim: int) -> int:
    from ..vec import _bump_generation

    set_setting(db, "vec_model", model)
    set_setting(db, "vec_dim", str(dim))
    _bump_generation(db)
    db.execute_sql(f"DROP TABLE IF EXISTS {VEC_TABLE}")
    db.execute_sql(f"CREATE TABLE {VEC_TABLE} (seq INTEGER PRIMARY KEY REFERENCES memory(seq) "
                   f"ON DELETE CASCADE, embedding vector({int(dim)}) NOT NULL)")
    count = 0
    last = ""
    while True:  # the table bare, by batches of decoded vectors, then the index in one pass
        rows = db.execute_sql("SELECT e.memory_id, m.seq, e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id "
                              "WHERE e.model = ? AND e.dim = ? AND e.memory_id > ? ORDER BY e.memory_id LIMIT 5000",
                              (model, dim, last)).fetchall()
        if not rows:
            break
        _copy(db, [(seq, _from_blob(blob, dim)) for _, seq, blob in rows])
        count += len(rows)
        last = rows[-1][0]
    _create_index(db)
    set_setting(db, "vec_dirty", "0")
    return count


def _from_blob(blob, dim: int):
    from ..vec import decode

    return decode(bytes(blob), dim)


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" * 2
_COPY_TRAILER = b"\xff\xff"


def copy_data(rows) -> bytes:
    """(seq, vector) rows in COPY's binary format, pgvector's binary `vector` in each: per row
    2 fields, the seq as int4, the vector as int2 dim, int2 0, dim float4, all big-endian."""
    seqs = np.asarray([int(seq) for seq, _ in rows], dtype=">i4")
    vectors = np.asarray([vector for _, vector in rows], dtype=">f4")
    dim = vectors.shape[1]
    record = np.dtype([("fields", ">i2"), ("seq_len", ">i4"), ("seq", ">i4"), ("vec_len", ">i4"),
                       ("dim", ">i2"), ("unused", ">i2"), ("values", ">f4", (dim,))])
    out = np.zeros(len(rows), dtype=record)
    out["fields"], out["seq_len"], out["seq"], out["vec_len"] = 2, 4, seqs, 4 + 4 * dim
    out["dim"], out["values"] = dim, vectors
    return _COPY_HEADER + out.tobytes() + _COPY_TRAILER


def _copy(db, rows) -> None:
    """Load (seq, vector) rows with one binary COPY; the caller removed any row of their seqs."""
    if rows:
        cursor = db.cursor()
        with cursor.copy(f"COPY {VEC_TABLE} (seq, embedding) FROM STDIN WITH (FORMAT binary)") as copy:
            copy.write(copy_data(rows))


def put_vectors(db, rows) -> None:
    from ..vec import _bump_generation

    _bump_generation(db)
    if not rows or not _vec_table_exists(db):
        return  # ensure_index makes it (with these rows) before any vector is stored
    seqs = [int(seq) for seq, _ in rows]
    if len(rows) >= BULK_ROWS and _index_exists(db) and _own_table(db):
        held = db.execute_sql(f"SELECT count(*) FROM {VEC_TABLE}").fetchone()[0]
        if held < len(rows):  # a bulk load beginning: the index is built once, after it
            db.execute_sql(f"DROP INDEX {VEC_INDEX}")
    # A re-embedded memory replaces its vector (COPY cannot update in place).
    db.execute_sql(f"DELETE FROM {VEC_TABLE} WHERE seq = ANY(?)", (seqs,))
    _copy(db, rows)


def drop_vectors(db, seqs: list[int]) -> None:
    from ..vec import _bump_generation

    _bump_generation(db)
    if seqs and _vec_table_exists(db):
        db.cursor().executemany(f"DELETE FROM {VEC_TABLE} WHERE seq = ?", [(int(s),) for s in seqs])


def knn_vec0(db, query, k: int) -> list[tuple[int, float]]:
    """(seq, cosine distance) of the k nearest vectors, through the HNSW index."""
    from ..vec import MAX_KNN

    k = min(k, MAX_KNN)
    # Whether the table and its index are there is asked once per index generation (every
    # drop of either bumps it, db/vec.py index_state read it just before): a round trip fewer
    # per search.
    ready = (db.connection(), getattr(db._state, "llmem_vec_generation", None))
    if ready[1] is None or getattr(db._state, "llmem_vec_ready", None) != ready:
        table, index = db.execute_sql("SELECT to_regclass(?) IS NOT NULL, to_regclass(?) IS NOT NULL",
                                      (VEC_TABLE, VEC_INDEX)).fetchone()
        if not table:
            return []
        if not index:
            build_pending_index(db)  # a bulk load's, when no `embed` built it at its end
        else:
            db._state.llmem_vec_ready = ready
    literal = vector_literal(query)
    if k <= SESSION_EF_SEARCH:  # the session's own settings do (connection.py)
        rows = db.execute_sql(f"SELECT seq, embedding <=> ?::vector FROM {VEC_TABLE} "
                              "ORDER BY embedding <=> ?::vector LIMIT ?", (literal, literal, k)).fetchall()
        return [(int(seq), float(dist)) for seq, dist in rows]
    with db.atomic():
        # SET LOCAL: the search's own settings, gone with its transaction.
        db.execute_sql(f"SET LOCAL hnsw.ef_search = {min(max(k, 40), MAX_EF_SEARCH)}")
        db.execute_sql("SET LOCAL hnsw.iterative_scan = strict_order")
        # ORDER BY the distance alone, or the planner cannot use the HNSW index.
        rows = db.execute_sql(f"SELECT seq, embedding <=> ?::vector FROM {VEC_TABLE} "
                              "ORDER BY embedding <=> ?::vector LIMIT ?", (literal, literal, k)).fetchall()
    return [(int(seq), float(dist)) for seq, dist in rows]
