"""Which agent stores exist on disk: cheap checks, without loading the transcript readers."""

from __future__ import annotations

import os
from pathlib import Path

from llmem.adapters.base import is_valid_session_id

EVENTS_FILE = "events.jsonl"
WORKSPACE_FILE = "workspace.yaml"


def find_databases(data_dir: str | Path) -> list[Path]:
    """The `opencode*.db` files in an OpenCode data dir, `opencode.db` first."""
    directory = Path(data_dir)
    if not directory.is_dir():
        return []
    found = [path for path in directory.glob("opencode*.db") if path.is_file()]
    return sorted(found, key=lambda path: (path.name != "opencode.db", path.name))


def has_legacy_storage(data_dir: str | Path) -> bool:
    """True if the pre-1.2 JSON `storage/` tree holds any session file."""
    session_root = Path(data_dir) / "storage" / "session"
    return session_root.is_dir() and any(session_root.glob("*/*.json"))


def has_sessions(state_dir: str | Path) -> bool:
    """True if a Copilot session-state dir holds at least one session."""
    directory = Path(state_dir).expanduser()
    if not directory.is_dir():
        return False
    for entry in directory.iterdir():
        if entry.is_dir() and is_valid_session_id(entry.name):
            if (entry / EVENTS_FILE).is_file() or (entry / WORKSPACE_FILE).is_file():
                return True
        elif entry.suffix == ".jsonl" and is_valid_session_id(entry.stem):
            return True
    return False


def detect_adapter(
    opencode_data_dir: str | Path | None, copilot_state_dir: str | Path | None,
    codex_home: str | Path | None = None,
) -> str:
    """Pick `opencode`, `copilot`, `codex` or `none` from what exists on disk (session.adapter: auto)."""
    if opencode_data_dir is not None:
        data_dir = Path(opencode_data_dir).expanduser()
        if find_databases(data_dir) or (data_dir / "storage").is_dir():
            return "opencode"
    if copilot_state_dir is not None and has_sessions(copilot_state_dir):
        return "copilot"
    if codex_home is not None and has_codex_sessions(codex_home):
        return "codex"
    return "none"


# ---- Codex CLI (formats/CODEX.md §1)

CODEX_SESSIONS_DIR = "sessions"
CODEX_ARCHIVED_DIR = "archived_sessions"


def codex_home_dir(configured: str | Path) -> Path:
    """Codex's home: $CODEX_HOME when set (Codex itself obeys it), else the configured folder
    (session.codex.home)."""
    return Path(os.environ.get("CODEX_HOME") or configured).expanduser()


def has_codex_sessions(home: str | Path) -> bool:
    """True if Codex's sessions folder exists under its home."""
    return (Path(home).expanduser() / CODEX_SESSIONS_DIR).is_dir()
