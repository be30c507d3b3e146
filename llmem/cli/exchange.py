"""Moving memories in and out: export, import, import-native (an agent's own instruction files)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .choices import native_choice
from .memory import catch_up_embeddings
from .output import json_option, notice, print_json, progress_bar


@click.command()
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="File to write (- for stdout).")
@click.option("--embeddings", is_flag=True, help="Include the vectors (base64 float32).")
@click.pass_obj
def export(app, output, embeddings):
    """Export every memory and relation as JSON."""
    from ..exchange import export_data
    from ..paths import check_output_folder, write_output_file

    if output != "-":
        check_output_folder(Path(output))  # before the work: a typo fails at once
    data = export_data(app.store, include_embeddings=embeddings)
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if output == "-":
        sys.stdout.write(text)
        _say_rescue(data)
        return
    write_output_file(Path(output), text)
    click.echo(f"Exported {len(data['memories'])} memories and {len(data['relations'])} relations to {output}")
    _say_rescue(data)


def _say_rescue(data: dict) -> None:
    """A damaged store's export: what it could not save, on stderr."""
    rescue = data.get("rescue")
    if not rescue:
        return
    notice(f"the store is damaged: saved every row that could be read; {rescue['unreadable_memories']} "
           f"memory rows and {rescue['unreadable_relations']} relations could not be read, "
           f"{rescue['memories_with_damaged_text']} memories were saved with damaged text (U+FFFD)")


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--dry-run", is_flag=True, help="Check the file and show what would change; write nothing.")
@json_option("Print the outcome as JSON.")
@click.pass_obj
def import_memories(app, file, dry_run, as_json):
    """Import an export file: checked whole first, then written all at once (ids kept)."""
    from ..errors import UsageError
    from ..exchange import apply_import, plan_import
    from ..paths import decode_utf8

    source = "standard input" if file == "-" else file
    try:
        data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}") from None
    text = decode_utf8(data, source, hint="`llmem export` writes UTF-8; convert the file, e.g. with iconv -t UTF-8")
    try:
        document = json.loads(text)
    except RecursionError:
        raise UsageError(f"{source} nests its JSON too deeply to be an export file",
                         hint="is it an `llmem export` file?") from None
    except ValueError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}", hint="is it an `llmem export` file?") from None
    plan = plan_import(app.store, document)
    if plan.errors:
        for error in plan.errors[:20]:
            click.echo(f"  {error}", err=True)
        more = len(plan.errors) - 20
        if more > 0:
            click.echo(f"  … and {more} more", err=True)
        raise UsageError(f"{source} has {len(plan.errors)} problem(s); nothing was imported")
    if dry_run:
        outcome = plan.summary()
    else:
        with progress_bar("Importing", len(plan.new), show=not as_json) as progress:
            outcome = apply_import(app.store, plan, progress=progress.to)
    outcome["dry_run"] = dry_run
    if not dry_run and outcome["new"]:
        catch_up_embeddings(app, show=not as_json)
    if as_json:
        print_json(outcome)
        return
    verb = "Would import" if dry_run else "Imported"
    click.echo(f"{verb} {outcome['new']} memories and {outcome['relations']} relations "
               f"({outcome['already_present']} already present, {outcome['duplicates']} duplicates of existing memories)")


@click.command("import-native")
@click.argument("agent", type=native_choice())
@click.option("--project", "project_dir", type=click.Path(file_okay=False),
              help="Project folder whose instruction files to read (default: the current folder).")
@click.option("--dry-run", is_flag=True, help="Show what would be added or retired; write nothing.")
@json_option("Print the outcome as JSON.")
@click.pass_obj
def import_native(app, agent, project_dir, dry_run, as_json):
    """Bring an agent's own instruction and memory files in (CLAUDE.md and Claude Code's
    memory folder, AGENTS.md, Copilot instructions): one memory per bullet or paragraph, with
    its source path; a second run adds nothing, a changed note supersedes the old one."""
    import os

    from ..adapters.native import native_files
    from ..adapters.registry import get_agent
    from ..capture.native import import_native as run_import
    from ..errors import UsageError
    from ..paths import project_key, project_root_of

    folder = Path(project_dir or os.getcwd()).expanduser().resolve()
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder", hint="pass --project with a project folder")
    root = project_root_of(str(folder))
    project = project_key(root)
    config = app.config
    unit = get_agent(agent)
    dirs = list(dict.fromkeys([Path(root), folder]))
    refused: list = []
    files = native_files(unit, unit.native_home(config), dirs, project, refused)
    for path in refused:
        notice(f"not read: {path.entry!r} in {path.config} names a file outside the folder "
               f"{path.folder}; only files inside it are imported")
    outcome = run_import(app.store, agent, files, project=project, dry_run=dry_run)
    if not dry_run and outcome.added:
        catch_up_embeddings(app, show=not as_json)
    if as_json:
        print_json({**outcome.as_dict(), "agent": agent, "project": project, "dry_run": dry_run,
                    "refused": [path.as_dict() for path in refused]})
        return
    if not files and not outcome.retired:
        click.echo(f"No {agent} instruction or memory files found for {project}")
        return
    verb = "Would add" if dry_run else "Added"
    for row in outcome.added:
        first = row["content"].splitlines()[0][:100]
        where = row["path"] + (f" § {row['section']}" if row["section"] else "")
        click.echo(f"  + [{row['type']}] {first}  ({where})")
    for row in outcome.retired:
        click.echo(f"  - {row['content'].splitlines()[0][:100]}  (no longer in its file)")
    click.echo(f"{verb} {len(outcome.added)} memories from {len(files)} file(s): "
               f"{outcome.unchanged} already present, {len(outcome.superseded)} superseding a changed note, "
               f"{len(outcome.retired)} {'would be ' if dry_run else ''}retired")
