"""Commands over single memories: add, get, list, update, invalidate, correct, delete (the writes
through the memory service, llmem/memories.py)."""

from __future__ import annotations

import click

from .output import (
    PROJECT,
    TEXT,
    json_option,
    limit_option,
    memory_line,
    notice,
    parse_json_object,
    print_json,
    progress_bar,
    terminal_text,
)

TYPE_CHOICE = click.Choice(["fact", "decision", "preference", "event", "project_state", "procedure",
                            "conversation", "self_assessment"])


def _say_pending(pending: str | None) -> None:
    """Tell the user a memory stored without its vector catches up later (the service's note)."""
    if pending:
        notice(f"stored without embedding ({pending}); `llmem embed --pending` embeds it later")


def catch_up_embeddings(app, *, show: bool = True) -> None:
    """After a bulk write (import, import-native, a dream): embed what is pending while the
    embedder answers; when it does not, say how the vectors catch up later."""
    from ..vectors import catch_up, pending_query

    if not app.embedder.available:
        return
    pending = pending_query(app.store, app.embedder.identity).count()
    if not pending:
        return
    with progress_bar("Embedding", pending, show=show) as progress:
        _, stopped = catch_up(app.store, app.embedder, progress=progress.to)
    if stopped:
        notice(f"some memories are not embedded yet ({stopped}); the worker or "
               "`llmem embed --pending` embeds them later")


@click.command()
@click.option("--content", "-c", type=TEXT, required=True, help="The memory text.")
@click.option("--type", "-t", "memory_type", type=TYPE_CHOICE, default="fact", show_default=True)
@click.option("--summary", type=TEXT, help="A short summary.")
@click.option("--confidence", type=click.FloatRange(0.0, 1.0),
              help="0.0–1.0 (default 0.9 for what you add yourself).")
@click.option("--project", type=PROJECT, help="Project (a folder: its repository) this memory belongs to (default: global).")
@click.option("--metadata", help="JSON object of extra fields.")
@click.option("--valid-until", help="ISO date after which the memory no longer holds.")
@json_option("Print the stored memory as JSON.")
@click.pass_obj
def add(app, content, memory_type, summary, confidence, project, metadata, valid_until, as_json):
    """Add a memory."""
    from ..errors import UsageError
    from ..store import memory_to_dict
    from ..times import from_iso

    meta = parse_json_object(metadata, "--metadata")
    try:
        until = from_iso(valid_until)
    except ValueError:
        raise UsageError(f"--valid-until {valid_until!r} is not a date", hint="use ISO form, e.g. 2027-01-31") from None
    result = app.memories.add(content, memory_type, summary=summary, confidence=confidence,
                              source="user", project=project, metadata=meta, valid_until=until)
    _say_pending(result.pending)
    if as_json:
        print_json({**memory_to_dict(result.memory), "created": result.created})
    elif result.created:
        click.echo(f"Added {result.memory.id}")
    else:
        click.echo(f"Already stored as {result.memory.id}")


@click.command()
@click.argument("memory_id")
@json_option()
@click.pass_obj
def get(app, memory_id, as_json):
    """Show one memory by id or unique prefix (read-only: access is not tracked)."""
    from ..store import memory_to_dict

    memory = app.store.get(memory_id)
    data = memory_to_dict(memory)
    relations = app.store.relations_of([memory.id])
    data["relations"] = [{"source_id": r.source_id, "target_id": r.target_id, "type": r.type}
                         for r in relations]
    if as_json:
        print_json(data)
        return
    for key, value in data.items():
        if key in ("metadata", "relations"):
            continue
        if value is not None:
            click.echo(terminal_text(f"{key:>15}: {value}"))
    if data["metadata"]:
        import json

        click.echo(terminal_text(f"{'metadata':>15}: {json.dumps(data['metadata'], ensure_ascii=False)}"))
    for rel in data["relations"]:
        click.echo(terminal_text(f"{'relation':>15}: {rel['source_id'][:8]} --{rel['type']}--> {rel['target_id'][:8]}"))


@click.command("list")
@click.option("--type", "-t", "memory_type", type=TYPE_CHOICE, help="Only this type.")
@click.option("--project", type=PROJECT, help="Only this project.")
@limit_option(default=50)
@click.option("--all", "include_all", is_flag=True, help="Include invalidated and expired memories.")
@json_option()
@click.pass_obj
def list_memories(app, memory_type, project, limit, include_all, as_json):
    """List memories, newest first."""
    app.reads_only()  # a full disk or a read-only file system still lists
    from ..store import memory_to_dict
    from ..times import now

    memories = app.store.list(memory_type=memory_type, project=project, limit=limit,
                              include_invalid=include_all,
                              unexpired_at=None if include_all else now())
    if as_json:
        print_json([memory_to_dict(m) for m in memories])
        return
    if not memories:
        click.echo("No memories.", err=True)
    for memory in memories:
        click.echo(memory_line(memory))


@click.command()
@click.argument("memory_id")
@click.option("--content", type=TEXT, help="New text (re-embedded).")
@click.option("--summary", type=TEXT, help="New summary.")
@click.option("--confidence", type=click.FloatRange(0.0, 1.0))
@click.option("--type", "-t", "memory_type", type=TYPE_CHOICE)
@click.option("--metadata", help="JSON object merged into the metadata.")
@json_option("Print the updated memory as JSON.")
@click.pass_obj
def update(app, memory_id, content, summary, confidence, memory_type, metadata, as_json):
    """Change a memory's content, summary, confidence, type or metadata."""
    from ..errors import UsageError
    from ..store import memory_to_dict

    meta = parse_json_object(metadata, "--metadata")
    if all(v is None for v in (content, summary, confidence, memory_type, meta)):
        raise UsageError("nothing to update",
                         hint="pass --content, --summary, --confidence, --type or --metadata")
    result = app.memories.update(memory_id, content=content, summary=summary, confidence=confidence,
                                 memory_type=memory_type, metadata=meta)
    _say_pending(result.pending)
    memory = result.memory
    if as_json:
        print_json(memory_to_dict(memory))
    else:
        click.echo(f"Updated {memory.id}")


@click.command()
@click.argument("memory_id")
@click.option("--reason", type=TEXT, required=True, help="Why it no longer holds.")
@click.pass_obj
def invalidate(app, memory_id, reason):
    """Invalidate a memory (soft delete: kept for reference, no longer returned).

    An invalidated memory is left as it was, first reason and time kept, and the command says so.
    """
    from ..memories import AlreadyInvalid
    from ..times import to_iso

    result = app.memories.invalidate(memory_id, reason)
    memory = result.memory
    if isinstance(result, AlreadyInvalid):
        click.echo(f"Already invalidated {memory.id} at {to_iso(memory.invalidated_at)} ({result.reason}); "
                   "left as it was")
        return
    click.echo(f"Invalidated {memory.id}")


@click.command()
@click.argument("memory_id")
@click.option("--content", "-c", type=TEXT, required=True, help="What holds now.")
@click.option("--reason", type=TEXT, help="Why the old text no longer holds (default: superseded by the new id).")
@json_option("Print the new memory as JSON.")
@click.pass_obj
def correct(app, memory_id, content, reason, as_json):
    """Correct a memory: a new one stating --content supersedes it, and it is invalidated.

    Nothing is overwritten: the old text stays, invalidated, linked from the new one.
    """
    from ..store import memory_to_dict

    result = app.memories.correct(memory_id, content, reason=reason)
    _say_pending(result.pending)
    if as_json:
        print_json({**memory_to_dict(result.memory), "supersedes": result.replaced.id})
    else:
        click.echo(f"Stored {result.memory.id}, which supersedes {result.replaced.id} (now invalid)")


@click.command()
@click.argument("memory_id")
@click.pass_obj
def delete(app, memory_id):
    """Delete a memory for good, with its relations on both sides."""
    deleted = app.memories.delete(memory_id)
    click.echo(f"Deleted {deleted}")
