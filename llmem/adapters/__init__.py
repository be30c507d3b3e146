"""Session adapters: read an agent's transcripts into one normalised shape, looked up by name."""

from __future__ import annotations

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
from llmem.adapters.detect import find_databases, has_legacy_storage, has_sessions
from llmem.adapters.resolve import (
    ADAPTER_NAMES,
    CONFIG_CHOICES,
    NoneAdapter,
    adapter_from_config,
    detect_adapter,
    get_adapter,
    id_shape,
    present_adapters,
    present_agents,
    resolve_adapter,
)

# The readers load on first use (PEP 562): a hook that only validates an id or detects the
# adapter should not pay for importing them all.
_LAZY = {"ClaudeAdapter": "llmem.adapters.claude", "CodexAdapter": "llmem.adapters.codex",
         "CopilotAdapter": "llmem.adapters.copilot",
         "OpenCodeAdapter": "llmem.adapters.opencode"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "adapter_from_config",
    "ADAPTER_NAMES",
    "CONFIG_CHOICES",
    "AdapterError",
    "ClaudeAdapter",
    "CodexAdapter",
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
