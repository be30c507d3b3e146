"""Adapters looked up by name, and which agent owns a session: by the shape of its id, then
by looking in each present store.

Every command that takes a session id (enqueue, introspect, context, hook) and the worker
resolve through `resolve_adapter`, so under `session.adapter: auto` a Copilot id is read by
the Copilot adapter even when OpenCode is installed too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from llmem.adapters import registry
from llmem.adapters.base import (
    AdapterError,
    Cursor,
    NoTranscript,
    SessionAdapter,
    SessionInfo,
    SessionNotFound,
    Transcript,
    UnknownAdapter,
    validate_session_id,
)

# The names as llmem ships them; registry.adapter_names() / config_choices() read the live list.
ADAPTER_NAMES = registry.adapter_names()
# `auto` is a config value, resolved by detect_adapter() to one of ADAPTER_NAMES.
CONFIG_CHOICES = registry.config_choices()


def id_shape(session_id: str) -> str | None:
    """The agent whose ids have this shape: the one that alone makes it (`opencode` for ses_…,
    `codex` for a UUID v7), else the first that could have made it (`copilot` for another
    UUID, which Claude Code and older Codex releases use too), or None."""
    ranked = [(agent.id_rank(session_id), agent.name) for agent in registry.all_agents()]
    best = max((rank for rank, _ in ranked), default=0)
    return next((name for rank, name in ranked if rank == best), None) if best else None


def detect_from_config(config) -> str:
    """The first agent in the registry whose store holds sessions, or `none` (session.adapter:
    auto, where a single reader is wanted)."""
    return detect_adapter({agent.name: agent.store_dir(config) for agent in registry.all_agents()})


def present_agents(config) -> list[str]:
    """The agents whose stores exist on this machine (what `auto` reads), in registry order."""
    return [agent.name for agent in registry.all_agents() if agent.present(config)]


def present_adapters(config) -> list[SessionAdapter]:
    """One adapter per present store (empty when no agent is installed)."""
    return [adapter_from_config(config, name) for name in present_agents(config)]


def resolve_adapter(config, session_id: str, name: str | None = None) -> SessionAdapter:
    """The adapter that owns `session_id`.

    A name given here (`--adapter`, an event's recorded adapter) or a session.adapter other
    than auto is used as it is. Under auto the present stores are asked in turn, those whose
    id shape matches first (adapters/agent.py `id_rank`), and the first that holds the
    session wins. With no store present the `none` adapter answers (nothing to read). When
    stores are present but none holds the id, SessionNotFound names every store looked in; a
    store that could not be read (locked, damaged) raises its own error instead, since the
    session may well be in it.
    """
    validate_session_id(session_id)
    chosen = name or config.session.adapter  # config: session.adapter
    if chosen != registry.AUTO:
        return adapter_from_config(config, chosen)
    agents = [agent for agent in registry.all_agents() if agent.present(config)]
    if not agents:
        return adapter_from_config(config, registry.NONE)
    agents.sort(key=lambda agent: -agent.id_rank(session_id))
    unreadable: AdapterError | None = None
    for agent in agents:
        adapter = agent.reader(config)
        try:
            if adapter.has_session(session_id):
                return adapter
        except AdapterError as exc:
            unreadable = unreadable or exc
    if unreadable is not None:
        raise unreadable
    looked_in = " and ".join(f"{agent.label} ({agent.store_dir(config)})" for agent in agents)
    raise SessionNotFound(f"session {session_id} not found: looked in {looked_in}",
                          hint="check the id, or name the agent with --adapter " + "|".join(registry.agent_names()))


class NoneAdapter:
    """The `none` adapter: no sessions, and every transcript read raises NoTranscript."""

    name = "none"

    def list_sessions(self) -> list[SessionInfo]:
        """Always empty."""
        return []

    def has_session(self, session_id: str) -> bool:
        """Never: there is no store."""
        return False

    def read_transcript(self, session_id: str, after: Cursor = None) -> Transcript:
        """Raise NoTranscript: with session.adapter = none there is nothing to read."""
        raise NoTranscript("no_transcript: session.adapter is 'none'")


def detect_adapter(stores: Mapping[str, str | Path | None]) -> str:
    """The first agent, in registry order, whose store (agent name → the folder of its
    sessions, adapters/agent.py `store_dir`) holds sessions, or `none`."""
    for agent in registry.all_agents():
        store = stores.get(agent.name)
        if store is not None and agent.holds_sessions(Path(store).expanduser()):
            return agent.name
    return registry.NONE


def get_adapter(name: str, stores: Mapping[str, str | Path | None] | None = None) -> SessionAdapter:
    """The adapter called `name` (or `auto`) over the store folder given for it in `stores`
    (agent name → folder); the other folders are ignored."""
    stores = stores or {}
    if name == registry.AUTO:
        name = detect_adapter(stores)
    if name == registry.NONE:
        return NoneAdapter()
    if name not in registry.AGENT_MODULES:
        raise UnknownAdapter(
            f"unknown session adapter {name!r}; choose one of: {', '.join(registry.config_choices())}"
        )
    agent = registry.get_agent(name)
    store = stores.get(name)
    if store is None:
        raise AdapterError(f"the {name} adapter needs {agent.label}'s {agent.folder_name} ({agent.config_key})")
    return agent.reader_at(Path(store).expanduser())


def adapter_from_config(config, name: str | None = None) -> SessionAdapter:
    """The adapter a config selects (or `name`, overriding session.adapter), over its folders."""
    name = name or config.session.adapter  # config: session.adapter
    if name == registry.AUTO:
        name = detect_from_config(config)
    if name == registry.NONE:
        return NoneAdapter()
    if name not in registry.AGENT_MODULES:
        raise UnknownAdapter(
            f"unknown session adapter {name!r}; choose one of: {', '.join(registry.config_choices())}"
        )
    return registry.get_agent(name).reader(config)
