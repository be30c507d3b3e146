"""The agents llmem knows, one line each: name → the module that defines it (its `AGENT`).

Everything that does something per agent iterates this list (the watcher, resolve, detect,
install, doctor, the CLI's choices, the viewer) instead of naming the agents. Adding an
agent is its unit module (adapters/agent.py says what it holds) and one line here. The
modules load on first use, so listing the names costs no import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmem.adapters.agent import Agent

# In the order `auto` looks in the stores (and the CLI lists them).
AGENT_MODULES: dict[str, str] = {
    "opencode": "llmem.adapters.agents.opencode",
    "copilot": "llmem.adapters.agents.copilot",
    "claude": "llmem.adapters.agents.claude",
    "codex": "llmem.adapters.agents.codex",
}

# Not an agent: the session.adapter value for "no transcripts", and `auto`, which picks.
NONE = "none"
AUTO = "auto"


def agent_names() -> tuple[str, ...]:
    """Every agent's name, in registry order."""
    return tuple(AGENT_MODULES)


def adapter_names() -> tuple[str, ...]:
    """What `--adapter` takes: an agent, or none."""
    return (*AGENT_MODULES, NONE)


def config_choices() -> tuple[str, ...]:
    """What session.adapter takes: auto, an agent, or none."""
    return (AUTO, *adapter_names())


def get_agent(name: str) -> Agent:
    """The unit of the agent called `name` (KeyError for a name not in the registry)."""
    return importlib.import_module(AGENT_MODULES[name]).AGENT


def all_agents() -> list[Agent]:
    """Every agent's unit, in registry order."""
    return [get_agent(name) for name in AGENT_MODULES]


def label(name: str) -> str:
    """How the user knows the agent ("Claude Code"); the name itself when unknown."""
    return get_agent(name).label if name in AGENT_MODULES else name
