"""Hybrid search (SPEC §3): FTS5 bm25 + vector KNN, fused by RRF, reranked by memory signals."""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .db import vec
from .db.fts import match_count, match_expression, ranked_matches, semantic_text
from .db.models import EPISODE_SOURCE, USER_ORIGINS, Memory
from .db.queries import memory_filter, rank_fields, seqs_passing
from .errors import EmbedderUnavailable, UsageError
from .providers.embedders import Embedder
from .times import days_between, now

log = logging.getLogger(__name__)

TYPE_PRIORITY = {
    "decision": 1.2, "preference": 1.1, "procedure": 1.1, "fact": 1.0, "project_state": 1.0,
    "self_assessment": 1.0, "event": 0.9, "conversation": 0.7,
}
# FTS5 column weights for bm25(): content, summary, identifier hints.
BM25_WEIGHTS = (1.0, 0.6, 0.4)
# The deepest the FTS ranking looks for rows that pass the filters.
MAX_FTS_FETCH = 20_000
QUERY_TEXT_CHARS = 300  # of a user query kept for the shadow trial
# The semantic query leaves out words found in more than this share of the memories.
COMMON_WORD_SHARE = 0.10
# In hybrid mode the top lexical hit's vector is added to the query vector with this weight
# (pseudo-relevance feedback): it restates the query in the store's own words.
FEEDBACK_WEIGHT = 0.3
# A semantic candidate needs at least this share of the best candidate's cosine similarity.
SEMANTIC_FLOOR = 0.5
# An episode's final score is multiplied by this: a typed memory saying the same thing (the
# decision, not the turn it was taken in) ranks above it, and episodes still rank among
# themselves by relevance. Kept a plain factor until ranking is reworked.
EPISODE_PRIOR = 0.85


@dataclass
class SearchOptions:
    limit: int = 10
    mode: str = "hybrid"  # hybrid | fts | semantic
    memory_type: str | None = None
    project: str | None = None
    include_invalid: bool = False
    valid_only: bool = False
    related: bool = False
    track: bool = True
    origin: str = "search"
    rrf_k: int = 60
    candidate_multiplier: int = 5
    blend: float = 0.3


class RankFields(NamedTuple):
    """The columns the rerank reads: enough to score a candidate without loading it."""

    seq: int
    type: str
    confidence: float
    accessed_at: float | None
    access_count: int
    created_at: float
    source: str


def is_episode(memory) -> bool:
    """Whether a memory is an episode (a piece of the conversation, capture/episodes.py)."""
    return getattr(memory, "source", None) == EPISODE_SOURCE


def kind_label(memory) -> str:
    """What a result is, as the CLI and the MCP tools print it: its type, or
    `episode:<role>` for a piece of the conversation (whose words: the user's or the agent's)."""
    if not is_episode(memory):
        return memory.type
    role = (memory.metadata or {}).get("role")
    return f"episode:{role}" if role else "episode"


@dataclass
class Hit:
    """One search result with every score component (what --explain prints)."""

    memory: Memory | None  # loaded only for the results that are returned
    score: float
    seq: int = 0
    fts_rank: int | None = None
    fts_bm25: float | None = None
    vec_rank: int | None = None
    vec_distance: float | None = None
    rrf: float = 0.0
    rrf_norm: float = 0.0
    signal: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    via: str | None = None  # set for results added by --related

    def explain(self) -> dict[str, Any]:
        """Every score component by name, in the order `llmem search --explain` prints them."""
        return {"fts_rank": self.fts_rank, "bm25": self.fts_bm25, "vec_rank": self.vec_rank,
                "cosine_distance": self.vec_distance, "rrf": self.rrf, "rrf_norm": self.rrf_norm,
                "signal": self.signal, **self.components, "final": self.score}


@dataclass
class SearchResult:
    hits: list[Hit]
    mode: str  # the mode that actually ran
    notice: str | None = None  # e.g. why hybrid became FTS-only
    semantic_query: str | None = None  # the text that was embedded, when it differs


def query_hash(query: str) -> str:
    """Normalised query identity, for counting distinct queries in promotion."""
    normal = " ".join(query.lower().split())
    return hashlib.sha256(normal.encode("utf-8")).hexdigest()[:16]


def memory_signal(memory: Memory | RankFields, at: float) -> tuple[float, dict[str, float]]:
    """The seed's weighted signal: confidence, recency, frequency, type priority."""
    confidence = float(memory.confidence or 0.0)
    if memory.accessed_at and memory.access_count:
        recency = math.exp(-0.01 * days_between(at, memory.accessed_at))
        age_days = max(days_between(at, memory.created_at), 1.0)
        frequency = math.log(1 + memory.access_count / age_days)
    else:
        recency = frequency = 0.0
    priority = TYPE_PRIORITY.get(memory.type, 1.0)
    signal = 0.4 * confidence + 0.3 * recency + 0.2 * frequency + 0.1 * priority
    return signal, {"confidence": confidence, "recency": recency, "frequency": frequency,
                    "type_priority": priority}


class Searcher:
    """Runs searches over one store with one embedder."""

    def __init__(self, store, embedder: Embedder | None):
        self.store = store
        self.db = store.db
        self.embedder = embedder

    # ---- candidate lists -------------------------------------------------------------

    def _filters(self, opts: SearchOptions, at: float) -> tuple[str, list[Any]]:
        return memory_filter(memory_type=opts.memory_type, project=opts.project,
                             include_invalid=opts.include_invalid, valid_only=opts.valid_only, at=at)

    def fts_candidates(self, query: str, depth: int, where: str, params: list) -> list[tuple[int, float]]:
        """(seq, bm25) best first; bm25 is negative, lower is better.

        The filters apply to the best-ranked matches only (`fts.ranked_matches`); when they
        drop too many, it looks deeper.
        """
        expression = match_expression(query)
        if expression is None:
            return []
        fetch = depth if where == "1" else depth * 2
        while True:
            rows = ranked_matches(self.db, expression, BM25_WEIGHTS, fetch, where, params)
            if len(rows) >= depth or where == "1" or fetch >= MAX_FTS_FETCH:
                return rows[:depth]
            if match_count(self.db, expression, fetch) < fetch:
                return rows[:depth]  # every match was seen: the filters just keep few of them
            fetch *= 4

    def vector_candidates(self, query_vector, depth: int, where: str, params: list) -> list[tuple[int, float]]:
        """(seq, cosine distance) best first, filtered, down to SEMANTIC_FLOOR of the best."""
        nearest = self._nearest(query_vector, depth, where, params)
        if not nearest:
            return nearest
        # Every memory has *some* cosine similarity to the query: without a floor, a small
        # store puts all of them in the list, and RRF then treats the unrelated as evidence.
        floor = SEMANTIC_FLOOR * (1.0 - nearest[0][1])
        return [(s, d) for s, d in nearest if 1.0 - d >= floor]

    def _nearest(self, query_vector, depth: int, where: str, params: list) -> list[tuple[int, float]]:
        """(seq, cosine distance) best first, filtered: one scan of the vector file."""
        model, dim = vec.index_state(self.db)
        if model != self.embedder.identity or dim != len(query_vector):
            return []  # nothing embedded with this model yet
        from .db import vector_file  # numpy comes with it: FTS-only searches never load it

        return vector_file.nearest(self.db, query_vector, depth, model, dim, where, params)

    # ---- the search ------------------------------------------------------------------

    def search(self, query: str, opts: SearchOptions | None = None) -> SearchResult:
        opts = opts or SearchOptions()
        if opts.limit < 1:
            raise UsageError("--limit must be at least 1")
        if opts.mode not in ("hybrid", "fts", "semantic"):
            raise UsageError(f"unknown search mode {opts.mode!r}")
        at = now()
        mode, notice = opts.mode, None
        where, params = self._filters(opts, at)
        depth = max(opts.limit * opts.candidate_multiplier, 50)

        query_vector = semantic_query = None
        if mode in ("hybrid", "semantic"):
            if self.embedder is None or not self.embedder.available:
                if mode == "semantic":
                    raise UsageError("semantic search needs an embedder (embedding.provider is none)",
                                     hint="configure embedding.provider, or use --fts-only")
                mode, notice = "fts", "no embedder configured: searching with FTS only"
            else:
                try:
                    # Redacted before it is re-tokenised: `sk-proj-…` split into words no
                    # longer matches its pattern when the embedder redacts what it sends.
                    safe_query = self.store.redactor.text(query)
                    semantic_query = semantic_text(self.db, safe_query, share=COMMON_WORD_SHARE)
                    query_vector = self.embedder.embed_query(semantic_query)
                except EmbedderUnavailable as exc:
                    if mode == "semantic":
                        raise
                    mode, notice = "fts", f"embedder unavailable ({exc.message}): searching with FTS only"

        lists: list[list[tuple[int, float]]] = []
        fts_list = self.fts_candidates(query, depth, where, params) if mode in ("hybrid", "fts") else []
        if fts_list and query_vector is not None:
            query_vector = self._with_feedback(query_vector, fts_list[0][0])
        vec_list = (self.vector_candidates(query_vector, depth, where, params)
                    if query_vector is not None else [])
        if mode in ("hybrid", "fts"):
            lists.append(fts_list)
        if query_vector is not None:
            lists.append(vec_list)
        if mode == "hybrid" and query_vector is not None and not vec_list and fts_list:
            notice = "no memory is embedded with this model yet: run `llmem embed --pending`"

        hits = self._fuse_and_rerank(fts_list, vec_list, len(lists), opts, at)[:opts.limit]
        Memory = self.store.models.Memory
        memories = {m.seq: m for m in Memory.select().where(Memory.seq.in_([h.seq for h in hits]))}
        for hit in hits:
            hit.memory = memories[hit.seq]
        if opts.related and hits:
            hits += self._related(hits, opts, where, params)
        if opts.track and hits:
            self.record_recall(hits, query, opts.origin, at)
        return SearchResult(hits, mode, notice,
                            semantic_query if semantic_query not in (None, query) else None)

    def _with_feedback(self, query_vector, seq: int):
        """The query vector nudged towards the top lexical hit's vector (when it has one)."""
        stored = vec.stored_vector(self.db, seq, self.embedder.identity, len(query_vector))
        if stored is None:
            return query_vector
        return vec.normalize(query_vector + FEEDBACK_WEIGHT * stored)

    def _fuse_and_rerank(self, fts_list, vec_list, list_count: int, opts: SearchOptions,
                         at: float) -> list[Hit]:
        k = opts.rrf_k
        fused: dict[int, dict[str, Any]] = {}
        for rank, (seq, bm25) in enumerate(fts_list, start=1):
            entry = fused.setdefault(seq, {"rrf": 0.0})
            entry.update(fts_rank=rank, fts_bm25=bm25)
            entry["rrf"] += 1.0 / (k + rank)
        for rank, (seq, distance) in enumerate(vec_list, start=1):
            entry = fused.setdefault(seq, {"rrf": 0.0})
            entry.update(vec_rank=rank, vec_distance=distance)
            entry["rrf"] += 1.0 / (k + rank)
        if not fused:
            return []
        best_possible = max(list_count, 1) / (k + 1)  # rank 1 in every list
        hits = []
        for row in map(RankFields._make, rank_fields(self.db, list(fused))):
            entry = fused[row.seq]
            rrf_norm = entry["rrf"] / best_possible
            signal, components = memory_signal(row, at)
            score = rrf_norm * (1 - opts.blend) + signal * opts.blend
            if row.source == EPISODE_SOURCE:
                score *= EPISODE_PRIOR
                components = {**components, "episode_prior": EPISODE_PRIOR}
            hits.append(Hit(memory=None, seq=row.seq, score=score, fts_rank=entry.get("fts_rank"),
                            fts_bm25=entry.get("fts_bm25"), vec_rank=entry.get("vec_rank"),
                            vec_distance=entry.get("vec_distance"), rrf=entry["rrf"],
                            rrf_norm=rrf_norm, signal=signal, components=components))
        hits.sort(key=lambda h: (-h.score, h.seq))
        return hits

    def _related(self, hits: list[Hit], opts: SearchOptions, where: str, params: list) -> list[Hit]:
        """One hop of relations from the results, each marked with how it was reached."""
        shown = {h.memory.id for h in hits}
        extra: dict[str, Hit] = {}
        Memory, Relation = self.store.models.Memory, self.store.models.Relation
        rows = Relation.select().where(Relation.source.in_(list(shown)) | Relation.target.in_(list(shown)))
        at = now()
        for relation in rows:
            src, dst = relation.source_id, relation.target_id
            other, anchor = (dst, src) if src in shown else (src, dst)
            if other in shown or other in extra:
                continue
            memory = Memory.get_or_none(Memory.id == other)
            if memory is None or not seqs_passing(self.db, [memory.seq], where, params):
                continue
            signal, components = memory_signal(memory, at)
            extra[other] = Hit(memory=memory, seq=memory.seq, score=0.0, signal=signal, components=components,
                               via=f"{relation.type} {anchor[:8]}")
        return list(extra.values())

    def record_recall(self, hits: list[Hit], query: str, origin: str, at: float) -> None:
        """Access tracking and RecallEvent rows; best effort, never fails the search."""
        if getattr(self.db, "read_only", False):
            return  # opened read-only (a full disk): nothing can be recorded
        qhash = query_hash(query)
        try:
            with self.db.atomic():
                self.store.touch_accessed([h.memory.id for h in hits], at)
                self.store.models.RecallEvent.insert_many([
                    {"memory": h.memory.id, "query_hash": qhash, "rank": i, "score": h.score,
                     "origin": origin, "created_at": at}
                    for i, h in enumerate(hits, start=1)]).execute()
                if origin in USER_ORIGINS and hits:
                    # The query's words, redacted, once per hash: the shadow trial asks them again.
                    self.store.models.RecallQuery.insert(
                        query_hash=qhash, text=self.store.redactor.text(query)[:QUERY_TEXT_CHARS],
                        created_at=at).on_conflict_ignore().execute()
        except Exception as exc:  # a locked or read-only store must not fail a search
            log.warning("could not record access for %d results: %s", len(hits), exc)
