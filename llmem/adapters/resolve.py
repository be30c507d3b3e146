"""Adapters looked up by name, and which agent owns a session: by the shape of its id, then
by looking in each present store.

Every command that takes a session id (enqueue, introspect, context, hook) and the worker
resolve through `resolve_adapter`, so under `session.adapter: auto` a Copilot id is read by
the Copilot adapter even when OpenCode is installed too.
"""

from __future__ import annotations

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
from llmem.adapters.detect import detect_adapter

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
    for agent in registry.all_agents():
        if agent.holds_sessions(agent.store_dir(config)):
            return agent.name
    return registry.NONE


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
    chosen = name or config.values["session"]["adapter"]  # config: session.adapter
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


def get_adapter(
    name: str,
    *,
    opencode_data_dir: str | Path | None = None,
    copilot_state_dir: str | Path | None = None,
    copilot_share_dir: str | Path | None = None,
    claude_dir: str | Path | None = None,
    codex_home: str | Path | None = None,
) -> SessionAdapter:
    """The adapter called `name` (or `auto`), built from the folders given (the stores of the
    shipped agents, named as their config keys name them); others are ignored."""
    stores = {"opencode": opencode_data_dir, "copilot": copilot_state_dir,
              "claude": Path(claude_dir) / "projects" if claude_dir is not None else None,
              "codex": Path(codex_home) / "sessions" if codex_home is not None else None}
    if name == registry.AUTO:
        name = detect_adapter(opencode_data_dir, copilot_state_dir, claude_dir, codex_home)
    if name == registry.NONE:
        return NoneAdapter()
    if name not in registry.AGENT_MODULES:
        raise UnknownAdapter(
            f"unknown session adapter {name!r}; choose one of: {', '.join(registry.config_choices())}"
        )
    store = stores.get(name)
    if store is None:
        agent = registry.get_agent(name)
        raise AdapterError(f"the {name} adapter needs {agent.label}'s {agent.folder_name} ({agent.config_key})")
    adapter = registry.get_agent(name).reader_at(Path(store).expanduser())
    if name == "copilot" and copilot_share_dir is not None:
        adapter.share_dir = Path(copilot_share_dir).expanduser()
    return adapter


def adapter_from_config(config, name: str | None = None) -> SessionAdapter:
    """The adapter a config selects (or `name`, overriding session.adapter), over its folders."""
    name = name or config.values["session"]["adapter"]  # config: session.adapter
    if name == registry.AUTO:
        name = detect_from_config(config)
    if name == registry.NONE:
        return NoneAdapter()
    if name not in registry.AGENT_MODULES:
        raise UnknownAdapter(
            f"unknown session adapter {name!r}; choose one of: {', '.join(registry.config_choices())}"
        )
    return registry.get_agent(name).reader(config)
