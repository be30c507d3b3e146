"""REM phase: type counts, themes and clusters, behavioural insights in three tiers,
calibration of earlier insights, stale procedures.

Tier 1 is a low-confidence procedure memory (applied with the run); Tiers 2 and 3 are
entries in proposed-changes.md for a human to review — never applied to any skill. Each
insight has a key (its category); a marker comment in the file and `insight_key` in the
procedure's metadata make sure the same insight is never proposed twice.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..capture.taxonomy import POSITIVE_CATEGORIES, TAXONOMY, enough_evidence
from ..db.queries import (
    contents_of,
    insight_procedure_rows,
    procedure_use_rows,
    valid_assessments_since,
    valid_type_counts,
)
from ..db.settings import get_setting
from ..times import days_between, now, utc_date
from ..trust import EXTERNAL
from .journal import Action
from .text import (
    assessment_fields,
    category_of,
    iteration_count,
)
from .themes import theme_terms, themes

if TYPE_CHECKING:
    from ..config import DreamSettings

log = logging.getLogger(__name__)

TREND_MARGIN = 0.10  # a change within ±10 % is "stable"

_CHECKLIST = {
    "NULL_SAFETY": ["Check every value that may be None/null/undefined before using its fields",
                    "Prefer early returns or explicit defaults over chained access"],
    "ERROR_HANDLING": ["Catch the narrowest exception and say what to do about it",
                       "Never swallow an error silently; log or re-raise it"],
    "OFF_BY_ONE": ["Write down the inclusive/exclusive bounds before writing the loop",
                   "Test the empty, single-element and last-element cases"],
    "RACE_CONDITION": ["List what is shared between tasks and who may write it",
                       "Hold a lock or use a transaction around every read-then-write"],
    "AUTH_BYPASS": ["Check authorisation on every entry point, not only the UI path",
                    "Validate and encode untrusted input at the boundary"],
    "DATA_INTEGRITY": ["Name the source of truth and rebuild derived state from it",
                       "Invalidate caches, embeddings and indexes when the source changes"],
    "MISSING_VERIFICATION": ["Run the tests (or the command) before saying it works",
                             "Check the actual output, not the expected one"],
    "EDGE_CASE": ["Try empty input, wrong types and boundary values",
                  "Decide the behaviour for each before coding it"],
    "PERFORMANCE": ["Look for queries or recomputation inside loops",
                    "Measure before and after the change"],
    "DESIGN": ["State the responsibility of each new module in one sentence",
               "Check the dependency direction before adding an import"],
}


@dataclass
class RemResult:
    type_counts: dict[str, int] = field(default_factory=dict)
    themes: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    categories: dict[str, dict[str, Any]] = field(default_factory=dict)
    insights: list[dict[str, Any]] = field(default_factory=list)
    # Categories past the threshold on heuristic guesses from one session only: no insight.
    held_insights: list[dict[str, Any]] = field(default_factory=list)
    calibration: list[dict[str, Any]] = field(default_factory=list)
    stale_procedures: list[str] = field(default_factory=list)
    stale_total: int = 0
    proposed_text: str | None = None  # the new proposed-changes.md, when it changes
    proposed_record: dict[str, list[int]] | None = None  # the new PROPOSED_KEY setting
    actions: list[Action] = field(default_factory=list)

    def hits(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for cluster in self.clusters:
            counts.update(cluster["ids"])
        for info in self.categories.values():
            counts.update(info["ids"])
        return dict(counts)

    def as_dict(self) -> dict[str, Any]:
        return {"type_counts": self.type_counts, "themes": self.themes, "clusters": self.clusters,
                "categories": self.categories, "insights": self.insights,
                "held_insights": self.held_insights,
                "calibration": self.calibration, "stale_procedures": self.stale_procedures,
                "stale_total": self.stale_total,
                "proposed_changes": self.proposed_text is not None}


def _json_object(value) -> dict:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def type_counts(db) -> dict[str, int]:
    return dict(valid_type_counts(db))


def clusters(db, pairs: list[dict[str, Any]], limit: int = 10) -> list[dict[str, Any]]:
    """Connected groups of memories that light found close to each other."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for pair in pairs:
        ra, rb = find(pair["a"]), find(pair["b"])
        if ra != rb:
            parent[rb] = ra
    groups: dict[str, list[str]] = {}
    for node in parent:
        groups.setdefault(find(node), []).append(node)
    ranked = sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))[:limit]
    out = []
    for ids in ranked:
        contents = contents_of(db, ids)
        shared = Counter(t for c in contents for t in theme_terms(c))
        out.append({"ids": sorted(ids), "size": len(ids),
                    "terms": [t for t, n in shared.most_common(5) if n > 1]})
    return out


def _assessments(db, since: float) -> list[dict[str, Any]]:
    rows = valid_assessments_since(db, since)
    out = []
    for memory_id, content, metadata, created_at, project, session_id in rows:
        meta = _json_object(metadata)
        fields = assessment_fields(content, meta)
        out.append({"id": memory_id, "category": category_of(content, meta), "fields": fields,
                    "iterations": iteration_count(fields), "created_at": created_at,
                    "project": project, "session_id": session_id, "metadata": meta})
    return out


def _untrusted_ids(store, memory_ids: list[str]) -> set[str]:
    Memory = store.models.Memory
    found: set[str] = set()
    for start in range(0, len(memory_ids), 500):
        chunk = memory_ids[start:start + 500]
        found.update(row.id for row in Memory.select(Memory.id).where(
            Memory.id.in_(chunk) & (Memory.trust == EXTERNAL)))
    return found


def _trend(before: float, after: float) -> str:
    if before == 0:
        return "increasing" if after > 0 else "stable"
    ratio = after / before
    if ratio < 1 - TREND_MARGIN:
        return "decreasing"
    if ratio > 1 + TREND_MARGIN:
        return "increasing"
    return "stable"


def calibrate(procedure: dict[str, Any], assessments: list[dict[str, Any]], window_days: int,
              at: float) -> dict[str, Any]:
    """Compare a category's error rate (and mean iterations) before and after its insight."""
    category = procedure["category"]
    introduced = procedure["introduced_at"]
    after_days = days_between(at, introduced)
    result = {"memory_id": procedure["id"], "category": category, "introduced_at": introduced}
    if after_days < 1:
        return {**result, "status": None, "reason": "introduced less than a day ago"}
    span = min(float(window_days), after_days)
    before = [a for a in assessments if a["category"] == category and introduced - span * 86400 <= a["created_at"] < introduced]
    after = [a for a in assessments if a["category"] == category and a["created_at"] >= introduced]
    before_rate = len(before) / span
    after_rate = len(after) / after_days
    status = _trend(before_rate, after_rate)
    metric = "error_rate"
    iters_before = [a["iterations"] for a in before if a["iterations"]]
    iters_after = [a["iterations"] for a in after if a["iterations"]]
    mean_before = sum(iters_before) / len(iters_before) if iters_before else None
    mean_after = sum(iters_after) / len(iters_after) if iters_after else None
    if status == "stable" and mean_before is not None and mean_after is not None:
        # Same number of mistakes, but do they take fewer attempts to fix?
        status, metric = _trend(mean_before, mean_after), "iteration_count"
    return {**result, "status": status, "metric": metric,
            "before": {"count": len(before), "per_day": round(before_rate, 4),
                       "mean_iterations": mean_before, "days": round(span, 2)},
            "after": {"count": len(after), "per_day": round(after_rate, 4),
                      "mean_iterations": mean_after, "days": round(after_days, 2)}}


def _insight_procedures(db) -> dict[str, dict[str, Any]]:
    rows = insight_procedure_rows(db)
    out = {}
    for memory_id, metadata, created_at in rows:
        meta = _json_object(metadata)
        out[meta["insight_key"]] = {"id": memory_id, "category": meta.get("category", meta["insight_key"]),
                                    "introduced_at": float(meta.get("introduced_at") or created_at),
                                    "calibration_status": meta.get("calibration_status")}
    return out


def _dedup(values: list[str], limit: int) -> list[str]:
    seen, out = set(), []
    for value in values:
        key = " ".join(value.lower().split())
        if value and key not in seen:
            seen.add(key)
            out.append(value)
    return out[:limit]


PROPOSED_KEY = "dream_proposed_insights"  # setting row: {insight key: [tiers proposed]}


def proposed_insights(db) -> dict[str, list[int]]:
    """The tiers already proposed for each insight key (kept in the PROPOSED_KEY setting)."""
    return _json_object(get_setting(db, PROPOSED_KEY))


def insight_marker(key: str) -> str:
    return f"<!-- llmem:insight {key} -->"


def skill_patch_marker(key: str) -> str:
    return f"<!-- llmem:skill-patch {key} -->"


def _insight_text(key: str, info: dict[str, Any], lookback: int, at: float) -> str:
    happened = _dedup([a["fields"].get("What_happened", "") for a in info["items"]], 3)
    fixes = _dedup([a["fields"].get("Proposed_update", "") for a in info["items"]], 5)
    ids = ", ".join(i[:8] for i in info["ids"][:10])
    lines = [f"## Behavioural insight: {key} ({utc_date(at)})", insight_marker(key), "",
             f"- Seen: {info['count']} self_assessments about {key} in the last {lookback} days ({ids})"]
    if key in TAXONOMY:
        lines.append(f"- Class of mistake: {TAXONOMY[key]}")
    for text in happened:
        lines.append(f"- What happened: {text}")
    for text in fixes or _CHECKLIST.get(key, [])[:1]:
        lines.append(f"- Proposed change: {text}")
    lines += ["- Status: proposed. Review it; llmem never applies it by itself.", ""]
    return "\n".join(lines) + "\n"


def _skill_patch_text(key: str, info: dict[str, Any], at: float) -> str:
    contexts = _dedup([a["fields"].get("Context", "") for a in info["items"]], 3)
    happened = _dedup([a["fields"].get("What_happened", "") for a in info["items"]], 3)
    fixes = _dedup([a["fields"].get("Proposed_update", "") for a in info["items"]], 5)
    caught = _dedup([a["fields"].get("What_caught_it", "") for a in info["items"]], 3)
    checklist = _dedup(fixes + _CHECKLIST.get(key, []), 6)
    detection = TAXONOMY.get(key, f"Mistakes of the class {key}")
    where = f" Seen in: {'; '.join(contexts)}." if contexts else ""
    lines = [f"## [SKILL PATCH] {key}", skill_patch_marker(key), "",
             f"Proposed by llmem dream on {utc_date(at)} from {info['count']} self_assessments. "
             "Not applied: review it, then add it to a skill by hand.", "",
             "### Detection Rule", "",
             f"Apply this patch when the task touches code prone to: {detection}.{where}", "",
             "### Checklist", ""]
    lines += [f"- [ ] {item}" for item in checklist] or ["- [ ] Re-read the change for this class of mistake"]
    lines += ["", "### Pitfall", ""]
    lines += [f"- {text}" for text in happened] or [f"- {detection}"]
    lines += ["", "### Verification", ""]
    if caught:
        lines.append(f"- Earlier it was caught by: {', '.join(caught)}; check for it before that point.")
    lines += ["- Write or run a test that fails without the fix and passes with it.",
              f"- Search the diff for the pattern above before calling the task done ({key}).", ""]
    return "\n".join(lines) + "\n"


def _procedure_text(key: str, info: dict[str, Any]) -> str:
    fixes = _dedup([a["fields"].get("Proposed_update", "") for a in info["items"]], 3)
    steps = fixes or _CHECKLIST.get(key, [])[:2] or [f"Double-check for {key} mistakes"]
    return (f"Recurring {key} mistakes ({info['count']} self_assessments): "
            + "; ".join(steps) + ".")


def plan_rem(store, cfg: DreamSettings, *, pairs: list[dict[str, Any]], proposed_path: Path,
             at: float | None = None) -> RemResult:
    """Reflect on the store; return what REM found and the actions it would take."""
    at = at or now()
    db = store.db
    result = RemResult()
    lookback = int(cfg.behavioral_lookback_days)
    result.type_counts = type_counts(db)
    result.themes = themes(db, at - lookback * 86400)
    result.clusters = clusters(db, pairs)

    procedures = _insight_procedures(db)
    oldest_intro = min([p["introduced_at"] for p in procedures.values()] + [at])
    assessments = _assessments(db, min(at - lookback * 86400, oldest_intro - lookback * 86400))
    recent = [a for a in assessments if a["created_at"] >= at - lookback * 86400 and a["category"]]
    # Self-assessments from tool output or file content (trust external) are no evidence of
    # their own: no procedure or skill patch is proposed from untrusted origins alone.
    untrusted = _untrusted_ids(store, [a["id"] for a in recent])
    recent = [a for a in recent if a["id"] not in untrusted]
    by_category: dict[str, dict[str, Any]] = {}
    for item in recent:
        info = by_category.setdefault(item["category"], {"count": 0, "ids": [], "items": [], "projects": set()})
        info["count"] += 1
        info["ids"].append(item["id"])
        info["items"].append(item)
        info["projects"].add(item["project"])
    result.categories = {k: {"count": v["count"], "ids": v["ids"]} for k, v in sorted(by_category.items())}

    existing_text = proposed_path.read_text(encoding="utf-8") if proposed_path.exists() else ""
    proposed = proposed_insights(db)
    additions: list[str] = []
    threshold = int(cfg.behavioral_threshold)
    patch_threshold = int(cfg.skill_patch_threshold)
    for key, info in sorted(by_category.items()):
        if key in POSITIVE_CATEGORIES or info["count"] < threshold:
            continue
        if not enough_evidence((item["metadata"], item["session_id"]) for item in info["items"]):
            result.held_insights.append({"key": key, "count": info["count"], "reason": (
                "only heuristic self_assessments from a single session: a guess from wording, "
                "not yet a pattern")})
            continue
        tiers = []
        project = next(iter(info["projects"])) if len(info["projects"]) == 1 else None
        if key not in procedures:
            tiers.append(1)
            result.actions.append(Action(
                "rem", "insight", None, f"Tier 1: procedure memory for {key} ({info['count']} self_assessments)",
                detail={"tier": 1, "key": key, "content": _procedure_text(key, info), "project": project,
                        "metadata": {"insight_key": key, "category": key, "tier": 1,
                                     "introduced_at": at, "generated_by": "dream",
                                     "evidence": info["ids"][:20]}}))
        # Proposed once: the marker in the file, or the store's record (the user may have
        # reviewed the entry and deleted it from the file).
        done = set(proposed.get(key, []))
        if insight_marker(key) not in existing_text and 2 not in done:
            tiers.append(2)
            additions.append(_insight_text(key, info, lookback, at))
        if info["count"] >= patch_threshold and skill_patch_marker(key) not in existing_text and 3 not in done:
            tiers.append(3)
            additions.append(_skill_patch_text(key, info, at))
        if {2, 3} & set(tiers):
            proposed[key] = sorted(done | ({2, 3} & set(tiers)))
        result.insights.append({"key": key, "count": info["count"], "tiers": tiers})
    if additions:
        head = existing_text or ("# Proposed changes\n\nWritten by `llmem dream`. Nothing here is applied "
                                 "automatically: review each entry and apply it by hand.\n")
        result.proposed_text = head.rstrip("\n") + "\n\n" + "\n".join(additions)
        result.proposed_record = proposed
        result.actions.append(Action("rem", "proposed_changes", None,
                                     f"append {len(additions)} entries to {proposed_path.name}",
                                     detail={"path": str(proposed_path)}))

    for key, procedure in sorted(procedures.items()):
        outcome = calibrate(procedure, assessments, lookback, at)
        result.calibration.append(outcome)
        if outcome["status"]:
            result.actions.append(Action(
                "rem", "calibrate", procedure["id"],
                f"calibration of {key}: {outcome['status']} ({outcome['metric']})",
                changes={"metadata": {"calibration_status": outcome["status"], "calibrated_at": at,
                                      "calibration": {k: outcome[k] for k in ("metric", "before", "after")}}}))

    stale_before = at - int(cfg.stale_procedure_days) * 86400
    rows = procedure_use_rows(db)
    for memory_id, access_count, created_at, flagged in rows:
        stale = (access_count or 0) == 0 and created_at < stale_before
        if stale:
            result.stale_total += 1
        if stale and not flagged:
            result.stale_procedures.append(memory_id)
            result.actions.append(Action("rem", "flag_stale", memory_id,
                                         "stale procedure: never used, decays twice as fast",
                                         changes={"metadata": {"stale_procedure": True, "stale_at": at}}))
        elif flagged and not stale:
            result.actions.append(Action("rem", "unflag_stale", memory_id, "procedure in use again",
                                         changes={"metadata": {"stale_procedure": False}}))
    return result
