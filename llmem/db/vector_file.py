"""The stored vectors of one model as a contiguous, memory-mapped file beside the store.

Every process that searches (CLI, hooks, the MCP server, the worker) scans the same file:
mapped read-only, it lives once in the page cache, a first search costs the scan and not a
load (reading 100k BLOBs into numpy took 0.7 s and two copies), and numpy's scan is ~9x
faster than vec0's on the same vectors.

Layout (little-endian): a header (magic, version, dim, count, change id, model, prefilter
dims) padded to HEADER_BYTES, the int8 matrix (count x dim), the float32 scales (count), the
int64 seqs, ascending; each part starts 8-byte aligned. A row times its scale is the stored
vector (db/vec.py): the file holds the table's compact encoding as it is, a quarter of float32.
Then, when the file has a prefilter, 64-byte aligned: its basis (dim x p float32), its rows
(count x p int8, each stored vector less the centre, projected on the basis and quantised as
db/vec.py quantises) in two blocks, every row's first `lead` components (what the first pass
of a large file reads, contiguous: read as a strided half of whole rows it cost twice as
much) and then the rest of each, and their float32 scales.

The prefilter: the stored vectors' p = dim / 3 leading principal components (128 of MiniLM's
384, found from an even sample of PREFILTER_SAMPLE_ROWS rows when the file is written), kept
when they hold PREFILTER_MIN_VARIANCE of the variance and the file has PREFILTER_MIN_ROWS.
A search scans those rows (a third of the int8 scan's elements) and rescores its best
PREFILTER_CANDIDATE_SHARE exactly from the int8 rows, so the scores it returns are the
stored vectors' own. Measured (bench/quantization.py, 11.6k real MiniLM vectors, 1.2k
questions, 1% of the rows rescored): recall@10 0.998 against the exact scan of the stored
rows, the same as float32 components gave (PCA-96: 0.991, PCA-64: 0.968); bench/search.py at
100k, vectors with MiniLM's spectrum: 1.000. Random vectors have no leading directions (128
of 384 hold a third of their variance): they get no prefilter and the exact scan. The cost:
132 bytes a vector beside the int8 row's 388 (a file of 100k MiniLM vectors: 53 MB against
40; float32 components took 512 bytes, 91 MB, and scanned no faster: 4.4 against 4.6 ms of
CPU at 100k), and writing the file finds the components and projects every row.

Freshness: the embedding table stays the truth. Triggers log every memory whose vector
changed in `vector_change` (migration 0016), and the file records the last change id it
holds. A search reads the current id (one lookup); when it moved, the process reads the
changed rows from the table into a small overlay that hides and replaces the file's rows.
An overlay past REBUILD_SHARE of the file has the file rebuilt (temp file, fsync, rename).
Every candidate is checked before it is returned: against the memory rows (the filters,
and a deleted memory has none) and against the change log past the scan's snapshot, so a
vector removed or moved to another model meanwhile never is (when another process pruned the
log past the snapshot, against each candidate's embedding row).

The scan converts SCAN_ELEMENTS int8 elements at a time to float32 (a block that stays in the CPU's
cache) and multiplies each block with BLAS: at 100k x 384 it costs the CPU time of one
float32 product over the whole matrix (15 ms against 14), which reads four times the bytes;
a whole-matrix int8 product is 4x slower (numpy has no integer BLAS and upcasts it all). Sign bits were measured and not taken: with
exact rescoring of the best 2% they kept recall@10 at 0.89 (the bar is 0.99).
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import queue
import stat
import struct
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..paths import atomic_file
from .backend import per_backend
from .queries import seqs_passing
from .settings import get_setting, set_setting
from .vec import decode, quantize, split_rows

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"LLMEMVEC"
VERSION = 5  # 1: float32 rows (before migration 0017); 2: no prefilter; 3: a float32 prefilter;
# 4: the prefilter's rows whole (its first pass read a strided half of each)
# magic, version, dim, count, change id, store token, model length, prefilter dims, of them
# the leading ones the first pass reads (a block of their own)
HEADER = struct.Struct("<8sIIQQ32sIII")
HEADER_BYTES = 4096  # the matrix starts page-aligned
SUFFIX = ".vectors"
# The overlay is folded into a rebuilt file when it holds this share of the file's rows.
REBUILD_SHARE = 0.05
MIN_REBUILD_ROWS = 2048
# A file is written only for a table of at least this many rows. Below it the rows are read
# from the table into the process, as an overlay of up to MIN_REBUILD_ROWS already is (a
# process's first search at 2047 rows of 384: 5 ms against 0.6 ms mapping a file; a resident
# process pays it once), and the store holds its vectors once: a file's page-aligned header
# alone cost a small store a tenth of its transcript text (bench/recall.py).
FILE_MIN_ROWS = MIN_REBUILD_ROWS
STREAM_ROWS = 4096
# int8 elements converted to float32 per BLAS product of a scan (about 680 rows of 384, 2048
# of the prefilter's 128): a block stays in cache, and OpenBLAS runs a product this small on
# one thread (from 2048 x 384 it spread over threads and, on a loaded machine, cost 25x the
# CPU time; 4096 x 128 cost 8x).
SCAN_ELEMENTS = 2048 * 128
# The prefilter (see the module's docstring): the stored vectors' first principal components
# as float32, dim // 3 of them (128 of MiniLM's 384), rounded to PREFILTER_STEP ...
PREFILTER_SHARE_OF_DIM = 3
PREFILTER_STEP = 16
# ... kept only when they hold this share of the vectors' variance (MiniLM: 0.89 in 128 of
# 384; vectors with no dominant directions, such as random ones, hold ~0.35: no prefilter,
# the scan stays exact) and the file holds this many rows (below, the exact scan is ~1 ms).
PREFILTER_MIN_VARIANCE = 0.85
PREFILTER_MIN_ROWS = 20_000
# The rows the prefilter passes on to be rescored exactly: this share of the file, at least
# PREFILTER_MIN_CANDIDATES (bench/quantization.py: MiniLM recall@10 0.998 at 1%).
PREFILTER_CANDIDATE_SHARE = 0.01
PREFILTER_MIN_CANDIDATES = 1024
# Rows sampled (evenly) to find the components: enough for the leading directions, and the
# rebuild does not pay a covariance over every row.
PREFILTER_SAMPLE_ROWS = 16_384
PREFILTER_ALIGN = 64  # the float32 parts start on a cache line
# A large file's prefilter is read in two passes: the first reads every row's PREFILTER_LEAD_DIMS
# leading components (the ones holding most of the variance) and passes its best
# PREFILTER_LEAD_SHARE on; the second adds the rest of their components, and the prefilter's
# best of those are rescored as before. At 1M rows the prefilter's scan of every row's 128
# components was most of the KNN's CPU time (~40 ms). MiniLM's vectors (bench/quantization.py,
# 1,201 questions, 1% rescored) against the stored rows: recall@10 0.962 from 32 components
# passing 5%, 0.990 from 64 passing 5%, 0.995 from 64 passing 10% (one pass: 0.998).
PREFILTER_LEAD_DIMS = 64
PREFILTER_LEAD_SHARE = 0.10
PREFILTER_LEAD_MIN_ROWS = 200_000
# _top_index's sample: every TOP_SAMPLE_STRIDE-th score, cut this many ranks (and three times
# the square root of the k it asks for, scaled down to the sample) below that k: enough that its
# threshold rarely passes fewer than k.
TOP_SAMPLE_STRIDE = 16
TOP_SAMPLE_SPARE = 16
# The scan runs on the scanning thread from this many rows: at 3k rows (a 0.3 ms scan), load
# average 11, hybrid took 51 ms p50 beside the FTS query against 42 after it, at the same CPU.
BESIDE_MIN_ROWS = 20_000
# A matrix of this many rows (the prefilter's first pass of a large file, its survivors, the
# candidates it passes on) is scored on two threads once no FTS query runs beside it
# (NearestSearch): at 1M rows the scan is then most of a search's wall time, and a core idle.
SHARED_SCAN_ROWS = 8192
PRUNED_KEY = "vector_change_pruned"  # change ids at or below it are gone from the log
TOKEN_KEY = "vector_store_token"  # set by migration 0016: which store a file belongs to


# ---- SQL (all of it: db/ is the only layer that speaks it) --------------------------------

def change_id(db) -> int:
    """The id of the last logged vector change (0 before any)."""
    row = db.execute_sql("SELECT seq FROM sqlite_sequence WHERE name = 'vector_change'").fetchone()
    return int(row[0]) if row else 0


def _changed_rows(db, after: int, upto: int) -> list[tuple]:
    """(seq, model, dim, vector) now held for each memory whose vector changed in (after, upto];
    model and vector are None when its embedding is gone; deleted memories are left out."""
    return db.execute_sql(
        "SELECT m.seq, e.model, e.dim, e.vector FROM "
        "(SELECT DISTINCT memory_id FROM vector_change WHERE id > ? AND id <= ?) c "
        "JOIN memory m ON m.id = c.memory_id LEFT JOIN embedding e ON e.memory_id = c.memory_id",
        (after, upto)).fetchall()


def _all_rows(db, model: str, dim: int):
    # CROSS JOIN keeps memory as the outer loop: rows come in seq order without a sort.
    return db.execute_sql(
        "SELECT m.seq, e.vector FROM memory m CROSS JOIN embedding e ON e.memory_id = m.id "
        "WHERE e.model = ? AND e.dim = ? ORDER BY m.seq", (model, dim))


def _changed_count(db, after: int, upto: int) -> int:
    """How many memories' vectors changed in (after, upto]."""
    return db.execute_sql("SELECT COUNT(DISTINCT memory_id) FROM vector_change WHERE id > ? AND id <= ?",
                          (after, upto)).fetchone()[0]


def _row_count(db, model: str, dim: int) -> int:
    return db.execute_sql("SELECT COUNT(*) FROM embedding WHERE model = ? AND dim = ?",
                          (model, dim)).fetchone()[0]


def _passing(db, seqs: list[int] | None, model: str, dim: int, where: str, params: list) -> set[int]:
    """The seqs (among `seqs`, or all) that hold a vector of (model, dim) and pass `where`."""
    # NOT INDEXED: the candidates are found by rowid, not through an index on a filter column.
    sql = ("SELECT m.seq FROM memory m NOT INDEXED JOIN embedding e ON e.memory_id = m.id "
           f"WHERE e.model = ? AND e.dim = ? AND {where}")
    head: list = [model, dim]
    if seqs is None:
        return {r[0] for r in db.execute_sql(sql, [*head, *params])}
    found: set[int] = set()
    for start in range(0, len(seqs), 10_000):  # below SQLite's variable limit
        chunk = seqs[start:start + 10_000]
        found.update(r[0] for r in db.execute_sql(
            sql + f" AND m.seq IN ({','.join('?' * len(chunk))})", [*head, *params, *chunk]))
    return found


def _gone_since(db, seen: int, model: str, dim: int) -> set[int] | None:
    """The seqs whose vector changed after change id `seen` and is no longer one of (model,
    dim) (deleted, or another model's), or None when the log no longer holds every change
    since `seen` (another process rebuilt its file and pruned past it). Usually no row: the
    log's last ids, read by rowid, instead of each candidate's embedding row (0.8 ms a search
    at 100k, most of it reading those rows)."""
    rows = db.execute_sql(
        "SELECT m.seq FROM vector_change c JOIN memory m ON m.id = c.memory_id WHERE c.id > ? "
        "AND NOT EXISTS (SELECT 1 FROM embedding e WHERE e.memory_id = c.memory_id AND e.model = ? AND e.dim = ?) "
        "UNION ALL SELECT NULL WHERE CAST(coalesce((SELECT value FROM setting WHERE key = ?), '0') AS INTEGER) > ?",
        (seen, model, dim, PRUNED_KEY, seen)).fetchall()
    seqs = {r[0] for r in rows}
    return None if None in seqs else seqs


def _allowed(db, where: str, params: list) -> list[int]:
    """Every seq of a memory that passes `where`: the mask of a selective filter, read where
    the planner chooses (an index on a filter's column: a 1-in-50 project at 100k, 2.5 ms).
    Joined to the embedding table it went through every valid memory's embedding (117 ms);
    whether a masked row still holds its vector is asked of the change log after the scan,
    as for any candidate."""
    return [r[0] for r in db.execute_sql(f"SELECT m.seq FROM memory m WHERE {where}", params)]


def _prune_log(db, upto: int) -> None:
    """Forget logged changes a file on disk now holds (best effort: a read-only or busy
    store keeps its log, which costs only space)."""
    try:
        with db.atomic():
            db.execute_sql("DELETE FROM vector_change WHERE id <= ?", (upto,))
            if upto > int(get_setting(db, PRUNED_KEY, "0")):
                set_setting(db, PRUNED_KEY, str(upto))
    except Exception as exc:  # the driver's error family: locked, read-only, full disk
        log.debug("vector change log not pruned: %s", exc)


def _pruned(db) -> int:
    return int(get_setting(db, PRUNED_KEY, "0"))


def forget_changes(db) -> None:
    """Drop the whole change log: for a rewrite of every vector that no file on disk can hold
    (migration 0017 re-encodes them, and every older file has another VERSION)."""
    _prune_log(db, change_id(db))


# ---- the file ---------------------------------------------------------------------------

def file_path(db) -> Path | None:
    """Where the vector file of this store lies (None for an in-memory store)."""
    if not db.database or db.database == ":memory:" or str(db.database).startswith("file:"):
        return None
    return Path(db.database).with_suffix(SUFFIX)


def _own_folder(folder: Path) -> bool:
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def _align(offset: int, to: int = 8) -> int:
    return -(-offset // to) * to


def _layout(count: int, dim: int, pdims: int = 0) -> tuple[int, int, int, int]:
    """(where the scales start, the seqs, the prefilter, the file's size) for count x dim
    with a prefilter of `pdims` components (0: none)."""
    scales_at = _align(HEADER_BYTES + count * dim)
    seqs_at = _align(scales_at + 4 * count)
    end = seqs_at + 8 * count
    if not pdims:
        return scales_at, seqs_at, end, end
    prefilter_at = _align(end, PREFILTER_ALIGN)
    return scales_at, seqs_at, prefilter_at, _prefilter_layout(prefilter_at, count, dim, pdims)[1]


def _prefilter_layout(at: int, count: int, dim: int, pdims: int) -> tuple[int, int]:
    """(where the prefilter's row scales start, where it ends) for a prefilter starting at
    `at`: the basis (dim x pdims float32), the int8 rows (count x pdims, 64-byte aligned as
    pdims is a multiple of PREFILTER_STEP), their float32 scales."""
    rows_at = at + 4 * dim * pdims
    scales_at = _align(rows_at + count * pdims)
    return scales_at, scales_at + 4 * count


def _components(ints, scales, dim: int):
    """(basis, centre) of the prefilter: the leading principal components of the rows (dim x
    pdims float32) and their mean, from an evenly spaced sample of them, when it pays and
    holds; else None."""
    import numpy as np

    pdims = _align(dim // PREFILTER_SHARE_OF_DIM, PREFILTER_STEP)
    if len(ints) < PREFILTER_MIN_ROWS or pdims >= dim:
        return None
    step = max(1, len(ints) // PREFILTER_SAMPLE_ROWS)
    sample = ints[::step].astype(np.float32) * scales[::step, None]
    centre = sample.mean(axis=0)
    sample -= centre
    values, vectors = np.linalg.eigh((sample.T @ sample).astype(np.float64))  # ascending
    values, vectors = values[::-1], vectors[:, ::-1]
    if values.sum() <= 0 or values[:pdims].sum() / values.sum() < PREFILTER_MIN_VARIANCE:
        return None
    return np.ascontiguousarray(vectors[:, :pdims], dtype=np.float32), centre


def _project(ints, scales, components):
    """The prefilter's (int8 rows, float32 scales) of int8 rows: each row times its scale,
    less the centre, projected on the basis and quantised as the stored vectors are. Centred,
    the int8 range holds what tells rows apart and not the mean they share (whose share of a
    score is the same for every row: leaving it out keeps their order)."""
    import numpy as np

    basis, centre = components
    ints_out = np.empty((len(ints), basis.shape[1]), dtype=np.int8)
    scales_out = np.empty(len(ints), dtype=np.float32)
    for start in range(0, len(ints), STREAM_ROWS):
        block = ints[start:start + STREAM_ROWS].astype(np.float32) * scales[start:start + STREAM_ROWS, None]
        block -= centre
        end = start + len(block)
        ints_out[start:end], scales_out[start:end] = quantize(block @ basis)
    return ints_out, scales_out


def split_prefilter(basis, rows, row_scales):
    """The prefilter as a scan reads it: (basis, the rows' leading components, the rest of
    each, the rows' scales), the two blocks contiguous."""
    import numpy as np

    lead = lead_dims(len(rows), basis.shape[1])
    return basis, np.ascontiguousarray(rows[:, :lead]), np.ascontiguousarray(rows[:, lead:]), row_scales


def write_file(db, path: Path, model: str, dim: int, written: WrittenVectors | None = None) -> int:
    """Write the vectors of (model, dim) to `path` atomically; return the change id it holds.

    The id is read before the rows: a change committed meanwhile has a higher id, so the
    overlay re-reads it even when the file already holds it. `written`: what a bulk
    embedding just stored, taken as it is instead of read back (_table_rows).
    """
    import numpy as np

    holds = change_id(db)
    token = get_setting(db, TOKEN_KEY, "").encode("ascii")
    model_bytes = model.encode("utf-8")
    if HEADER.size + len(model_bytes) > HEADER_BYTES:
        raise ValueError(f"embedding model name too long for the vector file: {model[:40]}…")
    seqs, matrix, all_scales = _table_rows(db, model, dim, holds, written)
    count = len(seqs)
    components = _components(matrix, all_scales, dim)
    pdims = 0 if components is None else components[0].shape[1]
    scales_at, seqs_at, prefilter_at, _ = _layout(count, dim, pdims)
    with atomic_file(path, binary=True, sync_folder=True) as out:
        out.write(b"\0" * HEADER_BYTES)
        # The arrays' own buffers (contiguous): a tobytes() copy of 100k rows is 38 MB more.
        out.write(np.ascontiguousarray(matrix))
        out.write(b"\0" * (scales_at - HEADER_BYTES - count * dim))
        out.write(np.ascontiguousarray(all_scales, dtype="<f4"))
        out.write(b"\0" * (seqs_at - scales_at - 4 * count))
        out.write(np.ascontiguousarray(seqs, dtype="<i8"))
        lead = 0
        if components is not None:
            out.write(b"\0" * (prefilter_at - seqs_at - 8 * count))
            out.write(components[0].astype("<f4").tobytes())
            rows, row_scales = _project(matrix, all_scales, components)
            lead = lead_dims(count, pdims)
            out.write(np.ascontiguousarray(rows[:, :lead]).tobytes())
            out.write(np.ascontiguousarray(rows[:, lead:]).tobytes())
            rscales_at, _ = _prefilter_layout(prefilter_at, count, dim, pdims)
            out.write(b"\0" * (rscales_at - prefilter_at - 4 * dim * pdims - count * pdims))
            out.write(row_scales.astype("<f4").tobytes())
        out.seek(0)
        out.write(HEADER.pack(MAGIC, VERSION, dim, count, holds, token, len(model_bytes), pdims, lead)
                  + model_bytes)
    return holds


def _map_file(db, path: Path, model: str, dim: int):
    """(mmap, seqs, int8 matrix, scales, prefilter, change id) of a valid file of this store
    for (model, dim), else None; the prefilter is split_prefilter's tuple or None.

    Valid: whole, of this store (its token), and not ahead of the store's change log (a
    store restored from a backup)."""
    import numpy as np

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # missing, or a symlink planted in its place
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size < HEADER_BYTES:
            return None
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    magic, version, file_dim, count, holds, token, model_len, pdims, lead = HEADER.unpack_from(mapped, 0)
    file_model = bytes(mapped[HEADER.size:HEADER.size + model_len]).decode("utf-8", "replace")
    scales_at, seqs_at, prefilter_at, expected = _layout(count, dim, pdims if pdims < dim else 0)
    mine = token.rstrip(b"\0").decode("ascii", "replace") == get_setting(db, TOKEN_KEY, "")
    if ((magic, version, file_dim, file_model) != (MAGIC, VERSION, dim, model) or len(mapped) != expected
            or pdims >= dim or lead > pdims or (pdims and not lead) or not mine or holds > change_id(db)):
        mapped.close()
        return None
    matrix = np.frombuffer(mapped, dtype=np.int8, count=count * dim, offset=HEADER_BYTES).reshape(count, dim)
    scales = np.frombuffer(mapped, dtype="<f4", count=count, offset=scales_at)
    seqs = np.frombuffer(mapped, dtype="<i8", count=count, offset=seqs_at)
    prefilter = None
    if pdims:
        basis = np.frombuffer(mapped, dtype="<f4", count=dim * pdims, offset=prefilter_at).reshape(dim, pdims)
        rows_at = prefilter_at + 4 * dim * pdims
        lead_rows = np.frombuffer(mapped, dtype=np.int8, count=count * lead, offset=rows_at).reshape(count, lead)
        rest_rows = np.frombuffer(mapped, dtype=np.int8, count=count * (pdims - lead),
                                  offset=rows_at + count * lead).reshape(count, pdims - lead)
        rscales_at, _ = _prefilter_layout(prefilter_at, count, dim, pdims)
        prefilter = (basis, lead_rows, rest_rows, np.frombuffer(mapped, dtype="<f4", count=count, offset=rscales_at))
    return mapped, seqs, matrix, scales, prefilter, holds


def _read_rows(db, model: str, dim: int):
    """(seqs, int8 matrix, scales) read straight from the table, for a store too small for a
    file or whose folder is not ours: one copy, filled as the rows stream in."""
    import numpy as np

    count = _row_count(db, model, dim)
    seqs = np.empty(count, dtype=np.int64)
    matrix = np.empty((count, dim), dtype=np.int8)
    scales = np.empty(count, dtype=np.float32)
    filled = 0
    cursor = _all_rows(db, model, dim)
    while (rows := cursor.fetchmany(STREAM_ROWS)) and filled < count:
        rows = rows[:count - filled]  # a writer may have added rows since the count
        end = filled + len(rows)
        seqs[filled:end] = [r[0] for r in rows]
        matrix[filled:end], scales[filled:end] = split_rows([r[1] for r in rows], dim)
        filled = end
    return seqs[:filled], matrix[:filled], scales[:filled]


class WrittenVectors:
    """The vectors a bulk embedding stored, batch by batch, as the table holds them (int8 rows
    and scales, seqs ascending), with the change ids each batch's transaction logged: the
    vector file is then written from them instead of reading them back (100k: 0.38 s of the
    0.67 s `embed --pending` spent writing the file). A row another writer changed meanwhile
    is read from the table (_table_rows). It holds dim + 4 bytes a row, as the matrix a file
    written from the table is built in did."""

    def __init__(self, model: str, dim: int):
        self.model, self.dim = model, dim
        self.seqs: list[np.ndarray] = []
        self.ints: list[np.ndarray] = []
        self.scales: list[np.ndarray] = []
        self.logged: list[tuple[int, int]] = []  # each batch's change ids: (after, upto]

    @contextmanager
    def batch(self, db, seqs: list[int], blobs: list[bytes]):
        """Around one batch's writes, inside its write transaction (so no other writer's
        change can take an id between the two reads of the log)."""
        import numpy as np

        after = change_id(db)
        yield
        ints, scales = split_rows(blobs, self.dim)
        self.seqs.append(np.asarray(seqs, dtype=np.int64))
        self.ints.append(ints)
        self.scales.append(scales)
        self.logged.append((after, change_id(db)))

    def others_since(self, upto: int) -> list[tuple[int, int]]:
        """The change ids in (first batch, upto] that no batch of this record logged, as
        (after, upto] ranges: another writer's changes."""
        gaps = []
        at = self.logged[0][0]
        for after, through in [*self.logged, (upto, upto)]:
            if after > at:
                gaps.append((at, after))
            at = max(at, through)
        return gaps


@per_backend
def written_vectors(db, model: str, dim: int) -> WrittenVectors | None:
    """A record to keep a bulk embedding's vectors in, for the vector file (db/postgres's
    twin: None, as the server keeps its own index)."""
    return WrittenVectors(model, dim)


def _table_seqs(db, model: str, dim: int):
    import numpy as np

    rows = db.execute_sql("SELECT m.seq FROM memory m CROSS JOIN embedding e ON e.memory_id = m.id "
                          "WHERE e.model = ? AND e.dim = ? ORDER BY m.seq", (model, dim)).fetchall()
    return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))


def _changed_seqs(db, ranges: list[tuple[int, int]]) -> set[int]:
    """The seqs of the memories whose vector a change in any of the (after, upto] ranges touched."""
    found: set[int] = set()
    for after, upto in ranges:
        found.update(r[0] for r in db.execute_sql(
            "SELECT DISTINCT m.seq FROM vector_change c JOIN memory m ON m.id = c.memory_id "
            "WHERE c.id > ? AND c.id <= ?", (after, upto)))
    return found


def _rows_of(db, seqs: list[int], model: str, dim: int) -> list[tuple]:
    """(seq, vector) of the given seqs that hold a vector of (model, dim), in no order."""
    rows: list[tuple] = []
    for start in range(0, len(seqs), 10_000):  # below SQLite's variable limit
        chunk = seqs[start:start + 10_000]
        rows += db.execute_sql("SELECT m.seq, e.vector FROM memory m JOIN embedding e ON e.memory_id = m.id "
                               f"WHERE e.model = ? AND e.dim = ? AND m.seq IN ({','.join('?' * len(chunk))})",
                               [model, dim, *chunk]).fetchall()
    return rows


def _table_rows(db, model: str, dim: int, upto: int, written: WrittenVectors | None = None):
    """(seqs, int8 matrix, scales) of the table's vectors of (model, dim), every change up to
    change id `upto` included. The rows of `written` are taken as they are, but for those
    another writer changed after they were stored (the log's ids between and after its
    batches), which are read, as are the table's other rows (found by their count first: the
    seqs of 100k rows, read through a join, cost 0.3 s). From the table alone when the log no
    longer reaches back to the record's first batch (pruned by another process) or the
    record holds too few of the rows."""
    import numpy as np

    if (written is None or not written.logged or (written.model, written.dim) != (model, dim)
            or _pruned(db) > written.logged[0][0]):
        return _read_rows(db, model, dim)
    seqs, ints, scales = np.concatenate(written.seqs), np.concatenate(written.ints), np.concatenate(written.scales)
    changed = _changed_seqs(db, written.others_since(upto))
    if changed:
        keep = ~np.isin(seqs, np.fromiter(changed, dtype=np.int64, count=len(changed)))
        seqs, ints, scales = seqs[keep], ints[keep], scales[keep]
    rows = _rows_of(db, sorted(changed), model, dim)
    if _row_count(db, model, dim) != len(seqs) + len(rows):  # the table holds others too
        table = _table_seqs(db, model, dim)
        inside = np.isin(seqs, table, assume_unique=True)
        if not inside.all():  # gone since (a deleted memory)
            seqs, ints, scales = seqs[inside], ints[inside], scales[inside]
        missing = np.setdiff1d(table, seqs, assume_unique=True)
        if len(missing) > len(table) // 2:
            return _read_rows(db, model, dim)
        rows = _rows_of(db, missing.tolist(), model, dim)
    if rows:
        read_ints, read_scales = split_rows([r[1] for r in rows], dim)
        seqs = np.concatenate([seqs, np.asarray([r[0] for r in rows], dtype=np.int64)])
        order = np.argsort(seqs, kind="stable")
        seqs, ints, scales = seqs[order], np.concatenate([ints, read_ints])[order], np.concatenate([scales, read_scales])[order]
    return seqs, ints, scales


class Cores:
    """Whether a search's products may take the second core (the sharing thread): from the
    start when its caller waits for the scan, and from the moment the caller comes to wait
    when it ran its keyword query meanwhile (`free` is set then, and read block by block)."""

    __slots__ = ("free",)

    def __init__(self, free: bool):
        self.free = free


def _in_blocks(count: int, block_rows: int, cores: Cores | None, work: Callable, buffers: Callable) -> None:
    """`work(start, buffers())` for every block of `count` rows, on this thread and, for a
    large matrix once `cores.free` says a core is free, on the sharing thread too
    (SHARED_SCAN_ROWS says why). A range iterator's next() is one call under the GIL: each
    block is claimed once, and done the same way by either thread, so every result is one
    thread's to the bit."""
    blocks = iter(range(0, count, block_rows))
    shares = cores is not None and count >= SHARED_SCAN_ROWS
    helper = None
    mine = buffers()
    for start in blocks:
        if helper is None and shares and cores.free:
            helper = _share(_claim_blocks, blocks, work, buffers)
        work(start, mine)
    if helper is not None and not helper.cancel():  # cancelled: it never started, nothing to wait for
        helper.result()


def _claim_blocks(blocks, work: Callable, buffers: Callable) -> None:
    """The sharing thread's part of _in_blocks: the blocks still unclaimed."""
    mine = buffers()
    for start in blocks:
        work(start, mine)


def _scores(matrix, scales, query, cores: Cores | None = None, at=None):
    """The similarity of `query` to each int8 row (or, given `at`, to the rows at those
    indexes) times its scale, block by block (the module's docstring says why; _in_blocks
    says on which threads)."""
    import numpy as np

    count = len(matrix) if at is None else len(at)
    width = matrix.shape[1]
    block_rows = max(1, SCAN_ELEMENTS // max(1, width))
    out = np.empty(count, dtype=np.float32)

    def buffers():
        # The float32 rows a product reads and, scoring rows by index, the int8 rows gathered
        # for it: block by block, not all at once, so a block stays in cache and the gathering
        # is shared as the products are.
        rows = min(block_rows, count)
        return np.empty((rows, width), dtype=np.float32), np.empty((rows, width), dtype=np.int8) if at is not None else None

    def score(start: int, mine) -> None:
        floats, gathered = mine
        if at is None:
            rows = matrix[start:start + block_rows]
        else:  # np.take copies whole rows where fancy indexing copies element by element (3x)
            picked = at[start:start + block_rows]
            rows = np.take(matrix, picked, axis=0, out=gathered[:len(picked)])
        part = floats[:len(rows)]
        np.copyto(part, rows, casting="unsafe")
        np.dot(part, query, out=out[start:start + len(rows)])

    _in_blocks(count, block_rows, cores, score, buffers)
    out *= scales
    return out


def _share(work: Callable, *args):
    """`work(*args)` handed to the sharing thread: a Future whose result() waits for it (and
    raises what it raised), and whose cancel() succeeds while the thread has not taken it up."""
    from concurrent.futures import Future

    shared: Future = Future()

    def run() -> None:
        if not shared.set_running_or_notify_cancel():
            return
        try:
            shared.set_result(work(*args))
        except BaseException as exc:  # raised again by result(), in the thread that waits
            shared.set_exception(exc)

    _thread_queue("sharing").put(run)
    return shared


def lead_dims(rows: int, pdims: int) -> int:
    """How many of the prefilter's `pdims` components its first pass reads in a file of `rows`."""
    return min(pdims, PREFILTER_LEAD_DIMS) if rows >= PREFILTER_LEAD_MIN_ROWS else pdims


def lead_count(rows: int) -> int:
    """How many of `rows` file rows the prefilter's first pass passes on to the second."""
    return min(rows, math.ceil(PREFILTER_LEAD_SHARE * rows))


def candidate_count(rows: int) -> int:
    """How many of `rows` file rows the prefilter passes on to be rescored exactly."""
    return min(rows, max(PREFILTER_MIN_CANDIDATES, math.ceil(PREFILTER_CANDIDATE_SHARE * rows)))


class Snapshot(NamedTuple):
    """An index's arrays at one moment: a refresh replaces them, never edits them in place."""

    seqs: np.ndarray
    matrix: np.ndarray
    scales: np.ndarray
    # (basis, the int8 rows' leading components, the rest of them, the rows' scales)
    prefilter: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None
    extra_seqs: np.ndarray
    extra: np.ndarray
    hidden: np.ndarray | None
    seen: int  # the change id the arrays hold every change up to


class Scores:
    """One query's similarities over a snapshot of an index: every file row's (exact, or the
    prefilter's estimate) and every overlay row's, hidden rows at -inf. No SQL: a thread may
    compute it while another runs the keyword query. `cores`: when a second core may take
    part of each large product (Cores)."""

    def __init__(self, view: Snapshot, query, cores: Cores):
        import numpy as np

        self.cores = cores
        self.seqs, self.matrix, self.scales = view.seqs, view.matrix, view.scales
        self.extra_seqs, self.query, self.seen = view.extra_seqs, query, view.seen
        self.exact = view.prefilter is None
        if self.exact:
            self.sims = _scores(self.matrix, self.scales, query, cores)
        else:  # the prefilter's estimates: of the leading components only, in a large file
            basis, lead_rows, self.rest_rows, self.row_scales = view.prefilter
            self.projected = query @ basis
            # (each row's estimate less the centre's share, the same for every row)
            self.sims = _scores(lead_rows, self.row_scales, self.projected[:lead_rows.shape[1]], cores)
        if view.hidden is not None:
            self.sims[view.hidden] = -np.inf
        self.extra = view.extra @ query
        self.total = len(self.sims) + len(self.extra)
        self._ranked = None  # (seqs, similarities) of the file's best rows, exact, best first
        self._ranked_for = 0  # how many the ranking was asked for

    def best(self, k: int) -> list[tuple[int, float]]:
        """The k best (seq, exact similarity) over the file's and the overlay's rows."""
        import numpy as np

        seqs, sims = self._best_in_file(k)
        picked = list(zip(seqs[:k].tolist(), sims[:k].tolist(), strict=True))
        picked += [(int(self.extra_seqs[i]), float(self.extra[i])) for i in _top_index(self.extra, k)]
        picked = [p for p in picked if p[1] != -np.inf]
        picked.sort(key=lambda p: (-p[1], p[0]))
        return picked[:k]

    def _best_in_file(self, k: int):
        """(seqs, exact similarities) of at least the file's k best rows, best first: arrays,
        as only the few asked for become Python tuples (10k of them cost 2 ms at 1M)."""
        import numpy as np

        if self._ranked is not None and k <= self._ranked_for:
            return self._ranked
        if self.exact:
            wide = k
            at = _top_index(self.sims, k)
            sims = self.sims[at]
        else:  # the prefilter's best, rescored from the int8 rows
            wide = max(k, candidate_count(len(self.sims)))
            at = self._prefilter_best(wide)
            sims = _scores(self.matrix, self.scales[at], self.query, self.cores, at)
        keep = sims != -np.inf
        seqs, sims = self.seqs[at[keep]], sims[keep]
        order = np.lexsort((seqs, -sims))  # best first, ties by seq
        self._ranked, self._ranked_for = (seqs[order], sims[order]), wide
        return self._ranked

    def _prefilter_best(self, wide: int):
        """The file indexes of the prefilter's `wide` best rows (none hidden), ascending: the
        rows are then read in one sweep. In two passes when the first read only the leading
        components: its best PREFILTER_LEAD_SHARE get the rest of theirs added."""
        import numpy as np

        sims = self.sims
        if self.rest_rows.shape[1]:
            near = _best_ascending(sims, max(wide, lead_count(len(sims))))
            near = near[sims[near] != -np.inf]
            lead = len(self.projected) - self.rest_rows.shape[1]
            # Gathered block by block, as the scan reads: a float32 copy of 100k survivors at
            # 1M was 26 MB, and gathering them all first kept it on one core.
            sims = sims[near] + _scores(self.rest_rows, self.row_scales[near], self.projected[lead:],
                                        self.cores, near)
            return near[np.sort(_top_index(sims, wide))]
        at = np.sort(_top_index(sims, wide))
        return at[sims[at] != -np.inf]

    def keep_only(self, allowed) -> None:
        """Drop every row whose seq is not in `allowed` (an int64 array)."""
        import numpy as np

        # The file's seqs ascend: the allowed ones are found by binary search (np.isin sorted
        # both arrays: 2 ms of a filtered search at 100k).
        allowed = np.unique(allowed)
        at = np.searchsorted(self.seqs, allowed)
        inside = at < len(self.seqs)
        at = at[inside][self.seqs[at[inside]] == allowed[inside]]
        keep = np.zeros(len(self.sims), dtype=bool)
        keep[at] = True
        self.sims[~keep] = -np.inf
        self.extra[~np.isin(self.extra_seqs, allowed)] = -np.inf
        self._ranked, self._ranked_for = None, 0


class VectorIndex:
    """The vectors of one (store, model, dim) in this process: the mapped file plus an overlay
    of the rows changed since it was written."""

    def __init__(self, db, model: str, dim: int, written: WrittenVectors | None = None):
        self.model, self.dim = model, dim
        self.path = file_path(db)
        self.lock = threading.Lock()
        self._load(db, written=written)

    def _load(self, db, *, rebuild: bool = False, written: WrittenVectors | None = None) -> None:
        """Map the file, or write it first when it is missing, stale or `rebuild` (from
        `written` where it can: _table_rows); below FILE_MIN_ROWS, read the rows instead."""
        self._mapped = None
        loaded = None if (rebuild or self.path is None) else _map_file(db, self.path, self.model, self.dim)
        if loaded is not None and loaded[5] < _pruned(db):
            loaded = None  # older than the log remembers: it cannot catch up
        if loaded is None and self.path is not None and _own_folder(self.path.parent) \
                and not self.path.is_symlink() and _row_count(db, self.model, self.dim) >= FILE_MIN_ROWS:
            try:
                holds = write_file(db, self.path, self.model, self.dim, written)
                loaded = _map_file(db, self.path, self.model, self.dim)
                if loaded is not None:
                    _prune_log(db, holds)
            except OSError as exc:  # a full disk or a read-only folder: scan from memory
                log.warning("vector file %s not written (%s): searching from memory", self.path, exc)
        if loaded is None:
            holds = change_id(db)
            seqs, matrix, scales = _table_rows(db, self.model, self.dim, holds, written)
            components = _components(matrix, scales, self.dim)
            prefilter = None if components is None else split_prefilter(components[0], *_project(matrix, scales, components))
        else:
            self._mapped, seqs, matrix, scales, prefilter, holds = loaded
        self.seqs, self.matrix, self.scales, self.holds, self.seen = seqs, matrix, scales, holds, holds
        self.prefilter = prefilter
        self.overlay: dict[int, np.ndarray | None] = {}
        self._overlay_arrays()

    def _overlay_arrays(self) -> None:
        import numpy as np

        live = [(s, v) for s, v in self.overlay.items() if v is not None]
        self.extra_seqs = np.asarray([s for s, _ in live], dtype=np.int64)
        self.extra = (np.stack([v for _, v in live]) if live
                      else np.empty((0, self.dim), dtype=np.float32))
        self.hidden = None
        if self.overlay:
            changed = np.asarray(list(self.overlay), dtype=np.int64)
            at = np.searchsorted(self.seqs, changed)
            inside = at < len(self.seqs)
            at, changed = at[inside], changed[inside]
            self.hidden = np.zeros(len(self.seqs), dtype=bool)
            self.hidden[at[self.seqs[at] == changed]] = True

    def refresh(self, db, written: WrittenVectors | None = None) -> None:
        """Catch up with the vectors written since this process last looked (`written`:
        what a bulk embedding of this process just stored, for a rebuild to take)."""

        current = change_id(db)
        if current == self.seen:
            return
        if current < self.seen:  # the store was replaced or restored: start again
            self._load(db)
            return
        rebuild_at = max(MIN_REBUILD_ROWS, REBUILD_SHARE * len(self.seqs))
        if current - self.seen >= rebuild_at and _changed_count(db, self.seen, current) >= rebuild_at:
            # Rebuilt whatever the changed rows hold: not read (and decoded one by one) first.
            self._load(db, rebuild=True, written=written)
            return
        rows = _changed_rows(db, self.seen, current)
        if _pruned(db) > self.seen:  # another process rebuilt and pruned past us
            self._load(db)
            return
        for seq, model, dim, blob in rows:
            same = model == self.model and dim == self.dim and blob is not None
            self.overlay[seq] = decode(blob, dim) if same else None
        self.seen = current
        if len(self.overlay) >= rebuild_at:
            self._load(db, rebuild=True, written=written)
        else:
            self._overlay_arrays()

    def snapshot(self) -> Snapshot:
        return Snapshot(self.seqs, self.matrix, self.scales, self.prefilter, self.extra_seqs,
                        self.extra, self.hidden, self.seen)

    def scores(self, view: Snapshot, query, depth: int, cores: Cores) -> Scores:
        """The scan of `nearest` (no SQL), with the `depth * 4` best ranked exactly."""
        import numpy as np

        scores = Scores(view, np.ascontiguousarray(query, dtype=np.float32), cores)
        scores.best(depth * 4)
        return scores

    def select(self, db, scores: Scores, depth: int, where: str, params: list,
               passing: Callable[[list[int]], set[int]] | None = None) -> list[tuple[int, float]]:
        """(seq, cosine distance) of the `depth` nearest vectors passing `where`, best first.

        One scan: the best candidates are checked against the table (then four times as
        many); when a selective filter leaves too few, the rows that pass it become a mask
        over the same scores. `passing` (seqs → those of them that exist and pass `where`)
        lets the caller check them in a query it needs anyway; whether each still holds a
        vector of this model is read from the change log past the scan's snapshot.
        """
        import numpy as np

        total = scores.total
        if total == 0:
            return []
        first = min(total, depth + 16)  # a few spare for rows the filter or a deletion drops
        check = passing or (lambda seqs: seqs_passing(db, seqs, where, params))
        while True:
            candidates = scores.best(first)
            kept = self._still_held(db, scores, candidates, check, where, params)
            if len(kept) >= depth or first >= total or first >= depth * 4:
                break
            first = min(total, depth * 4)  # deeper into the same scores, not a new scan
        if len(kept) < depth and first < total:
            scores.keep_only(np.fromiter(_allowed(db, where, params), dtype=np.int64))
            # Every row left passes `where`: only whether it still holds its vector is asked.
            kept = self._still_held(db, scores, scores.best(depth + 16), set, where, params)
        return [(s, 1.0 - sim) for s, sim in kept[:depth]]

    def _still_held(self, db, scores: Scores, candidates: list[tuple[int, float]],
                    check: Callable[[list[int]], set[int]], where: str, params: list) -> list[tuple[int, float]]:
        """The candidates that pass `check` and still hold a vector of this model (the change
        log past the scan's snapshot says which do not; when it was pruned past the snapshot,
        each candidate's embedding row is read)."""
        seqs = [s for s, _ in candidates]
        gone = _gone_since(db, scores.seen, self.model, self.dim)
        allowed = _passing(db, seqs, self.model, self.dim, where, params) if gone is None else check(seqs) - gone
        return [(s, sim) for s, sim in candidates if s in allowed]


def _top_index(scores, k: int):
    """The indexes of the k best scores, in no order.

    A large array is first cut at a threshold read from a strided sample (an argpartition of
    100k scores cost ~1 ms; the sample's and the comparison ~0.2): what passes it holds the k
    best whenever it holds k, and else the whole array is partitioned."""
    import numpy as np

    if len(scores) == 0:
        return np.empty(0, dtype=np.int64)
    k = min(k, len(scores))
    if k == len(scores):
        return np.arange(k)
    if k * 4 <= len(scores):
        passing = np.flatnonzero(scores >= _sampled_threshold(scores, k))
        if len(passing) >= k:
            return passing[np.argpartition(-scores[passing], k - 1)[:k]]
    return np.argpartition(-scores, k - 1)[:k]


def _best_ascending(scores, k: int):
    """The indexes, ascending, of at least the k best scores (about k: what passes
    _top_index's sampled threshold, taken whole). The prefilter's first pass needs no exact
    count, and cutting 100k of 1M to k and sorting them cost 8 ms of a 40 ms KNN."""
    import numpy as np

    k = min(k, len(scores))
    if k > 0 and k * 4 <= len(scores):
        passing = np.flatnonzero(scores >= _sampled_threshold(scores, k))
        if len(passing) >= k:
            return passing
    return np.sort(_top_index(scores, k))


def _sampled_threshold(scores, k: int) -> float:
    """A score that the k best pass, read from a strided sample (see _top_index)."""
    import numpy as np

    sample = scores[::TOP_SAMPLE_STRIDE]
    # The spare grows with the sample's own spread (~ its square root): the prefilter's
    # first pass asks for 10% of the rows.
    sampled = k // TOP_SAMPLE_STRIDE
    rank = min(len(sample), sampled + TOP_SAMPLE_SPARE + 3 * math.isqrt(sampled))
    return np.partition(sample, len(sample) - rank)[len(sample) - rank]


_indexes: dict[tuple[str, str, int], VectorIndex] = {}
_indexes_lock = threading.Lock()


@per_backend
def index_for(db, model: str, dim: int, written: WrittenVectors | None = None) -> VectorIndex:
    """This process's index of (store, model, dim), caught up with the table (`written`:
    the vectors a bulk embedding just stored, which a file written now takes as they are)."""
    key = (str(db.database), model, dim)
    with _indexes_lock:
        index = _indexes.get(key)
        if index is None:
            index = _indexes[key] = VectorIndex(db, model, dim, written)
    with index.lock:
        index.refresh(db, written)
    return index


class NearestSearch:
    """A KNN begun by `begin_nearest`: its scan runs (on the scanning thread, when asked) while
    the caller does other work; `finish` checks the filters against the table and returns the
    nearest."""

    def __init__(self, index: VectorIndex, query, depth: int, background: bool):
        self.index, self.depth = index, depth
        self._scores: Scores | None = None
        self._error: BaseException | None = None
        self._done: threading.Event | None = None
        # Beside the caller's keyword query the scan keeps to one core until the caller comes to
        # wait for it (1M memories, load 1: sharing from the start, three threads on two cores,
        # cost hybrid 3 ms); a scan the caller waits for from the start shares at once (KNN
        # alone 29.8 -> 23.1 ms).
        self._cores = Cores(free=not background)
        view = index.snapshot()
        if background:
            self._done = threading.Event()
            _thread_queue("scan").put(lambda: self.scan(view, query))
        else:
            self.scan(view, query)

    def scan(self, view: Snapshot, query) -> None:
        try:
            self._scores = self.index.scores(view, query, self.depth, self._cores)
        except BaseException as exc:  # raised again by finish, in the caller's thread
            self._error = exc
        finally:
            if self._done is not None:
                self._done.set()

    def finish(self, db, where: str, params: list,
               passing: Callable[[list[int]], set[int]] | None = None) -> list[tuple[int, float]]:
        """The nearest passing `where` (VectorIndex.select, which says what `passing` is)."""
        self._cores.free = True  # this thread now only waits: the scan's blocks may take its core
        if self._done is not None:
            self._done.wait()
        if self._error is not None:
            raise self._error
        return self.index.select(db, self._scores, self.depth, where, params, passing)


# Two threads per process: one scans for the searches that run their FTS query meanwhile, one
# takes blocks of a large matrix beside whichever thread scores the others (its work never
# waits on anything, so neither can wait on the other for good). Started once, as a thread
# started per search made the search wait ~2 ms on a loaded machine for the new thread to be
# scheduled. Keyed by pid: a forked child starts its own.
_threads: dict[str, tuple[int, queue.SimpleQueue]] = {}
_threads_lock = threading.Lock()


def _thread_queue(name: str) -> queue.SimpleQueue:
    with _threads_lock:
        running = _threads.get(name)
        if running is None or running[0] != os.getpid():
            work: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_work_forever, args=(work,), name=f"llmem-vector-{name}", daemon=True).start()
            running = _threads[name] = (os.getpid(), work)
        return running[1]


def _work_forever(work: queue.SimpleQueue) -> None:
    while True:
        work.get()()


@per_backend
def begin_nearest(db, query, depth: int, model: str, dim: int, *, background: bool = False) -> NearestSearch:
    """Start the KNN of `query` over the vectors of (model, dim): caught up with the table
    here, scanned in a thread when `background` (numpy's products release the GIL, and so
    does SQLite's step: an FTS query in the caller's thread runs beside it on another core).

    Beside the FTS query whatever the load: bench/search.py at 100k, 200 queries taking turns,
    load average 6.3-6.9 on 2 cores: hybrid 46.0 ms p50 beside, 53.7 after (17.5 and 17.9 ms
    of CPU); at load 2.3, 15.9 against 18.9. (A rule that kept the scan in the caller's
    thread unless a core was idle by the load average left it there at both loads.) A small
    file's scan is too short to pay for the hand-over (BESIDE_MIN_ROWS)."""
    index = index_for(db, model, dim)
    with index.lock:  # a snapshot of the arrays: a later refresh replaces them, never edits them
        beside = background and len(index.seqs) + len(index.extra_seqs) >= BESIDE_MIN_ROWS
        return NearestSearch(index, query, depth, beside)


@per_backend
def nearest(db, query, depth: int, model: str, dim: int, where: str, params: list,
            passing: Callable[[list[int]], set[int]] | None = None) -> list[tuple[int, float]]:
    """(seq, cosine distance) of the `depth` nearest vectors of (model, dim) passing `where`
    (`passing`: VectorIndex.select)."""
    return begin_nearest(db, query, depth, model, dim).finish(db, where, params, passing)
