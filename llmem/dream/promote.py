"""Promotion: rank memories on their user recall signals and promote those past every gate.

score = 0.30 relevance + 0.24 frequency + 0.15 query diversity + 0.15 recency
      + 0.10 multi-day consolidation + 0.06 conceptual richness + phase boost (≤ 0.05)
Each signal is in [0, 1]. Only recalls with origin `search` or `mcp` count (and the
evidence a grounded backfill staged from dated notes, origin `grounded`): context injection
and dream itself re-surface memories without a user asking for them.

Recalls are counted per query context and per day, so that noise cannot pass the gates: a
burst — every recall within BURST_WINDOW of the burst's first one, whatever its queries — is
one query context (an agent searching around one task, or one search repeated, asks once);
the same query again on the same day adds nothing. `recalls` (frequency, `min_recall_count`)
counts distinct (day, query context) pairs, `unique_queries` (diversity,
`min_unique_queries`) the distinct query contexts, `recall_days` (consolidation) the distinct
days, in dream.timezone. Six searches within a minute are one recall of one query on one day.

Diary and report artefacts are never promoted (gate `grounded`, see artefacts.py), and a
shadow trial's verdict only moves a candidate in the ranking (verdicts.py), never past a gate.
A self_assessment the heuristics guessed from wording has one more gate, `evidence`: it is
promoted only when a stated assessment of its category exists or guesses come from two
sessions or more (taxonomy.enough_evidence), so a misread correction never becomes core.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from ..capture.taxonomy import enough_evidence, is_heuristic
from ..db.bulk import memory_rows_by_id
from ..db.models import EPISODE_SOURCE, USER_ORIGINS
from ..db.queries import metadata_equals, recall_bounds, recall_counts_outside, recall_rows
from ..times import days_between, now
from ..trust import EXTERNAL
from .artefacts import artefact_reason
from .text import distinct_terms
from .verdicts import ORDER_SHIFT, latest_verdicts

if TYPE_CHECKING:
    from ..config import DreamSettings

WEIGHTS = {"relevance": 0.30, "frequency": 0.24, "query_diversity": 0.15, "recency": 0.15,
           "consolidation": 0.10, "conceptual_richness": 0.06}
COUNTED_ORIGINS = (*USER_ORIGINS, "grounded")
BURST_WINDOW = 30 * 60  # seconds: recalls this close to a burst's first one are that burst
PHASE_BOOST_MAX = 0.05
PHASE_BOOST_HALF_LIFE_DAYS = 7.0
FREQUENCY_SATURATION = 20  # recalls at which frequency reaches 1
DIVERSITY_SATURATION = 5  # distinct queries at which diversity reaches 1
CONSOLIDATION_DAYS = 4  # distinct recall days at which consolidation reaches 1
RICHNESS_SATURATION = 12  # distinct concept terms at which richness reaches 1
RECENCY_HALF_LIFE_DAYS = 14.0

# Types an agent reads as rules to follow: never promoted from an untrusted origin alone.
INSTRUCTION_TYPES = ("procedure", "preference")


@dataclass
class Candidate:
    memory_id: str
    content: str
    memory_type: str
    project: str | None
    promoted_at: float | None
    invalidated_at: float | None
    content_hash: str = ""
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    recalls: int = 0  # distinct (day, query context) pairs
    unique_queries: int = 0  # distinct query contexts
    recall_days: int = 0
    mean_score: float = 0.0
    last_recall: float | None = None
    searches: int = 0  # raw counted recall rows, bursts and repeats included
    grounded: int = 0  # recalls staged from dated notes by a grounded backfill
    excluded_recalls: int = 0
    phase_hits: float = 0.0
    artefact: str | None = None  # why it is diary/report text, when it is
    shadow: dict[str, Any] | None = None  # the latest shadow-trial verdict
    # For a heuristic self_assessment: whether its category has evidence beyond it (else None).
    evidence: bool | None = None
    trust: str = "agent"  # whose words (llmem/trust.py)
    signals: dict[str, float] = field(default_factory=dict)
    score: float = 0.0
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)
    verdict: str = ""

    @property
    def passes(self) -> bool:
        return all(g["passed"] for g in self.gates.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id, "type": self.memory_type, "project": self.project,
            "content": self.content, "score": round(self.score, 4), "verdict": self.verdict,
            "signals": {k: {"value": round(v, 4), "weight": WEIGHTS.get(k),
                            "contribution": round(v * WEIGHTS[k], 4) if k in WEIGHTS else round(v, 4)}
                        for k, v in self.signals.items()},
            "gates": self.gates,
            "recalls": {"counted": self.recalls, "unique_queries": self.unique_queries,
                        "days": self.recall_days, "searches": self.searches, "grounded": self.grounded,
                        "mean_score": round(self.mean_score, 4),
                        "last": self.last_recall, "not_counted": self.excluded_recalls},
            "holding_gates": [name for name, gate in self.gates.items() if not gate["passed"]],
            "shadow": self.shadow,
        }

    @property
    def order_key(self) -> tuple[float, str]:
        """Best first: the score, moved by a fresh shadow verdict (which never opens a gate)."""
        shift = 0.0
        if self.shadow and not self.shadow.get("stale"):
            shift = ORDER_SHIFT.get(self.shadow.get("verdict"), 0.0)
        return (-(self.score + shift), self.memory_id)


@dataclass
class Evidence:
    """A memory's counted recalls, bursts and same-day repeats folded (see the module doc)."""

    recalls: int = 0
    unique_queries: int = 0
    days: int = 0
    mean_score: float = 0.0
    last: float | None = None
    searches: int = 0
    grounded: int = 0


def day_number(ts: float, zone: tzinfo | None) -> int:
    """The calendar day of a time in `zone` (None: the system's), as an ordinal."""
    return datetime.fromtimestamp(ts, zone).toordinal() if zone else datetime.fromtimestamp(ts).toordinal()


def fold_recalls(rows: list[tuple], zone: tzinfo | None = None) -> Evidence:
    """Evidence from one memory's (query_hash, created_at, score, origin) rows, oldest first."""
    contexts: dict[tuple[int, str], float] = {}
    grounded: set[tuple[int, str]] = set()
    burst_start = -math.inf
    burst_key = (0, "")
    for query, at, score, origin in rows:
        if at - burst_start >= BURST_WINDOW:
            burst_start, burst_key = at, (day_number(at, zone), query)
        contexts[burst_key] = max(contexts.get(burst_key, 0.0), max(0.0, min(1.0, float(score or 0.0))))
        if origin == "grounded":
            grounded.add(burst_key)
    if not contexts:
        return Evidence()
    return Evidence(recalls=len(contexts), unique_queries=len({q for _, q in contexts}),
                    days=len({d for d, _ in contexts}), mean_score=sum(contexts.values()) / len(contexts),
                    last=rows[-1][1], searches=len(rows), grounded=len(grounded))


def recall_zone(cfg: DreamSettings) -> tzinfo | None:
    """The zone recall days are counted in: dream.timezone, None for the system's (its
    rules, DST included). Grounded staging dates its recalls in the same zone."""
    name = cfg.timezone
    return ZoneInfo(name) if name else None


def recent_phase_hits(store, at: float, window_days: float = 28.0) -> dict[str, float]:
    """Light/REM appearances from recent applied runs, each weighted by how recent it is."""
    DreamRun = store.models.DreamRun
    hits: dict[str, float] = {}
    runs = (DreamRun.select().where((DreamRun.kind == "dream") & (DreamRun.status == "done")
                                    & (DreamRun.started_at >= at - window_days * 86400)))
    for run in runs:
        decay = 0.5 ** (days_between(at, run.started_at) / PHASE_BOOST_HALF_LIFE_DAYS)
        for memory_id, count in ((run.summary or {}).get("phase_hits") or {}).items():
            hits[memory_id] = hits.get(memory_id, 0.0) + count * decay
    return hits


def score_candidate(c: Candidate, at: float, cfg: DreamSettings) -> Candidate:
    recency = 0.0
    if c.last_recall:
        recency = 0.5 ** (days_between(at, c.last_recall) / RECENCY_HALF_LIFE_DAYS)
    c.signals = {
        "relevance": max(0.0, min(1.0, c.mean_score)),
        "frequency": min(1.0, math.log1p(c.recalls) / math.log1p(FREQUENCY_SATURATION)),
        "query_diversity": min(1.0, c.unique_queries / DIVERSITY_SATURATION),
        "recency": recency,
        "consolidation": min(1.0, max(0, c.recall_days - 1) / (CONSOLIDATION_DAYS - 1)),
        "conceptual_richness": min(1.0, len(distinct_terms(c.content)) / RICHNESS_SATURATION),
    }
    boost = min(PHASE_BOOST_MAX, PHASE_BOOST_MAX * (1 - math.exp(-c.phase_hits))) if c.phase_hits else 0.0
    c.signals["phase_boost"] = boost
    c.score = min(1.0, sum(c.signals[k] * w for k, w in WEIGHTS.items()) + boost)
    c.gates = {
        "min_score": {"value": round(c.score, 4), "required": cfg.min_score,
                      "passed": c.score >= cfg.min_score},
        "min_recall_count": {"value": c.recalls, "required": cfg.min_recall_count,
                             "passed": c.recalls >= cfg.min_recall_count},
        "min_unique_queries": {"value": c.unique_queries, "required": cfg.min_unique_queries,
                               "passed": c.unique_queries >= cfg.min_unique_queries},
    }
    if c.artefact:
        c.gates["grounded"] = {"value": c.artefact, "required": "a memory snippet, not diary or report text",
                               "passed": False}
    if c.trust == EXTERNAL and c.memory_type in INSTRUCTION_TYPES:
        # A procedure or preference that came from tool output, a web page or a project's file
        # is never promoted on recalls alone: a hostile README must not become a core rule.
        c.gates["trusted_origin"] = {"value": c.trust, "required": "the user's or the agent's words",
                                     "passed": False}
    if c.source == EPISODE_SOURCE:
        # An episode is a piece of the conversation: what was said, maybe later undone. Only
        # a typed memory (one the extraction or the dream's condensation made of it) is core.
        c.gates["typed"] = {"value": "an episode (conversation text)", "required": "a typed memory",
                            "passed": False}
    if c.evidence is not None:
        c.gates["evidence"] = {
            "value": "corroborated" if c.evidence else "heuristic guesses from one session",
            "required": "a stated self_assessment of the category, or guesses from 2 sessions",
            "passed": c.evidence}
    if c.invalidated_at:
        c.verdict = "not eligible: invalidated"
    elif c.artefact:
        c.verdict = f"not eligible: dream diary/report artefact ({c.artefact})"
    elif c.promoted_at:
        c.verdict = "already promoted"
    elif c.passes:
        c.verdict = "promote"
    else:
        failing = [name for name, gate in c.gates.items() if not gate["passed"]]
        c.verdict = "hold: fails " + ", ".join(failing)
    return c


def candidates(store, cfg: DreamSettings, *, at: float | None = None, memory_ids: list[str] | None = None,
               phase_hits: dict[str, float] | None = None) -> list[Candidate]:
    """Scored candidates, best first: memories with counted recalls (or exactly `memory_ids`)."""
    at = at or now()
    zone = recall_zone(cfg)
    grouped: dict[str, list[tuple]] = {}
    for memory_id, query, created_at, score, origin in recall_rows(store.db, COUNTED_ORIGINS, memory_ids):
        grouped.setdefault(memory_id, []).append((query, created_at, score, origin))
    wanted = list(memory_ids) if memory_ids is not None else list(grouped)
    hits = recent_phase_hits(store, at) if phase_hits is None else phase_hits
    Memory = store.models.Memory
    evidence: dict[tuple[str, str | None], bool] = {}
    out = []
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        others = recall_counts_outside(store.db, COUNTED_ORIGINS, chunk)
        verdicts = latest_verdicts(store, chunk)
        for memory in Memory.select().where(Memory.id.in_(chunk)):
            folded = fold_recalls(grouped.get(memory.id, []), zone)
            c = Candidate(memory.id, memory.content, memory.type, memory.project, memory.promoted_at,
                          memory.invalidated_at, content_hash=memory.content_hash, source=memory.source,
                          metadata=memory.metadata or {}, recalls=folded.recalls,
                          unique_queries=folded.unique_queries, recall_days=folded.days,
                          mean_score=folded.mean_score, last_recall=folded.last, searches=folded.searches,
                          grounded=folded.grounded, excluded_recalls=int(others.get(memory.id, 0)),
                          phase_hits=hits.get(memory.id, 0.0),
                          artefact=artefact_reason(memory.content, memory.metadata),
                          trust=memory.trust)
            if memory.type == "self_assessment" and is_heuristic(memory.metadata):
                key = (str((memory.metadata or {}).get("category")), memory.project)
                if key not in evidence:
                    evidence[key] = category_evidence(store, *key)
                c.evidence = evidence[key]
            verdict = verdicts.get(memory.id)
            if verdict is not None:
                c.shadow = {**verdict, "stale": verdict.get("content_hash") != memory.content_hash}
            score_candidate(c, at, cfg)
            if memory_ids is not None or (not c.invalidated_at and not c.promoted_at):
                out.append(c)
    out.sort(key=lambda c: c.order_key)
    return out


@dataclass
class RankedTop:
    """The best `top` candidates, exactly scored, and the counts over all of them."""

    top: list[Candidate]
    total: int  # valid, unpromoted memories with counted recalls
    ready: int  # of those, how many pass every gate


# The shortest a calendar day can be (a DST change): a span of time covers at most
# span // SHORTEST_DAY + 2 distinct days.
SHORTEST_DAY = 23 * 3600
# At most this many candidates scored per place ranked_top fills, beyond those that can pass.
SCORED_PER_PLACE = 3


def ranked_top(store, cfg: DreamSettings, *, top: int, at: float | None = None) -> RankedTop:
    """The first `top` places of `candidates`, and its counts, scoring only the memories
    that can matter (the Dreams page: scoring every one of 63k recalled memories at 100k took
    seconds). SQL bounds each recalled memory's score from above from its recall aggregates
    (db/queries.py recall_bounds) over the valid, unpromoted ones; folding only merges
    recalls, and a burst starts BURST_WINDOW after the last one at the earliest, so the
    span of a memory's recalls bounds its counted recalls and the days they fall on;
    relevance is at most the best score; richness, the phase boost and a helpful shadow
    verdict at most their caps. Candidates are scored best bound first until the `top`-th
    exact value beats every bound left (the places are then exactly `candidates`'), or
    SCORED_PER_PLACE × `top` were scored: held memories whose bounds cannot tell them apart
    (they differ in conceptual richness alone) are listed as the best of those scored. The
    counts are exact: every memory whose raw counts and bound can pass the gates is scored.
    """
    at = at or now()
    budget = max(SCORED_PER_PLACE * top, 150)
    frequency = [min(1.0, math.log1p(r) / math.log1p(FREQUENCY_SATURATION)) for r in range(FREQUENCY_SATURATION + 1)]
    total, bounds = recall_bounds(
        store.db, COUNTED_ORIGINS, at=at, weights=WEIGHTS, frequency=frequency, burst=float(BURST_WINDOW),
        shortest_day=float(SHORTEST_DAY), diversity=DIVERSITY_SATURATION, consolidation=CONSOLIDATION_DAYS,
        recency_half_life=RECENCY_HALF_LIFE_DAYS,
        constant=WEIGHTS["conceptual_richness"] + PHASE_BOOST_MAX + max(ORDER_SHIFT.values()) + 1e-9,
        top=budget, gates=(cfg.min_recall_count, cfg.min_unique_queries, cfg.min_score))
    hits = recent_phase_hits(store, at)
    scored: dict[str, Candidate] = {}

    def score(ids: list[str]) -> None:
        wanted = [i for i in ids if i not in scored]
        for start in range(0, len(wanted), 500):
            for c in candidates(store, cfg, at=at, memory_ids=wanted[start:start + 500], phase_hits=hits):
                scored[c.memory_id] = c

    ordered = [memory_id for memory_id, _, _ in bounds]
    position, step = 0, max(top, 50)
    while position < min(len(bounds), budget):
        score(ordered[position:position + step])
        position += step
        if len(scored) >= top and position < len(bounds):
            kth = sorted(c.order_key for c in scored.values())[top - 1]
            if -kth[0] > bounds[position][1]:
                break
    score([memory_id for memory_id, _, may_pass in bounds if may_pass])
    live = sorted((c for c in scored.values() if not c.invalidated_at and not c.promoted_at),
                  key=lambda c: c.order_key)
    return RankedTop(top=live[:top], total=total, ready=sum(1 for c in live if c.passes))


def category_evidence(store, category: str, project: str | None) -> bool:
    """Whether the valid self_assessments of a category (in a scope) make more than a guess."""
    Memory = store.models.Memory
    scope = Memory.project.is_null() if project is None else (
        (Memory.project == project) | Memory.project.is_null())
    rows = (Memory.select(Memory.metadata, Memory.session_id).where(
        (Memory.type == "self_assessment") & Memory.invalidated_at.is_null() & scope
        & metadata_equals(Memory.metadata, "category", category)))
    return enough_evidence((row.metadata, row.session_id) for row in rows)


def promotable(store, cfg: DreamSettings, *, limit: int | None = None, at: float | None = None,
               phase_hits: dict[str, float] | None = None) -> tuple[list[Candidate], list[Candidate]]:
    """(to promote, held back) among unpromoted valid memories."""
    ranked = candidates(store, cfg, at=at, phase_hits=phase_hits)
    chosen = [c for c in ranked if c.passes]
    if limit is not None:
        chosen = chosen[:limit]
    chosen_ids = {c.memory_id for c in chosen}
    return chosen, [c for c in ranked if c.memory_id not in chosen_ids]


def recheck(store, memory_id: str, ranked_hash: str) -> str | None:
    """Why a candidate ranked earlier must not be promoted now (None: promote it). Deep reads
    the memory again just before writing: one deleted, invalidated or edited since it was
    ranked is skipped rather than promoted on evidence about another text."""
    return recheck_many(store, [(memory_id, ranked_hash)]).get(memory_id)


def recheck_many(store, ranked: list[tuple[str, str]]) -> dict[str, str]:
    """memory_id → why not to promote it now, for the (memory_id, ranked content hash) pairs
    that fail `recheck`; read with one query per few hundred memories (db/bulk.py)."""
    names = ("invalidated_at", "promoted_at", "content_hash", "content", "metadata")
    rows = memory_rows_by_id(store.db, names, [memory_id for memory_id, _ in ranked])
    reasons = {}
    for memory_id, ranked_hash in ranked:
        row = rows.get(memory_id)
        reason = None
        if row is None:
            reason = "deleted since it was ranked"
        else:
            invalidated_at, promoted_at, stored_hash, content, metadata = row
            if invalidated_at:
                reason = "invalidated since it was ranked"
            elif promoted_at:
                reason = "already promoted"
            elif stored_hash != ranked_hash:
                reason = "its text changed since it was ranked (stale)"
            else:
                artefact = artefact_reason(content, json.loads(metadata) if metadata else {})
                reason = f"dream diary/report artefact ({artefact})" if artefact else None
        if reason:
            reasons[memory_id] = reason
    return reasons


def apply_promotions(store, journal, chosen: list[Candidate], at: float) -> tuple[list[Candidate], dict[str, str]]:
    """Promote each candidate that still holds (see `recheck`), through the journal; return
    (promoted, memory_id → why skipped). Call inside a transaction."""
    skipped = recheck_many(store, [(c.memory_id, c.content_hash) for c in chosen])
    promoted = [c for c in chosen if c.memory_id not in skipped]
    journal.update_many([("deep", "promote", c.memory_id, {"promoted_at": at}) for c in promoted])
    return promoted, skipped
