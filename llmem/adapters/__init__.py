"""Session adapters: read an agent's transcripts into one normalised shape, looked up by name."""

from __future__ import annotations

from pathlib import Path

from llmem.adapters.base import (
    AdapterError,
    Cursor,
    InvalidSessionId,
    NoTranscript,
    SessionAdapter,
    SessionInfo,
    SessionNotFound,
    StoreLocked,
    ToolCall,
    Transcript,
    TranscriptMessage,
    UnknownAdapter,
    validate_session_id,
)
from llmem.adapters.detect import detect_adapter, find_databases, has_legacy_storage, has_sessions
from llmem.adapters.resolve import id_shape, present_adapters, present_agents, resolve_adapter

# The readers load on first use (PEP 562): a hook that only validates an id or detects the
# adapter should not pay for importing both.
_LAZY = {"CopilotAdapter": "llmem.adapters.copilot", "OpenCodeAdapter": "llmem.adapters.opencode"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

ADAPTER_NAMES = ("opencode", "copilot", "none")
# `auto` is a config value, resolved by detect_adapter() to one of ADAPTER_NAMES.
CONFIG_CHOICES = ("auto", *ADAPTER_NAMES)

__all__ = [
    "adapter_from_config",
    "ADAPTER_NAMES",
    "CONFIG_CHOICES",
    "AdapterError",
    "CopilotAdapter",
    "Cursor",
    "InvalidSessionId",
    "NoTranscript",
    "NoneAdapter",
    "OpenCodeAdapter",
    "SessionAdapter",
    "SessionInfo",
    "SessionNotFound",
    "StoreLocked",
    "ToolCall",
    "Transcript",
    "TranscriptMessage",
    "detect_adapter",
    "find_databases",
    "get_adapter",
    "has_legacy_storage",
    "has_sessions",
    "id_shape",
    "present_adapters",
    "present_agents",
    "resolve_adapter",
    "UnknownAdapter",
    "validate_session_id",
]


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
) -> SessionAdapter:
    """The adapter called `name` (or `auto`), built from the paths it needs; others are ignored."""
    if name == "auto":
        name = detect_adapter(opencode_data_dir, copilot_state_dir)
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
    if name == "none":
        return NoneAdapter()
    raise UnknownAdapter(
        f"unknown session adapter {name!r}; choose one of: {', '.join(CONFIG_CHOICES)}"
    )


def adapter_from_config(config, name: str | None = None) -> SessionAdapter:
    """The adapter a config selects (or `name`, overriding session.adapter), with its paths."""
    from llmem.paths import expand

    session = config.values["session"]
    opencode_dir = expand(session["opencode"]["data_dir"])
    copilot_dir = expand(session["copilot"]["state_dir"])
    return get_adapter(name or session["adapter"], opencode_data_dir=opencode_dir, copilot_state_dir=copilot_dir,
                       copilot_share_dir=expand(session["copilot"]["share_dir"]))
