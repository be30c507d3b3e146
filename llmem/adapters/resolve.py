"""Adapters looked up by name, and which agent owns a session: by the shape of its id, then
by looking in each present store.

Every command that takes a session id (enqueue, introspect, context, hook) and the worker
resolve through `resolve_adapter`, so under `session.adapter: auto` a Copilot id is read by
the Copilot adapter even when OpenCode is installed too.
"""

from __future__ import annotations

import re
from pathlib import Path

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
from llmem.adapters.detect import (
    claude_config_dir,
    codex_home_dir,
    detect_adapter,
    has_claude_projects,
    has_codex_sessions,
    has_opencode_data,
)

# OpenCode ids are `ses_` + 26 characters; Copilot's are UUID v4, and so are Claude Code's:
# a UUID is looked up in both stores. Codex thread ids are UUID v7 (v4 in older releases, looked up like Copilot's).
_OPENCODE_ID_RE = re.compile(r"ses_[0-9A-Za-z]+")
_COPILOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_CODEX_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)

_LABELS = {"opencode": "OpenCode", "copilot": "Copilot", "claude": "Claude Code", "codex": "Codex"}
# Agents whose session ids have the shape id_shape() names.
_SHAPE_OWNERS = {"opencode": ("opencode",), "codex": ("codex",), "copilot": ("copilot", "claude", "codex")}

ADAPTER_NAMES = ("opencode", "copilot", "claude", "codex", "none")
# `auto` is a config value, resolved by detect_adapter() to one of ADAPTER_NAMES.
CONFIG_CHOICES = ("auto", *ADAPTER_NAMES)


def id_shape(session_id: str) -> str | None:
    """The id shape: `opencode` (ses_…), `codex` (a UUID v7), `copilot` (another UUID, which
    Claude Code and older Codex releases use too), or None."""
    if _OPENCODE_ID_RE.fullmatch(session_id):
        return "opencode"
    if _CODEX_ID_RE.fullmatch(session_id):
        return "codex"
    if _COPILOT_ID_RE.fullmatch(session_id):
        return "copilot"
    return None


def _store_paths(config) -> dict[str, Path]:
    session = config.session
    return {"opencode": session.opencode.data_dir,
            "copilot": session.copilot.state_dir,
            "claude": claude_config_dir(session.claude.config_dir),
            "codex": codex_home_dir(session.codex.home)}


def present_agents(config) -> list[str]:
    """The agents whose stores exist on this machine (what `auto` reads), OpenCode first."""
    paths = _store_paths(config)
    present = []
    if has_opencode_data(paths["opencode"]):
        present.append("opencode")
    if paths["copilot"].is_dir():
        present.append("copilot")
    if has_claude_projects(paths["claude"]):
        present.append("claude")
    if has_codex_sessions(paths["codex"]):
        present.append("codex")
    return present


def present_adapters(config) -> list[SessionAdapter]:
    """One adapter per present store (empty when no agent is installed)."""
    return [adapter_from_config(config, name) for name in present_agents(config)]


def resolve_adapter(config, session_id: str, name: str | None = None) -> SessionAdapter:
    """The adapter that owns `session_id`.

    A name given here (`--adapter`, an event's recorded adapter) or a session.adapter other
    than auto is used as it is. Under auto the present stores are asked in turn, the one whose
    id shape matches first, and the first that holds the session wins. With no store present
    the `none` adapter answers (nothing to read). When stores are present but none holds the
    id, SessionNotFound names every store looked in; a store that could not be read (locked,
    damaged) raises its own error instead, since the session may well be in it.
    """
    validate_session_id(session_id)
    chosen = name or config.session.adapter
    if chosen != "auto":
        return adapter_from_config(config, chosen)
    agents = present_agents(config)
    if not agents:
        return adapter_from_config(config, "none")
    owners = _SHAPE_OWNERS.get(id_shape(session_id) or "", ())
    agents.sort(key=lambda agent: agent not in owners)
    paths = _store_paths(config)
    unreadable: AdapterError | None = None
    for agent in agents:
        adapter = adapter_from_config(config, agent)
        try:
            if adapter.has_session(session_id):
                return adapter
        except AdapterError as exc:
            unreadable = unreadable or exc
    if unreadable is not None:
        raise unreadable
    looked_in = " and ".join(f"{_LABELS[agent]} ({paths[agent]})" for agent in agents)
    raise SessionNotFound(f"session {session_id} not found: looked in {looked_in}",
                          hint="check the id, or name the agent with --adapter opencode|copilot|claude|codex")


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
    """The adapter called `name` (or `auto`), built from the paths it needs; others are ignored."""
    if name == "auto":
        name = detect_adapter(opencode_data_dir, copilot_state_dir, claude_dir, codex_home)
    if name == "opencode":
        if opencode_data_dir is None:
            raise AdapterError(
                "the opencode adapter needs the OpenCode data dir (session.opencode)"
            )
        from llmem.adapters.opencode import OpenCodeAdapter

        return OpenCodeAdapter(opencode_data_dir)
    if name == "copilot":
        if copilot_state_dir is None:
            raise AdapterError("the copilot adapter needs copilot.state_dir (session-state dir)")
        from llmem.adapters.copilot import CopilotAdapter

        return CopilotAdapter(copilot_state_dir, copilot_share_dir)
    if name == "claude":
        if claude_dir is None:
            raise AdapterError("the claude adapter needs Claude Code's config folder (session.claude.config_dir)")
        from llmem.adapters.claude import ClaudeAdapter

        return ClaudeAdapter(claude_dir)
    if name == "codex":
        if codex_home is None:
            raise AdapterError("the codex adapter needs Codex's home folder (session.codex.home)")
        from llmem.adapters.codex import CodexAdapter

        return CodexAdapter(codex_home)
    if name == "none":
        return NoneAdapter()
    raise UnknownAdapter(
        f"unknown session adapter {name!r}; choose one of: {', '.join(CONFIG_CHOICES)}"
    )


def adapter_from_config(config, name: str | None = None) -> SessionAdapter:
    """The adapter a config selects (or `name`, overriding session.adapter), with its paths."""
    session = config.session
    paths = _store_paths(config)
    return get_adapter(name or session.adapter, opencode_data_dir=paths["opencode"],
                       copilot_state_dir=paths["copilot"], copilot_share_dir=session.copilot.share_dir,
                       claude_dir=paths["claude"], codex_home=paths["codex"])
