"""Dream commands: dream (preview/apply), dream on|off|status|help, dream undo, promote,
promote-explain."""

from __future__ import annotations

import re

import click

from .choices import agent_choice
from .dream_lane import print_deep_status, rem_backfill, rem_harness, shadow
from .memory import catch_up_embeddings
from .output import (
    TEXT,
    bounded_int,
    json_option,
    limit_option,
    notice,
    print_json,
    progress_bar,
    short,
)

PHASE_CHOICE = click.Choice(["light", "rem", "deep"])
# Actions `dream --json` lists by default: printing a big night's 116k actions took longer
# than the dream (and no reader wants them all); --all-actions asks for every one.
JSON_ACTIONS = 200


@click.group(name="dream", invoke_without_command=True)
@click.option("--apply", "apply_", is_flag=True, help="Execute the plan (default: preview, writes nothing).")
@click.option("--phase", type=PHASE_CHOICE, help="Run only this phase (default: light → REM → deep).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write an HTML report (self-contained) to this file.")
@click.option("--no-llm", is_flag=True,
              help="Ask no LLM: merges concatenate, the diary narrative uses the plain template.")
@click.option("--scheduled", is_flag=True,
              help="Run as the schedule does (the systemd timer): do nothing while dreaming is off.")
@json_option("Print the plan or the outcome as JSON.")
@click.option("--actions", "shown_actions", type=bounded_int(0), default=JSON_ACTIONS, show_default=True,
              help="With --json: list this many actions (their counts are always complete).")
@click.option("--all-actions", is_flag=True, help="With --json: list every action (a big night has 100k+).")
@click.pass_context
def dream_group(ctx, apply_, phase, report_path, no_llm, scheduled, as_json, shown_actions, all_actions):
    """Consolidate memory: preview by default, --apply to execute.

    `llmem dream off` pauses the scheduled runs (worker and systemd timer); a run you start
    by hand still goes ahead, as the design's manual commands do.
    """
    if ctx.invoked_subcommand is not None:
        return
    from pathlib import Path

    from ..dream import PHASES, run_dream
    from ..dream.switch import dream_switch
    from ..paths import check_output_folder

    app = ctx.obj
    switch = dream_switch(app.store, app.config)
    if not switch.enabled:
        if scheduled:
            click.echo(f"Dreaming is off ({switch.source}): nothing done. `llmem dream on` turns it back on.")
            return
        notice(f"dreaming is off ({switch.source}): scheduled runs are paused; this run you asked for goes ahead")
    if report_path:
        check_output_folder(Path(report_path))  # before the run: a typo must not cost a dream
    phases = [phase] if phase else None
    with progress_bar("Dreaming" if apply_ else "Planning", len(phases or PHASES),
                      show=not as_json) as progress:
        outcome = run_dream(app.store, app.config, apply=apply_, phases=phases,
                            report_path=Path(report_path) if report_path else None, use_llm=not no_llm,
                            progress=lambda _phase: progress.advance())
    if apply_:  # merges and insights are new memories: searchable by meaning at once
        catch_up_embeddings(app, show=not as_json)
    if as_json:
        data = outcome.summary()
        listed = outcome.actions if all_actions else outcome.actions[:shown_actions]
        data["actions"] = [a.as_dict() for a in listed]
        data["actions_total"] = len(outcome.actions)
        data["actions_listed"] = len(listed)
        print_json(data)
        return
    _print_outcome(outcome, report_path)


def _print_outcome(outcome, report_path) -> None:
    from ..dream.narrate import theme_line
    from ..dream.status import change_total

    head = f"Dream run {outcome.run_id} applied" if outcome.applied else "Dream preview (nothing written; --apply to execute)"
    click.echo(f"{head}: {' → '.join(outcome.phases)}")
    for note in outcome.notes:
        click.echo(f"  note: {note}")
    if outcome.light is not None:
        light = outcome.light
        if light.skipped:
            click.echo(f"light  skipped the comparison: {light.skipped}")
        else:
            click.echo(f"light  {light.changed} changed vs {light.compared_with} memories in {light.seconds:.2f} s")
        click.echo(f"       {len(light.near_duplicates)} near-duplicate pairs, {len(light.exact_duplicates)} "
                   f"exact-duplicate groups, {len(light.auto_links)} auto-link candidates")
        for n in light.notes:
            click.echo(f"       {n}")
    if outcome.rem is not None:
        rem = outcome.rem
        click.echo("rem    types: " + (", ".join(f"{t} {n}" for t, n in rem.type_counts.items()) or "none"))
        for theme in rem.themes[:8]:
            click.echo(f"       theme {theme_line(theme)}")
        for category, info in rem.categories.items():
            click.echo(f"       {info['count']} self_assessment memories about {category}")
        for item in rem.calibration:
            click.echo(f"       calibration {item['category']}: {item['status'] or item.get('reason')}")
        click.echo(f"       stale procedures: {rem.stale_total}")
    counts = outcome.action_counts()
    for phase, kinds in counts.items():
        if kinds:
            click.echo(f"{phase:<6} " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    for action in outcome.actions[:40]:
        target = f"{action.memory_id[:8]} " if action.memory_id else ""
        click.echo(f"  [{action.phase}] {action.kind:<12} {target}{short(action.text, 100)}")
    if len(outcome.actions) > 40:
        click.echo(f"  … {len(outcome.actions) - 40} more (--json --all-actions lists all)")
    total = change_total(counts)
    if total:
        verb = "made" if outcome.applied else "proposed"
        click.echo(f"{total} change{'s' if total != 1 else ''} {verb}.")
    else:
        click.echo("Nothing to change.")
    if report_path:
        click.echo(f"Report: {report_path}")
    if outcome.applied:
        click.echo(f"Undo with: llmem dream undo {outcome.run_id}")


@dream_group.command(name="status")
@click.option("--deep", is_flag=True, help="The promotion candidates: signals, holding gates, shadow verdicts.")
@json_option()
@click.pass_obj
def dream_status_cmd(app, deep, as_json):
    """Show the last and next dream run, counts per phase and candidates waiting."""
    from ..dream import dream_status

    if deep:
        print_deep_status(app, as_json)
        return
    data = dream_status(app.store, app.config)
    if as_json:
        print_json(data)
        return
    state = "on" if data["enabled"] else "off"
    click.echo(f"Dreaming:  {state} ({data['enabled_by']}); schedule read in {data['timezone']}")
    last = data["last_run"]
    if last:
        click.echo(f"Last run:  {last['id']} ({last['status']}) started {last['started_at']}, "
                   f"phases {', '.join(last['phases'])}: {last['changes']} changes ({last['writes']} journaled writes)")
        for phase, kinds in last["counts"].items():
            if kinds:
                click.echo(f"  {phase:<6} " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    else:
        click.echo("Last run:  never")
    upcoming = data["next_run"] or ("none: dreaming is off" if not data["enabled"] else "not scheduled")
    click.echo(f"Next run:  {upcoming} (schedule {data['schedule']!r})")
    if data["running"]:
        click.echo(f"Running:   run {data['running'].get('run_id')} (pid {data['running'].get('pid')})")
    c = data["candidates"]
    click.echo(f"Waiting:   {c['merge_pairs']} near-duplicate pairs, {c['promotion_ready']} memories ready "
               f"for promotion ({c['promotion_held']} held back by the gates); `llmem dream` previews every change")
    if data["recent_runs"]:
        click.echo("Recent runs:")
        for run in data["recent_runs"]:
            click.echo(f"  {run['id']}  {run['kind']:<8} {run['status']:<7} {run['started_at']}  {run['changes']} changes")


@dream_group.command(name="on")
@json_option()
@click.pass_obj
def dream_on(app, as_json):
    """Turn dreaming on: the worker's periodic dream and the systemd timer run again."""
    _switch(app, True, as_json)


@dream_group.command(name="off")
@json_option()
@click.pass_obj
def dream_off(app, as_json):
    """Turn dreaming off: scheduled runs do nothing until `llmem dream on`."""
    _switch(app, False, as_json)


def _switch(app, enabled: bool, as_json: bool) -> None:
    from ..dream.switch import set_dream_enabled

    switch = set_dream_enabled(app.store, app.config, enabled)
    if as_json:
        print_json(switch.as_dict())
        return
    if enabled:
        click.echo(f"Dreaming is on ({switch.source}): the schedule {app.config.dream.schedule!r} runs it.")
    else:
        click.echo(f"Dreaming is off ({switch.source}): the worker's periodic dream and the systemd timer do nothing; "
                   "`llmem dream --apply` still runs when you ask.")


@dream_group.command(name="help")
@click.pass_context
def dream_help(ctx):
    """Show the dream commands and what the switch does."""
    click.echo(ctx.parent.get_help())


@dream_group.command(name="undo")
@click.argument("run_id")
@click.option("--force", is_flag=True,
              help="Also restore memories changed since the run (their later edits are lost).")
@json_option()
@click.pass_obj
def dream_undo(app, run_id, force, as_json):
    """Restore everything a dream (or promote) run changed; memories edited since are kept."""
    from ..dream import DreamLock, undo_run
    from ..dream.journal import new_run_id

    with DreamLock(app.store.db, new_run_id(), what="undo"):
        result = undo_run(app.store, run_id, force=force)
    if as_json:
        print_json(result.as_dict())
        return
    click.echo(f"Undid run {result.run_id}: {result.restored} memory rows restored, {result.deleted} "
               f"created memories removed, {result.unlinked} relations removed, {result.files} files restored")
    for path in result.skipped_files:
        notice(f"{path} changed since the run; left as it is")
    for memory_id in result.skipped_memories:
        notice(f"memory {memory_id} changed since the run; left as it is")
    if result.skipped_memories:
        notice(f"to restore those too (losing their later edits): llmem dream undo {result.run_id} --force")


@dream_group.group(name="review", invoke_without_command=True)
@json_option()
@click.pass_context
def dream_review(ctx, as_json):
    """List the proposed changes (insights, skill patches) with their ids and decisions."""
    if ctx.invoked_subcommand is not None:
        return
    from ..dream.review import list_proposals

    app = ctx.obj
    path = app.config.paths.proposed_changes_path
    proposals = list_proposals(app.store.db, path)
    if as_json:
        print_json([p.as_dict() for p in proposals])
        return
    if not proposals:
        click.echo(f"No proposed changes in {path}")
        return
    for proposal in proposals:
        decided = proposal.decision
        state = "waiting" if decided is None else f"{decided.decision} by {decided.by}"
        if proposal.changed_since_decision:
            state += " (edited since)"
        click.echo(f"{proposal.id:<32} {state:<36} {short(proposal.title, 60)}")
    click.echo("Decide with: llmem dream review accept|reject ID")


def _decide(app, proposal_id: str, decision: str, note: str, as_json: bool) -> None:
    from ..dream.review import record_decision, reviewer

    made = record_decision(app.store, app.config.paths.proposed_changes_path, proposal_id,
                           decision, by=reviewer("cli"), note=note or "")
    if as_json:
        print_json(made.as_dict())
        return
    click.echo(f"Recorded: {made.proposal_id} {made.decision} by {made.by}. Nothing was applied"
               + (": add the patch to your skill by hand." if decision == "accepted" else "."))


@dream_review.command(name="accept")
@click.argument("proposal_id")
@click.option("--note", type=TEXT, help="Why, for the record.")
@json_option()
@click.pass_obj
def dream_review_accept(app, proposal_id, note, as_json):
    """Record that you accept a proposed change (you apply it by hand)."""
    _decide(app, proposal_id, "accepted", note, as_json)


@dream_review.command(name="reject")
@click.argument("proposal_id")
@click.option("--note", type=TEXT, help="Why, for the record.")
@json_option()
@click.pass_obj
def dream_review_reject(app, proposal_id, note, as_json):
    """Record that you reject a proposed change."""
    _decide(app, proposal_id, "rejected", note, as_json)


for _command in (rem_harness, rem_backfill, shadow):
    dream_group.add_command(_command)


@click.command(name="promote")
@click.option("--apply", "apply_", is_flag=True, help="Promote (default: preview).")
@limit_option("Promote at most N memories.")
@json_option()
@click.pass_obj
def promote(app, apply_, limit, as_json):
    """Promote the best-recalled memories to core (MEMORY.md), behind the deep-phase gates."""
    from ..dream.sweep import run_promote

    outcome = run_promote(app.store, app.config, apply=apply_, limit=limit)
    if as_json:
        print_json({"applied": outcome.applied, "run_id": outcome.run_id,
                    "promote": [c.as_dict() for c in outcome.chosen], "skipped": outcome.skipped,
                    "held": [c.as_dict() for c in outcome.held[:50]]})
        return
    verb = "Promoted" if outcome.applied else "Would promote"
    click.echo(f"{verb} {len(outcome.chosen)} memories ({len(outcome.held)} held back by the gates)")
    for c in outcome.chosen:
        click.echo(f"  {c.memory_id[:8]}  {c.score:.3f}  {c.recalls} recalls, {c.unique_queries} queries  "
                   f"{short(c.content, 70)}")
    for memory_id, why in outcome.skipped.items():
        click.echo(f"  skipped {memory_id[:8]}: {why}")
    if outcome.applied:
        click.echo(f"Undo with: llmem dream undo {outcome.run_id}")
    elif outcome.chosen:
        click.echo("Preview only: add --apply to promote.")


@click.command(name="promote-explain")
@click.argument("target", nargs=-1, required=True)
@limit_option("Memories explained for a query.", default=5)
@json_option()
@click.pass_obj
def promote_explain(app, target, limit, as_json):
    """Explain why a memory (ID, or the results of QUERY) would or would not be promoted."""
    from ..dream.promote import candidates
    from ..dream.verdicts import verdict_line
    from ..errors import LlmemError, NotFound, UsageError

    text = " ".join(target).strip()
    if not text:
        raise UsageError("give a memory id or a query")
    ids = None
    if re.fullmatch(r"[0-9a-fA-F-]{4,36}", text):
        try:
            ids = [app.store.resolve_id(text)]
        except LlmemError:
            ids = None
    if ids is None:
        ids = _search_ids(app, text, limit)
        if not ids:
            raise NotFound(f"no memory matches {text!r}", hint="give a memory id, or another query")
    explained = candidates(app.store, app.config.dream, memory_ids=ids)
    explained.sort(key=lambda c: ids.index(c.memory_id))
    if as_json:
        print_json([c.as_dict() for c in explained])
        return
    for c in explained:
        click.echo(f"{c.memory_id}  [{c.memory_type}]  {short(c.content, 80)}")
        click.echo(f"  verdict: {c.verdict}   score {c.score:.3f}")
        data = c.as_dict()
        for name, signal in data["signals"].items():
            weight = f"× {signal['weight']:.2f}" if signal["weight"] is not None else "(boost)"
            click.echo(f"    {name:<20} {signal['value']:.3f} {weight:<8} = {signal['contribution']:.3f}")
        for name, gate in c.gates.items():
            mark = "pass" if gate["passed"] else "FAIL"
            click.echo(f"    gate {name:<18} {mark}  {gate['value']} (needs ≥ {gate['required']})")
        click.echo(f"    {c.recalls} counted recalls of {c.searches} recorded ({c.grounded} staged from notes; "
                   f"bursts and same-day repeats count once), {c.unique_queries} query contexts, {c.recall_days} "
                   f"days; {c.excluded_recalls} context/dream recalls not counted")
        click.echo(f"    {verdict_line(c.shadow)}")


def _search_ids(app, text: str, limit: int) -> list[str]:
    from ..search import Searcher

    embedder = app.embedder if app.embedder.available else None
    result = Searcher(app.store, embedder).search(
        text, app.search_options(limit=limit, track=False, mode="hybrid" if embedder else "fts"))
    if result.notice:
        notice(result.notice)
    return [hit.memory.id for hit in result.hits]


@click.command(name="backfill")
@click.option("--adapter", "adapter_name", type=agent_choice(),
              help="Which agent's sessions (default: session.adapter; auto reads every agent found).")
@click.option("--since", help="Only sessions active since this date (ISO, e.g. 2026-10-01).")
@limit_option("At most N sessions (oldest first).")
@click.option("--no-llm", is_flag=True, help="Extract with heuristics only.")
@click.option("--rollback", "rollback_id", metavar="RUN_ID", help="Remove what that backfill run added.")
@json_option()
@click.pass_obj
def backfill(app, adapter_name, since, limit, no_llm, rollback_id, as_json):
    """Extract memories from past sessions (resumable); --rollback RUN_ID undoes one."""
    from ..dream.backfill import backfill_adapters, pick_sessions, rollback_backfill, run_backfill
    from ..errors import UsageError
    from ..times import from_iso

    if rollback_id:
        result = rollback_backfill(app.store, rollback_id)
        if as_json:
            print_json(result.as_dict())
        else:
            click.echo(f"Rolled back backfill {result.run_id}: {result.deleted} memories removed, "
                       f"session cursors restored")
        return
    try:
        since_ts = from_iso(since)
    except ValueError:
        raise UsageError(f"--since {since!r} is not a date", hint="use ISO form, e.g. 2026-10-01") from None
    adapters = backfill_adapters(app.config, adapter_name)
    sessions = pick_sessions(adapters, since=since_ts, limit=limit)
    if not sessions:
        where = ", ".join(adapter.name for adapter in adapters) or "no agent's store was found"
        click.echo(f"No sessions to backfill ({where}).")
        return
    label = f"Backfilling {', '.join(adapter.name for adapter in adapters)} sessions"
    with progress_bar(label, len(sessions), show=not as_json) as progress:
        outcome = run_backfill(app, adapter_name=adapter_name, use_llm=not no_llm, sessions=sessions,
                               progress=lambda _info: progress.advance())
    if as_json:
        print_json(outcome.as_dict())
        return
    per_agent = ", ".join(f"{name} {outcome.sessions_by_adapter.get(name, 0)}" for name in outcome.adapters)
    click.echo(f"Backfill {outcome.run_id}: {outcome.sessions} sessions ({per_agent}), "
               f"{outcome.added} memories added, "
               f"{outcome.updated} updated, {outcome.duplicates} duplicates skipped"
               + (f", {outcome.deferred} deferred (token budget)" if outcome.deferred else ""))
    if outcome.llm_unreachable:
        click.echo("The LLM could not be reached: the sessions after it failed were read with the heuristics alone")
    for error in outcome.errors:
        notice(f"{error['adapter']} session {error['session_id']}: {error['error']}")
    click.echo(f"Roll back with: llmem backfill --rollback {outcome.run_id}")
