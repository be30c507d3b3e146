"""Read Claude Code sessions: `<config dir>/projects/<encoded-cwd>/<session-id>.jsonl`.

The files are only ever read. One line per record; an
assistant reply is split into one line per content block, regrouped here by `message.id`.
Sidechain lines and the `<session>/subagents/agent-*.jsonl` transcripts belong to subagents:
they are never a session of their own nor the user's words. What a subagent found reaches the
parent as its `Agent`/`Task` tool result or a task notification, which are read as tool output.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
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
    mtime_ms,
    output_text,
    read_json_object,
    report_skipped,
    validate_session_id,
)
from llmem.adapters.detect import CLAUDE_PROJECTS_DIR, CLAUDE_SESSIONS_DIR, claude_session_id
from llmem.paths import project_root_of
from llmem.processes import pid_is_alive

NAME = "claude"
log = logging.getLogger("llmem.adapters.claude")

# Line types Claude Code 2.1.332 writes; anything else is a newer type,
# skipped and counted, never fatal.
KNOWN_LINE_TYPES = frozenset(
    {
        "user", "assistant", "system", "attachment", "progress", "summary", "custom-title",
        "ai-title", "tag", "agent-name", "agent-color", "last-prompt", "file-history-snapshot",
        "file-history-delta", "queue-operation", "cost-state", "mode", "permission-mode",
        "tools-used", "atis-latch", "worktree-state", "pr-link", "ended-by-model",
        "content-replacement", "memory-mode", "api-request", "api-request-shape",
        "api-request-blob", "api-request-resumed",
    }
)
# The request journal holds whole system prompts (tens of KB a line) and nothing of the
# conversation: recognised by their first bytes and never parsed.
_JOURNAL_LINE = re.compile(rb'\{"type":"api-request')
# Title rows, weakest first: a later kind wins over an earlier one, the last row of a kind wins.
_TITLE_KEYS = (("summary", "summary"), ("ai-title", "aiTitle"), ("custom-title", "customTitle"))
# Harness-written user lines that are neither the user's words nor a tool result.
_COMMAND_PREFIXES = ("<command-name>", "<command-message>", "<local-command-stdout>",
                     "<local-command-stderr>", "<local-command-caveat>")
_INTERRUPTED_PREFIX = "[Request interrupted by user"
_TASK_NOTIFICATION = "<task-notification>"
_NOTIFICATION_FIELD = re.compile(r"<(result|tool-use-id|summary)>(.*?)</\1>", re.DOTALL)


@dataclass
class ClaudeLog:
    """The complete lines of one transcript file, parsed; a line still being written is left out."""

    # (line index, object) pairs; the line index is stable in an append-only file.
    lines: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    skipped_malformed: int = 0
    path: str | None = None
    mtime_ms: int | None = None

    @property
    def line_objects(self) -> list[dict[str, Any]]:
        """Just the parsed lines, in file order (what the lifecycle rules take)."""
        return [line for _, line in self.lines]


def parse_lines(raw: bytes, source: str = "Claude Code transcript", first_index: int = 0) -> ClaudeLog:
    """Parse the complete lines of `raw` (numbered from `first_index`); the bytes after the last
    newline are a line Claude Code is still appending: left for the next read, not malformed."""
    parsed = ClaudeLog()
    complete = raw[: raw.rfind(b"\n") + 1]
    for index, line in enumerate(complete.split(b"\n")[:-1], first_index):
        if not line.strip() or _JOURNAL_LINE.match(line):
            continue
        # A write cut mid-character must not fail the whole file; the damaged line is skipped.
        record, problem = read_json_object(line.decode("utf-8", errors="replace"))
        if record is None or not isinstance(record.get("type"), str):
            parsed.skipped_malformed += 1
            report_skipped(source, f"line {index + 1}", f"it is {problem or 'a record without a type'}")
            continue
        parsed.lines.append((index, record))
    return parsed


def read_log_file(path: str | Path) -> ClaudeLog:
    """Parse one transcript file (read-only)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        modified_ms = int(path.stat().st_mtime * 1000)
    except OSError as error:
        raise AdapterError(f"cannot read Claude Code transcript {path}: {error}") from error
    parsed = parse_lines(raw, f"Claude Code transcript {path}")
    parsed.path, parsed.mtime_ms = str(path), modified_ms
    return parsed


# What the lifecycle rules read of a line; a followed transcript keeps only
# this, so a long session costs kilobytes of memory, not its megabytes of tool output.
_LIFECYCLE_KEYS = ("type", "subtype", "uuid", "timestamp", "isSidechain", "agentId", "isMeta",
                   "isCompactSummary", "origin", "preventedContinuation")
_KEPT_TEXT = 200


def _slim_block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    slim = {"type": block.get("type")}
    if isinstance(block.get("text"), str):
        slim["text"] = block["text"][:_KEPT_TEXT]
    return slim


def lifecycle_view(line: dict[str, Any]) -> dict[str, Any]:
    """The part of a line the lifecycle rules look at."""
    view = {key: line[key] for key in _LIFECYCLE_KEYS if key in line}
    message = line.get("message")
    if isinstance(message, dict):
        content = message.get("content")
        view["message"] = {
            "stop_reason": message.get("stop_reason"),
            "content": content[:_KEPT_TEXT] if isinstance(content, str)
            else [_slim_block(block) for block in content] if isinstance(content, list) else None,
        }
    return view


class ClaudeTail:
    """One transcript followed by byte offset (base.JsonlTail): each read parses only the
    lines appended since the last, and keeps their lifecycle view. A file that shrank or was
    replaced is read again from the start (Claude Code may rewrite its own transcript, §2.1)."""

    def __init__(self, path: Path):
        self.path = path
        self.tail = JsonlTail(path, "Claude Code transcript")
        self.log = ClaudeLog(path=str(path))

    def read(self) -> ClaudeLog:
        """The lifecycle view of every complete line so far."""
        chunk = self.tail.read()
        if chunk.restarted:
            self.log = ClaudeLog(path=str(self.path))
        new = parse_lines(chunk.raw, f"Claude Code transcript {self.path}", chunk.first_index)
        self.log.lines += [(index, lifecycle_view(line)) for index, line in new.lines]
        self.log.skipped_malformed += new.skipped_malformed
        self.log.mtime_ms = chunk.mtime_ms
        return self.log


def is_sidechain(line: dict[str, Any]) -> bool:
    """A subagent's line (older versions wrote them into the main file)."""
    return line.get("isSidechain") is True or bool(line.get("agentId"))


def _message(line: dict[str, Any]) -> dict[str, Any] | None:
    message = line.get("message")
    return message if isinstance(message, dict) else None


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _text_of(blocks: list[Any]) -> str:
    return "\n\n".join(block["text"] for block in blocks
                       if isinstance(block, dict) and block.get("type") == "text"
                       and isinstance(block.get("text"), str) and block["text"])


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        texts = [as_str(part.get("text")) for part in content if isinstance(part, dict)]
        return "\n".join(text for text in texts if text)
    return output_text(content)


def user_line_kind(line: dict[str, Any]) -> str:
    """What a `user` line is: prompt, tool_result, summary, notification, command, interrupt, meta."""
    if line.get("isCompactSummary") is True:
        return "summary"
    if line.get("isMeta") is True:
        return "meta"
    message = _message(line) or {}
    blocks = _blocks(message)
    text = _text_of(blocks).lstrip()
    origin = line.get("origin") if isinstance(line.get("origin"), dict) else {}
    if origin.get("kind") == "task-notification" or text.startswith(_TASK_NOTIFICATION):
        return "notification"
    if text.startswith(_COMMAND_PREFIXES):
        return "command"
    if text.startswith(_INTERRUPTED_PREFIX):
        return "interrupt"
    if not text and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
        return "tool_result"
    return "prompt"


@dataclass
class _PendingCall:
    name: str
    owner_index: int
    input: Any = None
    output: str = ""
    status: str | None = None
    call_id: str | None = None

    def freeze(self) -> ToolCall:
        return ToolCall(name=self.name, input=self.input, output=self.output,
                        status=self.status, call_id=self.call_id)


@dataclass
class _PendingMessage:
    id: str
    index: int
    role: str
    text: str = ""
    calls: list[_PendingCall] = field(default_factory=list)
    time_ms: int | None = None
    updated_ms: int | None = None
    kind: str = "message"
    synthetic: bool = False
    reasoning: str = ""
    finish: str | None = None
    api_message_id: str | None = None

    def freeze(self) -> TranscriptMessage:
        return TranscriptMessage(
            id=self.id, index=self.index, role=self.role, text=self.text,
            tool_calls=tuple(call.freeze() for call in self.calls), time_ms=self.time_ms,
            updated_ms=self.updated_ms or self.time_ms, completed_ms=self.updated_ms or self.time_ms,
            finish=self.finish, kind=self.kind, synthetic=self.synthetic, reasoning=self.reasoning)


def _join(*parts: str) -> str:
    return "\n\n".join(part for part in parts if part)


class _Builder:
    """Turns parsed lines into messages; lines at or before `cut` only feed what later lines
    refer to (tool calls, title, cwd), so a read past a cursor rebuilds nothing before it."""

    def __init__(self, transcript: Transcript, cut: int):
        self.transcript = transcript
        self.cut = cut
        self.messages: list[_PendingMessage] = []
        self.calls: dict[str, _PendingCall] = {}
        self.titles: dict[str, str] = {}

    def add(self, index: int, line: dict[str, Any]) -> None:
        line_type = line["type"]
        time_ms = iso_to_ms(line.get("timestamp"))
        transcript = self.transcript
        if time_ms is not None:
            transcript.created_ms = min(transcript.created_ms or time_ms, time_ms)
            transcript.updated_ms = max(transcript.updated_ms or 0, time_ms)
        if line_type not in KNOWN_LINE_TYPES:
            transcript.skipped_unknown += 1
            log.debug("%s: line %d has unknown type %r: skipped", transcript.session_id, index + 1, line_type)
            return
        if is_sidechain(line):
            return  # a subagent's work: its result reaches the parent as a tool result
        if transcript.directory is None and as_str(line.get("cwd")):
            transcript.directory = line["cwd"]
        for title_type, key in _TITLE_KEYS:
            if line_type == title_type and as_str(line.get(key)):
                self.titles[title_type] = line[key]
        if line_type in ("user", "assistant") and _message(line) is None:
            transcript.skipped_malformed += 1
            report_skipped(f"Claude Code session {transcript.session_id}", f"line {index + 1}",
                           f"its {line_type} line has no message object")
            return
        line_id = as_str(line.get("uuid")) or f"line-{index}"
        if line_type == "assistant":
            self._assistant(index, line_id, line, time_ms)
        elif line_type == "user":
            self._user(index, line_id, line, time_ms)
        elif line_type == "system" and line.get("subtype") == "compact_boundary":
            self.messages.append(_PendingMessage(line_id, index, "system", time_ms=time_ms, kind="compaction_marker"))

    def _assistant(self, index: int, line_id: str, line: dict[str, Any], time_ms: int | None) -> None:
        message = _message(line)
        api_id = as_str(message.get("id"))
        last = self.messages[-1] if self.messages else None
        if (last is not None and api_id and last.api_message_id == api_id and last.role == "assistant"
                and last.index > self.cut):
            pending = last  # one more content block of the same reply
        else:
            pending = _PendingMessage(line_id, index, "assistant", time_ms=time_ms, api_message_id=api_id)
            self.messages.append(pending)
        pending.id, pending.index, pending.updated_ms = line_id, index, time_ms or pending.updated_ms
        pending.finish = as_str(message.get("stop_reason")) or pending.finish
        for block in _blocks(message):
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" and as_str(block.get("text")):
                pending.text = _join(pending.text, block["text"])
            elif kind == "thinking" and as_str(block.get("thinking")):
                pending.reasoning = _join(pending.reasoning, block["thinking"])
            elif kind in ("tool_use", "server_tool_use"):
                call = _PendingCall(name=as_str(block.get("name")) or "unknown", owner_index=index,
                                    input=abbreviate_input(block.get("input")), status="pending",
                                    call_id=as_str(block.get("id")))
                pending.calls.append(call)
                if call.call_id:
                    self.calls[call.call_id] = call

    def _user(self, index: int, line_id: str, line: dict[str, Any], time_ms: int | None) -> None:
        kind = user_line_kind(line)
        blocks = _blocks(_message(line))
        text = _text_of(blocks)
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                self._tool_result(index, line_id, block, time_ms)
        if kind == "summary":
            self.messages.append(_PendingMessage(line_id, index, "assistant", text=text, time_ms=time_ms,
                                       kind="compaction_summary"))
        elif kind == "notification":
            self._notification(index, line_id, text, time_ms)
        elif kind == "command":
            self.messages.append(_PendingMessage(line_id, index, "system", text=text, time_ms=time_ms, kind="command"))
        elif kind == "interrupt":
            self.messages.append(_PendingMessage(line_id, index, "system", text=text, time_ms=time_ms, kind="abort"))
        elif kind == "prompt" and text:
            origin = line.get("origin") if isinstance(line.get("origin"), dict) else {}
            # Prompts the harness wrote (wake-ups, polls) are not the user's own words.
            synthetic = origin.get("kind") not in (None, "human")
            self.messages.append(_PendingMessage(line_id, index, "user", text=text, time_ms=time_ms, synthetic=synthetic))

    def _tool_result(self, index: int, line_id: str, block: dict[str, Any], time_ms: int | None) -> None:
        call_id = as_str(block.get("tool_use_id"))
        call = self.calls.get(call_id) if call_id else None
        if call is None:
            call = _PendingCall(name="unknown", owner_index=index, call_id=call_id)
        call.status = "error" if block.get("is_error") is True else "completed"
        call.output = abbreviate(_result_text(block))
        if index > self.cut and call.owner_index <= self.cut:
            # The call was read before the cursor (or never): its result stands on its own.
            self.messages.append(_PendingMessage(line_id, index, "tool", time_ms=time_ms, calls=[call]))

    def _notification(self, index: int, line_id: str, text: str, time_ms: int | None) -> None:
        fields = dict(_NOTIFICATION_FIELD.findall(text))
        call_id = fields.get("tool-use-id")
        call = self.calls.get(call_id) if call_id else None
        result = _PendingCall(name=call.name if call else "Agent", owner_index=index,
                              input=call.input if call else None, status="completed", call_id=call_id,
                              output=abbreviate((fields.get("result") or fields.get("summary") or text).strip()))
        self.messages.append(_PendingMessage(line_id, index, "tool", time_ms=time_ms, calls=[result]))

    def finish(self) -> None:
        transcript = self.transcript
        for title_type, _ in reversed(_TITLE_KEYS):
            if title_type in self.titles:
                transcript.title = self.titles[title_type]
                break
        transcript.messages = [message.freeze() for message in self.messages if message.index > self.cut]


def transcript_from_log(session_id: str, parsed: ClaudeLog, after: Cursor = None) -> Transcript:
    """Normalise a transcript; with `after` (a line uuid or line index), only what follows it."""
    transcript = Transcript(adapter=NAME, session_id=session_id, skipped_malformed=parsed.skipped_malformed,
                            source_path=parsed.path)
    cut = -1
    if isinstance(after, bool) or not isinstance(after, int | str | None):
        raise AdapterError(f"cursor must be a line uuid or a line index, not {after!r}")
    if isinstance(after, int):
        cut = after
    elif isinstance(after, str):
        found = next((index for index, line in parsed.lines if line.get("uuid") == after), None)
        if found is None and after.startswith("line-") and after[5:].isdigit():
            found = int(after[5:])
        if found is None:
            transcript.cursor_found = False
        else:
            cut = found
    builder = _Builder(transcript, cut)
    for index, line in parsed.lines:
        builder.add(index, line)
    builder.finish()
    # Claude Code records the launch directory, not the repository: memories are kept per
    # repository root, as the hooks map their stdin cwd.
    transcript.project_root = project_root_of(transcript.directory)
    return transcript


# ---------------------------------------------------------------- the adapter


def _first_cwd(path: Path) -> str | None:
    """The cwd of the first line that has one, from the head of the file only."""
    try:
        with path.open("rb") as handle:
            head = handle.read(256 * 1024)
    except OSError:
        return None
    for line in head.split(b"\n")[:-1]:
        if _JOURNAL_LINE.match(line):
            continue
        record, _ = read_json_object(line.decode("utf-8", errors="replace"))
        if record is not None and not is_sidechain(record) and as_str(record.get("cwd")):
            return record["cwd"]
    return None


class ClaudeAdapter:
    """Sessions from Claude Code's `projects/` folder, read-only."""

    name = NAME

    def __init__(self, config_dir: str | Path) -> None:
        self.config_dir = Path(config_dir).expanduser()
        self.projects_dir = self.config_dir / CLAUDE_PROJECTS_DIR
        self.sessions_dir = self.config_dir / CLAUDE_SESSIONS_DIR

    def transcript_path(self, session_id: str) -> Path | None:
        """The session's main transcript (the newest if several project folders hold one)."""
        validate_session_id(session_id)
        if session_id.startswith("agent-") or not self.projects_dir.is_dir():
            return None  # a subagent transcript is never a session of its own
        found = [path for path in self.projects_dir.glob(f"*/{session_id}.jsonl") if path.is_file()]
        return max(found, key=lambda path: mtime_ms(path) or 0) if found else None

    def has_session(self, session_id: str) -> bool:
        """True if a project folder holds `<session_id>.jsonl`."""
        return self.transcript_path(session_id) is not None

    def read_log(self, session_id: str) -> ClaudeLog:
        """The session's parsed lines (for the lifecycle rules)."""
        path = self.transcript_path(session_id)
        if path is None:
            raise SessionNotFound(f"Claude Code session {session_id} not found in {self.projects_dir}")
        return read_log_file(path)

    def read_transcript(self, session_id: str, after: Cursor = None) -> Transcript:
        """The session's transcript; with `after`, only messages after that line (uuid or index)."""
        return transcript_from_log(session_id, self.read_log(session_id), after)

    def list_sessions(self) -> list[SessionInfo]:
        """Main transcripts of every project folder, newest first (subagent files are not sessions)."""
        sessions: dict[str, SessionInfo] = {}
        if not self.projects_dir.is_dir():
            return []
        for path in sorted(self.projects_dir.glob("*/*.jsonl")):
            if claude_session_id(path, self.projects_dir) is None:
                continue
            info = SessionInfo(id=path.stem, title=None, directory=_first_cwd(path), updated_ms=mtime_ms(path))
            known = sessions.get(path.stem)
            if known is None or (info.updated_ms or 0) > (known.updated_ms or 0):
                sessions[path.stem] = info
        return sorted(sessions.values(), key=lambda info: info.updated_ms or 0, reverse=True)

    def process_alive(self, session_id: str) -> bool | None:
        """From Claude Code's live-process registry (`sessions/<pid>.json`, §5): None when no
        entry names the session, else whether a process holding it still runs."""
        if not self.sessions_dir.is_dir():
            return None
        pids = []
        for path in self.sessions_dir.glob("*.json"):
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # being written, or removed meanwhile
            if isinstance(entry, dict) and entry.get("sessionId") == session_id and isinstance(entry.get("pid"), int):
                pids.append(entry["pid"])
        if not pids:
            return None
        return any(pid_is_alive(pid) for pid in pids)

