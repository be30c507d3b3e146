"""`llmem dream status --deep`: the promotion candidates with their signals, the gate that
holds each, the shadow verdict when there is one, and the grounded evidence staged."""

from __future__ import annotations

from typing import Any

from .promote import BURST_WINDOW, Candidate, candidates
from .shadow import last_trial

SHOWN = 20


def deep_status(store, config, *, limit: int = SHOWN, ranked: list[Candidate] | None = None) -> dict[str, Any]:
    """`ranked`: the candidates when the caller scored them already (see `dream_status`)."""
    cfg = config.dream
    if ranked is None:
        ranked = candidates(store, cfg)
    RecallEvent = store.models.RecallEvent
    staged = RecallEvent.select().where(RecallEvent.staged_by.is_null(False))
    return {
        "gates": {name: getattr(cfg, name) for name in ("min_score", "min_recall_count", "min_unique_queries")},
        "burst_window_minutes": BURST_WINDOW // 60,
        "total": len(ranked),
        "ready": sum(1 for c in ranked if c.passes),
        "candidates": [c.as_dict() for c in ranked[:limit]],
        "grounded_staged": {"recalls": staged.count(),
                            "memories": staged.select(RecallEvent.memory).distinct().count()},
        "shadow_trial": last_trial(store),
        "shadow_trial_can_run": config.llm.provider != "none",
    }
