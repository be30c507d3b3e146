"""Commands for a store several machines and a team share: share."""

from __future__ import annotations

import click

from ..db.models import SHAREABLE_TYPES
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
