"""The shadow trial's verdicts as the journal keeps them, for ranking, promote-explain and
`dream status --deep`.

A trial is a run of kind `shadow`; each candidate it judged is one journal row (op `report`,
kind `shadow_trial`) whose `after` holds the verdict, the suggestion, the reason, the risk
flags and the hash of the text it judged. Undoing the run retracts its verdicts. A verdict on
text that has changed since is shown as stale and no longer moves the candidate.
"""

from __future__ import annotations

from typing import Any

from ..times import to_iso

SHADOW_KIND = "shadow"
TRIAL_ACTION = "shadow_trial"
SUGGESTIONS = {"helpful": "promote", "neutral": "defer", "harmful": "reject"}
# How a fresh verdict moves a candidate in the ranking (never past a gate): a helpful one a
# little up, a harmful one below every other candidate.
ORDER_SHIFT = {"helpful": 0.05, "neutral": 0.0, "harmful": -1.0}


def latest_verdicts(store, memory_ids: list[str]) -> dict[str, dict[str, Any]]:
    """memory_id → the newest verdict a finished, not undone shadow trial gave it."""
    DreamRun, DreamAction = store.models.DreamRun, store.models.DreamAction
    out: dict[str, dict[str, Any]] = {}
    for start in range(0, len(memory_ids), 500):
        chunk = memory_ids[start:start + 500]
        rows = (DreamAction.select(DreamAction.memory_id, DreamAction.after, DreamAction.created_at, DreamRun.id)
                .join(DreamRun).where((DreamRun.kind == SHADOW_KIND) & (DreamRun.status == "done")
                                      & (DreamAction.kind == TRIAL_ACTION)
                                      & DreamAction.memory_id.in_(chunk))
                .order_by(DreamAction.created_at.desc(), DreamAction.id.desc()).tuples())
        for memory_id, after, created_at, run_id in rows:
            if memory_id not in out and after:
                out[memory_id] = {**after, "run_id": run_id, "at": to_iso(created_at)}
    return out


def verdict_line(verdict: dict[str, Any] | None) -> str:
    """One readable line for a candidate's shadow verdict."""
    if not verdict:
        return "shadow trial: none yet (`llmem dream shadow` runs one when an LLM is configured)"
    flags = ", ".join(verdict.get("risk_flags") or []) or "none"
    stale = " — STALE: the memory changed since" if verdict.get("stale") else ""
    return (f"shadow trial: {verdict['verdict']} → {verdict['suggestion']} suggestion "
            f"(run {verdict['run_id']}, {verdict['at']}){stale}; reason: {verdict.get('reason') or '-'}; "
            f"risk flags: {flags}")
