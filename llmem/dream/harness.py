"""`llmem dream rem-harness`: what REM would reflect and what deep would promote, written
nowhere. It is the sweep's own preview (which opens no run, lock, diary or file) read as the
seed's harness: REM's reflections, the candidate truths it would propose, and each promotion
as the exact MEMORY.md line it would get, beside the best candidates held back and why."""

from __future__ import annotations

from typing import Any

from .memory_md import entry_line
from .promote import candidates
from .sweep import run_dream

HELD_SHOWN = 10


def rem_harness(store, config) -> dict[str, Any]:
    outcome = run_dream(store, config, apply=False, use_llm=False)
    max_tokens = config.dream.max_promoted_snippet_tokens
    rem = outcome.rem.as_dict() if outcome.rem else {}
    truths = [a.detail.get("content") for a in outcome.actions if a.kind == "insight" and a.detail.get("content")]
    deep = outcome.deep
    chosen = deep.promote if deep else []
    Memory = store.models.Memory
    rows = {m.id: m for m in Memory.select().where(Memory.id.in_([c.memory_id for c in chosen]))} if chosen else {}
    held = [c for c in candidates(store, config.dream) if not c.passes][:HELD_SHOWN]
    return {
        "rem": {"themes": rem.get("themes", []), "clusters": rem.get("clusters", []),
                "categories": rem.get("categories", {}), "insights": rem.get("insights", []),
                "calibration": rem.get("calibration", []), "candidate_truths": truths},
        "deep": {
            "promote": [{"memory_id": c.memory_id, "score": round(c.score, 4),
                         "memory_md_line": entry_line(rows[c.memory_id], max_tokens),
                         "shadow": c.shadow} for c in chosen if c.memory_id in rows],
            "held": [{"memory_id": c.memory_id, "score": round(c.score, 4), "holding_gates":
                      [n for n, g in c.gates.items() if not g["passed"]], "verdict": c.verdict} for c in held],
            "counts": deep.counts() if deep else {},
        },
        "notes": outcome.notes,
    }
