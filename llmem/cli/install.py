"""`llmem install <agent>`: connect llmem to an agent — its hooks (or plugin) and its MCP server.

One command per agent of the registry that llmem installs into (adapters/registry.py; an
agent's `install_help` says what its install does); `llmem install systemd` is added by
cli/pipeline.py."""

from __future__ import annotations

import click

from ..adapters.registry import all_agents
from .output import json_option, print_json


@click.group("install")
def install_group():
    """Connect llmem to an agent: its hooks (or plugin) and its MCP server `llmem mcp`."""


_PART_LABELS = {"plugin": "the {label} plugin", "hooks": "the {label} hooks",
                "notify": "Codex's notify program", "mcp": "the llmem MCP server for {label}"}


def _report(outcome, as_json: bool) -> None:
    if as_json:
        print_json(outcome.as_dict())
        return
    from ..setup.agents import label

    shown_backups = set()
    for part in outcome.parts:
        what = _PART_LABELS[part.part].format(label=label(outcome.agent))
        subject, be = what[0].upper() + what[1:], "are" if part.part == "hooks" else "is"
        where = part.path
        message = {
            "created": f"Installed {what}: {where}",
            "updated": f"Updated {what}: {where}",
            "unchanged": f"{subject} {be} already installed: {where}",
            "removed": f"Removed {what}: {where}",
            "absent": f"{subject} {be} not installed (not in {where})",
            "kept": f"{subject}: left as it was in {where} (see the note below)",
        }[part.action]
        backup = part.as_dict()["backup"]
        if backup and backup not in shown_backups:
            shown_backups.add(backup)
            message += f" (backup: {backup})"
        click.echo(message)
    for note in outcome.notes:
        click.echo(f"note: {note}")


def _install_command(agent: str, what: str) -> click.Command:
    @click.command(agent, help=what)
    @click.option("--uninstall", is_flag=True, help="Remove exactly what llmem added.")
    @click.option("--no-mcp", "no_mcp", is_flag=True, help="Leave the agent's MCP configuration alone.")
    @json_option("Print what was done as JSON.")
    @click.pass_obj
    def command(app, uninstall, no_mcp, as_json):
        from ..setup import agents

        _report(agents.install(app.config, agent, uninstall=uninstall, with_mcp=not no_mcp), as_json)

    return command


for _agent in all_agents():
    if _agent.install_help:
        install_group.add_command(_install_command(_agent.name, _agent.install_help))
