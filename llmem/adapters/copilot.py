"""Read GitHub Copilot CLI sessions: `session-state/<id>/events.jsonl` and `--share` exports."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from llmem.adapters.base import (
    NOT_JSON,
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
    is_valid_session_id,
    iso_to_ms,
    messages_after,
    mtime_ms,
    output_text,
    read_json_object,
    report_skipped,
    validate_session_id,
)
from llmem.adapters.detect import EVENTS_FILE, WORKSPACE_FILE
from llmem.adapters.lifecycle import copilot_subagent_event
from llmem.processes import pid_is_alive

NAME = "copilot"

# Persisted event types of Copilot CLI 1.0.63–1.0.102. Others are newer
# types: ignored and counted, never fatal.
KNOWN_EVENT_TYPES = frozenset(
    {
        "session.start",
        "session.resume",
        "system.message",
        "user.message",
        "assistant.turn_start",
        "assistant.turn_end",
        "assistant.message",
        "assistant.reasoning",
        "tool.execution_start",
        "tool.execution_complete",
        "tool.user_requested",
        "subagent.started",
        "subagent.completed",
        "subagent.failed",
        "session.compaction_start",
        "session.compaction_complete",
        "session.truncation",
        "session.context_changed",
        "session.model_change",
        "session.mode_changed",
        "session.plan_changed",
        "session.workspace_file_changed",
        "session.info",
        "session.warning",
        "session.error",
        "abort",
        "session.task_complete",
        "hook.start",
        "hook.end",
        "session.shutdown",
    }
)

_SHARE_NAME_RE = re.compile(r"copilot-session-(.+)\.md")
_LOCK_NAME_RE = re.compile(r"inuse\.(\d+)\.lock")


@dataclass
class CopilotEventLog:
    """The parsed lines of one `events.jsonl`, with the count of lines that were skipped."""

    # (line index, event object) pairs; the line index is a stable cursor for an append-only file.
    events: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    skipped_malformed: int = 0
    path: str | None = None

    @property
    def event_objects(self) -> list[dict[str, Any]]:
        """Just the events, in file order (what the lifecycle rules take)."""
        return [event for _, event in self.events]


def parse_events(text: str, source: str = "Copilot events", first_index: int = 0) -> CopilotEventLog:
    """Parse JSON lines (numbered from `first_index`); skip and count malformed lines,
    including a truncated last line."""
    log = CopilotEventLog()
    lines = text.split("\n")
    for index, line in enumerate(lines, first_index):
        if not line.strip():
            continue
        event, problem = read_json_object(line)
        if event is None:
            log.skipped_malformed += 1
            # Bad JSON is also the usual state of the last line while Copilot still appends
            # it: not worth a log line. Anything else (too deep, not an object) is.
            if problem != NOT_JSON:
                report_skipped(source, f"line {index + 1}", f"it is {problem}")
            continue
        if not isinstance(event.get("type"), str) or not isinstance(event.get("data", {}), dict):
            log.skipped_malformed += 1
            continue
        log.events.append((index, event))
    return log


def read_events_file(path: str | Path) -> CopilotEventLog:
    """Parse one `events.jsonl` file."""
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise AdapterError(f"cannot read Copilot events file {path}: {error}") from error
    # A write cut mid-character must not fail the whole file; the damaged line is skipped.
    log = parse_events(raw.decode("utf-8", errors="replace"), f"Copilot events file {path}")
    log.path = str(path)
    return log


# What the lifecycle rules read of an event (adapters/lifecycle.py, Copilot): a followed
# session keeps only this, so a long one costs kilobytes, not its megabytes of tool output.
_LIFECYCLE_KEYS = ("type", "id", "timestamp", "agentId")
_LIFECYCLE_DATA_KEYS = ("parentToolCallId", "hookInvocationId", "hookType", "toolCallId", "turnId", "success")


def lifecycle_view(event: dict[str, Any]) -> dict[str, Any]:
    """The part of an event the lifecycle rules look at."""
    view = {key: event[key] for key in _LIFECYCLE_KEYS if key in event}
    data = _data(event)
    view["data"] = {key: data[key] for key in _LIFECYCLE_DATA_KEYS if key in data}
    if data.get("toolRequests"):
        view["data"]["toolRequests"] = True
    return view


class CopilotTail:
    """One session's events.jsonl followed by byte offset for the watcher (base.JsonlTail):
    each read parses only the events appended since the last (the last line once Copilot has
    finished it) and keeps their lifecycle view. A file that shrank or was replaced is read
    again from the start."""

    def __init__(self, path: Path):
        self.path = path
        self.tail = JsonlTail(path, "Copilot events file")
        self.log = CopilotEventLog(path=str(path))

    def read(self) -> CopilotEventLog:
        """The lifecycle view of every complete event so far."""
        chunk = self.tail.read()
        if chunk.restarted:
            self.log = CopilotEventLog(path=str(self.path))
        # The chunk ends with a newline: its last "line" is empty, not a truncated record.
        new = parse_events(chunk.raw.decode("utf-8", errors="replace"), f"Copilot events file {self.path}",
                           chunk.first_index)
        self.log.events += [(index, lifecycle_view(event)) for index, event in new.events]
        self.log.skipped_malformed += new.skipped_malformed
        return self.log


def _data(event: dict[str, Any]) -> dict[str, Any]:
    data = event.get("data")
    return data if isinstance(data, dict) else {}


@dataclass
class _PendingCall:
    name: str
    input: Any = None
    output: str = ""
    status: str | None = None
    call_id: str | None = None

    def freeze(self) -> ToolCall:
        return ToolCall(
            name=self.name,
            input=self.input,
            output=self.output,
            status=self.status,
            call_id=self.call_id,
        )


@dataclass
class _PendingMessage:
    id: str
    index: int
    role: str
    text: str = ""
    calls: list[_PendingCall] = field(default_factory=list)
    time_ms: int | None = None
    kind: str = "message"
    reasoning: str = ""

    def freeze(self) -> TranscriptMessage:
        return TranscriptMessage(
            id=self.id,
            index=self.index,
            role=self.role,
            text=self.text,
            tool_calls=tuple(call.freeze() for call in self.calls),
            time_ms=self.time_ms,
            updated_ms=self.time_ms,
            completed_ms=self.time_ms,
            kind=self.kind,
            reasoning=self.reasoning,
        )


def transcript_from_events(session_id: str, log: CopilotEventLog) -> Transcript:
    """Normalise an event log: messages, tool calls paired with their results, summaries."""
    transcript = Transcript(
        adapter=NAME, session_id=session_id, skipped_malformed=log.skipped_malformed
    )
    messages: list[_PendingMessage] = []
    calls_by_id: dict[str, _PendingCall] = {}
    pending_reasoning: list[str] = []

    def tool_message(event_id: str, index: int, time_ms: int | None, call: _PendingCall) -> None:
        # A tool run no assistant message asked for (a user `!command`, or a sub-agent's).
        messages.append(
            _PendingMessage(id=event_id, index=index, role="tool", time_ms=time_ms, calls=[call])
        )

    for index, event in log.events:
        event_type = event["type"]
        data = _data(event)
        event_id = as_str(event.get("id")) or f"line-{index}"
        time_ms = iso_to_ms(event.get("timestamp"))
        if time_ms is not None:
            transcript.updated_ms = max(transcript.updated_ms or 0, time_ms)
        if event_type not in KNOWN_EVENT_TYPES:
            transcript.skipped_unknown += 1
            continue
        if copilot_subagent_event(event):
            # A sub-agent's prompt, replies and tools: what it found comes back as the result
            # of the main agent's tool call that ran it (ARCHITECTURE.md, "Subagents are not users").
            continue
        if event_type in ("session.start", "session.resume"):
            context = data.get("context") if isinstance(data.get("context"), dict) else {}
            if event_type == "session.start":
                transcript.created_ms = iso_to_ms(data.get("startTime")) or time_ms
            transcript.directory = transcript.directory or as_str(context.get("cwd"))
            transcript.project_root = transcript.project_root or as_str(context.get("gitRoot"))
        elif event_type == "system.message":
            messages.append(
                _PendingMessage(
                    id=event_id,
                    index=index,
                    role="system",
                    time_ms=time_ms,
                    text=as_str(data.get("content")) or "",
                    kind="system_prompt",
                )
            )
        elif event_type == "user.message":
            messages.append(
                _PendingMessage(
                    id=event_id,
                    index=index,
                    role="user",
                    time_ms=time_ms,
                    text=as_str(data.get("content")) or "",
                )
            )
        elif event_type == "assistant.reasoning":
            if as_str(data.get("content")):
                pending_reasoning.append(data["content"])
        elif event_type == "assistant.message":
            message = _PendingMessage(
                id=event_id,
                index=index,
                role="assistant",
                time_ms=time_ms,
                text=as_str(data.get("content")) or "",
                reasoning=as_str(data.get("reasoningText")) or "\n\n".join(pending_reasoning),
            )
            pending_reasoning = []
            requests = data.get("toolRequests")
            for request in requests if isinstance(requests, list) else []:
                if not isinstance(request, dict):
                    continue
                call = _PendingCall(
                    name=as_str(request.get("name")) or "unknown",
                    input=abbreviate_input(request.get("arguments")),
                    status="pending",
                    call_id=as_str(request.get("toolCallId")),
                )
                message.calls.append(call)
                if call.call_id:
                    calls_by_id[call.call_id] = call
            messages.append(message)
        elif event_type in ("tool.execution_start", "tool.user_requested"):
            call_id = as_str(data.get("toolCallId"))
            call = calls_by_id.get(call_id) if call_id else None
            if call is None:
                call = _PendingCall(
                    name=as_str(data.get("toolName")) or as_str(data.get("name")) or "unknown",
                    input=abbreviate_input(data.get("arguments")),
                    call_id=call_id,
                )
                if call_id:
                    calls_by_id[call_id] = call
                tool_message(event_id, index, time_ms, call)
            call.status = "running" if event_type == "tool.execution_start" else "pending"
        elif event_type == "tool.execution_complete":
            call_id = as_str(data.get("toolCallId"))
            call = calls_by_id.get(call_id) if call_id else None
            if call is None:
                call = _PendingCall(name="unknown", call_id=call_id)
                tool_message(event_id, index, time_ms, call)
            call.status = "completed" if data.get("success") is True else "error"
            call.output = abbreviate(_tool_result_text(data))
        elif event_type == "session.compaction_complete":
            summary = as_str(data.get("summaryContent"))
            if data.get("success") is True and summary:
                messages.append(
                    _PendingMessage(
                        id=event_id,
                        index=index,
                        role="assistant",
                        time_ms=time_ms,
                        text=summary,
                        kind="compaction_summary",
                    )
                )
        elif event_type == "abort":
            messages.append(
                _PendingMessage(
                    id=event_id,
                    index=index,
                    role="system",
                    time_ms=time_ms,
                    text=f"[aborted: {as_str(data.get('reason')) or 'unknown'}]",
                    kind="abort",
                )
            )
    transcript.messages = [message.freeze() for message in messages]
    return transcript


def _tool_result_text(data: dict[str, Any]) -> str:
    result = data.get("result") if isinstance(data.get("result"), dict) else {}
    error = data.get("error") if isinstance(data.get("error"), dict) else {}
    if data.get("success") is not True and error.get("message"):
        return output_text(error.get("message"))
    return output_text(result.get("content"))


# ---------------------------------------------------------------- --share Markdown exports

_HEADING_RE = re.compile(r"^###\s+(.*?)\s*$")
_ELAPSED_RE = re.compile(r"^<sub>⏱️\s*(.*?)</sub>\s*$")
_TOOL_HEADING_RE = re.compile(r"^(✅|❌)\s*`([^`]*)`")
_STARTED_RE = re.compile(r"\*\*Started:\*\*\s*(.+?)\s*$", re.MULTILINE)
_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}


def _elapsed_ms(text: str) -> int | None:
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|h|m|s)\b", text)
    if not parts:
        return None
    return int(sum(float(amount) * _UNIT_MS[unit] for amount, unit in parts))


def _started_ms(header: str) -> int | None:
    match = _STARTED_RE.search(header)
    if match is None:
        return None
    try:
        # en-US `toLocaleString()` in the exporting machine's local time zone.
        started = datetime.strptime(match.group(1).strip(), "%m/%d/%Y, %I:%M:%S %p")
    except ValueError:
        return None
    return int(started.timestamp() * 1000)


def _split_entries(text: str) -> list[str]:
    """Split on `---` separator lines, ignoring any inside fenced code blocks."""
    chunks: list[list[str]] = [[]]
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.strip() == "---":
            chunks.append([])
        else:
            chunks[-1].append(line)
    return ["\n".join(chunk).strip() for chunk in chunks]


def _tool_from_markdown(name: str, ok: bool, body: str) -> ToolCall:
    # Body: an optional summary line (e.g. "$ command") then the output in a code fence.
    before, fence, after = body.partition("```")
    output = after.split("\n", 1)[1] if fence and "\n" in after else after
    output = output.rsplit("```", 1)[0].strip("\n") if fence else ""
    summary = before.strip()
    return ToolCall(
        name=name or "unknown",
        input=summary or None,
        output=abbreviate(output if fence else summary),
        status="completed" if ok else "error",
    )


def transcript_from_share_markdown(session_id: str, text: str) -> Transcript:
    """Normalise a `copilot-session-<id>.md` export (less detail than events.jsonl)."""
    transcript = Transcript(adapter=NAME, session_id=session_id)
    started_ms: int | None = None
    entries: list[dict[str, Any]] = []
    for chunk in _split_entries(text):
        if not chunk or chunk.startswith("<sub>Generated by"):
            continue
        if chunk.startswith("# ") and not entries:
            started_ms = _started_ms(chunk)
            continue
        lines = chunk.splitlines()
        elapsed = None
        elapsed_match = _ELAPSED_RE.match(lines[0])
        if elapsed_match:
            elapsed = _elapsed_ms(elapsed_match.group(1))
            lines = lines[1:]
        while lines and not lines[0].strip():
            lines = lines[1:]
        heading = _HEADING_RE.match(lines[0]) if lines else None
        if heading is None:
            if entries:
                # A `---` rule inside a message's own Markdown: glue the pieces back together.
                entries[-1]["body"] += "\n\n---\n\n" + chunk
            else:
                transcript.skipped_malformed += 1
            continue
        entries.append(
            {"heading": heading.group(1), "body": "\n".join(lines[1:]).strip(), "elapsed": elapsed}
        )
    for index, entry in enumerate(entries):
        heading, body = entry["heading"], entry["body"]
        time_ms = None
        if started_ms is not None and entry["elapsed"] is not None:
            time_ms = started_ms + entry["elapsed"]
        common = {"id": f"md-{index}", "index": index, "time_ms": time_ms, "updated_ms": time_ms}
        tool = _TOOL_HEADING_RE.match(heading)
        if heading.endswith("User"):
            message = TranscriptMessage(role="user", text=body, **common)
        elif heading.endswith("Copilot"):
            message = TranscriptMessage(role="assistant", text=body, **common)
        elif tool:
            call = _tool_from_markdown(tool.group(2), tool.group(1) == "✅", body)
            message = TranscriptMessage(role="tool", tool_calls=(call,), **common)
        elif "Compacted" in heading:
            message = TranscriptMessage(role="system", kind="compaction_marker", **common)
        else:
            transcript.skipped_unknown += 1
            continue
        transcript.messages.append(message)
    if transcript.messages:
        transcript.created_ms = started_ms
        transcript.updated_ms = transcript.messages[-1].time_ms
    return transcript


# ---------------------------------------------------------------- the adapter


def _read_workspace(path: Path) -> dict[str, Any] | None:
    """workspace.yaml as a dict; None if missing or unreadable."""
    # Imported here, not at module level: hooks import the adapters and must start fast.
    import yaml

    # libyaml when present: it refuses deep nesting at once, where the pure-Python loader
    # spends seconds on a hostile file before it overflows the stack.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        # RecursionError: nesting deeper than the YAML parser's stack (a damaged or hostile file).
        return None
    return loaded if isinstance(loaded, dict) else None


def _workspace_title(workspace: dict[str, Any]) -> str | None:
    # Older files call the display title `summary`; Copilot itself copies it to `name`.
    return as_str(workspace.get("name")) or as_str(workspace.get("summary"))


class CopilotAdapter:
    """Sessions from Copilot CLI's `session-state/` dir and, as a fallback, `--share` files."""

    name = NAME

    def __init__(self, state_dir: str | Path, share_dir: str | Path | None = None) -> None:
        self.state_dir = Path(state_dir).expanduser()
        self.share_dir = Path(share_dir).expanduser() if share_dir is not None else None

    def session_dir(self, session_id: str) -> Path:
        """The directory a session's state lives in (the id is validated first)."""
        return self.state_dir / validate_session_id(session_id)

    def events_path(self, session_id: str) -> Path | None:
        """The session's events.jsonl, or the legacy flat `<id>.jsonl`; None if neither exists."""
        candidates = (
            self.session_dir(session_id) / EVENTS_FILE,
            self.state_dir / f"{session_id}.jsonl",
        )
        return next((path for path in candidates if path.is_file()), None)

    def share_path(self, session_id: str) -> Path | None:
        """The session's `--share` Markdown export, if there is one."""
        if self.share_dir is None:
            return None
        path = self.share_dir / f"copilot-session-{validate_session_id(session_id)}.md"
        return path if path.is_file() else None

    def has_session(self, session_id: str) -> bool:
        """True if session-state (or a `--share` export) holds this session."""
        return (
            self.session_dir(session_id).is_dir()
            or self.events_path(session_id) is not None
            or self.share_path(session_id) is not None
        )

    def read_events(self, session_id: str) -> CopilotEventLog:
        """The session's raw persisted events (for the lifecycle rules)."""
        path = self.events_path(session_id)
        if path is None:
            if self.session_dir(session_id).is_dir():
                # Copilot writes nothing until the first prompt: an empty log, not an error.
                return CopilotEventLog()
            raise SessionNotFound(f"Copilot session {session_id} not found in {self.state_dir}")
        return read_events_file(path)

    def read_transcript(self, session_id: str, after: Cursor = None) -> Transcript:
        """The session's transcript; with `after`, only messages after that id or index."""
        session_dir = self.session_dir(session_id)
        events_path = self.events_path(session_id)
        share_path = self.share_path(session_id)
        if events_path is not None:
            transcript = transcript_from_events(session_id, read_events_file(events_path))
            transcript.source_path = str(events_path)
        elif share_path is not None:
            try:
                text = share_path.read_text(encoding="utf-8", errors="replace")
            except OSError as error:
                raise AdapterError(f"cannot read Copilot export {share_path}: {error}") from error
            transcript = transcript_from_share_markdown(session_id, text)
            transcript.source_path = str(share_path)
        elif session_dir.is_dir():
            transcript = Transcript(adapter=NAME, session_id=session_id)
            transcript.source_path = str(session_dir)
        else:
            raise SessionNotFound(
                f"Copilot session {session_id} not found in {self.state_dir}"
                + (f" or {self.share_dir}" if self.share_dir else "")
            )
        self._apply_workspace(transcript, session_dir / WORKSPACE_FILE)
        transcript.messages, transcript.cursor_found = messages_after(transcript.messages, after)
        return transcript

    def _apply_workspace(self, transcript: Transcript, path: Path) -> None:
        if not path.is_file():
            return
        workspace = _read_workspace(path)
        if workspace is None:
            transcript.skipped_malformed += 1
            return
        transcript.title = _workspace_title(workspace) or transcript.title
        transcript.directory = as_str(workspace.get("cwd")) or transcript.directory
        transcript.project_root = as_str(workspace.get("git_root")) or transcript.project_root
        transcript.created_ms = iso_to_ms(workspace.get("created_at")) or transcript.created_ms
        updated = iso_to_ms(workspace.get("updated_at"))
        if updated is not None:
            transcript.updated_ms = max(transcript.updated_ms or 0, updated)

    def list_sessions(self) -> list[SessionInfo]:
        """Sessions in session-state (dirs and legacy flat files) and share exports, newest first."""
        sessions: dict[str, SessionInfo] = {}
        entries = sorted(self.state_dir.iterdir()) if self.state_dir.is_dir() else []
        for entry in entries:
            if entry.is_dir() and is_valid_session_id(entry.name):
                workspace = _read_workspace(entry / WORKSPACE_FILE) or {}
                updated = [
                    iso_to_ms(workspace.get("updated_at")),
                    mtime_ms(entry / EVENTS_FILE) if (entry / EVENTS_FILE).exists() else None,
                ]
                sessions[entry.name] = SessionInfo(
                    id=entry.name,
                    title=_workspace_title(workspace),
                    directory=as_str(workspace.get("cwd")),
                    updated_ms=max((ms for ms in updated if ms is not None), default=None),
                )
            elif entry.suffix == ".jsonl" and is_valid_session_id(entry.stem):
                sessions.setdefault(
                    entry.stem, SessionInfo(entry.stem, None, None, mtime_ms(entry))
                )
        if self.share_dir is not None and self.share_dir.is_dir():
            for path in sorted(self.share_dir.glob("copilot-session-*.md")):
                match = _SHARE_NAME_RE.fullmatch(path.name)
                if match and is_valid_session_id(match.group(1)):
                    sessions.setdefault(
                        match.group(1), SessionInfo(match.group(1), None, None, mtime_ms(path))
                    )
        return sorted(sessions.values(), key=lambda info: info.updated_ms or 0, reverse=True)

    def lock_pids(self, session_id: str) -> list[int]:
        """Process ids named by the session's `inuse.<pid>.lock` files."""
        session_dir = self.session_dir(session_id)
        if not session_dir.is_dir():
            return []
        pids = []
        for path in session_dir.glob("inuse.*.lock"):
            match = _LOCK_NAME_RE.fullmatch(path.name)
            if match:
                pids.append(int(match.group(1)))
        return sorted(pids)

    def lock_alive(self, session_id: str) -> bool | None:
        """None without a lock file; else whether any locking process still runs."""
        pids = self.lock_pids(session_id)
        if not pids:
            return None
        return any(pid_is_alive(pid) for pid in pids)
