"""Hybrid search (SPEC §3): FTS5 bm25 + vector KNN, fused on calibrated evidence, priors as tie-breakers.

Each candidate gets a relevance in [0, 1] that means the same across queries: the lexical side
is the IDF-weighted share of the query's terms the memory holds (an identifier counts whole and
heavily, its parts weakly), the semantic side the cosine similarity mapped between what an
unrelated and a matching text score; the two combine so that one strong channel can carry a
memory alone. Confidence, type, age and chosen use only order memories within a narrow band of
relevance; a superseded memory ranks below its successor, an older one below a newer that
says nearly the same.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .db import vec
from .db.fts import (
    STOPWORDS,
    alternative_matches,
    counted_words,
    document_frequencies,
    index_tokens,
    match_alternatives,
    match_count,
    memory_count,
    newest_matches,
    parse_query,
    ranked_matches,
    ranked_matches_bound,
    semantic_text,
    stem_words,
    universal_terms,
)
from .db.models import EPISODE_SOURCE, USER_ORIGINS, Memory
from .db.queries import (
    CANDIDATE_COLUMNS,
    candidate_rows,
    memories_from_rows,
    memory_filter,
    memory_rows,
    next_turns,
    rank_signals,
    seqs_passing,
)
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
# The bm25 of a memory matched by universal terms only (`fts.universal_terms`), as FTS5 gives
# it (an IDF clamped to 1e-6): when nothing else matched they tie, and the fusion reads a tie.
TIED_BM25 = -1e-6
QUERY_TEXT_CHARS = 300  # of a user query kept for the shadow trial
# The semantic query leaves out words found in more than this share of the memories.
COMMON_WORD_SHARE = 0.30
# In hybrid mode the top lexical hit's vector is added to the query vector with this weight
# (pseudo-relevance feedback): it restates the query in the store's own words.
FEEDBACK_WEIGHT = 0.3
# A semantic candidate needs at least this share of the best candidate's cosine similarity.
SEMANTIC_FLOOR = 0.5
# An episode's final score is multiplied by this: a typed memory saying the same thing (the
# decision, not the turn it was taken in) ranks above it, and episodes still rank among
# themselves by relevance. Kept a plain factor until ranking is reworked.
EPISODE_PRIOR = 0.85
# The semantic channel: a logistic of MiniLM's cosine similarity, 0.5 at COSINE_MIDPOINT (LoCoMo dev
# MRR 0.472 at 0.45, 0.484 at 0.50; the coding set alike)
# (~0.08 for an unrelated text at 0.2, ~0.84 for a match at 0.7). Strictly increasing, so
# the vectors' own order survives among strong matches (a clip at the top tied them). Its
# scale: at 0.08 a cosine 0.05 higher outweighed a lexical share twice as large (the release
# tag above the database it was asked about); bench/ranking.py tuning MRR 0.864 at 0.08,
# 0.869 at 0.10, 0.875 at 0.12, 0.873 at 0.14; LoCoMo dev R@5/MRR 0.595/0.509 → 0.593/0.511.
COSINE_MIDPOINT = 0.50
COSINE_SCALE = 0.12
# bm25's share of the lexical channel: it orders memories that hold the same share of the query.
BM25_SHARE = 0.2
# Every query term weighs this much besides its IDF: in a store of a few memories a word they
# all hold has an IDF near 0 and the share would be decided by the words none holds.
TERM_WEIGHT = 0.5
# An identifier weighs this many times its rarest token's IDF; an identifier's parts this share.
ATOM_WEIGHT = 2.0
PART_WEIGHT = 0.3
# An identifier's tokens found without its spelling (`release` for `--release`) keep this share.
SPELLING_SHARE = 0.5
# The share of the final score the priors (confidence, type, age, chosen use) hold: enough to
# order memories of near-equal relevance, never enough to lift a weaker match over a clear one.
PRIOR_WEIGHT = 0.06
# A memory superseded by a valid one keeps this share of its score (and ranks below it).
SUPERSEDED_FACTOR = 0.6
# Two memories of one project and type this similar (cosine) say the same thing: the newer wins,
# when it is not much less relevant (CONFLICT_BAND). MiniLM, bench/ranking.py's set: an old and
# a new decision on one subject 0.67-0.88, two distinct memories of one project and type ≤ 0.70.
CONFLICT_COSINE = 0.75
CONFLICT_BAND = 0.25
# ...or the newer holds this IDF-weighted share of the older's words. bench/ranking.py's set: an
# old and a new decision on one subject 0.61-0.86, any other two of one project and type ≤ 0.44.
CONFLICT_WORDS = 0.55
# The kinds of memory a newer one replaces (an event or a conversation's turn stays true).
REPLACEABLE_TYPES = frozenset(["decision", "fact", "preference", "procedure", "project_state"])
# A turn of a conversation that asks a question holds the question, not its answer: it keeps
# QUESTION_FACTOR of its score, and the next turn of its session (the reply) gets REPLY_SHARE of
# the score it had, when that is more than its own. It applies to the REPLY_DEPTH best hits.
# LoCoMo dev (the answer is the reply to a turn that asks what the question asks):
# R@5/MRR 0.593/0.511 → 0.64/0.56 with 0.8 and 0.9; replies alone 0.63/0.53, the factor alone 0.60/0.52.
QUESTION_FACTOR = 0.8
REPLY_SHARE = 0.9
REPLY_DEPTH = 10
CONVERSATION_TYPE = "conversation"
MAX_STEMS = 100_000  # words a Searcher keeps stemmed (a few MB)


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
    blend: float = 0.3  # kept for the config's rerank_blend; the priors' share is PRIOR_WEIGHT
    min_relevance: float = 0.0
    # How much agreement of both channels adds: 0 keeps the stronger, 1 is a noisy-or.
    # bench/ranking.py tuning split: 0 → MRR 0.795, 0.5 → 0.807, 1 → 0.827 (LoCoMo alike).
    both_weight: float = 1.0
    feedback: float = 0.0  # pseudo-relevance feedback weight (FEEDBACK_WEIGHT was 0.3)
    # semantic_text's common-word rule. At 0.10 it dropped "tests", "api", a project's name from
    # coding questions (paraphrase MRR 0.59 → 0.48 on bench/ranking.py); at 0.30 it still drops
    # a chat's speaker names (LoCoMo dev R@5 0.521 → 0.578) and leaves coding words alone.
    common_share: float = COMMON_WORD_SHARE
    cosine_midpoint: float = COSINE_MIDPOINT  # here to be measured with bench --set
    cosine_scale: float = COSINE_SCALE
    bm25_share: float = BM25_SHARE


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
    relevance: float = 0.0  # calibrated, in [0, 1]
    lexical: float = 0.0
    semantic: float = 0.0
    superseded_by: str | None = None  # id of the valid memory that replaced this one

    def explain(self) -> dict[str, Any]:
        """Every score component by name, in the order `llmem search --explain` prints them."""
        return {"fts_rank": self.fts_rank, "bm25": self.fts_bm25, "vec_rank": self.vec_rank,
                "cosine_distance": self.vec_distance, "lexical": self.lexical, "semantic": self.semantic,
                "relevance": self.relevance, "prior": self.signal, **self.components,
                "superseded_by": self.superseded_by, "final": self.score}


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


def memory_prior(mtype: str, confidence: float | None, created_at: float, chosen_uses: int,
                 at: float) -> tuple[float, dict[str, float]]:
    """The tie-breaker in [0, 1]: confidence, type priority, age since created (counted even
    with tracking off) and how often someone chose it (never automatic injections)."""
    confidence = float(confidence or 0.0)
    priority = TYPE_PRIORITY.get(mtype, 1.0)
    freshness = math.exp(-days_between(at, created_at) / 180.0)
    use = 1.0 - math.exp(-chosen_uses / 5.0)
    prior = 0.35 * confidence + 0.25 * (priority - 0.7) / 0.5 + 0.25 * freshness + 0.15 * use
    return prior, {"confidence": confidence, "type_priority": priority, "freshness": freshness,
                   "chosen_uses": float(chosen_uses)}


def _above_floor(nearest: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The nearest (seq, cosine distance) down to SEMANTIC_FLOOR of the best one's similarity."""
    if not nearest:
        return nearest
    # Every memory has *some* cosine similarity to the query: without a floor, a small
    # store puts all of them in the list, and fusion then treats the unrelated as evidence.
    floor = SEMANTIC_FLOOR * (1.0 - nearest[0][1])
    return [(s, d) for s, d in nearest if 1.0 - d >= floor]


_COLUMN = {name: i for i, name in enumerate(CANDIDATE_COLUMNS)}
_SEQ, _ID, _TYPE, _CONTENT, _SUMMARY, _HINTS = (_COLUMN[c] for c in ("seq", "id", "type", "content", "summary",
                                                                     "hints"))
_CONFIDENCE, _CREATED_AT, _SOURCE, _PASSES = (_COLUMN[c] for c in ("confidence", "created_at", "source", "passes"))


class _CandidateRows:
    """The rows (db/queries.py candidate_rows) of a search's candidates, each read once: the
    vector candidates' filter check and the rerank both read them."""

    def __init__(self, db, where: str, params: list):
        self.db, self.where, self.params = db, where, params
        self._rows: dict[int, tuple] = {}
        self._asked: set[int] = set()  # read, found or not

    def load(self, seqs) -> None:
        missing = [s for s in dict.fromkeys(seqs) if s not in self._asked]
        if missing:
            self._asked.update(missing)
            self._rows.update((row[_SEQ], row) for row in candidate_rows(self.db, missing, self.where, self.params))

    def passing(self, seqs) -> set[int]:
        """Those of `seqs` (loaded) that exist and pass the search's filters."""
        return {s for s in seqs if (row := self._rows.get(s)) is not None and row[_PASSES]}

    def get(self, seq: int) -> tuple | None:
        return self._rows.get(seq)


class _LexicalPlan(NamedTuple):
    """A query's lexical terms, stemmed: atoms (phrases of tokens), words, atom parts, and
    each atom as written (`--release`)."""

    atoms: list[tuple[str, ...]]
    words: list[str]
    parts: list[str]
    spelled: dict[tuple[str, ...], str]

    @property
    def terms(self) -> list[str]:
        """Every single term the plan weighs, once."""
        return list(dict.fromkeys([*(t for atom in self.atoms for t in atom), *self.words, *self.parts]))


class _Stems:
    """Index tokens and their stems as this store's index stems them, kept across searches
    (the rerank stems the words of ~100 memories a search: 1 ms of CPU at 100k, loaded), and
    each stem's forms seen so far (the words of a query term are looked up, not found by
    stemming every word again)."""

    def __init__(self):
        self.stems: dict[str, str] = {}
        # Tuples, not sets: a tuple of strings leaves the garbage collector's lists, and tens
        # of thousands of sets would be walked by every full collection.
        self.forms: dict[str, tuple[str, ...]] = {}

    def add(self, db, words: set[str]) -> None:
        """Stem the words of `words` not stemmed yet, all of them at once (set operations run in C)."""
        if len(self.stems) > MAX_STEMS:
            self.stems.clear()
            self.forms.clear()
        new = list(words.difference(self.stems))
        for word, stem in zip(new, stem_words(db, new), strict=True):
            self.stems[word] = stem
            self.forms[stem] = (*self.forms.get(stem, ()), word)

    def forms_of(self, stems) -> set[str]:
        """Every word seen whose stem is one of `stems`."""
        return set().union(*(self.forms.get(stem, ()) for stem in stems))


class _LexicalScorer:
    """The lexical channel of one query: the IDF-weighted share of the query a memory holds."""

    def __init__(self, plan: _LexicalPlan, frequencies: tuple[int, dict[str, int]]):
        total, df = frequencies

        def idf(term: str) -> float:
            # A word no memory holds weighs as one held once: it cannot tell memories apart, and
            # in a small store its full weight would outweigh every word the memories do hold.
            n = max(df.get(term, 0), 1)
            return TERM_WEIGHT + math.log(1.0 + (total - n + 0.5) / (n + 0.5))

        self.spelled = plan.spelled
        wanted = [(atom, ATOM_WEIGHT * max(idf(t) for t in atom)) for atom in dict.fromkeys(plan.atoms)]
        wanted += [((w,), idf(w)) for w in plan.words]
        wanted += [((p,), PART_WEIGHT * idf(p)) for p in plan.parts]
        self.wanted = wanted
        self.whole = sum(weight for _, weight in wanted)
        self.query_stems = {t for atom, _ in wanted for t in atom}
        self._stems: dict[str, str] = {}
        self._matching: set[str] = set()

    def read_with(self, stemmed: _Stems) -> None:
        """Take the stems of the candidates' words: those whose stem is a query term are the
        only words a memory's score reads."""
        self._stems = stemmed.stems
        self._matching = stemmed.forms_of(self.query_stems)

    def score(self, words: list[str], content: str, summary: str | None) -> float:
        """The share of the query held by a memory of index tokens `words` (of `read_with`'s
        vocabulary) and text `content`, `summary`."""
        if not self.whole:
            return 0.0
        matching = self._matching.intersection(words)
        if not matching:
            return 0.0
        stems = self._stems
        present = {stems[w] for w in matching}
        tokens = None
        text = None
        held = 0.0
        for atom, weight in self.wanted:
            if len(atom) == 1:
                if atom[0] not in present:
                    continue
            else:
                if not all(t in present for t in atom):
                    continue
                if tokens is None:
                    tokens = [stems[w] for w in words]
                if not _holds_run(tokens, atom):
                    continue
            if atom in self.spelled:
                if text is None:
                    text = f"{content} {summary or ''}".lower()
                if self.spelled[atom] not in text:
                    weight *= SPELLING_SHARE  # `release` of "a release" is not `--release`
            held += weight
        return held / self.whole


def _holds_run(tokens: list[str], run: tuple[str, ...]) -> bool:
    """Whether `run` appears in `tokens` as consecutive tokens (an identifier, whole)."""
    n = len(run)
    return any(tuple(tokens[i:i + n]) == run for i, t in enumerate(tokens) if t == run[0])


class Searcher:
    """Runs searches over one store with one embedder."""

    def __init__(self, store, embedder: Embedder | None):
        self.store = store
        self.db = store.db
        self.embedder = embedder
        self._stems = _Stems()

    # ---- candidate lists -------------------------------------------------------------

    def _filters(self, opts: SearchOptions, at: float) -> tuple[str, list[Any]]:
        return memory_filter(memory_type=opts.memory_type, project=opts.project,
                             include_invalid=opts.include_invalid, valid_only=opts.valid_only, at=at)

    def fts_candidates(self, query: str, depth: int, where: str, params: list,
                       known: dict[str, int] | None = None) -> list[tuple[int, float]]:
        """(seq, bm25) best first; bm25 is negative, lower is better.

        The filters apply to the best-ranked matches only (`fts.ranked_matches`); when they
        drop too many, it looks deeper. `known`: document frequencies the caller read already
        (`fts.alternative_matches`).
        """
        alternatives = match_alternatives(query)
        if not alternatives:
            return []
        universal = universal_terms(self.db, alternatives)
        telling = [a for a in alternatives if a not in universal]
        rows = self._bounded_ranking(telling, depth, where, params, known) if telling else []
        if len(rows) < depth and universal:
            # What only the universal terms match ties at bm25 ~0 however it is ranked: the
            # newest fill the list, read without scoring every match.
            tied = TIED_BM25 if not rows else 0.0
            seen = {seq for seq, _ in rows}
            fill = newest_matches(self.db, " OR ".join(sorted(universal)), depth, where, params)
            rows += [(seq, tied) for seq in fill if seq not in seen][:depth - len(rows)]
        return rows

    def _bounded_ranking(self, alternatives: list[str], depth: int, where: str, params: list,
                         known: dict[str, int] | None = None) -> list[tuple[int, float]]:
        """(seq, bm25) of the `depth` best matches of the alternatives OR-ed, best first, bm25
        scoring about `fts.ranked_matches_bound` of their matches at most.

        bm25 costs FTS5 ~1.3 µs for every match it scores (80 ms for a query of three words
        in 2-4% of 1M memories each), 15x what reading the matches costs. The rarest
        alternatives, up to that many matches together (at least the rarest one), are
        ranked over every match; the memories holding one of them and a common one as well
        are ranked with the common ones' weight added, and so are those holding every common
        one: each of these rankings is FTS5's own bm25 over every phrase the memory holds, so
        the best of a memory holding any rare alternative are the exact ones. What holds only
        some of the common ones is left out (bench/search.py at 1M: bm25's top 10 kept 0.95 of
        the time, at a third of the CPU)."""
        expression = " OR ".join(alternatives)
        bound = ranked_matches_bound(self.db)
        if bound is None or memory_count(self.db) <= bound or len(alternatives) < 2:
            return self._ranked(expression, depth, where, params)
        matches = alternative_matches(self.db, alternatives, known)
        order = sorted(range(len(alternatives)), key=lambda i: matches[i])
        rare, held = [], 0
        for i in order:
            if rare and held + matches[i] > bound:
                break
            rare.append(alternatives[i])
            held += matches[i]
        if len(rare) == len(alternatives):
            return self._ranked(expression, depth, where, params)
        common = [a for a in alternatives if a not in rare]
        either = " OR ".join(rare)
        expressions = [either, f"({either}) AND ({' OR '.join(common)})"]
        if len(common) > 1:
            expressions.append(" AND ".join(common))
        best: dict[int, float] = {}
        for part in expressions:
            for seq, bm25 in self._ranked(part, depth, where, params):
                best[seq] = min(bm25, best.get(seq, bm25))
        return sorted(best.items(), key=lambda p: (p[1], p[0]))[:depth]

    def _ranked(self, expression: str, depth: int, where: str, params: list) -> list[tuple[int, float]]:
        fetch = depth if where == "1" else depth * 2
        matches = None
        while True:
            rows = ranked_matches(self.db, expression, BM25_WEIGHTS, fetch, where, params)
            if len(rows) >= depth or where == "1" or fetch >= MAX_FTS_FETCH:
                return rows[:depth]
            if matches is None:
                matches = match_count(self.db, expression, MAX_FTS_FETCH)
            if matches <= fetch:
                return rows[:depth]  # every match was seen: the filters just keep few of them
            # Deep enough at once for the share the filters kept (each pass ranks every match
            # again: a 1-in-50 project at 100k took four, 27 ms of CPU), twice over for luck;
            # when they kept none, the share is below one in `fetch`.
            wanted = fetch * 16 if not rows else math.ceil(2 * depth * fetch / len(rows))
            fetch = min(matches, MAX_FTS_FETCH, max(wanted, fetch * 4))

    def vector_candidates(self, query_vector, depth: int, where: str, params: list) -> list[tuple[int, float]]:
        """(seq, cosine distance) best first, filtered, down to SEMANTIC_FLOOR of the best."""
        return _above_floor(self._nearest(query_vector, depth, where, params))

    def _nearest(self, query_vector, depth: int, where: str, params: list) -> list[tuple[int, float]]:
        """(seq, cosine distance) best first, filtered: one scan of the vector file."""
        pending = self._begin_nearest(query_vector, depth)
        return pending.finish(self.db, where, params) if pending is not None else []

    def _begin_nearest(self, query_vector, depth: int, *, background: bool = False):
        """The KNN begun (`vector_file.begin_nearest`): None when nothing is embedded with
        this model yet."""
        model, dim = vec.index_state(self.db)
        if model != self.embedder.identity or dim != len(query_vector):
            return None
        from .db import vector_file  # numpy comes with it: FTS-only searches never load it

        return vector_file.begin_nearest(self.db, query_vector, depth, model, dim, background=background)

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

        embeds = mode in ("hybrid", "semantic") and self.embedder is not None and self.embedder.available
        # Redacted before it is re-tokenised: `sk-proj-…` split into words no longer matches
        # its pattern when the embedder redacts what it sends.
        safe_query = self.store.redactor.text(query) if embeds else None
        plan = self._lexical_plan(query) if mode in ("hybrid", "fts") else None
        # The document frequencies of every term the search weighs, read once: the semantic
        # query's common words and the lexical channel's IDF.
        counted = counted_words(safe_query) if embeds and opts.common_share > 0 else []
        terms = list(dict.fromkeys([*(plan.terms if plan else ()), *stem_words(self.db, counted)]))
        frequencies = document_frequencies(self.db, terms) if terms else None

        query_vector = semantic_query = None
        if mode in ("hybrid", "semantic"):
            if not embeds:
                if mode == "semantic":
                    raise UsageError("semantic search needs an embedder (embedding.provider is none)",
                                     hint="configure embedding.provider, or use --fts-only")
                mode, notice = "fts", "no embedder configured: searching with FTS only"
            else:
                try:
                    semantic_query = (semantic_text(self.db, safe_query, share=opts.common_share,
                                                    frequencies=frequencies)
                                      if opts.common_share > 0 else safe_query)
                    query_vector = self.embedder.embed_query(semantic_query)
                except EmbedderUnavailable as exc:
                    if mode == "semantic":
                        raise
                    mode, notice = "fts", f"embedder unavailable ({exc.message}): searching with FTS only"
                    plan = plan or self._lexical_plan(query)

        keywords = mode in ("hybrid", "fts")
        feedback = keywords and opts.feedback > 0  # the vector query waits for the top keyword hit
        pending = None
        if query_vector is not None and not feedback:
            # The scan runs in a thread while this one runs the FTS query (both release the GIL).
            pending = self._begin_nearest(query_vector, depth, background=keywords)
        # The terms whose frequencies were read above, absent ones at 0: the keyword ranking
        # reads only the others.
        known = {term: frequencies[1].get(term, 0) for term in terms} if frequencies else None
        fts_list = self.fts_candidates(query, depth, where, params, known) if keywords else []
        if fts_list and query_vector is not None and feedback:
            query_vector = self._with_feedback(query_vector, fts_list[0][0], opts.feedback)
        if query_vector is not None and feedback:
            pending = self._begin_nearest(query_vector, depth)
        rows = _CandidateRows(self.db, where, params)

        def passing(seqs: list[int]) -> set[int]:
            # The vector candidates' filter check, in the query that reads the keyword
            # candidates' rows too: one statement for both.
            rows.load([*(seq for seq, _ in fts_list), *seqs])
            return rows.passing(seqs)

        vec_list = _above_floor(pending.finish(self.db, where, params, passing)) if pending is not None else []
        if mode == "hybrid" and query_vector is not None and not vec_list and fts_list:
            notice = "no memory is embedded with this model yet: run `llmem embed --pending`"

        if plan is not None and frequencies is None:  # a fallback to keywords after the count
            frequencies = document_frequencies(self.db, plan.terms)
        lexical = self._lexical_scorer(plan, frequencies) if keywords and plan is not None else None
        hits = self._fuse_and_rerank(fts_list, vec_list, rows, lexical, opts, at)
        hits = self._with_replies(hits, where, params)
        hits = [h for h in hits if h.relevance >= opts.min_relevance][:opts.limit]
        Memory = self.store.models.Memory
        memories = {m.seq: m for m in memories_from_rows(Memory, memory_rows(self.db, [h.seq for h in hits]))}
        hits = [h for h in hits if h.seq in memories]  # deleted meanwhile
        for hit in hits:
            hit.memory = memories[hit.seq]
        self._newer_first(hits, opts.include_invalid)
        if opts.related and hits:
            hits += self._related(hits, opts, where, params)
        if opts.track and hits:
            self.record_recall(hits, query, opts.origin, at)
        return SearchResult(hits, mode, notice,
                            semantic_query if semantic_query not in (None, query) else None)

    def _with_feedback(self, query_vector, seq: int, weight: float):
        """The query vector nudged towards the top lexical hit's vector (when it has one)."""
        stored = vec.stored_vector(self.db, seq, self.embedder.identity, len(query_vector))
        if stored is None:
            return query_vector
        return vec.normalize(query_vector + weight * stored)

    def _fuse_and_rerank(self, fts_list, vec_list, rows: _CandidateRows, lexical, opts: SearchOptions,
                         at: float) -> list[Hit]:
        fused: dict[int, list] = {}  # seq -> [fts_rank, bm25, vec_rank, distance]
        for rank, (seq, bm25) in enumerate(fts_list, start=1):
            fused[seq] = [rank, bm25, None, None]
        for rank, (seq, distance) in enumerate(vec_list, start=1):
            entry = fused.setdefault(seq, [None, None, None, None])
            entry[2], entry[3] = rank, distance
        if not fused:
            return []
        rows.load(list(fused))
        best_bm25 = min((bm25 for _, bm25 in fts_list), default=-1.0) or -1.0  # negative: lower is better
        candidates = [(seq, row) for seq in fused if (row := rows.get(seq)) is not None]
        uses, replaced = rank_signals(self.db, [row[_ID] for _, row in candidates], USER_ORIGINS)
        words_of = ([index_tokens(row[_CONTENT], row[_SUMMARY], row[_HINTS]) for _, row in candidates]
                    if lexical else [])
        if lexical:
            self._stems.add(self.db, set().union(*words_of))
            lexical.read_with(self._stems)
        bm25_share, both_weight = opts.bm25_share, opts.both_weight
        midpoint, scale = opts.cosine_midpoint, opts.cosine_scale
        hits = []
        for i, (seq, row) in enumerate(candidates):
            fts_rank, bm25, vec_rank, distance = fused[seq]
            content, mtype = row[_CONTENT], row[_TYPE]
            lex = 0.0
            if lexical:
                lex = lexical.score(words_of[i], content, row[_SUMMARY])
                if bm25 is not None:
                    lex *= (1 - bm25_share) + bm25_share * bm25 / best_bm25
            sem = 0.0
            if distance is not None:
                sem = 1.0 / (1.0 + math.exp(-((1.0 - distance) - midpoint) / scale))
            strong, weak = (lex, sem) if lex >= sem else (sem, lex)
            relevance = strong + both_weight * weak * (1.0 - strong)
            prior, components = memory_prior(mtype, row[_CONFIDENCE], row[_CREATED_AT], uses.get(row[_ID], 0), at)
            score = (1 - PRIOR_WEIGHT) * relevance + PRIOR_WEIGHT * prior
            if row[_SOURCE] == EPISODE_SOURCE:
                score *= EPISODE_PRIOR
                components["episode_prior"] = EPISODE_PRIOR
            if mtype == CONVERSATION_TYPE and content.rstrip().endswith("?"):
                components["asked_score"] = score
                score *= QUESTION_FACTOR
                components["question_factor"] = QUESTION_FACTOR
            successor = replaced.get(row[_ID])
            if successor:
                score *= SUPERSEDED_FACTOR
                components["superseded_factor"] = SUPERSEDED_FACTOR
            hits.append(Hit(memory=None, seq=seq, score=score, fts_rank=fts_rank, fts_bm25=bm25,
                            vec_rank=vec_rank, vec_distance=distance, signal=prior, components=components,
                            relevance=relevance, lexical=lex, semantic=sem, superseded_by=successor))
        hits.sort(key=lambda h: (-h.score, h.seq))
        return hits

    def _with_replies(self, hits: list[Hit], where: str, params: list) -> list[Hit]:
        """`hits` with the replies to the best question-shaped turns raised (or added) to
        REPLY_SHARE of the question's score and relevance, best first again."""
        asked = [h for h in hits[:REPLY_DEPTH] if "asked_score" in h.components]
        replies = next_turns(self.db, [h.seq for h in asked], where, params)
        if not replies:
            return hits
        by_seq = {h.seq: h for h in hits}
        for question in asked:
            seq = replies.get(question.seq)
            if seq is None:
                continue
            score = REPLY_SHARE * question.components["asked_score"]
            reply = by_seq.get(seq)
            if reply is None:
                reply = by_seq[seq] = Hit(memory=None, seq=seq, score=0.0)
                hits.append(reply)
            if score > reply.score:
                reply.score = score
                reply.relevance = max(reply.relevance, REPLY_SHARE * question.relevance)
                reply.components["reply_to"] = question.seq
        hits.sort(key=lambda h: (-h.score, h.seq))
        return hits

    def _lexical_plan(self, query: str) -> _LexicalPlan:
        """The query's atoms, words and atom parts, stemmed as the index stems (`linting`
        finds `lint`)."""
        parsed = parse_query(query)

        def stem(words) -> tuple[str, ...]:
            return tuple(stem_words(self.db, list(words)))

        atoms = [stem(atom) for atom in parsed.atoms]
        words = list(dict.fromkeys(stem(parsed.words)))
        parts = [p for p in dict.fromkeys(stem(parsed.parts)) if p not in words]
        return _LexicalPlan(atoms, words, parts, dict(zip(atoms, parsed.spelled, strict=True)))

    def _lexical_scorer(self, plan: _LexicalPlan, frequencies: tuple[int, dict[str, int]]) -> _LexicalScorer:
        return _LexicalScorer(plan, frequencies)

    def _newer_first(self, hits: list[Hit], include_invalid: bool) -> None:
        """Among the results, a memory another one supersedes gives its place to it, and so
        does the older of two memories of one project and type that say nearly the same (a
        replaceable kind: a decision or a fact is replaced, an event or a turn of a
        conversation is not): the current one is the answer to what the query matched."""
        order = {h.memory.id: i for i, h in enumerate(hits)}
        moves: list[tuple[Hit, Hit]] = []
        for hit in hits:
            successor = hit.superseded_by
            if successor in order and order[successor] > order[hit.memory.id]:
                moves.append((hit, hits[order[successor]]))
        replaceable = [h for h in hits if not is_episode(h.memory) and h.memory.type in REPLACEABLE_TYPES]
        pairs = [(older, newer) for i, older in enumerate(replaceable) for newer in replaceable[i + 1:]
                 if older.memory.project == newer.memory.project and older.memory.type == newer.memory.type
                 and older.memory.created_at < newer.memory.created_at
                 and older.relevance - newer.relevance < CONFLICT_BAND]
        if pairs:
            restates = self._restatement(pairs)
            for older, newer in pairs:
                if restates(older, newer):
                    older.components["newer_wins"] = newer.seq
                    moves.append((older, newer))
        for demoted, current in moves:
            at, below = hits.index(demoted), hits.index(current)
            if at < below:  # the current one takes the place the replaced one had
                hits.remove(current)
                hits.insert(at, current)
                current.score, demoted.score = max(current.score, demoted.score), min(current.score, demoted.score)

    def _restatement(self, pairs: list[tuple[Hit, Hit]]):
        """Whether a newer hit says what an older one says: their vectors are CONFLICT_COSINE
        alike, or the newer holds CONFLICT_WORDS of the older's words, IDF-weighted
        (`X moved its events from RabbitMQ to Kafka` restates `X publishes its events to
        RabbitMQ` at cosine 0.67)."""
        hits = list({h.seq: h for pair in pairs for h in pair}.values())
        vectors = {}
        if self.embedder is not None:
            model, dim = vec.index_state(self.db)
            if model == self.embedder.identity:
                vectors = vec.stored_vectors(self.db, [h.seq for h in hits], model, dim)
        words = {h.seq: set(stem_words(self.db, [t for t in index_tokens(h.memory.content) if t not in STOPWORDS]))
                 for h in hits}
        older_words = set().union(*(words[older.seq] for older, _ in pairs))
        total, df = document_frequencies(self.db, sorted(older_words))

        def idf(term: str) -> float:
            n = df.get(term, 0)
            return math.log(1.0 + (total - n + 0.5) / (n + 0.5))

        def restates(older: Hit, newer: Hit) -> bool:
            a, b = vectors.get(older.seq), vectors.get(newer.seq)
            if a is not None and b is not None and float(a @ b) >= CONFLICT_COSINE:
                return True
            held = words[older.seq]
            whole = sum(idf(t) for t in held)
            return whole > 0 and sum(idf(t) for t in held & words[newer.seq]) / whole >= CONFLICT_WORDS

        return restates

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
