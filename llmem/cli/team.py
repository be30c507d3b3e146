"""Commands for a store several machines and a team share: share, store copy."""

from __future__ import annotations

import click

from .output import PROJECT, json_option, print_json


@click.command()
@click.argument("project", type=PROJECT, required=False)
@click.option("--unshare", is_flag=True, help="Stop sharing: the project's memories are yours alone again.")
@click.option("--list", "listing", is_flag=True, help="List the shared projects and who shares them.")
@json_option()
@click.pass_obj
def share(app, project, unshare, listing, as_json):
    """Share a project's facts, decisions and procedures with everyone who uses this store.

    PROJECT is a folder (its repository's project) or a project key such as
    github.com/acme/api. Memories stay private until shared: preferences, self-assessments
    and the conversation itself are never shared. On a PostgreSQL store the server enforces
    it (each teammate connects as their own database role); a SQLite file is one user's."""
    from ..db.visibility import shared_projects, store_author
    from ..errors import UsageError

    if listing:
        rows = [{"project": p, "shared_by": a or None, "since": at} for p, a, at in shared_projects(app.store.db)]
        if as_json:
            print_json(rows)
            return
        for row in rows:
            click.echo(f"{row['project']}  shared by {row['shared_by'] or 'you'}")
        if not rows:
            click.echo("No project is shared.")
        return
    if not project:
        raise UsageError("name the project to share", hint="llmem share PROJECT (a folder or a key), or --list")
    from ..db.models import SHAREABLE_TYPES  # here: `llmem --help` imports this module, not peewee

    changed = app.store.share(project, shared=not unshare)
    kinds = ", ".join(SHAREABLE_TYPES)
    if as_json:
        print_json({"project": project, "shared": not unshare, "memories_changed": changed,
                    "author": store_author(app.store.db)})
        return
    if unshare:
        click.echo(f"{project} is no longer shared: {changed} of your memories are private again.")
    else:
        click.echo(f"Shared {project}: your {kinds} there ({changed} now) and those to come are readable "
                   "by everyone who uses this store.")


@click.group("store")
def store_group():
    """The store itself: copy it onto another backend."""


@store_group.command("copy")
@click.option("--to", "target_url", required=True,
              help="The store to copy into: postgresql://USER@HOST:PORT/DB, or sqlite:///PATH.")
@click.option("--merge", is_flag=True, help="Add to a target that already holds memories (else refused).")
@json_option("Print the per-table checks as JSON.")
@click.pass_obj
def store_copy(app, target_url, merge, as_json):
    """Copy every memory, relation, vector, journal entry, cursor and event into another
    store (SQLite → PostgreSQL and back), checked by counts and hashes at the end.

    A copy killed midway resumes where it stopped when run again. The source is not changed;
    point llmem at the copy with `llmem config set store.url URL` when it is done."""
    from ..config import check_store_url
    from ..db.connection import names_this_store
    from ..errors import LlmemError, UsageError
    from ..redact import masked_url
    from ..store import Store
    from ..transfer import copy_store

    try:
        check_store_url(target_url)
    except ValueError as exc:
        raise UsageError(f"--to: {exc}", hint="a postgresql://… URL or sqlite:///PATH") from None
    if names_this_store(app.store.db, target_url):
        raise UsageError("the target is the store itself", hint="--to names another store")
    target = Store.open(target_url)
    try:
        outcome = copy_store(app.store, target, merge=merge)
    finally:
        target.close()
    if as_json:
        print_json(outcome.as_dict())
    else:
        click.echo(f"{'Resumed and copied' if outcome.resumed else 'Copied'} {app.store.db.location} → "
                   f"{masked_url(target_url)}")
        for check in outcome.checks:
            click.echo(f"  {check.table:<15} {check.copied:>8} copied, {check.source_rows:>8} in the source, "
                       f"{check.target_rows:>8} in the target  {'ok' if check.matches else 'MISMATCH'}")
        click.echo(f"  vector index: {outcome.vectors_indexed} vectors")
    if not outcome.ok:
        bad = ", ".join(c.table for c in outcome.checks if not c.matches)
        raise LlmemError(f"the copy does not match its source in: {bad}",
                         hint="run the same command again (it resumes); if it persists, report it with -v")
    if not as_json:
        click.echo(f"Done. To use it: llmem config set store.url '{masked_url(target_url)}' "
                   "(with the password, or in ~/.pgpass), then `llmem queue --reset` to requeue pending events.")

