"""The environment variables that place llmem's own folders and the agents', handed on where a
launcher does not pass its environment through: Codex starts an MCP server with a short
allow-list of its variables plus the entry's `env` table, Copilot's docs promise only PATH,
and a systemd user unit sees the user manager's environment, not the shell's. Without them
`llmem mcp` or the watcher opens an empty store under $HOME, or watches the wrong agent folder.
"""

from __future__ import annotations

import os

from ..adapters.registry import all_agents

# llmem's own places (paths.py, config.py), then each agent's (its unit's folder_variables).
FOLDER_VARIABLES = ("LLMEM_HOME", "LLMEM_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
                    *sorted({name for agent in all_agents() for name in agent.folder_variables}))


def folder_environment() -> dict[str, str]:
    """The folder variables set here, each as an absolute path: the server or unit starts in
    another folder than the install did, where a relative path would point elsewhere."""
    return {name: os.path.abspath(os.path.expanduser(os.environ[name]))
            for name in FOLDER_VARIABLES if os.environ.get(name)}
