"""A store with real proposed changes: self_assessments that REM turns into an insight and a
[SKILL PATCH] in proposed-changes.md (shared by the review and the viewer's Dreams tests)."""

from __future__ import annotations

from dream_support import add

from llmem.dream import run_dream


def propose_changes(store, config, category: str = "EDGE_CASE"):
    """Three self_assessments of `category` and an applied REM run: returns its outcome."""
    for age in (1, 2, 3):
        add(store, f"What_happened: forgot the {category} check ({age})\n"
                   f"Proposed_update: add the {category} check", "self_assessment",
            age_days=age, metadata={"category": category})
    return run_dream(store, config, apply=True, phases=["rem"])
