#!/usr/bin/env python3
"""Ranking quality on the coding-memory set (tests/fixtures/ranking/set.json, issue 19).

Prints figures; it is not a test. One store with the set's 306 memories (projects, created_at,
`supersedes` links), embedded with the chosen embedder; every graded query runs through the
default hybrid search and its two baselines (BM25 only, dense only) on the same store, with
access tracking off. Per category and split (tune / held-out): MRR@10, R@1, R@5; then the
AUROC of the top hit's relevance between answerable and unanswerable queries, and the share
of contested pairs (a decision and the one it replaced) where the current one ranks higher,
both per split.
    python bench/ranking.py                      # the built-in MiniLM
    python bench/ranking.py --embedder fake      # no model
    python bench/ranking.py --split heldout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from locomo import CachedQueries, baseline, choose_embedder, parse_options  # noqa: E402

from llmem.search import Searcher, SearchOptions  # noqa: E402
from llmem.store import Store  # noqa: E402
from llmem.vectors import embed_pending  # noqa: E402

SET = ROOT / "tests" / "fixtures" / "ranking" / "set.json"
MODES = ("hybrid", "fts", "semantic")
LABELS = {"hybrid": "hybrid", "fts": "BM25", "semantic": "dense"}
CATEGORIES = ("exact-identifier", "paraphrase", "project-scoped", "superseded", "type-filter",
              "multi-fact", "unanswerable")


def load_set(store: Store, data: dict) -> dict[int, str]:
    """The set's memories into `store`; returns seq -> the set's id."""
    ids = {}
    for m in data["memories"]:
        added = store.add(m["content"], m["type"], project=m["project"], created_at=m["created_at"],
                          source=m.get("source", "user"), confidence=m.get("confidence", 0.7))
        ids[m["id"]] = added.memory.id
    for m in data["memories"]:
        if m.get("supersedes"):
            store.relate(ids[m["id"]], ids[m["supersedes"]], "supersedes")
    Memory = store.models.Memory
    by_uuid = {v: k for k, v in ids.items()}
    return {row.seq: by_uuid[row.id] for row in Memory.select(Memory.seq, Memory.id)}


def auroc(positives: list[float], negatives: list[float]) -> float:
    """P(an answerable query's top relevance > an unanswerable one's); ties count half."""
    if not positives or not negatives:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def run(args) -> dict:
    data = json.loads(SET.read_text())
    embedder, said = choose_embedder(args.embedder)
    cached = CachedQueries(embedder) if embedder is not None else None
    extra = parse_options(args.set)
    queries = [q for q in data["queries"] if args.split in ("all", q["split"])]
    print(f"ranking set: {len(data['memories'])} memories, {len(queries)} queries ({args.split}); {said}")
    if extra:
        print("search options:", ", ".join(f"{k}={v}" for k, v in extra.items()))
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="llmem-ranking-") as tmp:
        store = Store.open(Path(tmp) / "ranking.db")
        name_of = load_set(store, data)
        if embedder is not None:
            embed_pending(store, embedder)
        searcher = Searcher(store, cached)
        modes = MODES if embedder is not None else ("fts",)
        for mode in modes:
            per = defaultdict(lambda: {"rr": [], "r1": [], "r5": []})
            answerable, unanswerable, ms = defaultdict(list), defaultdict(list), []
            contested = defaultdict(list)
            for q in queries:
                opts = SearchOptions(limit=10, mode=mode, track=False, project=q.get("project"),
                                     memory_type=q.get("memory_type"), **extra)
                if cached is not None:
                    cached.embed_query(q["query"])
                start = time.perf_counter()
                ranked_seqs, top = baseline(searcher, mode, q["query"], opts)
                ms.append((time.perf_counter() - start) * 1000)
                ranked = [name_of[s] for s in ranked_seqs]
                relevant = set(q["relevant"])
                if not relevant:
                    unanswerable[q["split"]].append(top)
                    continue
                answerable[q["split"]].append(top)
                rank = next((i for i, r in enumerate(ranked, start=1) if r in relevant), None)
                if args.misses and mode == "hybrid" and rank != 1:
                    print(f"  miss [{q['category']}/{q['split']}] {q['query']!r} want {sorted(relevant)} "
                          f"rank {rank}; got {ranked[:3]}")
                cell = per[(q["category"], q["split"])]
                cell["rr"].append(1.0 / rank if rank else 0.0)
                cell["r1"].append(len(relevant & set(ranked[:1])) / min(len(relevant), 1))
                cell["r5"].append(len(relevant & set(ranked[:5])) / len(relevant))
                for old in q.get("superseded", []):
                    new_rank = rank or 99
                    old_rank = ranked.index(old) + 1 if old in ranked else 99
                    contested[q["split"]].append(new_rank < old_rank)
            results[mode] = {"per": per, "auroc": {split: auroc(answerable[split], unanswerable[split]) for split in answerable},
                             "contested": contested,
                             "p50": statistics.median(ms)}
        store.close()
    report(results, modes)
    return results


def mean(values):
    return statistics.fmean(values) if values else float("nan")


def report(results: dict, modes) -> None:
    splits = sorted({s for r in results.values() for (_, s) in r["per"]}, reverse=True)
    for split in splits:
        print(f"\n[{split}] MRR@10 / R@1 / R@5")
        print(f"{'category':<18} {'n':>3} " + " ".join(f"{LABELS[m]:>20}" for m in modes))
        totals = {m: {"rr": [], "r1": [], "r5": []} for m in modes}
        for cat in CATEGORIES:
            cells, n = [], 0
            for m in modes:
                cell = results[m]["per"].get((cat, split))
                if not cell:
                    continue
                n = len(cell["rr"])
                for key in totals[m]:
                    totals[m][key] += cell[key]
                cells.append(f"{mean(cell['rr']):.3f}/{mean(cell['r1']):.2f}/{mean(cell['r5']):.2f}")
            if cells:
                print(f"{cat:<18} {n:>3} " + " ".join(f"{c:>20}" for c in cells))
        print(f"{'overall':<18} {len(totals[modes[0]]['rr']):>3} " + " ".join(
            f"{mean(totals[m]['rr']):.3f}/{mean(totals[m]['r1']):.2f}/{mean(totals[m]['r5']):.2f}".rjust(20)
            for m in modes))
    print()
    for m in modes:
        r = results[m]
        pairs = "  ".join(f"{split} {sum(won)}/{len(won)} ({mean(won):.0%})"
                          for split, won in sorted(r["contested"].items(), reverse=True))
        separated = "  ".join(f"{split} {value:.3f}" for split, value in sorted(r["auroc"].items(), reverse=True))
        print(f"{LABELS[m]:<8} AUROC answerable vs unanswerable: {separated}   "
              f"current above superseded: {pairs}   p50 {r['p50']:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", default="builtin", help="builtin, local, fake or none.")
    parser.add_argument("--misses", action="store_true", help="Print the hybrid's queries not at rank 1.")
    parser.add_argument("--split", default="all", choices=("all", "tune", "heldout"))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="Override a SearchOptions field, e.g. --set blend=0.2.")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run(args)


if __name__ == "__main__":
    main()
