"""`llmem dream status`: last and next run, counts per phase, candidates waiting."""

from __future__ import annotations

from typing import Any

from ..times import to_iso
from .journal import action_counts, last_run
from .lock import INTERRUPTED, lock_is_live, read_lock
from .promote import Candidate, RankedTop, candidates
from .schedule import next_run
from .switch import dream_switch, dream_zone, zone_name


def _run_info(store, run, live_run_id: str | None) -> dict[str, Any] | None:
    if run is None:
        return None
    status, error = run.status, run.error
    if status == "running" and run.id != live_run_id:
        # Its process died without finishing (the next run's takeover records it as failed).
        status, error = "interrupted", error or INTERRUPTED
    writes = action_counts(store, run.id)
    counts = change_counts(run, writes)
    return {"id": run.id, "kind": run.kind, "phases": run.phases.split(",") if run.phases else [],
            "status": status, "started_at": to_iso(run.started_at),
            "finished_at": to_iso(run.finished_at), "error": error,
            "counts": counts, "changes": change_total(counts),
            "writes": change_total(writes)}


def change_counts(run, writes: dict[str, dict[str, int]] | None = None) -> dict[str, dict[str, int]]:
    """A run's changes per phase and kind, counted as its preview counted them.

    The journal holds several rows per change (a merge: the new memory, each original, each
    relation); those are `writes`, used only for runs whose summary has no counts.
    """
    counts = (run.summary or {}).get("counts")
    if counts is None:
        counts = writes if writes is not None else {}
    return {phase: kinds for phase, kinds in counts.items() if kinds}


def change_total(counts: dict[str, dict[str, int]]) -> int:
    """How many changes a run proposes or made: the one number preview, status and DREAMS.md show."""
    return sum(sum(kinds.values()) for kinds in counts.values())


def dream_status(store, config, *, recent: int = 5, ranked: list[Candidate] | RankedTop | None = None) -> dict[str, Any]:
    """Everything `dream status` shows, as data. `ranked`: the promotion candidates when the
    caller has scored them already (scoring reads every recall: the Dreams page and
    `status --deep` list them too, and score once)."""
    DreamRun, Memory = store.models.DreamRun, store.models.Memory
    cfg = config.dream
    last_any = DreamRun.select().where(DreamRun.kind == "dream").order_by(DreamRun.started_at.desc()).first()
    last_applied = last_run(store, "dream")
    schedule = cfg.schedule
    zone = dream_zone(config)
    switch = dream_switch(store, config)
    upcoming = next_run(schedule, zone=zone) if switch.enabled else None
    waiting_pairs = 0
    light_run = last_run(store, "dream", "light")
    if light_run is not None:
        light = (light_run.summary or {}).get("light") or {}
        pairs = light.get("near_duplicates", [])
        ids = list({p[k] for p in pairs for k in ("a", "b")})
        valid: set[str] = set()
        for start in range(0, len(ids), 500):
            valid.update(i for (i,) in Memory.select(Memory.id).where(
                Memory.id.in_(ids[start:start + 500]) & Memory.invalidated_at.is_null()).tuples())
        waiting_pairs = sum(1 for p in pairs if p["a"] in valid and p["b"] in valid)
    if ranked is None:
        ranked = candidates(store, cfg)
    if isinstance(ranked, RankedTop):  # the Dreams page: the top scored, the counts over all
        ready, total = ranked.ready, ranked.total
    else:
        ready, total = sum(1 for c in ranked if c.passes), len(ranked)
    holder = read_lock(store.db)
    running = holder if lock_is_live(holder, store.db) else None
    live_run_id = running.get("run_id") if running else None
    runs = DreamRun.select().order_by(DreamRun.started_at.desc()).limit(recent)
    return {
        "enabled": switch.enabled,
        "enabled_by": switch.source,
        "timezone": zone_name(config),
        "last_run": _run_info(store, last_any, live_run_id),
        "last_applied_run": _run_info(store, last_applied, live_run_id),
        "schedule": schedule,
        "next_run": upcoming.isoformat(timespec="minutes") if upcoming else None,
        "running": running,
        "stale_lock": holder if holder and not running else None,
        "candidates": {"merge_pairs": waiting_pairs, "promotion_ready": ready,
                       "promotion_held": total - ready},
        "recent_runs": [_run_info(store, r, live_run_id) for r in runs],
    }
