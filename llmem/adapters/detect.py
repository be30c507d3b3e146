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


def has_opencode_data(data_dir: str | Path) -> bool:
    """True if an OpenCode data dir holds a database or the pre-1.2 `storage/` tree."""
    data_dir = Path(data_dir).expanduser()
    return bool(find_databases(data_dir)) or (data_dir / "storage").is_dir()


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


# ---- Claude Code

CLAUDE_PROJECTS_DIR = "projects"
CLAUDE_SESSIONS_DIR = "sessions"


def claude_config_dir(configured: str | Path) -> Path:
    """Claude Code's config home: $CLAUDE_CONFIG_DIR when set (Claude Code itself obeys it),
    else the configured folder (session.claude.config_dir)."""
    from_env = os.environ.get("CLAUDE_CONFIG_DIR")
    return Path(from_env or configured).expanduser()


def claude_session_id(path: Path, projects_dir: Path) -> str | None:
    """The session id of a main transcript `projects/<encoded-cwd>/<id>.jsonl`, else None.

    Subagent transcripts (`<id>/subagents/agent-*.jsonl`, and the flat `agent-*.jsonl` of
    versions before 2.1.2) and `tool-results/` files are never sessions of their own.
    """
    try:
        parts = path.relative_to(projects_dir).parts
    except ValueError:
        return None
    if len(parts) != 2 or not parts[1].endswith(".jsonl"):
        return None
    session_id = parts[1][: -len(".jsonl")]
    if session_id.startswith("agent-") or not is_valid_session_id(session_id):
        return None
    return session_id


# ---- Codex CLI

CODEX_SESSIONS_DIR = "sessions"
CODEX_ARCHIVED_DIR = "archived_sessions"


def codex_home_dir(configured: str | Path) -> Path:
    """Codex's home: $CODEX_HOME when set (Codex itself obeys it), else the configured folder
    (session.codex.home)."""
    return Path(os.environ.get("CODEX_HOME") or configured).expanduser()

