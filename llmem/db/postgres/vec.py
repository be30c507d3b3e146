"""The vector index on Postgres: `memory_vec(seq, embedding vector(dim))` under an HNSW
cosine index, derived from the `embedding` table as vec0's table is on SQLite (db/vec.py
keeps the index state in settings, and its reads of the embedding table run here as they are).
"""

from __future__ import annotations

from ..settings import set_setting

VEC_TABLE = "memory_vec"
# HNSW visits ef_search candidates (pgvector's default 40): a search that asks for k
# nearest asks for at least k (pgvector caps it at 1000), and iterative scans go past it.
MAX_EF_SEARCH = 1000


def vector_literal(vector) -> str:
    """pgvector's text form of a vector: `[x,y,…]` (float32 values, in full)."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def _vec_table_exists(db) -> bool:
    return db.execute_sql("SELECT to_regclass(?) IS NOT NULL", (VEC_TABLE,)).fetchone()[0]


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
    db.execute_sql(f"CREATE INDEX {VEC_TABLE}_hnsw ON {VEC_TABLE} USING hnsw (embedding vector_cosine_ops)")
    rows = db.execute_sql("SELECT m.seq, e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id "
                          "WHERE e.model = ? AND e.dim = ?", (model, dim)).fetchall()
    _insert(db, [(seq, _from_blob(blob, dim)) for seq, blob in rows])
    set_setting(db, "vec_dirty", "0")
    return len(rows)


def _from_blob(blob, dim: int):
    from ..vec import decode

    return decode(bytes(blob), dim)


def _insert(db, rows) -> None:
    if rows:
        db.cursor().executemany(
            f"INSERT INTO {VEC_TABLE}(seq, embedding) VALUES (?, ?::vector) "
            "ON CONFLICT (seq) DO UPDATE SET embedding = excluded.embedding",
            [(int(seq), vector_literal(vec)) for seq, vec in rows])


def put_vectors(db, rows) -> None:
    from ..vec import _bump_generation

    _bump_generation(db)
    if not _vec_table_exists(db):
        return  # ensure_index makes it (with these rows) before any vector is stored
    _insert(db, rows)


def drop_vectors(db, seqs: list[int]) -> None:
    from ..vec import _bump_generation

    _bump_generation(db)
    if seqs and _vec_table_exists(db):
        db.cursor().executemany(f"DELETE FROM {VEC_TABLE} WHERE seq = ?", [(int(s),) for s in seqs])


def knn_vec0(db, query, k: int) -> list[tuple[int, float]]:
    """(seq, cosine distance) of the k nearest vectors, through the HNSW index."""
    from ..vec import MAX_KNN

    k = min(k, MAX_KNN)
    if not _vec_table_exists(db):
        return []
    with db.atomic():
        # SET LOCAL: the search's own settings, gone with its transaction.
        db.execute_sql(f"SET LOCAL hnsw.ef_search = {min(max(k, 40), MAX_EF_SEARCH)}")
        db.execute_sql("SET LOCAL hnsw.iterative_scan = strict_order")
        # ORDER BY the distance alone, or the planner cannot use the HNSW index.
        literal = vector_literal(query)
        rows = db.execute_sql(f"SELECT seq, embedding <=> ?::vector FROM {VEC_TABLE} "
                              "ORDER BY embedding <=> ?::vector LIMIT ?", (literal, literal, k)).fetchall()
    return [(int(seq), float(dist)) for seq, dist in rows]
