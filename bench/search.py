#!/usr/bin/env python3
"""Search latency on synthetic memories: FTS, semantic, hybrid, fresh CLI, each beside its floor.

The floors, measured in the same run: FTS alone, and an exact numpy scan over a float32
matrix already in RAM. "before" is the KNN llmem ran until the vector file (vec0, re-run with
a deeper k when a filter left too few hits; or a numpy matrix loaded from the BLOBs): the
store no longer keeps a vec0 table, so the bench builds one from the same vectors to measure
it against (when sqlite-vec loads).
Prints figures; it is not a test. Example:
    python bench/search.py --memories 10000 --dim 384
    python bench/search.py --memories 100000 --dim 384 --queries 200
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import llmem  # noqa: E402,F401 - first, as in llmem's own processes: it sets numpy's BLAS threads

# isort: split
import numpy as np  # noqa: E402

from llmem.db import vec, vector_file  # noqa: E402
from llmem.db.queries import seqs_passing  # noqa: E402
from llmem.exchange import apply_import, plan_import  # noqa: E402
from llmem.providers.embedders import Embedder  # noqa: E402
from llmem.search import Searcher, SearchOptions  # noqa: E402
from llmem.store import Store  # noqa: E402
from llmem.vectors import store_vectors  # noqa: E402

TYPES = ["fact", "decision", "preference", "event", "project_state", "procedure", "conversation"]


def vocabulary(rng: random.Random, size: int = 6000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))))
    return sorted(words)


def synthetic_text(rng: random.Random, words: list[str], weights: list[float]) -> str:
    # Zipf-like content words (stopwords are never searched): the commonest term is in
    # a few percent of memories, most terms are rare, as in real notes.
    picks = rng.choices(words, weights=weights, k=rng.randint(8, 30))
    if rng.random() < 0.2:
        picks.append(f"{rng.choice(words)}_{rng.choice(words)}()")
    return " ".join(picks)


class FixedQuery(Embedder):
    """Returns a precomputed query vector: query embedding is excluded from the timing.

    Its vectors are stored under the identity of the fake Ollama model the fresh-process
    searches embed their query with, so those searches run the KNN over them."""

    provider = "ollama"

    def __init__(self, dim: int):
        super().__init__("nomic-embed-text")
        self.dim = dim
        self.next_vector = None

    def embed_query(self, text):
        return self.next_vector


# all-MiniLM-L6-v2's vectors of bench/quantization.py's 11.6k texts: the mean vector's length,
# the variance about it (0.687), and the share of it its leading directions hold, by how many
# of the 384 (random vectors' first 128 hold a third, MiniLM's 0.89).
EMBEDDING_MEAN_NORM = 0.56
EMBEDDING_VARIANCE = 0.687
EMBEDDING_SPECTRUM = ((1, 0.067), (2, 0.126), (4, 0.213), (8, 0.329), (16, 0.471), (32, 0.616), (64, 0.763),
                      (128, 0.891), (192, 0.951), (256, 0.982), (320, 0.996), (384, 1.0))


def isotropic(dim: int):
    """Random unit vectors: no direction dominates (the worst case of a prefilter)."""
    def draw(nrng, count):
        rows = nrng.normal(size=(count, dim)).astype(np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return draw


def embedding_like(nrng, dim: int):
    """Unit vectors drawn with a sentence embedder's mean and spectrum (EMBEDDING_SPECTRUM) in
    random directions."""
    at, share = zip(*EMBEDDING_SPECTRUM, strict=True)
    held = np.interp(np.arange(1, dim + 1) * 384 / dim, (0, *at), (0, *share))
    spread = np.diff(held, prepend=0.0) * EMBEDDING_VARIANCE
    basis, _ = np.linalg.qr(nrng.normal(size=(dim, dim)))
    mean = nrng.normal(size=dim)
    mean *= EMBEDDING_MEAN_NORM / np.linalg.norm(mean)

    def draw(nrng, count):
        rows = mean + (nrng.normal(size=(count, dim)) * np.sqrt(spread)) @ basis.T
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    return draw


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def timed(fn, runs) -> list[float]:
    out = []
    for arg in runs:
        start = time.perf_counter()
        fn(arg)
        out.append((time.perf_counter() - start) * 1000)
    return out


def interleaved(cases: dict, runs: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """({name: wall ms per run}, {name: CPU ms per run, every thread of the process}) for
    {name: (fn, args)}, taking turns run by run: on a shared, loaded machine a figure and its
    floor then see the same load, and the CPU time is what the work costs when the wall time
    also holds the wait for a core."""
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(runs):
        for name, (fn, args) in cases.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn(args[i])
            wall[name].append((time.perf_counter() - start) * 1000)
            cpu[name].append((time.process_time() - start_cpu) * 1000)
    return wall, cpu


def report(name: str, ms: list[float], floor: list[float] | float | None = None,
           floor_name: str = "floor", cpu: list[float] | None = None) -> float:
    """Print a figure (p50, p95, and the CPU time's p50 when given) and, given its floor (runs,
    or their p50), the ratio to it; return the p50."""
    p50 = statistics.median(ms)
    ratio = ""
    if floor:
        base = statistics.median(floor) if isinstance(floor, list) else floor
        ratio = f"   {p50 / base:5.2f}x {floor_name}"
    used = f"   cpu p50 {statistics.median(cpu):7.2f} ms" if cpu else ""
    print(f"  {name:<40} p50 {p50:8.2f} ms   p95 {pct(ms, 95):8.2f} ms{used}{ratio}   (n={len(ms)})")
    return p50


class SequentialSearcher(Searcher):
    """The search with its KNN scanned after the FTS query, not beside it (to measure the thread)."""

    def _begin_nearest(self, query_vector, depth, *, background=False):
        return super()._begin_nearest(query_vector, depth)


def int8_scan(index, query, k):
    """The vector file's exact scan of every int8 row (what it ran before the prefilter)."""
    sims = vector_file._scores(index.matrix, index.scales, query, vector_file.Cores(free=True))
    return vector_file._top_index(sims, k)


VEC0_TABLE = "bench_vec0"
MAX_KNN = 4096  # vec0's limit on k


def build_vec0(db, seqs, matrix) -> None:
    """A vec0 table of the stored vectors (as float32), as llmem kept until migration 0017."""
    db.execute_sql(f"DROP TABLE IF EXISTS {VEC0_TABLE}")
    db.execute_sql(f"CREATE VIRTUAL TABLE {VEC0_TABLE} USING vec0("
                   f"seq INTEGER PRIMARY KEY, embedding float[{matrix.shape[1]}] distance_metric=cosine)")
    with db.atomic():
        db.cursor().executemany(f"INSERT INTO {VEC0_TABLE}(seq, embedding) VALUES (?, ?)",
                                [(int(s), vec.to_blob(v)) for s, v in zip(seqs, matrix, strict=True)])


def knn_vec0(db, query, k):
    rows = db.execute_sql(f"SELECT seq, distance FROM {VEC0_TABLE} WHERE embedding MATCH ? AND k = ? "
                          "ORDER BY distance", (vec.to_blob(query), min(k, MAX_KNN))).fetchall()
    return [(int(seq), float(dist)) for seq, dist in rows]


class BeforeSearcher(Searcher):
    """The KNN as it was before the vector file, kept here to measure against."""

    def _begin_nearest(self, query_vector, depth, *, background=False):
        searcher = self

        class Run:
            def finish(self, db, where, params):
                return searcher._vec0_nearest(query_vector, depth, where, params)
        return Run()

    def _vec0_nearest(self, query_vector, depth, where, params):
        k = depth
        while True:
            nearest = knn_vec0(self.db, query_vector, k)
            if where == "1" or not nearest:
                return nearest[:depth]
            allowed = seqs_passing(self.db, [s for s, _ in nearest], where, params)
            kept = [(s, d) for s, d in nearest if s in allowed]
            if len(kept) >= depth or len(nearest) < k or k >= MAX_KNN:
                return kept[:depth]
            k = min(k * 4, MAX_KNN)


def load_matrix(db, model: str, dim: int):
    """The old per-process load: every BLOB into one float32 numpy matrix (the exact-scan
    floor's input)."""
    rows = db.execute_sql("SELECT m.seq, e.vector FROM embedding e JOIN memory m ON m.id = e.memory_id "
                          "WHERE e.model = ? AND e.dim = ?", (model, dim)).fetchall()
    seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    return seqs, vec.decode_rows([r[1] for r in rows], dim)


def exact_scan(seqs, matrix, query, k):
    sims = matrix @ query
    top = np.argpartition(-sims, k - 1)[:k]
    return [(int(seqs[i]), float(1 - sims[i])) for i in top[np.argsort(-sims[top], kind="stable")]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--cli-runs", type=int, default=10)
    parser.add_argument("--keep", help="Folder to build the store in (kept afterwards).")
    parser.add_argument("--builtin", action="store_true",
                        help="Also time fresh searches with the built-in ONNX model, in-process and by a resident.")
    parser.add_argument("--vectors", choices=("embedding-like", "random"), default="embedding-like",
                        help="Synthetic vectors with a sentence embedder's spectrum (the default), or "
                             "isotropic random ones (the worst case of the vector file's prefilter).")
    parser.add_argument("--in-process-only", action="store_true",
                        help="Skip vec0 (the 'before' cases) and the fresh processes.")
    parser.add_argument("--search-alone", metavar="DIR", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--reuse", action="store_true",
                        help="Search the store a previous run left in --keep (same --memories, --dim).")
    args = parser.parse_args()
    if args.search_alone:
        run_search_alone(args.search_alone, args.dim, args.limit)
        return

    rng = random.Random(42)
    nrng = np.random.default_rng(42)
    words = vocabulary(rng)
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="llmem-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db_path = workdir / "memory.db"
    reuse = args.reuse and db_path.exists()
    if db_path.exists() and not reuse:
        db_path.unlink()
    print(f"llmem search benchmark: {args.memories} memories, {args.dim}-d vectors, store {db_path}")

    # ---- import -------------------------------------------------------------------------
    weights = [1.0 / (rank + 100) for rank in range(len(words))]
    texts = [synthetic_text(rng, words, weights) for _ in range(args.memories)]
    document = {"version": 1, "memories": [
        {"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "type": rng.choice(TYPES),
         "content": text, "confidence": round(rng.uniform(0.5, 1.0), 2)} for text in texts],
        "relations": []}
    store = Store.open(db_path)
    if not reuse:
        start = time.perf_counter()
        plan = plan_import(store, document)
        apply_import(store, plan)
        took = time.perf_counter() - start
        print(f"  import (validate + write)          {args.memories / took:8.0f} memories/s  ({took:.1f} s)")

    draw = embedding_like(nrng, args.dim) if args.vectors == "embedding-like" else isotropic(args.dim)
    vectors = draw(nrng, args.memories)
    embedder = FixedQuery(args.dim)
    memories = list(store.models.Memory.select().order_by(store.models.Memory.seq))
    start = time.perf_counter()
    for i in range(0, len(memories) if not reuse else 0, 2000):
        store_vectors(store, embedder, memories[i:i + 2000], vectors[i:i + 2000])
    took = time.perf_counter() - start
    if not reuse:
        print(f"  store vectors                      {args.memories / took:8.0f} vectors/s   ({took:.1f} s)")
    print(f"  sqlite-vec: {'loaded' if store.db.vec_loaded else 'unavailable'}")

    queries = [" ".join(rng.sample(texts[rng.randrange(len(texts))].split(), 3)) for _ in range(args.queries)]
    qvectors = []
    for _ in range(args.queries):
        if args.vectors == "embedding-like":  # a new text of the same distribution, near a stored one
            q = vectors[rng.randrange(args.memories)] + draw(nrng, 1)[0]
        else:
            q = vectors[rng.randrange(args.memories)] + 0.3 * nrng.normal(size=args.dim).astype(np.float32) / np.sqrt(args.dim)
        qvectors.append((q / np.linalg.norm(q)).astype(np.float32))  # float64 would upcast the matrix
    # Two projects, one holding one memory in fifty: its filter leaves few of the nearest.
    # (SQL's %: peewee reads `Memory.seq % 50` as LIKE, which put all but one memory in the
    # rare project.)
    with store.db.atomic():
        store.db.execute_sql("UPDATE memory SET project = CASE WHEN seq % 50 = 0 THEN '/p/rare' ELSE '/p/common' END")
    searcher, before = Searcher(store, embedder), BeforeSearcher(store, embedder)
    limit = 10
    depth = limit * 5
    model = embedder.identity
    pairs = list(zip(queries, qvectors, strict=True))

    print("first search of a process (the MCP server's first call):")
    start = time.perf_counter()
    seqs, matrix = load_matrix(store.db, model, args.dim)
    print(f"  {'before: load the matrix from the BLOBs':<40} {(time.perf_counter() - start) * 1000:8.0f} ms")
    vector_file._indexes.clear()
    vector_file.file_path(store.db).unlink(missing_ok=True)
    start = time.perf_counter()
    vector_file.nearest(store.db, qvectors[0], depth, model, args.dim, "1", [])
    print(f"  {'after: write the vector file (once)':<40} {(time.perf_counter() - start) * 1000:8.0f} ms")
    vector_file._indexes.clear()
    start = time.perf_counter()
    vector_file.nearest(store.db, qvectors[0], depth, model, args.dim, "1", [])
    print(f"  {'after: map the file + first scan':<40} {(time.perf_counter() - start) * 1000:8.0f} ms")

    recall, recall_f32 = [], []
    by_seq = np.argsort(seqs)
    for v in qvectors:
        truth = {s for s, _ in exact_scan(seqs, matrix, v, 10)}
        # the vectors as embedded, before the store encoded them (int8 and a scale, db/vec.py)
        truth_f32 = {s for s, _ in exact_scan(seqs[by_seq], vectors, v, 10)}
        got = {s for s, _ in vector_file.nearest(store.db, v, 10, model, args.dim, "1", [])}
        recall.append(len(truth & got) / 10)
        recall_f32.append(len(truth_f32 & got) / 10)
    print(f"  recall@10 of the vector file against the exact scan of the stored vectors: "
          f"{statistics.mean(recall):.3f}; against float32 of the vectors as embedded: "
          f"{statistics.mean(recall_f32):.3f}")
    if store.db.vec_loaded and not args.in_process_only:
        build_vec0(store.db, seqs, matrix)

    def run_search(engine, project=None, track=False):
        def go(pair):
            embedder.next_vector = pair[1]
            engine.search(pair[0], SearchOptions(limit=limit, track=track, project=project))
        return go

    where = "m.invalidated_at IS NULL"
    index = vector_file.index_for(store.db, model, args.dim)
    prefilter = index.prefilter
    print(f"  vector file: {vector_file.file_path(store.db).stat().st_size / 1e6:.1f} MB, prefilter: "
          + (f"{prefilter[0].shape[1]} int8 components ({prefilter[0].shape[1] + 4} bytes a vector), "
             f"{vector_file.candidate_count(len(index.seqs))} candidates rescored" if prefilter else "none"))
    sequential = SequentialSearcher(store, embedder)
    cases = {
        "fts": (lambda q: searcher.fts_candidates(q, depth, where, []), queries),
        "exact": (lambda v: exact_scan(seqs, matrix, v, depth), qvectors),
        "int8": (lambda v: int8_scan(index, v, depth), qvectors),
        "knn after": (lambda v: vector_file.nearest(store.db, v, depth, model, args.dim, where, []), qvectors),
        "hybrid after": (run_search(searcher), pairs),
        "hybrid sequential": (run_search(sequential), pairs),
        "project after": (run_search(searcher, "/p/rare"), pairs),
    }
    with_before = store.db.vec_loaded and not args.in_process_only
    if with_before:
        cases.update({"knn before": (lambda v: knn_vec0(store.db, v, depth), qvectors),
                      "hybrid before": (run_search(before), pairs),
                      "project before": (run_search(before, "/p/rare"), pairs)})
    load = os.getloadavg()
    ms, cpu = interleaved(cases, args.queries)
    floor = [a + b for a, b in zip(ms["fts"], ms["exact"], strict=True)]
    print(f"in-process (warm), limit 10, query embedding excluded, cases taking turns "
          f"(load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after):")
    report("floor: FTS5 bm25", ms["fts"], cpu=cpu["fts"])
    report("floor: exact numpy scan (matrix in RAM)", ms["exact"], cpu=cpu["exact"])
    print("  KNN, floor = the exact scan:")
    if with_before:
        report("KNN before (vec0)", ms["knn before"], ms["exact"], cpu=cpu["knn before"])
    report("KNN, the file's int8 scan (no prefilter)", ms["int8"], ms["exact"], cpu=cpu["int8"])
    report("KNN after (vector file)", ms["knn after"], ms["exact"], cpu=cpu["knn after"])
    print("  hybrid, floor = FTS + the exact scan:")
    for label, key in (("hybrid", "hybrid"), ("hybrid, project filter (1 in 50)", "project")):
        if with_before:
            report(f"{label}, before", ms[f"{key} before"], floor, cpu=cpu[f"{key} before"])
        report(f"{label}, after", ms[f"{key} after"], floor, cpu=cpu[f"{key} after"])
    report("hybrid, KNN after the FTS query", ms["hybrid sequential"], floor, cpu=cpu["hybrid sequential"])
    report("hybrid with access tracking, after", timed(run_search(searcher, track=True), pairs[:30]), floor[:30])
    store.close()
    search_alone(workdir, queries, qvectors, limit)
    if args.in_process_only:
        return

    # ---- fresh processes ----------------------------------------------------------------
    if args.builtin:
        builtin_search(args.memories, args.cli_runs, queries[:args.cli_runs])
    from fakes import FakeModelServer

    server = FakeModelServer(dim=args.dim).start()
    server.models.append("synthetic")
    (workdir / "config.yaml").write_text(
        f"db_path: {db_path}\nembedding:\n  provider: ollama\n  model: nomic-embed-text\n"
        f"  base_url: {server.url}\nllm:\n  provider: none\n")
    env = {**os.environ, "LLMEM_HOME": str(workdir)}
    exe = str(Path(sys.executable).parent / "llmem")

    def run(argv):
        subprocess.run([exe, *argv], env=env, check=True, capture_output=True)

    print("fresh process:")
    # The floor of a fresh process: the interpreter llmem is installed in, doing nothing.
    start_floor = report("python -c pass", timed(
        lambda _: subprocess.run([sys.executable, "-c", "pass"], check=True), range(args.cli_runs)))
    report("llmem --help", timed(lambda _: run(["--help"]), range(args.cli_runs)), start_floor, "python -c pass")
    report("llmem search --fts-only", timed(
        lambda q: run(["search", q, "--fts-only", "--no-track"]), queries[:args.cli_runs]),
        start_floor, "python -c pass")
    # The stored vectors are the fake Ollama model's (FixedQuery's identity): the process
    # embeds the query over HTTP and runs the KNN over them, as a real search does.
    # --semantic-only --min-relevance 0: the synthetic vectors are random, so every vector
    # candidate is far below the keyword hits and the default floor (the check asks whether KNN ran).
    found = json.loads(subprocess.run([exe, "search", queries[0], "--no-track", "--explain", "--json",
                                       "--semantic-only", "--min-relevance", "0"], env=env,
                                      check=True, capture_output=True, text=True).stdout)
    hits = found["results"] if isinstance(found, dict) else found
    assert any(hit["explain"]["vec_rank"] for hit in hits), "the HTTP-embed search ran no KNN"
    report("llmem search (HTTP embed + KNN)", timed(
        lambda q: run(["search", q, "--no-track"]), queries[:args.cli_runs]), start_floor, "python -c pass")
    resident_search("llmem search (HTTP embed), resident alive", workdir, run, queries[:args.cli_runs],
                    start_floor)
    server.stop()


def search_alone(workdir: Path, queries: list[str], qvectors: list, limit: int) -> None:
    """Hybrid searches in a process of their own that holds nothing else (this one holds the
    texts and the floor's float32 matrix): their p50 and that process's peak RSS."""
    np.save(workdir / "bench-queries.npy", np.stack(qvectors))
    (workdir / "bench-queries.json").write_text(json.dumps(queries))
    print("a process that only searches (the store above, same queries):")
    subprocess.run([sys.executable, __file__, "--search-alone", str(workdir), "--dim", str(len(qvectors[0])),
                    "--queries", str(len(queries)), "--limit", str(limit)], check=True)


def run_search_alone(workdir: Path, dim: int, limit: int) -> None:
    queries = json.loads((workdir / "bench-queries.json").read_text())
    qvectors = np.load(workdir / "bench-queries.npy")
    store = Store.open(workdir / "memory.db")
    embedder = FixedQuery(dim)
    searcher = Searcher(store, embedder)
    where = "m.invalidated_at IS NULL"

    def hybrid(i):
        embedder.next_vector = qvectors[i]
        searcher.search(queries[i], SearchOptions(limit=limit, track=False))

    hybrid(0)  # maps the file
    runs = range(len(queries))
    ms, cpu = interleaved({"fts": (lambda q: searcher.fts_candidates(q, limit * 5, where, []), queries),
                           "hybrid": (hybrid, runs)}, len(queries))
    report("floor: FTS5 bm25", ms["fts"], cpu=cpu["fts"])
    report("hybrid", ms["hybrid"], ms["fts"], "FTS", cpu=cpu["hybrid"])
    # VmHWM, not ru_maxrss: Linux carries the parent's peak over into an exec'ed child's.
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
    print(f"  peak RSS of this process: {peak:.0f} MB (load average {os.getloadavg()[0]:.2f})")
    store.close()


def resident_search(label: str, home: Path, run, queries: list[str], start_floor: float) -> None:
    """The same fresh `llmem search`, answered by a resident llmem (cli/resident.py) that this
    process hosts, as a running worker, `llmem run` or `llmem mcp` would."""
    from llmem.app import App
    from llmem.cli.resident import Resident

    os.environ["LLMEM_HOME"] = str(home)  # the resident answers the environment it was started in
    host = App()
    resident = Resident(host).start()
    assert resident is not None, "the resident did not start"
    try:
        run(["search", "warm up", "--no-track"])  # it loads the model on its first request
        report(label, timed(lambda q: run(["search", q, "--no-track"]), queries), start_floor, "python -c pass")
    finally:
        resident.stop()
        host.close()


def builtin_search(size: int, runs: int, queries: list[str]) -> None:
    """Fresh `llmem search` with the built-in ONNX model (the default install): the model loads
    in the process for its one query, or a resident answers it. The store: `size` memories with
    random vectors under the built-in model's identity (bench/hooks.py seed_bulk)."""
    from hooks import seed_bulk

    home = Path(tempfile.mkdtemp(prefix="llmem-bench-builtin-"))
    os.environ["LLMEM_HOME"] = str(home)
    (home / "config.yaml").write_text("embedding:\n  provider: builtin\nllm:\n  provider: none\n")
    started = time.perf_counter()
    seed_bulk(size, random.Random(size))
    print(f"fresh process, built-in model ({size} memories, built in {time.perf_counter() - started:.0f} s):")
    env = {**os.environ, "LLMEM_HOME": str(home)}
    exe = str(Path(sys.executable).parent / "llmem")

    def run(argv):
        subprocess.run([exe, *argv], env=env, check=True, capture_output=True)

    run(["search", "warm the page cache", "--no-track"])
    floor, fresh = [], []
    for query in queries:  # the floor interleaved: the machine's load moves
        floor += timed(lambda _: subprocess.run([sys.executable, "-c", "pass"], check=True), [0])
        fresh += timed(lambda q: run(["search", q, "--no-track"]), [query])
    start_floor = report("python -c pass", floor)
    report("llmem search (model loaded in-process)", fresh, start_floor, "python -c pass")
    resident_search("llmem search, resident alive", home, run, queries, start_floor)


if __name__ == "__main__":
    main()
