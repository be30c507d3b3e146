"""The sweep: light → REM → deep under the dream lock, journaled, with diary and report.

`run_dream` is the one entry point: the CLI, the worker's periodic task and the systemd
unit all call it. Without `apply` it only plans and writes nothing at all — no run row, no
lock row, no diary, no proposed changes, no MEMORY.md (only the HTML report, when asked).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peewee as pw

from ..db import bulk
from ..db.settings import get_setting, set_setting
from ..paths import write_output_file
from ..times import now
from . import diary, dreams_md, memory_md
from .condense import condense_episodes
from .deep import SPECIAL_KINDS, DeepResult, apply_action, apply_promotes, plan_deep
from .journal import (
    PHASES,
    Action,
    Journal,
    end_failed_run,
    finish_run,
    last_run,
    new_run_id,
    roll_back_failed_run,
    start_run,
)
from .light import LightResult, find_candidates, plan_episode_retention
from .lock import DreamLock, lock_is_live, read_lock
from .narrate import Narrator, md, stories, template
from .outcome import DreamOutcome
from .promote import apply_promotions, promotable, recent_phase_hits
from .rem import PROPOSED_KEY, RemResult, plan_rem, type_counts
from .switch import dream_zone

log = logging.getLogger(__name__)

BATCH = 200  # journaled actions per transaction
# Plain updates per transaction on the bulk path: ~0.2 s of the write lock each here (hooks
# and the worker wait that long at most), few enough commits for the whole night. Each
# commit writes every page the batch dirtied, and the journal's memory_id index takes its
# rows at random places: at 2,000 a batch the commits were 1.1 s of CPU of a 100k night,
# at 10,000 0.7 s.
BULK_BATCH = 10000


def _confidences(store) -> dict[str, float]:
    return bulk.valid_confidences(store.db)


def _simulate(before: dict[str, float], actions: list[Action]) -> list[float]:
    """Confidences after the planned actions (for a preview's 'after' histogram)."""
    after = dict(before)
    for action in actions:
        if action.kind == "invalidate":
            after.pop(action.memory_id, None)
        elif action.kind == "dedupe":
            for memory_id in action.detail["drop"]:
                after.pop(memory_id, None)
        elif action.kind == "merge":
            for memory_id in action.detail["ids"]:
                after.pop(memory_id, None)
            after[f"merged:{action.detail['ids'][0]}"] = action.detail["confidence"]
        elif "confidence" in action.changes and action.memory_id in after:
            after[action.memory_id] = action.changes["confidence"]
    return list(after.values())


def _make_llm(store, config):
    """The chat LLM for merges, or None (merges then concatenate)."""
    from ..providers.llm import make_llm

    try:
        return make_llm(config, store=store)
    except Exception as exc:  # a misconfigured LLM must not stop the night's consolidation
        log.warning("dream: no LLM for merges (%s); concatenating instead", exc)
        return None


def _light_from_last_run(store) -> LightResult:
    """Candidates the last applied light run found (for `--phase deep` on its own)."""
    run = last_run(store, "dream", "light")
    result = LightResult(since=None, model=None)
    if run is None:
        result.notes.append("no earlier light run: run the light phase first to find merge candidates")
        return result
    data = (run.summary or {}).get("light") or {}
    result.near_duplicates = data.get("near_duplicates", [])
    result.exact_duplicates = data.get("exact_duplicates", [])
    result.auto_links = data.get("auto_links", [])
    result.notes.append(f"merge candidates from light run {run.id}")
    return result


def run_dream(store, config, *, apply: bool = False, phases: list[str] | None = None,
              report_path: Path | None = None, llm: Any = None, use_llm: bool = True,
              promote_limit: int | None = None, diary_llm: Any = None,
              progress: Callable[[str], None] | None = None) -> DreamOutcome:
    """Run the sweep (or the chosen phases) in the order light → REM → deep; `progress(phase)`
    is called as each phase is done (the CLI's bar: the library prints nothing).

    `llm` merges; `diary_llm` writes the narrative (default: dream.model, then llm.model)."""
    cfg = config.dream
    chosen = [p for p in PHASES if p in (phases or PHASES)]
    at = now()
    outcome = DreamOutcome(applied=apply, phases=chosen, started_at=at)
    holder = read_lock(store.db)
    if not apply and lock_is_live(holder, store.db):
        outcome.notes.append(f"a dream run is in progress (run {holder.get('run_id')}); this preview may be out of date")
    # A preview simulates the after-histogram from each memory's confidence; a run reads it.
    before = _confidences(store) if not apply else None
    outcome.confidence_before = list(before.values()) if before is not None else \
        bulk.valid_confidence_values(store.db)
    outcome.type_counts = type_counts(store.db)

    if not apply:
        _plan_all(store, config, cfg, outcome, at, promote_limit, progress=progress)
        outcome.confidence_after = _simulate(before, outcome.actions)
        outcome.finished_at = now()
        if report_path:
            _write_report(store, report_path, outcome)
        return outcome

    run_id = new_run_id()
    lock = DreamLock(store.db, run_id).acquire()
    try:
        if lock.taken_over:
            outcome.notes.append(f"took over a stale lock left by run {lock.taken_over.get('run_id')} "
                                 f"(pid {lock.taken_over.get('pid')})")
            # A run that died holding the lock never finished: say so in its row.
            DreamRun = store.models.DreamRun
            DreamRun.update(status="failed", error="the process died during the run", finished_at=at).where(
                (DreamRun.id == lock.taken_over.get("run_id")) & (DreamRun.status == "running")).execute()
        run = start_run(store, "dream", chosen, run_id)
        outcome.run_id = run.id
        journal = Journal(store, run)
        # The LLM merges in deep and condenses the episodes that light lets go.
        made_llm = (_make_llm(store, config) if use_llm and llm is None
                    and ("deep" in chosen or "light" in chosen) else None)
        llm = llm if llm is not None else made_llm
        try:
            _plan_all(store, config, cfg, outcome, at, promote_limit, journal=journal, llm=llm,
                      progress=progress)
            _write_outputs(store, config, outcome, journal, diary_llm=diary_llm, use_llm=use_llm)
        except Exception as exc:
            outcome.finished_at = now()
            end_failed_run(store, run, lock, outcome.summary(), f"{exc.__class__.__name__}: {exc}")
            roll_back_failed_run(store, run.id)  # nothing half-written: what it wrote is put back
            raise
        finally:
            if made_llm is not None:  # its HTTP client and token-budget connection
                made_llm.close()
        outcome.finished_at = now()
        outcome.confidence_after = bulk.valid_confidence_values(store.db)
        finish_run(store, run, outcome.summary())
    finally:
        try:
            lock.release()
        except pw.DatabaseError as exc:  # a full disk: the row left is stale (dream/lock.py)
            log.warning("could not release the dream lock of run %s: %s", run_id, exc)
    report = report_path or cfg.report_path
    if report:
        _write_report(store, report, outcome)
    return outcome


def _plan_all(store, config, cfg, outcome: DreamOutcome, at: float, promote_limit: int | None,
              journal: Journal | None = None, llm: Any = None,
              progress: Callable[[str], None] | None = None) -> None:
    """Plan each phase in order; with a journal, apply each phase before planning the next."""
    done = progress or (lambda _phase: None)
    light: LightResult | None = None
    if "light" in outcome.phases:
        started = time.perf_counter()
        previous = last_run(store, "dream", "light")
        light = find_candidates(store, similarity_threshold=cfg.similarity_threshold,
                                auto_link_threshold=cfg.auto_link_threshold,
                                since=previous.started_at if previous else None,
                                embedder_provider=config.embedding.provider)
        outcome.light = light
        pruned = plan_episode_retention(store, config.capture, at)
        if journal is not None:
            pruned, condensed = condense_episodes(store, journal, llm, pruned)
            outcome.actions += condensed
        outcome.actions += pruned
        if journal is not None:
            for start in range(0, len(pruned), BATCH):
                with store.db.atomic():
                    for action in pruned[start:start + BATCH]:
                        journal.update("light", action.kind, action.memory_id, action.changes)
        outcome.phase_seconds["light"] = round(time.perf_counter() - started, 3)
        done("light")
    if "rem" in outcome.phases:
        started = time.perf_counter()
        pairs = (light.near_duplicates + light.auto_links) if light else []
        rem = plan_rem(store, cfg, pairs=pairs, proposed_path=config.paths.proposed_changes_path, at=at)
        outcome.rem = rem
        outcome.actions += rem.actions
        if journal is not None:
            _apply_rem(store, journal, rem, config)
        outcome.phase_seconds["rem"] = round(time.perf_counter() - started, 3)
        done("rem")
    if "deep" in outcome.phases:
        started = time.perf_counter()
        source = light if light is not None else _light_from_last_run(store)
        if light is None:
            outcome.notes += source.notes
        hits = recent_phase_hits(store, at)
        for memory_id, count in outcome.phase_hits().items():
            hits[memory_id] = hits.get(memory_id, 0.0) + count
        stale = set(outcome.rem.stale_procedures) if outcome.rem else set()
        deep = plan_deep(store, cfg, near_duplicates=source.near_duplicates,
                         exact_duplicates=source.exact_duplicates, auto_links=source.auto_links,
                         stale_ids=stale, phase_hits=hits, at=at, promote_limit=promote_limit)
        outcome.deep = deep
        outcome.actions += deep.actions
        if journal is not None:
            _apply_deep(store, journal, deep, llm, at, outcome)
        outcome.phase_seconds["deep"] = round(time.perf_counter() - started, 3)
        done("deep")


def _apply_rem(store, journal: Journal, rem: RemResult, config) -> None:
    updates = [a for a in rem.actions if a.kind not in ("insight", "proposed_changes")]
    for start in range(0, len(updates), BULK_BATCH):
        with store.db.atomic():
            journal.update_many([("rem", a.kind, a.memory_id, a.changes) for a in updates[start:start + BULK_BATCH]])
    with store.db.atomic():
        for action in rem.actions:
            if action.kind == "insight":
                detail = action.detail
                added = store.add(detail["content"], "procedure", confidence=0.5, source="dream",
                                  project=detail["project"], metadata=detail["metadata"])
                if added.created:
                    journal.create("rem", "insight", added.memory)
                    action.memory_id = added.memory.id
            elif action.kind == "proposed_changes":
                continue
    if rem.proposed_record is not None:
        with store.db.atomic():
            old = get_setting(store.db, PROPOSED_KEY)
            journal.record_row("rem", "proposed_changes", "setting", {"key": PROPOSED_KEY},
                               {"key": PROPOSED_KEY, "value": old} if old is not None else None)
            set_setting(store.db, PROPOSED_KEY, json.dumps(rem.proposed_record, sort_keys=True))
    if rem.proposed_text is not None:
        journal.write_file("rem", "proposed_changes", config.paths.proposed_changes_path, rem.proposed_text)


def _apply_deep(store, journal: Journal, deep: DeepResult, llm, at: float, outcome: DreamOutcome) -> None:
    actions = deep.actions
    merges = actions.of_kind("merge")
    # With an LLM each merge has its own transaction, the LLM asked outside it; without one
    # there is nothing to wait for, and BATCH merges share a transaction (a commit each was
    # a third of their time).
    def merge(action) -> None:
        result = apply_action(store, journal, action, llm=llm, at=at)
        outcome.merge_results.append({"ids": action.detail["ids"], **result})

    if llm is not None:
        for action in merges:
            merge(action)
    else:
        for start in range(0, len(merges), BATCH):
            with store.db.atomic():
                for action in merges[start:start + BATCH]:
                    merge(action)
    # In the plan's order by kind: dedupes and links one by one (BATCH per transaction), then
    # the plain updates (decay, boost, invalidate, …: most of a big night) and the promotions
    # through the journal's bulk path, BULK_BATCH per transaction. The plain updates are
    # read from the plan a batch at a time (Actions.updates): no Action is made for them.
    special = actions.of_kind(*(SPECIAL_KINDS - {"merge", "promote"}))
    for start in range(0, len(special), BATCH):
        with store.db.atomic():
            for action in special[start:start + BATCH]:
                apply_action(store, journal, action, at=at)
    for part in actions.update_parts(leave_out=SPECIAL_KINDS):
        compact = type(part) is not list
        for start in range(0, part.rows if compact else len(part), BULK_BATCH):
            with store.db.atomic():
                if compact:
                    part.apply(journal, start, start + BULK_BATCH)
                else:
                    journal.update_many(part[start:start + BULK_BATCH])
    promotes = actions.of_kind("promote")
    for start in range(0, len(promotes), BULK_BATCH):
        with store.db.atomic():
            apply_promotes(store, journal, promotes[start:start + BULK_BATCH])
    skipped = {a.memory_id for a in promotes if a.kind == "skip_promote"}
    deep.promote = [c for c in deep.promote if c.memory_id not in skipped]


def _write_outputs(store, config, outcome: DreamOutcome, journal: Journal, *, diary_llm: Any = None,
                   use_llm: bool = True) -> None:
    """DREAMS.md, the phase reports, the diary entry and the MEMORY.md mirror, journaled like
    every other write."""
    # A run that found and changed nothing writes nothing here: DREAMS.md keeps telling the
    # last run that did something (`dream status` says when this one ran), no report or diary
    # entry is added and no model is asked to retell last night's themes.
    if outcome.has_news():
        _write_dreams(store, config, outcome, journal, diary_llm=diary_llm, use_llm=use_llm)
    memory_md_path = config.paths.memory_md_path
    if (outcome.deep and outcome.deep.promote) or memory_md_path.exists():
        journal.write_file("deep", "memory_md", memory_md_path,
                           memory_md.render(store, config.dream.max_promoted_snippet_tokens))


def _write_dreams(store, config, outcome: DreamOutcome, journal: Journal, *, diary_llm: Any,
                  use_llm: bool) -> None:
    """The narratives, DREAMS.md's phase blocks, the phase reports and the diary entry."""
    cfg = config.dream
    zone = dream_zone(config)
    tales = stories(store, outcome)
    narrator = Narrator(config, store, llm=diary_llm) if use_llm else None
    try:
        for story in tales.values():
            if narrator is not None:
                narrator.narrate(story)
            elif story.enough:
                story.narrative, story.narrated_by = md(template(story)), "template"
    finally:
        if narrator is not None:
            narrator.close()
    if narrator is not None:
        outcome.notes += narrator.problems
    outcome.narratives = {phase: {"by": story.narrated_by, "text": story.narrative}
                          for phase, story in tales.items() if story.narrated_by}
    last_phase = outcome.phases[-1]
    counts = outcome.action_counts()
    stamp = dreams_md.when(outcome.started_at, zone)

    def run_line(phase: str) -> str:
        total = sum(counts.get(phase, {}).values())
        return f"Run {outcome.run_id}, {stamp}: {total} change{'s' if total != 1 else ''}"

    path = dreams_md.dreams_path(config)
    old = path.read_text(encoding="utf-8") if path.exists() else None
    try:
        text = dreams_md.rewrite(old, {phase: dreams_md.block(phase, run_line(phase), story)
                                       for phase, story in tales.items()})
    except dreams_md.DamagedBlocks as exc:
        outcome.notes.append(f"{exc.message}: {path.name} left as it is ({exc.hint})")
    else:
        journal.write_file(last_phase, "dreams_md", path, text)
    if cfg.phase_reports:
        day = dreams_md.day_of(outcome.started_at, zone)
        for phase, story in tales.items():
            report = dreams_md.report_path(config, phase, day)
            before = report.read_text(encoding="utf-8") if report.exists() else None
            journal.write_file(phase, "phase_report", report,
                               dreams_md.report_text(before, phase, day, run_line(phase), story))
    diary_path = config.diary_path
    old = diary_path.read_text(encoding="utf-8") if diary_path.exists() else None
    journal.write_file("rem" if outcome.rem else last_phase, "diary", diary_path,
                       diary.append_entry(old, diary.diary_entry(outcome, tales)))


def _write_report(store, path: Path, outcome: DreamOutcome) -> None:
    from .report import render_report

    write_output_file(Path(path).expanduser(), render_report(store, outcome))


@dataclass
class PromoteOutcome:
    applied: bool
    run_id: str | None
    chosen: list[Any]
    held: list[Any]
    skipped: dict[str, str] = field(default_factory=dict)  # memory_id → why not promoted after all


def run_promote(store, config, *, apply: bool = False, limit: int | None = None) -> PromoteOutcome:
    """Promotion on its own (the deep phase's gates), previewed or applied and journaled."""
    cfg = config.dream
    at = now()
    chosen, held = promotable(store, cfg, limit=limit, at=at)
    if not apply or not chosen:
        return PromoteOutcome(False, None, chosen, held)
    run_id = new_run_id()
    lock = DreamLock(store.db, run_id, what="promote").acquire()
    try:
        run = start_run(store, "promote", ["deep"], run_id)
        journal = Journal(store, run)
        try:
            with store.db.atomic():
                promoted, skipped = apply_promotions(store, journal, chosen, at)
            journal.write_file("deep", "memory_md", config.paths.memory_md_path,
                               memory_md.render(store, cfg.max_promoted_snippet_tokens))
        except Exception as exc:  # as a dream's: the run says it failed, the lock goes
            end_failed_run(store, run, lock, {}, f"{exc.__class__.__name__}: {exc}")
            raise
        counts = {"promote": len(promoted), **({"skip_promote": len(skipped)} if skipped else {})}
        finish_run(store, run, {"counts": {"deep": counts}, "promoted": [c.memory_id for c in promoted],
                                "skipped": skipped})
    finally:
        try:
            lock.release()
        except pw.DatabaseError as exc:  # a full disk: the row left is stale (dream/lock.py)
            log.warning("could not release the dream lock of run %s: %s", run_id, exc)
    return PromoteOutcome(True, run_id, promoted, held, skipped)
