"""Read OpenAI Codex CLI threads: `<codex home>/sessions/YYYY/MM/DD/rollout-…-<id>.jsonl`.

A rollout is append-only JSON lines, `{"timestamp", "type", "payload"}`;
its first line is `session_meta`. Both history modes are read: legacy files carry the prompt
as `event_msg user_message`, paginated ones as `event_msg item_completed` of a `UserMessage`.
Every other fact comes from the `response_item`s both modes write: assistant messages,
reasoning summaries, tool calls and their outputs. The `user`/`developer` response items are
harness text (AGENTS.md, environment, permissions, a hook's additional context such as
llmem's own block): never a prompt. Lines are read by byte offset, complete lines only, so
the cursor is `offset:<n>` and a half-written last line waits for the next read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from llmem.adapters.base import (
    AdapterError,
    Cursor,
    JsonlTail,
    SessionInfo,
    SessionNotFound,
    ToolCall,
    Transcript,
    TranscriptMessage,
    abbreviate,
    abbreviate_input,
    as_str,
    iso_to_ms,
    messages_after,
    mtime_ms,
    output_text,
    read_json_object,
    report_skipped,
    validate_session_id,
)
from llmem.adapters.detect import CODEX_ARCHIVED_DIR, CODEX_SESSIONS_DIR
from llmem.adapters.lifecycle import CodexMark

NAME = "codex"

# Item types of codex-cli 0.144–0.171; others are newer: skipped and counted.
KNOWN_ITEM_TYPES = frozenset({
    "session_meta", "turn_context", "response_item", "event_msg", "compacted", "world_state",
    "token_usage_record", "inter_agent_communication", "retained_context",
    "security_risk_score", "realtime_item",
})
_TOOL_CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call", "web_search_call",
                         "tool_search_call", "image_generation_call"})
_TOOL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "tool_search_output"})

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_ROLLOUT_RE = re.compile(rf"rollout-.*-({_UUID})\.jsonl", re.IGNORECASE)
_THREAD_ID_RE = re.compile(_UUID, re.IGNORECASE)
CURSOR_PREFIX = "offset:"
# `session_index.jsonl`: one {"id", "thread_name", "updated_at"} line per named thread (§1).
SESSION_INDEX = "session_index.jsonl"
_SESSION_INDEX_CAP = 16 * 1024 * 1024
# The first line carries the whole system prompt (~20 KB); more than this is no session_meta.
_META_LINE_CAP = 4 * 1024 * 1024


def rollout_thread_id(name: str) -> str | None:
    """The thread id a rollout file name ends with, None for any other file."""
    match = _ROLLOUT_RE.fullmatch(name)
    return match.group(1) if match else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# ---------------------------------------------------------------- lines


@dataclass
class RolloutLines:
    """Complete lines of one rollout from a byte offset: (start offset, object) pairs."""

    lines: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    end: int = 0  # where the next read starts: past the last complete line
    skipped_malformed: int = 0
    # JSON objects without the {type, payload} envelope: rollouts from before 2025-09 wrote
    # bare items, which this reader does not take.
    skipped_unknown: int = 0


def parse_lines(raw: bytes, start: int, source: str) -> RolloutLines:
    """Parse the complete lines of `raw` (bytes of the file from `start`); a last line without
    its newline is left for the next read. Malformed lines are skipped and reported once."""
    result = RolloutLines(end=start + raw.rfind(b"\n") + 1)
    offset = start
    for line in raw[: result.end - start].split(b"\n")[:-1]:
        line_start, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue
        # A write cut mid-character must not fail the file; the damaged line is skipped below.
        item, problem = read_json_object(line.decode("utf-8", errors="replace"))
        if item is None:
            result.skipped_malformed += 1
            report_skipped(source, f"line at byte {line_start}", f"it is {problem}")
            continue
        if not isinstance(item.get("type"), str) or "payload" not in item:
            result.skipped_unknown += 1
            continue
        result.lines.append((line_start, item))
    return result


def read_lines(path: Path, start: int = 0) -> RolloutLines:
    """The complete lines of a rollout file from byte `start`."""
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            raw = handle.read()
    except OSError as error:
        raise AdapterError(f"cannot read Codex rollout {path}: {error}") from error
    return parse_lines(raw, start, f"Codex rollout {path}")


def read_session_meta(path: Path) -> dict[str, Any] | None:
    """The payload of the rollout's first line when it is a session_meta, else None."""
    try:
        with path.open("rb") as handle:
            first = handle.readline(_META_LINE_CAP)
    except OSError:
        return None
    item, _ = read_json_object(first.decode("utf-8", errors="replace"))
    if item is None or item.get("type") != "session_meta":
        return None
    return _dict(item.get("payload"))


def is_subagent_meta(meta: dict[str, Any]) -> bool:
    """A thread Codex spawned for itself (a multi-agent child, a review, a compaction helper,
    memory consolidation), not one the user started."""
    thread_source = meta.get("thread_source")
    return (thread_source not in (None, "user")
            or (isinstance(meta.get("source"), dict) and "subagent" in meta["source"]))


def parent_thread_id(meta: dict[str, Any]) -> str | None:
    """The spawning thread of a multi-agent child, when the meta names it."""
    subagent = _dict(_dict(meta.get("source")).get("subagent"))
    parent = _dict(subagent.get("thread_spawn")).get("parent_thread_id")
    return parent if isinstance(parent, str) and _THREAD_ID_RE.fullmatch(parent) else None


def mark_of(offset: int, item: dict[str, Any]) -> CodexMark:
    """The lifecycle view of one line."""
    payload = _dict(item.get("payload"))
    kind = item["type"]
    if kind == "event_msg":
        kind = as_str(payload.get("type")) or kind
    return CodexMark(str(offset), kind, as_str(payload.get("turn_id")), iso_to_ms(item.get("timestamp")))


class CodexTail:
    """One rollout followed by byte offset for the watcher (base.JsonlTail): each read parses
    only the lines appended since the last and keeps their lifecycle view. A file that shrank
    or was replaced (`codex migrate-rollouts --apply`) is read again from the start."""

    def __init__(self, path: Path):
        self.path = path
        self.tail = JsonlTail(path, "Codex rollout")
        self.marks: list[CodexMark] = []
        self.subagent = False
        self.mtime_ms: int | None = None

    def read(self) -> list[CodexMark]:
        """The marks of every complete line so far."""
        chunk = self.tail.read()
        if chunk.restarted:
            self.marks, self.subagent = [], False
        new = parse_lines(chunk.raw, chunk.start, f"Codex rollout {self.path}")
        for offset, item in new.lines:
            if offset == 0 and item["type"] == "session_meta":
                self.subagent = is_subagent_meta(_dict(item.get("payload")))
            self.marks.append(mark_of(offset, item))
        self.mtime_ms = chunk.mtime_ms
        return self.marks


# ---------------------------------------------------------------- normalising


@dataclass
class _PendingMessage:
    id: str
    index: int
    role: str
    time_ms: int | None
    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    kind: str = "message"
    reasoning: str = ""
    turn_id: str | None = None

    def freeze(self) -> TranscriptMessage:
        return TranscriptMessage(id=self.id, index=self.index, role=self.role, text=self.text,
                                 tool_calls=tuple(self.calls), time_ms=self.time_ms,
                                 updated_ms=self.time_ms, completed_ms=self.time_ms,
                                 kind=self.kind, reasoning=self.reasoning)


def _content_text(content: Any, *types: str) -> str:
    """The text of a message's content parts of the given types."""
    parts = content if isinstance(content, list) else []
    return "\n\n".join(part["text"] for part in parts
                       if isinstance(part, dict) and part.get("type") in types
                       and isinstance(part.get("text"), str))


def _call_input(payload: dict[str, Any]) -> Any:
    """A tool call's input: the JSON `arguments` parsed, or the raw `input`/`action`."""
    arguments = payload.get("arguments")
    if isinstance(arguments, str):
        parsed, _ = read_json_object(arguments)
        return abbreviate_input(parsed if parsed is not None else arguments)
    for key in ("input", "action", "query"):
        if payload.get(key) is not None:
            return abbreviate_input(payload[key])
    return None


def _call_name(payload: dict[str, Any]) -> str:
    return as_str(payload.get("name")) or payload["type"].removesuffix("_call")


class _Normaliser:
    """Builds the transcript line by line (a rollout read whole, or past a cursor)."""

    def __init__(self, transcript: Transcript):
        self.transcript = transcript
        self.messages: list[_PendingMessage] = []
        self.calls: dict[str, tuple[_PendingMessage, int]] = {}  # call_id → (message, position)
        self.reasoning: list[str] = []

    def meta(self, payload: dict[str, Any], at_ms: int | None) -> None:
        from llmem.paths import project_root_of

        transcript = self.transcript
        cwd = as_str(payload.get("cwd"))
        transcript.directory = cwd
        # The repository root of the launch folder, as a hook maps its stdin cwd.
        transcript.project_root = project_root_of(cwd)
        transcript.created_ms = iso_to_ms(payload.get("timestamp")) or at_ms
        transcript.subagent = is_subagent_meta(payload)
        transcript.parent_session_id = parent_thread_id(payload)

    def line(self, offset: int, item: dict[str, Any]) -> None:
        kind = item["type"]
        payload = _dict(item.get("payload"))
        at_ms = iso_to_ms(item.get("timestamp"))
        if at_ms is not None:
            self.transcript.updated_ms = max(self.transcript.updated_ms or 0, at_ms)
        if kind not in KNOWN_ITEM_TYPES:
            self.transcript.skipped_unknown += 1
        elif kind == "session_meta":
            if offset == 0:
                self.meta(payload, at_ms)
        elif kind == "turn_context":
            self.transcript.directory = self.transcript.directory or as_str(payload.get("cwd"))
        elif kind == "event_msg":
            self.event(offset, payload, at_ms)
        elif kind == "response_item":
            self.response_item(offset, payload, at_ms)
        elif kind == "compacted":
            self.compacted(offset, payload, at_ms)

    def event(self, offset: int, payload: dict[str, Any], at_ms: int | None) -> None:
        event_type = payload.get("type")
        text = None
        if event_type == "user_message":  # legacy history
            text = as_str(payload.get("message"))
        elif event_type == "item_completed":  # paginated history
            item = _dict(payload.get("item"))
            if item.get("type") == "UserMessage":
                text = _content_text(item.get("content"), "text")
        if text is not None:
            self.messages.append(_PendingMessage(str(offset), offset, "user", at_ms, text=text,
                                                 turn_id=as_str(payload.get("turn_id"))))

    def response_item(self, offset: int, payload: dict[str, Any], at_ms: int | None) -> None:
        item_type = payload.get("type")
        turn_id = as_str(_dict(payload.get("internal_chat_message_metadata_passthrough")).get("turn_id"))
        if item_type == "message":
            if payload.get("role") != "assistant":
                return  # harness text: AGENTS.md, environment, permissions, hook context
            self.messages.append(_PendingMessage(
                str(offset), offset, "assistant", at_ms,
                text=_content_text(payload.get("content"), "output_text", "text"),
                reasoning="\n\n".join(self.reasoning), turn_id=turn_id))
            self.reasoning = []
        elif item_type == "reasoning":
            self.reasoning += [part["text"] for part in payload.get("summary") or []
                               if isinstance(part, dict) and isinstance(part.get("text"), str)]
        elif item_type in _TOOL_CALLS:
            self.tool_call(offset, payload, at_ms, turn_id)
        elif item_type in _TOOL_OUTPUTS:
            self.tool_output(offset, payload, at_ms)
        elif item_type == "compaction":
            # Remote compaction: the summary is opaque (encrypted_content), only the fact shows.
            self.messages.append(_PendingMessage(str(offset), offset, "system", at_ms,
                                                 kind="compaction_marker"))
        else:
            self.transcript.skipped_unknown += 1

    def tool_call(self, offset: int, payload: dict[str, Any], at_ms: int | None,
                  turn_id: str | None) -> None:
        call_id = as_str(payload.get("call_id")) or as_str(payload.get("id"))
        call = ToolCall(name=_call_name(payload), input=_call_input(payload),
                        status=as_str(payload.get("status")) or "pending", call_id=call_id)
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant" and last.turn_id == turn_id and turn_id:
            owner = last  # the calls a model response made after its text
        else:
            owner = _PendingMessage(str(offset), offset, "assistant", at_ms, turn_id=turn_id,
                                    reasoning="\n\n".join(self.reasoning))
            self.reasoning = []
            self.messages.append(owner)
        owner.calls.append(call)
        if call_id:
            self.calls[call_id] = (owner, len(owner.calls) - 1)

    def tool_output(self, offset: int, payload: dict[str, Any], at_ms: int | None) -> None:
        call_id = as_str(payload.get("call_id"))
        output = payload.get("output")
        if isinstance(output, dict):  # structured output: {content, success}
            output = output.get("content", output)
        text = abbreviate(output_text(output))
        found = self.calls.get(call_id) if call_id else None
        if found is None:
            # The call was read before the cursor (or never written): the result stands alone.
            self.messages.append(_PendingMessage(str(offset), offset, "tool", at_ms, calls=[
                ToolCall(name="unknown", output=text, status="completed", call_id=call_id)]))
            return
        owner, position = found
        call = owner.calls[position]
        owner.calls[position] = ToolCall(name=call.name, input=call.input, output=text,
                                         status="completed", call_id=call.call_id)

    def compacted(self, offset: int, payload: dict[str, Any], at_ms: int | None) -> None:
        summary = (as_str(payload.get("message")) or "").strip()
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant" and last.text.strip() and summary.endswith(last.text.strip()):
            last.kind = "compaction_summary"  # the model's summary, written just before
        else:
            self.messages.append(_PendingMessage(str(offset), offset, "system", at_ms,
                                                 kind="compaction_marker"))

    def finish(self, lines: RolloutLines) -> None:
        """Freeze the messages into the transcript."""
        self.transcript.messages = [message.freeze() for message in self.messages]
        self.transcript.skipped_malformed += lines.skipped_malformed
        self.transcript.skipped_unknown += lines.skipped_unknown


def transcript_from_lines(session_id: str, lines: RolloutLines,
                          meta: dict[str, Any] | None = None) -> Transcript:
    """Normalise rollout lines; `meta` is the session_meta when the lines start past it."""
    transcript = Transcript(adapter=NAME, session_id=session_id)
    normaliser = _Normaliser(transcript)
    if meta is not None:
        normaliser.meta(meta, None)
    for offset, item in lines.lines:
        normaliser.line(offset, item)
        if item["type"] == "response_item" and _dict(item.get("metadata")).get("compaction_output"):
            message = normaliser.messages[-1] if normaliser.messages else None
            if message is not None and message.id == str(offset):
                message.kind = "compaction_summary"
    normaliser.finish(lines)
    return transcript


def cursor_offset(after: Cursor) -> int | None:
    """The byte offset of an `offset:<n>` cursor, None for any other cursor."""
    if isinstance(after, str) and after.startswith(CURSOR_PREFIX):
        number = after[len(CURSOR_PREFIX):]
        if number.isdigit():
            return int(number)
    return None


def _offset_holds(path: Path, offset: int) -> bool:
    """The offset is a line start of this file (the file was not rewritten shorter)."""
    if offset == 0:
        return True
    try:
        with path.open("rb") as handle:
            handle.seek(offset - 1)
            return handle.read(1) == b"\n"
    except OSError:
        return False


# ---------------------------------------------------------------- the adapter


def _uuid7_day(thread_id: str) -> datetime | None:
    """The local creation time a UUID v7 thread id carries (its first 48 bits, in ms)."""
    if thread_id[14] != "7":
        return None
    try:
        return datetime.fromtimestamp(int(thread_id[:8] + thread_id[9:13], 16) / 1000)
    except (ValueError, OverflowError, OSError):
        return None


class CodexAdapter:
    """Threads from Codex's `sessions/` (and `archived_sessions/`) rollouts, read-only."""

    name = NAME

    def __init__(self, home: str | Path) -> None:
        self.home = Path(home).expanduser()
        self.sessions_dir = self.home / CODEX_SESSIONS_DIR
        self.archived_dir = self.home / CODEX_ARCHIVED_DIR
        self._paths: dict[str, Path] = {}

    def rollout_path(self, session_id: str) -> Path | None:
        """The thread's rollout file, None if there is none (ids are UUIDs: §1)."""
        validate_session_id(session_id)
        if not _THREAD_ID_RE.fullmatch(session_id):
            return None
        known = self._paths.get(session_id)
        if known is not None and known.is_file():
            return known
        name = f"rollout-*-{session_id}.jsonl"
        # A v7 id says the day: its folder (and the next and previous, for the local time
        # zone) is looked in first, before the whole tree.
        created = _uuid7_day(session_id.lower())
        days = [created + timedelta(days=shift) for shift in (0, -1, 1)] if created else []
        candidates = (
            *(path for day in days
              for path in (self.sessions_dir / f"{day:%Y/%m/%d}").glob(name)),
            *self.sessions_dir.glob(f"*/*/*/{name}"),
            *self.archived_dir.glob(name),
            *self.archived_dir.glob(f"*/*/*/{name}"),
        )
        for path in candidates:
            if path.is_file():
                self._paths[session_id] = path
                return path
        return None

    def has_session(self, session_id: str) -> bool:
        """True if a rollout file holds this thread."""
        return self.rollout_path(session_id) is not None

    def read_transcript(self, session_id: str, after: Cursor = None) -> Transcript:
        """The thread's transcript; `after` an `offset:<n>` cursor reads only the lines past it."""
        path = self.rollout_path(session_id)
        if path is None:
            raise SessionNotFound(f"Codex thread {session_id} not found in {self.sessions_dir}"
                                  f" or {self.archived_dir}")
        offset = cursor_offset(after)
        if offset is not None and _offset_holds(path, offset):
            lines = read_lines(path, offset)
            meta = read_session_meta(path) if offset > 0 else None
            transcript = transcript_from_lines(session_id, lines, meta)
        else:
            lines = read_lines(path)
            transcript = transcript_from_lines(session_id, lines)
            if offset is not None:
                transcript.cursor_found = False  # the file was rewritten: read whole
            elif after is not None:
                transcript.messages, transcript.cursor_found = messages_after(transcript.messages, after)
        transcript.read_to = f"{CURSOR_PREFIX}{lines.end}"
        transcript.title = self.thread_name(session_id)
        transcript.source_path = str(path)
        transcript.updated_ms = transcript.updated_ms or mtime_ms(path)
        return transcript

    def thread_name(self, session_id: str) -> str | None:
        """The thread's title (the TUI names threads), the newest entry of the session index."""
        path = self.home / SESSION_INDEX
        try:
            if path.stat().st_size > _SESSION_INDEX_CAP:
                return None  # a title is a search hint: not worth reading a runaway file
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        name = None
        for line in text.splitlines():
            if session_id not in line:
                continue
            entry, _ = read_json_object(line)
            if entry is not None and entry.get("id") == session_id and isinstance(entry.get("thread_name"), str):
                name = entry["thread_name"]
        return name

    def rollout_files(self) -> list[Path]:
        """Every rollout file, live and archived."""
        found = [*self.sessions_dir.glob("*/*/*/rollout-*.jsonl"), *self.archived_dir.glob("rollout-*.jsonl"),
                 *self.archived_dir.glob("*/*/*/rollout-*.jsonl")]
        return sorted(path for path in found if rollout_thread_id(path.name) and path.is_file())

    def list_sessions(self) -> list[SessionInfo]:
        """Every thread, newest first; subagent threads are listed, marked as such."""
        sessions: dict[str, SessionInfo] = {}
        for path in self.rollout_files():
            thread_id = rollout_thread_id(path.name)
            meta = read_session_meta(path) or {}
            sessions.setdefault(thread_id, SessionInfo(
                id=thread_id, title=None, directory=as_str(meta.get("cwd")), updated_ms=mtime_ms(path),
                parent_session_id=parent_thread_id(meta), subagent=is_subagent_meta(meta)))
        return sorted(sessions.values(), key=lambda info: info.updated_ms or 0, reverse=True)

