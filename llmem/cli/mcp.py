"""The mcp command: llmem's tools for agents, served over stdio by the MCP SDK."""

from __future__ import annotations

import logging

import click


@click.command()
@click.argument("action", required=False, type=click.Choice(["serve"]))
@click.pass_obj
def mcp(app, action):
    """Serve memory tools to an agent over MCP (stdio; `serve` is a synonym).

    The agent starts it: register the command `llmem mcp` in its MCP settings
    (`llmem install AGENT` does). Logs go to mcp.log; stdout is the protocol. While a
    worker, `llmem run` or another `llmem mcp` is alive, this process only relays the
    session to it, which answers with its store and model already open.
    """
    from ..mcp_server import serve

    if not click.get_current_context().find_root().params["verbose"]:
        # stderr ends up in the agent's own log of this server: warnings only there, the
        # rest is in mcp.log.
        for handler in logging.getLogger("llmem").handlers:
            if getattr(handler, "_llmem_stderr", False):
                handler.setLevel(logging.WARNING)
    from .resident import start_resident

    # Hooks are answered here too while the agent runs this server, on the thread that holds
    # the store, and other agents' `llmem mcp` relay their sessions here (hookclient.relay_mcp):
    # when this one's agent leaves, the process stays until the last of those has ended too.
    serve(app, beside=lambda executor: start_resident(app, run_on=executor, linger=True))
