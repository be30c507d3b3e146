"""Promotion: rank memories on their user recall signals and promote those past every gate.

score = 0.30 relevance + 0.24 frequency + 0.15 query diversity + 0.15 recency
      + 0.10 multi-day consolidation + 0.06 conceptual richness + phase boost (≤ 0.05)
Each signal is in [0, 1]. Only recalls with origin `search` or `mcp` count: context
injection and dream itself re-surface memories without a user asking for them.
A self_assessment the heuristics guessed from wording has one more gate, `evidence`: it is
promoted only when a stated assessment of its category exists or guesses come from two
sessions or more (taxonomy.enough_evidence), so a misread correction never becomes core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..capture.taxonomy import enough_evidence, is_heuristic
from ..db.queries import metadata_value, recall_totals
from ..times import days_between, now
from .text import distinct_terms

WEIGHTS = {"relevance": 0.30, "frequency": 0.24, "query_diversity": 0.15, "recency": 0.15,
           "consolidation": 0.10, "conceptual_richness": 0.06}
USER_ORIGINS = ("search", "mcp")
PHASE_BOOST_MAX = 0.05
PHASE_BOOST_HALF_LIFE_DAYS = 7.0
FREQUENCY_SATURATION = 20  # recalls at which frequency reaches 1
DIVERSITY_SATURATION = 5  # distinct queries at which diversity reaches 1
CONSOLIDATION_DAYS = 4  # distinct recall days at which consolidation reaches 1
RICHNESS_SATURATION = 12  # distinct concept terms at which richness reaches 1
RECENCY_HALF_LIFE_DAYS = 14.0


@dataclass
class Candidate:
    memory_id: str
    content: str
    memory_type: str
    project: str | None
    promoted_at: float | None
    invalidated_at: float | None
    recalls: int = 0
    unique_queries: int = 0
    recall_days: int = 0
    mean_score: float = 0.0
    last_recall: float | None = None
    excluded_recalls: int = 0
    phase_hits: float = 0.0
    # For a heuristic self_assessment: whether its category has evidence beyond it (else None).
    evidence: bool | None = None
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
            "recalls": {"user": self.recalls, "unique_queries": self.unique_queries,
                        "days": self.recall_days, "mean_score": round(self.mean_score, 4),
                        "last": self.last_recall, "not_counted": self.excluded_recalls},
        }


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


def score_candidate(c: Candidate, at: float, cfg: dict[str, Any]) -> Candidate:
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
        "min_score": {"value": round(c.score, 4), "required": cfg["min_score"],
                      "passed": c.score >= cfg["min_score"]},
        "min_recall_count": {"value": c.recalls, "required": cfg["min_recall_count"],
                             "passed": c.recalls >= cfg["min_recall_count"]},
        "min_unique_queries": {"value": c.unique_queries, "required": cfg["min_unique_queries"],
                               "passed": c.unique_queries >= cfg["min_unique_queries"]},
    }
    if c.evidence is not None:
        c.gates["evidence"] = {
            "value": "corroborated" if c.evidence else "heuristic guesses from one session",
            "required": "a stated self_assessment of the category, or guesses from 2 sessions",
            "passed": c.evidence}
    if c.invalidated_at:
        c.verdict = "not eligible: invalidated"
    elif c.promoted_at:
        c.verdict = "already promoted"
    elif c.passes:
        c.verdict = "promote"
    else:
        failing = [name for name, gate in c.gates.items() if not gate["passed"]]
        c.verdict = "hold: fails " + ", ".join(failing)
    return c


def candidates(store, cfg: dict[str, Any], *, at: float | None = None, memory_ids: list[str] | None = None,
               phase_hits: dict[str, float] | None = None) -> list[Candidate]:
    """Scored candidates, best first: memories with user recalls (or exactly `memory_ids`)."""
    at = at or now()
    rows = {r[0]: r for r in recall_totals(store.db, USER_ORIGINS, memory_ids)}
    wanted = list(memory_ids) if memory_ids is not None else [k for k, r in rows.items() if r[1]]
    hits = recent_phase_hits(store, at) if phase_hits is None else phase_hits
    Memory = store.models.Memory
    evidence: dict[tuple[str, str | None], bool] = {}
    out = []
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        for memory in Memory.select().where(Memory.id.in_(chunk)):
            r = rows.get(memory.id) or (memory.id, 0, 0, 0, None, None, 0)
            c = Candidate(memory.id, memory.content, memory.type, memory.project, memory.promoted_at,
                          memory.invalidated_at, recalls=int(r[1] or 0), unique_queries=int(r[2] or 0),
                          recall_days=int(r[3] or 0), mean_score=float(r[4] or 0.0), last_recall=r[5],
                          excluded_recalls=int(r[6] or 0), phase_hits=hits.get(memory.id, 0.0))
            if memory.type == "self_assessment" and is_heuristic(memory.metadata):
                key = (str((memory.metadata or {}).get("category")), memory.project)
                if key not in evidence:
                    evidence[key] = category_evidence(store, *key)
                c.evidence = evidence[key]
            score_candidate(c, at, cfg)
            if memory_ids is not None or (not c.invalidated_at and not c.promoted_at):
                out.append(c)
    out.sort(key=lambda c: (-c.score, c.memory_id))
    return out


def category_evidence(store, category: str, project: str | None) -> bool:
    """Whether the valid self_assessments of a category (in a scope) make more than a guess."""
    Memory = store.models.Memory
    scope = Memory.project.is_null() if project is None else (
        (Memory.project == project) | Memory.project.is_null())
    rows = (Memory.select(Memory.metadata, Memory.session_id).where(
        (Memory.type == "self_assessment") & Memory.invalidated_at.is_null() & scope
        & (metadata_value(Memory.metadata, "category") == category)))
    return enough_evidence((row.metadata, row.session_id) for row in rows)


def promotable(store, cfg: dict[str, Any], *, limit: int | None = None, at: float | None = None,
               phase_hits: dict[str, float] | None = None) -> tuple[list[Candidate], list[Candidate]]:
    """(to promote, held back) among unpromoted valid memories."""
    ranked = candidates(store, cfg, at=at, phase_hits=phase_hits)
    chosen = [c for c in ranked if c.passes]
    if limit is not None:
        chosen = chosen[:limit]
    chosen_ids = {c.memory_id for c in chosen}
    return chosen, [c for c in ranked if c.memory_id not in chosen_ids]
