"""Commands that record lessons: introspect, learn, track-review."""

from __future__ import annotations

import click

from .output import PROJECT, bounded_int, http_url, json_option, notice, print_json
from .session import ADAPTER_CHOICE


def _llm_override(app, model, base_url):
    """An LLM built with --model/--base-url, or None when neither was given."""
    if not model and not base_url:
        return None
    from ..providers.llm import make_llm

    llm = make_llm(app.config, model=model, base_url=base_url, store=app.store)
    if llm is None:
        notice("llm.provider is none in config.yaml: --model/--base-url are ignored")
    return llm


def _report(memories, as_json: bool, empty: str) -> None:
    from ..store import memory_to_dict

    if as_json:
        print_json([memory_to_dict(m) for m in memories])
        return
    if not memories:
        click.echo(empty)
    for memory in memories:
        meta = memory.metadata or {}
        if memory.type == "self_assessment":
            click.echo(f"Stored self_assessment {memory.id} ({meta.get('category')}, "
                       f"recurring: {meta.get('recurring', 'no')})")
        else:
            click.echo(f"Stored {memory.type} {memory.id}")


@click.command()
@click.option("--category", help="Error taxonomy category, e.g. NULL_SAFETY (manual mode).")
@click.option("--what-happened", help="The behaviour, not a narrative (manual mode).")
@click.option("--context", help="Where and when: file, task, session.")
@click.option("--caught-by", help="How it was discovered: self-review, test, user, CI.")
@click.option("--proposed-fix", help="A procedural directive that prevents it recurring.")
@click.option("--outcomes", help="What resulted; first try or several iterations?")
@click.option("--estimates-vs-actual", help="Was the complexity estimate right?")
@click.option("--iteration-count", type=bounded_int(), help="Attempts before success (1 = first try).")
@click.option("--auto", is_flag=True, help="Introspect a session (--session) or a text (--text) automatically.")
@click.option("--session", "session_id", help="Session id to introspect (with --auto).")
@click.option("--text", help="Text to introspect (with --auto).")
@click.option("--adapter", type=ADAPTER_CHOICE,
              help="Session adapter (default: session.adapter in config.yaml).")
@click.option("--project", type=PROJECT, help="Project (a folder: its repository) the lesson belongs to (default: global; a session's own with --session).")
@click.option("--model", help="LLM model for this run (overrides llm.model).")
@click.option("--base-url", callback=http_url, help="LLM server URL for this run (overrides llm.base_url).")
@json_option("Print the stored memories as JSON.")
@click.pass_obj
def introspect(app, category, what_happened, context, caught_by, proposed_fix, outcomes,
               estimates_vs_actual, iteration_count, auto, session_id, text, adapter, project, model,
               base_url, as_json):
    """Analyse a mistake and store it as a self_assessment memory."""
    from ..capture.introspect import (
        CATEGORIES,
        check_category,
        introspect_manual,
        introspect_session,
        introspect_text,
    )
    from ..errors import UsageError

    if auto:
        if bool(session_id) == bool(text):
            raise UsageError("--auto needs exactly one of --session ID or --text TEXT",
                             hint='e.g. llmem introspect --auto --session ses_123, or --auto --text "…"')
        if category or what_happened:
            raise UsageError("--category/--what-happened are for manual mode, not --auto")
        if session_id and project:
            raise UsageError("--project does not go with --session: a session's lessons take its own project",
                             hint="drop --project, or use --text")
        llm = _llm_override(app, model, base_url)
        try:
            if session_id:
                memories = introspect_session(app, session_id, adapter_name=adapter, llm=llm)
            else:
                memories = introspect_text(app, text, llm=llm, project=project)
        finally:
            if llm is not None:
                llm.close()
        _report(memories, as_json, "Nothing went wrong: no self_assessment stored.")
        return
    if session_id or text:
        raise UsageError("--session and --text need --auto", hint="add --auto")
    if not category or not what_happened:
        raise UsageError("manual introspection needs --category and --what-happened",
                         hint="categories: " + ", ".join(CATEGORIES) + "; or use --auto")
    check_category(category)
    llm = _llm_override(app, model, base_url)
    try:
        memories = introspect_manual(app, category, what_happened, context=context,
                                     caught_by=caught_by, proposed_fix=proposed_fix,
                                     outcomes=outcomes, estimates_vs_actual=estimates_vs_actual,
                                     iteration_count=iteration_count, llm=llm, project=project)
    finally:
        if llm is not None:
            llm.close()
    _report(memories, as_json, "")


@click.command()
@click.option("--wrong", required=True, help="What was done wrong.")
@click.option("--right", required=True, help="What to do instead.")
@click.option("--context", help="Where it happened, e.g. handler.py:42.")
@json_option("Print the stored memory as JSON.")
@click.pass_obj
def learn(app, wrong, right, context, as_json):
    """Learn a lesson from a wrong → right correction."""
    from ..capture.introspect import learn as learn_lesson

    _report(learn_lesson(app, wrong, right, context), as_json, "")


@click.command("track-review")
@click.option("--single", is_flag=True, help="Record one finding (with --category and --context).")
@click.option("--category", help="Taxonomy category of the single finding.")
@click.option("--what-happened", help="What the finding is (single mode).")
@click.option("--proposed-fix", help="How to prevent it (single mode).")
@click.option("--findings", "findings_file", type=click.Path(dir_okay=False),
              help="JSON file of findings: a list of {category, context, what_happened, …}.")
@click.option("--context", help="Where: file, PR, task (default context of every finding).")
@click.option("--clean", is_flag=True, help="Invalidate every earlier track-review memory first.")
@json_option("Print the stored memories as JSON.")
@click.pass_obj
def track_review(app, single, category, what_happened, proposed_fix, findings_file, context,
                 clean, as_json):
    """Track review findings as self_assessments; no findings → REVIEW_PASSED."""
    from ..capture.introspect import CATEGORIES
    from ..capture.introspect import track_review as track
    from ..errors import UsageError

    finding = None
    if single or category:
        if findings_file:
            raise UsageError("--single and --findings cannot be combined", hint="use one or the other")
        if not category:
            raise UsageError("--single needs --category", hint="categories: " + ", ".join(CATEGORIES))
        finding = {"category": category, "context": context, "what_happened": what_happened,
                   "proposed_fix": proposed_fix}
    elif what_happened or proposed_fix:
        raise UsageError("--what-happened/--proposed-fix need --single --category")
    memories = track(app, single=finding, findings_file=findings_file, context=context, clean=clean)
    if clean and not as_json:
        click.echo(f"Invalidated {memories.invalidated} earlier track-review memories")
    _report(memories, as_json, "" if clean else "Nothing stored.")
