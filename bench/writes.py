#!/usr/bin/env python3
"""Bulk writes beside their floors: `llmem import` and `embed --pending` at N memories.

Prints figures; it is not a test. Each figure is printed beside its floor measured in the
same run, as a ratio, in wall time and in CPU time (this process's user + sys: on a loaded
machine the wall time mostly measures waiting for a core): the floor is one `executemany` of the same rows into the same schema
(triggers, FTS and the vec0 index included) in a fresh store, with every value precomputed;
the import is also shown beside the same rows staged in a temporary table and inserted with
one INSERT … SELECT (the stronger floor: FTS5 writes a segment per statement).
`embed --pending` runs with an instant embedder (precomputed unit vectors), so the figure is
llmem's own cost. `--repeat N`: N rounds, each beside its own floors, then the p50 of the
ratios (the machine is shared: one round says little). Example:
    python bench/writes.py --memories 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llmem  # noqa: E402,F401 - first, as in llmem's own processes: it sets numpy's BLAS threads

# isort: split
import numpy as np  # noqa: E402

from llmem.db import vec  # noqa: E402
from llmem.exchange import apply_import, export_data, plan_import  # noqa: E402
from llmem.store import Store, content_hash, derived_fields  # noqa: E402
from llmem.vectors import embed_pending  # noqa: E402

WORDS = ["deploy", "release", "cache", "index", "vector", "query", "schema", "migration", "token", "session",
         "worker", "queue", "lock", "journal", "report", "config", "embed", "search", "merge", "handleRequest",
         "parseConfig", "sqlite", "numpy", "adapter", "transcript", "memory", "store"]


class InstantEmbedder:
    """An embedder that answers at once with precomputed unit vectors."""

    identity = "bench:instant"
    available = True

    def __init__(self, dim: int, seed: int = 3):
        rng = np.random.default_rng(seed)
        self.pool = rng.standard_normal((4096, dim), dtype=np.float32)
        self.pool /= np.linalg.norm(self.pool, axis=1, keepdims=True)
        self.next = 0

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        picks = (np.arange(len(texts)) + self.next) % len(self.pool)
        self.next += len(texts)
        return self.pool[picks]


def memory_rows(n: int, seed: int = 7) -> list[dict]:
    rnd = random.Random(seed)
    at = time.time()
    rows = []
    for i in range(n):
        content = " ".join(rnd.choice(WORDS) for _ in range(14)) + f" #{i}"
        created = at - rnd.uniform(0, 200) * 86400
        rows.append({"id": str(uuid.uuid4()), "type": rnd.choice(("fact", "decision", "procedure", "event")),
                     "content": content, "summary": None, "confidence": 0.7, "source": "extraction",
                     "project": f"/work/p{i % 20}", "session_id": f"ses_{i % 500}",
                     "metadata": {"speaker": "bench"} if i % 3 == 0 else {}, "access_count": 0,
                     "created_at": created, "updated_at": created})
    return rows


class Clock:
    """Wall and CPU seconds of a block: `with Clock() as c: ...`, then c.wall, c.cpu."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def ratio_line(label: str, took: Clock | tuple[float, float], floor: Clock, count: int,
               ratios: dict[str, list[tuple[float, float]]] | None = None) -> None:
    wall, cpu = (took.wall, took.cpu) if isinstance(took, Clock) else took
    print(f"  {label:<24} {wall:8.2f} s ({count / wall:8.0f}/s) CPU {cpu:7.2f} s   floor {floor.wall:7.2f} s "
          f"CPU {floor.cpu:7.2f} s   {wall / floor.wall:5.2f}× the floor ({cpu / floor.cpu:5.2f}× in CPU)", flush=True)
    if ratios is not None:
        ratios.setdefault(label, []).append((wall / floor.wall, cpu / floor.cpu))


def _default(field):
    value = field.default() if callable(field.default) else field.default
    return None if value is None else field.db_value(value)


def import_floor(path: Path, rows: list[dict], *, staged: bool = False) -> Clock:
    """One executemany of the finished rows into a fresh store (FTS triggers included).
    `staged`: into a temporary table, then one INSERT … SELECT into the store (as llmem's own
    bulk insert does since FTS5 writes a segment per statement): the stronger floor."""
    store = Store.open(path, vec_enabled=False)
    fields = store.models.Memory._meta.fields
    # The floor is plain sqlite3 (so it runs beside any version of llmem under test).
    names = [r[1] for r in store.db.execute_sql("PRAGMA table_info(memory)") if r[1] != "seq"]
    values = []
    for row in rows:
        full = {"version": 1, "hints": "", "accessed_at": None, "valid_from": None, "valid_until": None,
                "invalidated_at": None, "promoted_at": None, **row,
                "content_hash": content_hash(row["content"]),
                **derived_fields(row["content"], row["summary"], row["metadata"])}
        values.append([fields[name].db_value(full[name]) if name in full else _default(fields[name])
                       for name in names])
    columns, marks = ", ".join(names), ", ".join("?" * len(names))
    with Clock() as clock, store.db.atomic():
        if staged:
            cursor = store.db.cursor()
            cursor.execute(f"CREATE TEMP TABLE floor_rows ({columns})")
            cursor.executemany(f"INSERT INTO floor_rows({columns}) VALUES ({marks})", values)
            cursor.execute(f"INSERT INTO memory({columns}) SELECT {columns} FROM floor_rows ORDER BY rowid")
        else:
            store.db.cursor().executemany(f"INSERT INTO memory({columns}) VALUES ({marks})", values)
    store.close()
    return clock


def embed_floor(path: Path, embedder: InstantEmbedder, dim: int) -> tuple[Clock, int]:
    """One executemany of the embedding rows (vectors encoded as stored), values precomputed."""
    store = Store.open(path)
    pairs = store.db.execute_sql("SELECT seq, id FROM memory ORDER BY seq").fetchall()
    vectors = embedder.embed_documents([""] * len(pairs))
    blobs = vec.vector_blobs(store.db, vectors)
    rows = [(memory_id, embedder.identity, dim, blob, "h", 0.0) for (_, memory_id), blob in zip(pairs, blobs, strict=True)]
    vec_rows = [(seq, v) for (seq, _), v in zip(pairs, vectors, strict=True)]
    with Clock() as clock, store.db.atomic():
        vec.ensure_index(store.db, embedder.identity, dim)
        store.db.cursor().executemany(
            "INSERT INTO embedding(memory_id, model, dim, vector, content_hash, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            rows)
        vec.put_vectors(store.db, vec_rows)
    store.close()
    return clock, len(pairs)


def one_round(tmp: Path, args, rows: list[dict], document: dict, ratios: dict) -> None:
    """The import and `embed --pending`, each beside its floors, in fresh stores under `tmp`."""
    for path in tmp.glob("*"):
        if path.name != "source.db":
            path.unlink()
    floor = import_floor(tmp / "floor.db", rows)
    staged_floor = import_floor(tmp / "staged-floor.db", rows, staged=True)
    store = Store.open(tmp / "import.db", vec_enabled=False)
    with Clock() as check:
        plan = plan_import(store, document)
    with Clock() as write:
        apply_import(store, plan)
    store.close()
    print(f"  import: check {check.wall:.2f} s (CPU {check.cpu:.2f} s), write {write.wall:.2f} s (CPU {write.cpu:.2f} s)")
    ratio_line("import (check + write)", (check.wall + write.wall, check.cpu + write.cpu), floor, len(plan.new), ratios)
    ratio_line("import (write only)", write, floor, len(plan.new), ratios)
    ratio_line("import, staged floor", (check.wall + write.wall, check.cpu + write.cpu), staged_floor,
               len(plan.new), ratios)

    embedder = InstantEmbedder(args.dim)
    shutil.copy(tmp / "import.db", tmp / "embed-floor.db")
    # The import's document and rows (millions of objects) stay in this process for the next
    # round; an `embed --pending` process holds none of them. Frozen, the collector does not
    # walk them while embed_pending allocates its rows (it did: 1.5-2.2x the floor in CPU
    # beside them, 1.2-1.3x frozen, in the same run); the floor allocates nothing in its clock.
    gc.collect()
    gc.freeze()
    try:
        floor, count = embed_floor(tmp / "embed-floor.db", InstantEmbedder(args.dim), args.dim)
        store = Store.open(tmp / "import.db")
        with Clock() as embedded:
            done = embed_pending(store, embedder)
        store.close()
    finally:
        gc.unfreeze()
    assert done == count, (done, count)
    ratio_line("embed --pending", embedded, floor, done, ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--repeat", type=int, default=1, help="rounds, each with its floors; then the p50 of the ratios")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llmem-bench-writes-"))
    try:
        print(f"bulk writes: {args.memories} memories, dim {args.dim}")
        rows = memory_rows(args.memories)
        # The import file, as `llmem export` writes it.
        source = Store.open(tmp / "source.db", vec_enabled=False)
        with source.db.atomic():
            source.insert_rows(rows)
        document = json.loads(json.dumps(export_data(source)))
        source.close()
        ratios: dict[str, list[tuple[float, float]]] = {}
        for round_no in range(args.repeat):
            print(f"round {round_no + 1}, load {os.getloadavg()[0]:.2f}", flush=True)
            one_round(tmp, args, rows, document, ratios)
        if args.repeat > 1:
            print(f"p50 of {args.repeat} rounds (load now {os.getloadavg()[0]:.2f}):")
            for label, pairs in ratios.items():
                print(f"  {label:<24} {statistics.median(w for w, _ in pairs):5.2f}× the floor "
                      f"({statistics.median(c for _, c in pairs):5.2f}× in CPU)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
