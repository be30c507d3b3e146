"""The grounded lane and the review of promotion candidates: `dream rem-harness`,
`dream rem-backfill`, `dream shadow`, and what `dream status --deep` prints."""

from __future__ import annotations

import click

from .output import bounded_int, json_option, print_json, short


@click.command(name="rem-harness")
@click.option("--path", "folder", type=click.Path(file_okay=False, path_type=str),
              help="A folder of dated YYYY-MM-DD.md notes (with --grounded).")
@click.option("--grounded", is_flag=True, help="Preview the grounded diary entries of the notes in --path.")
@json_option()
@click.pass_obj
def rem_harness(app, folder, grounded, as_json):
    """Preview what REM would reflect and deep would promote (or, with --path DIR --grounded,
    the grounded diary entries of dated notes). Writes nothing."""
    from pathlib import Path

    from ..errors import UsageError

    if bool(folder) != grounded:
        raise UsageError("--path and --grounded go together",
                         hint="`llmem dream rem-harness --path DIR --grounded` previews dated notes; "
                              "`llmem dream rem-harness` alone previews the store")
    if grounded:
        from ..dream.grounded import preview

        outcome = preview(app.config, Path(folder))
        if as_json:
            print_json(outcome.as_dict())
            return
        _print_notes(outcome)
        click.echo("Preview only: `llmem dream rem-backfill --path DIR` writes these entries.")
        return
    from ..dream.harness import rem_harness as harness

    data = harness(app.store, app.config)
    if as_json:
        print_json(data)
        return
    rem, deep = data["rem"], data["deep"]
    click.echo("REM would reflect (nothing written):")
    for theme in rem["themes"][:8]:
        click.echo(f"  theme {theme.get('term')} ({theme.get('memories')} memories)")
    for category, info in rem["categories"].items():
        click.echo(f"  {info['count']} self_assessment memories about {category}")
    for truth in rem["candidate_truths"]:
        click.echo(f"  candidate truth: {short(truth, 100)}")
    if not (rem["themes"] or rem["categories"] or rem["candidate_truths"]):
        click.echo("  nothing recurring yet")
    click.echo(f"Deep would promote {len(deep['promote'])} memories to MEMORY.md:")
    for item in deep["promote"]:
        click.echo(f"  {item['memory_md_line']}")
    if deep["held"]:
        click.echo("Held back (best first):")
        for item in deep["held"]:
            click.echo(f"  {item['memory_id'][:8]}  {item['score']:.3f}  {item['verdict']}")


def _print_notes(outcome) -> None:
    for note in outcome.notes:
        if note.skipped:
            click.echo(f"{note.path.name}: skipped, {note.skipped}")
            continue
        if note.day in outcome.already:
            click.echo(f"{note.path.name}: already replayed by run {outcome.already[note.day]}")
            continue
        click.echo(note.entry(outcome.run_id))
    if outcome.ignored:
        click.echo(f"Not dated notes, left out: {', '.join(outcome.ignored[:10])}"
                   + (" …" if len(outcome.ignored) > 10 else ""))
    if not outcome.notes:
        click.echo("No YYYY-MM-DD.md note in that folder.")


@click.command(name="rem-backfill")
@click.option("--path", "folder", type=click.Path(file_okay=False, path_type=str),
              help="A folder of dated YYYY-MM-DD.md notes to replay.")
@click.option("--stage-short-term", "stage", is_flag=True,
              help="Also stage their durable candidates as evidence for deep ranking.")
@click.option("--rollback", "rollback_id", metavar="RUN_ID",
              help="Remove what that backfill wrote and staged.")
@click.option("--rollback-short-term", "rollback_short", is_flag=True,
              help="Remove the staged evidence only (of every backfill, or of --rollback RUN_ID).")
@json_option()
@click.pass_obj
def rem_backfill(app, folder, stage, rollback_id, rollback_short, as_json):
    """Write grounded, reversible diary entries for dated notes to DREAMS.md (journaled);
    --rollback RUN_ID or --rollback-short-term removes exactly what a backfill staged."""
    from pathlib import Path

    from ..dream import DreamLock
    from ..dream.grounded import rollback, run_rem_backfill
    from ..dream.journal import new_run_id
    from ..errors import UsageError

    rolling = bool(rollback_id or rollback_short)
    if folder and rolling:
        raise UsageError("--path replays notes; --rollback/--rollback-short-term undo a replay: give one or the other")
    if not folder and not rolling:
        raise UsageError("nothing to do", hint="give --path DIR to replay dated notes, or --rollback RUN_ID")
    if stage and not folder:
        raise UsageError("--stage-short-term stages the notes of --path DIR", hint="add --path DIR")
    with DreamLock(app.store.db, new_run_id(), what="rem-backfill"):
        if rolling:
            result = rollback(app.store, app.config, rollback_id, short_term_only=rollback_short)
        else:
            outcome = run_rem_backfill(app.store, app.config, Path(folder), stage=stage)
    if rolling:
        if as_json:
            print_json(result.as_dict())
            return
        what = "staged evidence of" if result.short_term_only else "grounded backfill"
        click.echo(f"Rolled back {what} {', '.join(result.runs) or 'no run'}: {result.recalls_removed} staged "
                   f"recalls and {result.memories_removed} staged memories removed"
                   + ("" if result.short_term_only else f", {result.entries_removed} diary entries removed"))
        for memory_id, why in result.memories_kept.items():
            click.echo(f"  kept {memory_id[:8]}: {why}")
        return
    if as_json:
        print_json(outcome.as_dict())
        return
    click.echo(f"Grounded backfill {outcome.run_id}: {len(outcome.written)} diary entries written to "
               f"{outcome.dreams_md}" + (f", {outcome.staged_recalls} recalls staged "
                                         f"({outcome.staged_memories} new memories)" if stage else ""))
    for day, run_id in outcome.already.items():
        if any(note.day == day for note in outcome.notes):
            click.echo(f"  {day}: already replayed by run {run_id}")
    for note in outcome.notes:
        if note.skipped:
            click.echo(f"  {note.path.name}: skipped, {note.skipped}")
    click.echo(f"Roll back with: llmem dream rem-backfill --rollback {outcome.run_id}")


@click.command(name="shadow")
@click.option("--limit", "-n", type=bounded_int(), default=10, show_default=True,
              help="Candidates to try, best first.")
@json_option()
@click.pass_obj
def shadow(app, limit, as_json):
    """Shadow-trial the promotion candidates with the LLM (report-only: never promotes)."""
    from ..dream.shadow import run_shadow_trial

    outcome = run_shadow_trial(app.store, app.config, limit=limit)
    if as_json:
        print_json(outcome.as_dict())
        return
    if not outcome.ran:
        click.echo(f"Shadow trial did not run: {outcome.reason}. Nothing recorded.")
        return
    click.echo(f"Shadow trial {outcome.run_id} (report-only: nothing promoted, MEMORY.md untouched):")
    for row in outcome.rows:
        flags = ", ".join(row["risk_flags"]) or "none"
        click.echo(f"  {row['memory_id'][:8]}  {row['verdict']:<8} → {row['suggestion']:<7} {short(row['reason'], 70)}"
                   f"  [risk: {flags}]")
    for failure in outcome.failed:
        click.echo(f"  {failure['memory_id'][:8]}  no verdict: {failure['error']}")
    click.echo(f"Retract with: llmem dream undo {outcome.run_id}")


def print_deep_status(app, as_json: bool) -> None:
    """`dream status --deep`: every candidate, its signals, the gates holding it, its verdict
    (with --json, beside everything `dream status --json` carries)."""
    from ..dream import dream_status
    from ..dream.deep_status import deep_status
    from ..dream.promote import candidates
    from ..dream.verdicts import verdict_line

    # Scored once for both: scoring reads every recall.
    ranked = candidates(app.store, app.config.dream)
    data = deep_status(app.store, app.config, ranked=ranked)
    if as_json:
        print_json({**dream_status(app.store, app.config, ranked=ranked), "deep": data})
        return
    gates = data["gates"]
    click.echo(f"Promotion candidates: {data['total']} ({data['ready']} pass every gate: score ≥ "
               f"{gates['min_score']}, ≥ {gates['min_recall_count']} recalls, ≥ {gates['min_unique_queries']} "
               f"query contexts; searches within {data['burst_window_minutes']} min count once)")
    for c in data["candidates"]:
        held = ", ".join(c["holding_gates"]) or "none"
        r = c["recalls"]
        click.echo(f"{c['memory_id'][:8]}  {c['score']:.3f}  [{c['type']}] {short(c['content'], 70)}")
        click.echo(f"    {r['counted']} counted recalls of {r['searches']} recorded ({r['grounded']} staged from notes), "
                   f"{r['unique_queries']} query contexts, {r['days']} days; held by: {held}; {c['verdict']}")
        click.echo("    " + "  ".join(f"{name} {s['value']:.2f}" for name, s in c["signals"].items()))
        if c["shadow"]:
            click.echo("    " + verdict_line(c["shadow"]))
    staged = data["grounded_staged"]
    click.echo(f"Grounded evidence staged: {staged['recalls']} recalls on {staged['memories']} memories")
    trial = data["shadow_trial"]
    if trial:
        counts = ", ".join(f"{k} {v}" for k, v in sorted((trial.get("verdicts") or {}).items())) or "no verdict"
        click.echo(f"Last shadow trial: {trial['run_id']} at {trial['at']}: {counts}")
    elif data["shadow_trial_can_run"]:
        click.echo("Shadow trial: never ran (`llmem dream shadow` runs it)")
    else:
        click.echo("Shadow trial: did not run: no LLM is configured (llm.provider: none)")
