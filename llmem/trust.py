"""Origin trust: whose words a memory holds, set by every writer (issue 20.5).

- `user`: the user's own words (`llmem add`, the viewer, a user turn, the user's own
  instruction files in their home folder);
- `agent`: the agent's words (MCP writes, an assistant turn, what extraction's model or the
  dream wrote from a session);
- `external`: content from outside the conversation (tool output, web pages, files of a
  project, which anyone who can commit to it wrote).

Context injection shows `external` memories as quoted data, never as instructions, and the
dream never promotes a procedure, nor proposes one, from `external` evidence alone.
"""

from __future__ import annotations

USER = "user"
AGENT = "agent"
EXTERNAL = "external"
TRUST_LEVELS = (USER, AGENT, EXTERNAL)  # most trusted first

# Sources whose text the user wrote or reviewed themselves (db.models.SOURCES).
_USER_SOURCES = ("user", "review", "learn")


def check_trust(trust: str) -> str:
    if trust not in TRUST_LEVELS:
        raise ValueError(f"unknown origin trust {trust!r} (one of: {', '.join(TRUST_LEVELS)})")
    return trust


def trust_of_role(role: str | None) -> str:
    """The trust of a transcript message's text by its role: a user turn is the user's words,
    an assistant turn the agent's, anything else (tool output, a system notice) external."""
    role = (role or "").lower()
    if role == "user":
        return USER
    if role == "assistant":
        return AGENT
    return EXTERNAL


def trust_of_source(source: str | None, metadata: dict | None = None, project: str | None = None) -> str:
    """The trust a writer that does not say gets from its memory's source: what a memory row of
    an older llmem (migration 0013) or an export without the field is taken to be."""
    meta = metadata or {}
    if meta.get("origin") == "mcp":
        return AGENT
    if source == "import" and meta.get("native_path"):
        # The user's own instruction files (no project) are theirs; a project's are file content.
        return USER if project is None else EXTERNAL
    if source in _USER_SOURCES or source == "import":
        return USER
    return AGENT


def least_trusted(*levels: str | None) -> str:
    """The least trusted of `levels` (None ignored): a text mixed from several origins is only
    as trusted as its least trusted part."""
    given = [level for level in levels if level in TRUST_LEVELS]
    return max(given, key=TRUST_LEVELS.index) if given else AGENT
