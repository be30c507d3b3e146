"""The normalised transcript every session adapter produces, and the shared helpers."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from llmem.errors import LlmemError
from llmem.paths import project_key

log = logging.getLogger("llmem.adapters")

# Tool output is kept only as a reminder of what happened; the full text can be megabytes.
TOOL_OUTPUT_CAP = 2000
# Tool inputs (e.g. an edit's oldString/newString or a write's content) are capped per value.
TOOL_INPUT_VALUE_CAP = 2000

# Deeper JSON than this is no transcript record (real ones nest a few dozen levels at most) and
# would overflow the stack of the recursive code that walks it (tool inputs, JSON dumps).
MAX_JSON_DEPTH = 200
NOT_JSON = "not valid JSON"

# Session ids come from file and directory names: letters, digits, '_' and '-' only, so an id
# can never name a path outside the directory it is looked up in (no '/', '..', '~', NUL).
_SESSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


class AdapterError(LlmemError):
    """A transcript store could not be read; the message says what to do."""


class InvalidSessionId(AdapterError, ValueError):
    """A session id that is not a plain token (it could escape the store's directory)."""

    exit_code = 2  # a bad argument (the README's exit codes)


class SessionNotFound(AdapterError, LookupError):
    """The adapter's store has no session with this id."""


class UnknownAdapter(AdapterError, ValueError):
    """An adapter name llmem does not have (a typo, or an event recorded by another version)."""


class StoreLocked(AdapterError):
    """The agent's database stayed locked by another process for longer than we wait."""


class NoTranscript(AdapterError):
    """The configured adapter is `none`: there is no transcript to read."""


@dataclass(frozen=True)
class ToolCall:
    """One tool invocation: its input and an abbreviated output."""

    name: str
    input: Any = None
    output: str = ""
    # pending | running | completed | error (None when the format does not say)
    status: str | None = None
    call_id: str | None = None
    # OpenCode `task` calls name the child session they ran in (state.metadata.sessionId).
    child_session_id: str | None = None


@dataclass(frozen=True)
class TranscriptMessage:
    """One message of a session, in the shape every adapter agrees on."""

    # Stable key usable as a cursor (OpenCode msg_ id, Copilot event id, md-<n> for exports).
    id: str
    # Position among the session's raw records; skipped malformed records leave gaps.
    index: int
    role: str  # user | assistant | system | tool
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    time_ms: int | None = None
    # Last time the record was written (OpenCode updates rows in place while streaming).
    updated_ms: int | None = None
    completed_ms: int | None = None
    # OpenCode assistant messages name the user message they answer (data.parentID).
    reply_to: str | None = None
    finish: str | None = None
    error: str | None = None
    # message | compaction_request | compaction_summary | compaction_continue |
    # compaction_marker | system_prompt
    kind: str = "message"
    synthetic: bool = False
    reasoning: str = ""


@dataclass
class Transcript:
    """A session's metadata and messages, optionally only those after a cursor."""

    adapter: str
    session_id: str
    title: str | None = None
    # Where the agent ran (cwd) and, when known, the repository root it belongs to.
    directory: str | None = None
    project_root: str | None = None
    parent_session_id: str | None = None
    # A helper agent's thread whose format names no parent (a Codex review thread): with a
    # parent id, the session is a subagent's anyway (see is_subagent).
    subagent: bool = False
    created_ms: int | None = None
    updated_ms: int | None = None
    archived_ms: int | None = None
    # OpenCode's session.time_compacting (1.18 does not seem to set it; usually None).
    compacting_ms: int | None = None
    messages: list[TranscriptMessage] = field(default_factory=list)
    # Records that could not be parsed (bad JSON, wrong shape, a truncated last line).
    skipped_malformed: int = 0
    # Records of a type this version does not know (future part or event types).
    skipped_unknown: int = 0
    # False when a cursor was given but not found: `messages` then holds the whole session.
    cursor_found: bool = True
    source_path: str | None = None
    # Adapters that read by byte offset (Codex): where the next read starts, past every
    # complete line read, message or not.
    read_to: str | None = None

    @property
    def cursor(self) -> str | None:
        """Where the next read starts: pass it back as `after` (the last message's id, or
        `read_to` when the adapter reads by offset)."""
        if self.read_to is not None:
            return self.read_to
        return self.messages[-1].id if self.messages else None

    @property
    def is_subagent(self) -> bool:
        """A subagent's session: never extracted or introspected on its own (ARCHITECTURE.md,
        "Subagents are not users")."""
        return self.subagent or self.parent_session_id is not None

    @property
    def project(self) -> str | None:
        """The project its memories belong to (paths.project_key: the repository's remote, the
        same on every machine, else its root folder)."""
        return project_key(self.project_root or self.directory)


@dataclass(frozen=True)
class SessionInfo:
    """One row of `list_sessions()`: enough to pick sessions for a backfill."""

    id: str
    title: str | None
    directory: str | None
    updated_ms: int | None
    parent_session_id: str | None = None
    subagent: bool = False  # as Transcript.subagent

    @property
    def is_subagent(self) -> bool:
        """As Transcript.is_subagent: backfill skips these."""
        return self.subagent or self.parent_session_id is not None


Cursor = str | int | None


class SessionAdapter(Protocol):
    """What every adapter offers: list sessions, read one transcript."""

    name: str

    def list_sessions(self) -> list[SessionInfo]:
        """Every readable session, newest first."""
        ...

    def read_transcript(self, session_id: str, after: Cursor = None) -> Transcript:
        """The session's transcript, only messages after `after` (message id or index)."""
        ...

    def has_session(self, session_id: str) -> bool:
        """True if this adapter's store holds the session (a cheap lookup, no transcript read)."""
        ...


def validate_session_id(session_id: object) -> str:
    """Return the id unchanged if it is a plain token, else raise InvalidSessionId."""
    if not isinstance(session_id, str) or not _SESSION_ID_RE.fullmatch(session_id):
        raise InvalidSessionId(
            f"invalid session id {session_id!r}: expected letters, digits, '_' or '-' "
            "(at most 128 characters)"
        )
    return session_id


def is_valid_session_id(session_id: object) -> bool:
    """True if `validate_session_id` would accept it."""
    return isinstance(session_id, str) and _SESSION_ID_RE.fullmatch(session_id) is not None


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True if lists/dicts nest deeper than `limit` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


class UndecodableText(bytes):
    """A TEXT value from an agent's database that is not valid UTF-8, kept as raw bytes."""


def decode_text(raw: bytes) -> str | UndecodableText:
    """SQLite text_factory: UTF-8 text, or the bytes marked undecodable (never a failed query)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return UndecodableText(raw)


def read_json_object(text: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(object, None) for one record's JSON text, else (None, why not) — the reason, no text."""
    if isinstance(text, UndecodableText):
        return None, "not valid UTF-8"
    if not isinstance(text, str):
        return None, "not text"
    try:
        value = json.loads(text)
    except RecursionError:
        # Nested deeper than the parser's stack: a hostile or corrupt record.
        return None, f"nested deeper than {MAX_JSON_DEPTH} levels"
    except ValueError:
        return None, NOT_JSON
    if not isinstance(value, dict):
        return None, "not a JSON object"
    if json_depth_exceeds(value):
        return None, f"nested deeper than {MAX_JSON_DEPTH} levels"
    return value, None


# Records already reported as skipped: the watcher re-reads a session on every write, and one
# bad row should make one log line, not one per read. Bounded so a huge store cannot grow it.
_REPORTED_SKIPS: set[tuple[str, str]] = set()
_REPORTED_SKIPS_CAP = 10_000


def report_skipped(source: str, record: str, reason: str) -> None:
    """Log once that a record was skipped: where, which record and why — never its text."""
    key = (source, record)
    if key in _REPORTED_SKIPS:
        return
    if len(_REPORTED_SKIPS) < _REPORTED_SKIPS_CAP:
        _REPORTED_SKIPS.add(key)
    log.warning("%s: skipped %s: %s", source, record, reason)


def abbreviate(text: str, cap: int = TOOL_OUTPUT_CAP) -> str:
    """Cut `text` to `cap` characters, saying how much was dropped."""
    if len(text) <= cap:
        return text
    return f"{text[:cap]}\n…[{len(text) - cap} more characters]"


def abbreviate_input(value: Any, cap: int = TOOL_INPUT_VALUE_CAP) -> Any:
    """Copy a JSON-like tool input with every long string value abbreviated."""
    if isinstance(value, str):
        return abbreviate(value, cap)
    if isinstance(value, dict):
        return {key: abbreviate_input(item, cap) for key, item in value.items()}
    if isinstance(value, list):
        return [abbreviate_input(item, cap) for item in value]
    return value


def output_text(value: Any) -> str:
    """A tool output as text (outputs are usually strings, sometimes JSON objects)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def iso_to_ms(value: Any) -> int | None:
    """Epoch milliseconds from an ISO-8601 string or datetime (None if unparseable)."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
    else:
        return None
    if moment.tzinfo is None:
        # Both agents write UTC ('Z'); YAML may hand back a naive datetime already in UTC.
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def mtime_ms(path: Path) -> int | None:
    """The file's modification time in ms, None if it is gone or unreadable."""
    try:
        return int(path.stat().st_mtime * 1000)
    except OSError:
        return None


def as_str(value: Any) -> str | None:
    """The value if it is a string, else None (JSON fields of any type)."""
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    """An integer from a JSON number (bools and other types give None)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def messages_after(
    messages: Sequence[TranscriptMessage], after: Cursor
) -> tuple[list[TranscriptMessage], bool]:
    """Slice messages strictly after a cursor (message id or index); say if it was found."""
    if after is None:
        return list(messages), True
    if isinstance(after, bool) or not isinstance(after, int | str):
        raise AdapterError(f"cursor must be a message id or an index, not {after!r}")
    if isinstance(after, int):
        return [message for message in messages if message.index > after], True
    for position, message in enumerate(messages):
        if message.id == after:
            return list(messages[position + 1 :]), True
    return list(messages), False


@dataclass(frozen=True)
class TailChunk:
    """The complete lines appended to a followed file since the last read."""

    raw: bytes  # whole lines only, each ending with its newline
    start: int  # the byte offset of raw[0] in the file
    first_index: int  # the line number (from 0) of the first line in raw
    # The file was read again from its start (it is new, shrank or was replaced): what the
    # follower kept of earlier reads no longer describes it.
    restarted: bool
    mtime_ms: int


class JsonlTail:
    """One append-only JSONL file followed by byte offset, the one tail every JSONL agent's
    watcher uses (Copilot's events.jsonl, Claude Code's transcripts, Codex's rollouts): each
    read returns only the complete lines written since the last one; a last line without its
    newline is still being written and waits for the next read. A file that shrank or was
    replaced (another inode: an agent rewrote or rotated it) is read again from its start.
    `bytes_read` counts what was read, so a test can tell a tail from a re-read."""

    def __init__(self, path: Path, what: str = "transcript"):
        self.path = path
        self.what = what
        self.identity: tuple[int, int] | None = None
        self.offset = 0
        self.next_index = 0
        self.bytes_read = 0

    def read(self) -> TailChunk:
        try:
            with self.path.open("rb") as handle:
                status = os.fstat(handle.fileno())
                identity = (status.st_dev, status.st_ino)
                restarted = identity != self.identity or status.st_size < self.offset
                if restarted:
                    self.identity, self.offset, self.next_index = identity, 0, 0
                handle.seek(self.offset)
                raw = handle.read()
        except OSError as error:
            raise AdapterError(f"cannot read {self.what} {self.path}: {error}") from error
        self.bytes_read += len(raw)
        complete = raw[: raw.rfind(b"\n") + 1]
        chunk = TailChunk(complete, self.offset, self.next_index, restarted, int(status.st_mtime * 1000))
        self.offset += len(complete)
        self.next_index += complete.count(b"\n")
        return chunk
