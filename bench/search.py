#!/usr/bin/env python3
"""Search latency on synthetic memories: FTS, semantic (vec0 and numpy), hybrid, fresh CLI.

Prints figures; it is not a test. Example:
    python bench/search.py --memories 10000
    python bench/search.py --memories 100000 --dim 768 --queries 200
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from llmem.db import vec  # noqa: E402
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


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def timed(fn, runs) -> list[float]:
    out = []
    for arg in runs:
        start = time.perf_counter()
        fn(arg)
        out.append((time.perf_counter() - start) * 1000)
    return out


def report(name: str, ms: list[float], floor: float | None = None, floor_name: str = "") -> float:
    """Print a figure (p50, p95) and, given its floor's p50, the ratio to it; return the p50."""
    p50 = statistics.median(ms)
    ratio = f"   {p50 / floor:6.2f}× {floor_name}" if floor else ""
    print(f"  {name:<34} p50 {p50:8.2f} ms   p95 {pct(ms, 95):8.2f} ms   (n={len(ms)}){ratio}")
    return p50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--cli-runs", type=int, default=10)
    parser.add_argument("--keep", help="Folder to build the store in (kept afterwards).")
    args = parser.parse_args()

    rng = random.Random(42)
    nrng = np.random.default_rng(42)
    words = vocabulary(rng)
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="llmem-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db_path = workdir / "memory.db"
    if db_path.exists():
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
    start = time.perf_counter()
    plan = plan_import(store, document)
    apply_import(store, plan)
    took = time.perf_counter() - start
    print(f"  import (validate + write)          {args.memories / took:8.0f} memories/s  ({took:.1f} s)")

    vectors = nrng.normal(size=(args.memories, args.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    embedder = FixedQuery(args.dim)
    Memory = store.models.Memory
    memories = list(Memory.select().order_by(Memory.seq))
    start = time.perf_counter()
    for i in range(0, len(memories), 2000):
        store_vectors(store, embedder, memories[i:i + 2000], vectors[i:i + 2000])
    took = time.perf_counter() - start
    print(f"  store vectors (+ vec0 index)       {args.memories / took:8.0f} vectors/s   ({took:.1f} s)")
    print(f"  sqlite-vec: {'loaded' if store.db.vec_loaded else 'unavailable'}")

    queries = [" ".join(rng.sample(texts[rng.randrange(len(texts))].split(), 3)) for _ in range(args.queries)]
    qvectors = []
    for _ in range(args.queries):
        q = vectors[rng.randrange(args.memories)] + 0.3 * nrng.normal(size=args.dim).astype(np.float32) / np.sqrt(args.dim)
        qvectors.append(q / np.linalg.norm(q))
    searcher = Searcher(store, embedder, vectors_in_memory=True)
    limit = 10
    depth = limit * 5

    print("in-process (warm), limit 10, query embedding excluded:")
    fts = report("FTS5 bm25", timed(lambda q: searcher.fts_candidates(q, depth, "m.invalidated_at IS NULL", []), queries))
    vec.knn_numpy(store.db, qvectors[0], depth, embedder.identity, args.dim)  # load the matrix once
    scan = report("semantic via numpy (matrix cached)", timed(
        lambda v: vec.knn_numpy(store.db, v, depth, embedder.identity, args.dim), qvectors))
    # The in-process floor: what a hybrid search cannot do without, FTS plus an exact scan.
    floor = fts + scan
    print(f"  floor: FTS + exact numpy scan      p50 {floor:8.2f} ms")
    if store.db.vec_loaded:
        report("semantic via vec0", timed(lambda v: vec.knn_vec0(store.db, v, depth), qvectors), scan, "numpy scan")

    def hybrid(pair):
        embedder.next_vector = pair[1]
        searcher.search(pair[0], SearchOptions(limit=limit, track=False))

    report("hybrid (vectors in memory)", timed(hybrid, list(zip(queries, qvectors, strict=True))), floor, "the floor")
    if store.db.vec_loaded:
        vec0_searcher = Searcher(store, embedder)

        def hybrid_vec0(pair):
            embedder.next_vector = pair[1]
            vec0_searcher.search(pair[0], SearchOptions(limit=limit, track=False))

        report("hybrid (vec0)", timed(hybrid_vec0, list(zip(queries, qvectors, strict=True))), floor, "the floor")

    def hybrid_tracked(pair):
        embedder.next_vector = pair[1]
        searcher.search(pair[0], SearchOptions(limit=limit, track=True))

    report("hybrid with access tracking", timed(hybrid_tracked, list(zip(queries, qvectors, strict=True))[:30]),
           floor, "the floor")
    store.close()

    # ---- fresh processes ----------------------------------------------------------------
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
    found = json.loads(subprocess.run([exe, "search", queries[0], "--no-track", "--explain", "--json"], env=env,
                                      check=True, capture_output=True, text=True).stdout)
    hits = found["results"] if isinstance(found, dict) else found
    assert any(hit["explain"]["vec_rank"] for hit in hits), "the HTTP-embed search ran no KNN"
    report("llmem search (HTTP embed + KNN)", timed(
        lambda q: run(["search", q, "--no-track"]), queries[:args.cli_runs]), start_floor, "python -c pass")
    server.stop()


if __name__ == "__main__":
    main()
