"""Lifecycle moments (idle, compacting, just compacted, ending) read from transcripts alone.

The rules follow each agent's documented session format (how its writes mark a turn's end,
a compaction and an ended session). They are pure functions of what the agent wrote plus `now_ms`; a watcher calls them after each change
and acts on what applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from llmem.adapters.base import Transcript, TranscriptMessage, iso_to_ms


class Moment(StrEnum):
    """A lifecycle moment a watcher reacts to."""

    IDLE = "idle"  # the agent finished and waits for the user
    BUSY = "busy"  # the agent is working
    COMPACTING = "compacting"  # a compaction started and has not finished
    JUST_COMPACTED = "just_compacted"  # a compaction finished that the caller has not seen
    ENDING = "ending"  # the session is over (see Lifecycle.ending_reason)


# Between agent steps the newest assistant row briefly looks complete (OpenCode), and Copilot
# appends events with a 100 ms debounce: wait this long without writes before calling it idle.
OPENCODE_IDLE_DEBOUNCE_MS = 1500
COPILOT_IDLE_DEBOUNCE_MS = 500
# Idle this long with no writes and the session counts as ended (neither agent closes sessions
# reliably: OpenCode never does, a Copilot crash leaves no shutdown event).
DEFAULT_INACTIVITY_MS = 30 * 60 * 1000

# OpenCode finish reasons that mean the agentic loop will call the model again.
_LOOP_CONTINUES = frozenset({"tool-calls", "unknown"})
_TOOL_IN_FLIGHT = frozenset({"pending", "running"})


@dataclass(frozen=True)
class Lifecycle:
    """Which moments apply to a session now, and the facts behind them."""

    moments: frozenset[Moment]
    # shutdown | crashed | archived | deleted | inactive
    ending_reason: str | None = None
    last_activity_ms: int | None = None
    # The latest finished compaction (summary message id / event id): pass it back as
    # `seen_compaction_id` so JUST_COMPACTED fires once per compaction.
    compaction_id: str | None = None
    # The finished reply that makes the session idle-shaped (OpenCode assistant message id,
    # Copilot turn_end/abort event id), debounced or not: a watcher emits idle once per reply,
    # whether or not it ever saw the session busy.
    reply_id: str | None = None
    # The newest message (OpenCode) or main-agent turn event (Copilot): a session that ends
    # again after it moved on (reopened, one more turn) is a new ending.
    last_turn_id: str | None = None
    # When the newest turn began (its prompt; Codex: its task_started): an idle or ending a
    # hook recorded after it is this turn's, and the watcher does not record it again.
    turn_started_ms: int | None = None

    def __contains__(self, moment: object) -> bool:
        return moment in self.moments


# ---------------------------------------------------------------- OpenCode


def _latest(messages: Sequence[TranscriptMessage], role: str) -> TranscriptMessage | None:
    return next((message for message in reversed(messages) if message.role == role), None)


def opencode_is_idle(messages: Sequence[TranscriptMessage]) -> bool:
    """The latest assistant message completely answers the latest user message (no debounce)."""
    user = _latest(messages, "user")
    assistant = _latest(messages, "assistant")
    if user is None or assistant is None:
        return False
    return (
        assistant.reply_to == user.id
        and assistant.completed_ms is not None
        and assistant.finish is not None
        and assistant.finish not in _LOOP_CONTINUES
        and not any(call.status in _TOOL_IN_FLIGHT for call in assistant.tool_calls)
    )


def _opencode_summary_for(
    messages: Sequence[TranscriptMessage], request: TranscriptMessage
) -> TranscriptMessage | None:
    return next(
        (
            message
            for message in messages
            if message.role == "assistant"
            and message.kind == "compaction_summary"
            and message.reply_to == request.id
            and message.completed_ms is not None
        ),
        None,
    )


def opencode_is_compacting(
    messages: Sequence[TranscriptMessage], compacting_ms: int | None = None
) -> bool:
    """A compaction request has no completed summary yet (or session.time_compacting is set)."""
    if compacting_ms is not None:
        return True
    request = next(
        (message for message in reversed(messages) if message.kind == "compaction_request"), None
    )
    return request is not None and _opencode_summary_for(messages, request) is None


def opencode_last_compaction(messages: Sequence[TranscriptMessage]) -> str | None:
    """The id of the latest successfully completed compaction summary, if any."""
    for message in reversed(messages):
        if (
            message.kind == "compaction_summary"
            and message.completed_ms is not None
            and message.error is None
        ):
            return message.id
    return None


def _last_activity(transcript: Transcript) -> int | None:
    times = [transcript.updated_ms]
    for message in transcript.messages:
        times += [message.time_ms, message.updated_ms, message.completed_ms]
    return max((moment for moment in times if moment is not None), default=None)


def opencode_lifecycle(
    transcript: Transcript | None,
    now_ms: int,
    *,
    seen_compaction_id: str | None = None,
    idle_debounce_ms: int = OPENCODE_IDLE_DEBOUNCE_MS,
    inactivity_ms: int = DEFAULT_INACTIVITY_MS,
) -> Lifecycle:
    """Moments of an OpenCode session; pass its whole transcript, None if the row is gone.

    A child session (a subagent's) has no moments of its own to act on: the watcher skips
    it (ARCHITECTURE.md, "Subagents are not users")."""
    if transcript is None:
        return Lifecycle(frozenset({Moment.ENDING}), ending_reason="deleted")
    messages = transcript.messages
    last_activity = _last_activity(transcript)
    quiet_ms = now_ms - last_activity if last_activity is not None else None
    moments: set[Moment] = set()
    idle = opencode_is_idle(messages)
    if idle and quiet_ms is not None and quiet_ms >= idle_debounce_ms:
        moments.add(Moment.IDLE)
    elif not idle and messages:
        moments.add(Moment.BUSY)
    if opencode_is_compacting(messages, transcript.compacting_ms):
        moments.add(Moment.COMPACTING)
    compaction_id = opencode_last_compaction(messages)
    if compaction_id is not None and compaction_id != seen_compaction_id:
        moments.add(Moment.JUST_COMPACTED)

    ending_reason = None
    if transcript.archived_ms is not None:
        ending_reason = "archived"
    elif idle and quiet_ms is not None and quiet_ms >= inactivity_ms:
        ending_reason = "inactive"
    if ending_reason is not None:
        moments.add(Moment.ENDING)
    prompt = _latest(messages, "user")
    return Lifecycle(frozenset(moments), ending_reason, last_activity, compaction_id,
                     reply_id=_latest(messages, "assistant").id if idle else None,
                     last_turn_id=messages[-1].id if messages else None,
                     turn_started_ms=prompt.time_ms if prompt else None)


# ---------------------------------------------------------------- Copilot CLI

# Events that move a turn forward; everything else (hooks, info, model/mode changes, background
# compaction, truncation, unknown future types) can land after a turn ends and says nothing
# about whether the agent is working.
_TURN_EVENTS = frozenset(
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
        "abort",
        "session.shutdown",
    }
)
# After these the session waits for a prompt without having done anything new.
_WAITING_EVENTS = frozenset({"session.start", "session.resume", "system.message"})
# Events after a shutdown that mean the session came back to life.
_REOPEN_EVENTS = frozenset({"session.resume", "user.message", "assistant.turn_start"})


def _data(event: dict[str, Any]) -> dict[str, Any]:
    data = event.get("data")
    return data if isinstance(data, dict) else {}


def copilot_subagent_event(event: dict[str, Any]) -> bool:
    """A sub-agent's event (it carries agentId or data.parentToolCallId): no turn of the
    session's own, and never the user's words (ARCHITECTURE.md, "Subagents are not users")."""
    return bool(event.get("agentId") or _data(event).get("parentToolCallId"))


def _main_agent(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events of the main agent."""
    return [event for event in events if isinstance(event, dict) and not copilot_subagent_event(event)]


def _agent_stop_hook_ended(events: Sequence[dict[str, Any]]) -> bool:
    """The last hook event is the end of an `agentStop` hook run (the exact idle moment)."""
    last_hook = next(
        (event for event in reversed(events) if event.get("type") in ("hook.start", "hook.end")),
        None,
    )
    if last_hook is None or last_hook.get("type") != "hook.end":
        return False
    invocation = _data(last_hook).get("hookInvocationId")
    hook_type = _data(last_hook).get("hookType")
    if hook_type is None and invocation is not None:
        start = next(
            (
                event
                for event in events
                if event.get("type") == "hook.start"
                and _data(event).get("hookInvocationId") == invocation
            ),
            None,
        )
        hook_type = _data(start).get("hookType") if start else None
    return hook_type == "agentStop"


def _unfinished_tool_calls(events: Sequence[dict[str, Any]]) -> set[str]:
    started: set[str] = set()
    for event in events:
        call_id = _data(event).get("toolCallId")
        if not isinstance(call_id, str):
            continue
        if event.get("type") == "tool.execution_start":
            started.add(call_id)
        elif event.get("type") == "tool.execution_complete":
            started.discard(call_id)
    return started


def _turn_requested_tools(events: Sequence[dict[str, Any]], turn_end_position: int) -> bool:
    """Whether an assistant.message of the turn that ended here asked for tools."""
    turn_id = _data(events[turn_end_position]).get("turnId")
    for event in reversed(events[:turn_end_position]):
        event_type = event.get("type")
        if event_type == "assistant.turn_start" and _data(event).get("turnId") == turn_id:
            return False
        if event_type == "assistant.message" and _data(event).get("toolRequests"):
            return True
        if event_type == "assistant.turn_end":
            return False
    return False


def copilot_is_idle(events: Sequence[dict[str, Any]]) -> bool:
    """The main agent finished its turn without asking for tools, or was aborted (no debounce)."""
    main = _main_agent(events)
    turn_events = [event for event in main if event.get("type") in _TURN_EVENTS]
    if not turn_events:
        return False
    last_type = turn_events[-1].get("type")
    if last_type == "abort":
        return True
    if _agent_stop_hook_ended(main) and last_type == "assistant.turn_end":
        return True
    if last_type != "assistant.turn_end":
        return False
    return not _turn_requested_tools(turn_events, len(turn_events) - 1) and not (
        _unfinished_tool_calls(main)
    )


def copilot_is_busy(events: Sequence[dict[str, Any]]) -> bool:
    """The main agent is mid-turn: the last turn event is a prompt, a model call or a tool run."""
    turn_events = [event for event in _main_agent(events) if event.get("type") in _TURN_EVENTS]
    if not turn_events:
        return False
    last_type = turn_events[-1].get("type")
    if last_type in _WAITING_EVENTS or last_type in ("abort", "session.shutdown"):
        return False
    return not copilot_is_idle(events)


def copilot_is_compacting(events: Sequence[dict[str, Any]]) -> bool:
    """A session.compaction_start has no later session.compaction_complete."""
    for event in reversed(events):
        event_type = event.get("type") if isinstance(event, dict) else None
        if event_type == "session.compaction_complete":
            return False
        if event_type == "session.compaction_start":
            return True
    return False


def _event_id(event: dict[str, Any], position: int) -> str:
    """An event's id; its line position when it has none (events.jsonl is append-only)."""
    event_id = event.get("id")
    return event_id if isinstance(event_id, str) else f"event-{position}"


def copilot_last_turn_id(events: Sequence[dict[str, Any]]) -> str | None:
    """The id of the main agent's newest turn event (hooks and metadata do not count)."""
    for position in range(len(events) - 1, -1, -1):
        event = events[position]
        if (isinstance(event, dict) and event.get("type") in _TURN_EVENTS
                and not copilot_subagent_event(event)):
            return _event_id(event, position)
    return None


def copilot_last_compaction(events: Sequence[dict[str, Any]]) -> str | None:
    """The id of the latest successful compaction_complete (or non-LLM truncation) event."""
    for position in range(len(events) - 1, -1, -1):
        event = events[position]
        if not isinstance(event, dict):
            continue
        event_type = event.get("type")
        done = event_type == "session.truncation" or (
            event_type == "session.compaction_complete" and _data(event).get("success") is True
        )
        if done:
            return _event_id(event, position)
    return None


def copilot_shut_down(events: Sequence[dict[str, Any]]) -> bool:
    """A session.shutdown was written and the session was not reopened after it."""
    for event in reversed(events):
        event_type = event.get("type") if isinstance(event, dict) else None
        if event_type == "session.shutdown":
            return True
        if event_type in _REOPEN_EVENTS:
            return False
    return False


def copilot_lifecycle(
    events: Sequence[dict[str, Any]],
    now_ms: int,
    *,
    lock_alive: bool | None = None,
    seen_compaction_id: str | None = None,
    idle_debounce_ms: int = COPILOT_IDLE_DEBOUNCE_MS,
    inactivity_ms: int = DEFAULT_INACTIVITY_MS,
) -> Lifecycle:
    """Moments of a Copilot session from its events; `lock_alive` from the inuse lock, if known."""
    times = [iso_to_ms(event.get("timestamp")) for event in events if isinstance(event, dict)]
    last_activity = max((moment for moment in times if moment is not None), default=None)
    quiet_ms = now_ms - last_activity if last_activity is not None else None
    moments: set[Moment] = set()

    ending_reason = None
    if copilot_shut_down(events) and lock_alive is not True:
        ending_reason = "shutdown"
    elif lock_alive is False:
        # A lock whose process is gone and no shutdown event: Copilot crashed or was killed.
        ending_reason = "crashed"
    busy = copilot_is_busy(events)
    if ending_reason is None and not busy and quiet_ms is not None and quiet_ms >= inactivity_ms:
        ending_reason = "inactive"
    if ending_reason is not None:
        moments.add(Moment.ENDING)

    idle = copilot_is_idle(events)
    if ending_reason not in ("shutdown", "crashed"):
        if busy:
            moments.add(Moment.BUSY)
        elif idle and quiet_ms is not None and quiet_ms >= idle_debounce_ms:
            moments.add(Moment.IDLE)
    if copilot_is_compacting(events):
        moments.add(Moment.COMPACTING)
    compaction_id = copilot_last_compaction(events)
    if compaction_id is not None and compaction_id != seen_compaction_id:
        moments.add(Moment.JUST_COMPACTED)
    last_turn_id = copilot_last_turn_id(events)
    prompt = next((event for event in reversed(_main_agent(events)) if event.get("type") == "user.message"), None)
    # When idle, the newest turn event is the turn_end (or abort) that finished the reply.
    return Lifecycle(frozenset(moments), ending_reason, last_activity, compaction_id,
                     reply_id=last_turn_id if idle else None, last_turn_id=last_turn_id,
                     turn_started_ms=iso_to_ms(prompt.get("timestamp")) if prompt else None)


# ---------------------------------------------------------------- Claude Code

# After an assistant line with a finished stop_reason, Claude Code writes only bookkeeping rows
# (or a Stop hook makes the turn go on): wait this long without writes before calling it idle
# when no turn_duration / stop_hook_summary line confirms it.
CLAUDE_IDLE_DEBOUNCE_MS = 1500
_CLAUDE_DONE_REASONS = frozenset({"end_turn", "stop_sequence", "max_tokens", "refusal"})
# User lines the harness writes around a /compact or a local command: they move no turn.
_CLAUDE_QUIET_USER_KINDS = frozenset({"summary", "meta", "command"})


def _claude_main(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lines of the main conversation: subagent (sidechain) lines are left out."""
    # Imported here, not at the top: the Copilot and Codex readers import this module, and the
    # readers load on first use (adapters/__init__.py), so neither should pull in Claude's.
    from llmem.adapters.claude import is_sidechain

    return [line for line in lines if isinstance(line, dict) and not is_sidechain(line)]


def _claude_blocks(line: dict[str, Any]) -> list[Any]:
    message = line.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def claude_turn(lines: Sequence[dict[str, Any]]) -> tuple[str, str | None]:
    """("idle" | "idle_confirmed" | "busy" | "waiting", and the reply's uuid when idle).

    Read backwards from the newest line that moves a turn: a turn_duration, or a Stop hook that
    let the turn end, confirms it; the assistant line that ended the turn is the reply.
    """
    from llmem.adapters.claude import user_line_kind  # see _claude_main

    confirmed = False
    for line in reversed(_claude_main(lines)):
        line_type = line.get("type")
        if line_type == "system":
            subtype = line.get("subtype")
            if subtype == "turn_duration":
                confirmed = True
            elif subtype == "stop_hook_summary":
                if line.get("preventedContinuation") is True and not confirmed:
                    return "busy", None  # a Stop hook made the turn go on
                confirmed = True
        elif line_type == "user":
            kind = user_line_kind(line)
            if kind in _CLAUDE_QUIET_USER_KINDS:
                continue
            if kind == "interrupt":
                return "idle_confirmed", line.get("uuid") if isinstance(line.get("uuid"), str) else None
            return "busy", None  # a prompt, a notification or a tool result: the model is called next
        elif line_type == "assistant":
            message = line.get("message") if isinstance(line.get("message"), dict) else {}
            asks_tool = any(isinstance(block, dict) and block.get("type") == "tool_use"
                            for block in _claude_blocks(line))
            if asks_tool or message.get("stop_reason") not in _CLAUDE_DONE_REASONS:
                return "busy", None
            reply = line.get("uuid") if isinstance(line.get("uuid"), str) else None
            return ("idle_confirmed" if confirmed else "idle"), reply
    return "waiting", None


def claude_last_compaction(lines: Sequence[dict[str, Any]]) -> str | None:
    """The uuid of the newest compact_boundary line (compaction leaves only its result)."""
    for line in reversed(_claude_main(lines)):
        if line.get("type") == "system" and line.get("subtype") == "compact_boundary":
            uuid = line.get("uuid")
            return uuid if isinstance(uuid, str) else None
    return None


def claude_last_turn_id(lines: Sequence[dict[str, Any]]) -> str | None:
    """The uuid of the newest user or assistant line of the main conversation."""
    for line in reversed(_claude_main(lines)):
        if line.get("type") in ("user", "assistant") and isinstance(line.get("uuid"), str):
            return line["uuid"]
    return None


def claude_turn_started_ms(lines: Sequence[dict[str, Any]]) -> int | None:
    """When the newest turn began: its prompt (or the task notification that woke the model)."""
    from llmem.adapters.claude import user_line_kind  # see _claude_main

    for line in reversed(_claude_main(lines)):
        if line.get("type") == "user" and user_line_kind(line) in ("prompt", "notification"):
            return iso_to_ms(line.get("timestamp"))
    return None


def claude_exited(lines: Sequence[dict[str, Any]]) -> bool:
    """A cost-state row (written at every clean exit) follows the last conversation line."""
    for line in reversed(_claude_main(lines)):
        line_type = line.get("type")
        if line_type == "cost-state":
            return True
        if line_type in ("user", "assistant"):
            return False
    return False


def claude_lifecycle(
    lines: Sequence[dict[str, Any]],
    now_ms: int,
    *,
    process_alive: bool | None = None,
    mtime_ms: int | None = None,
    seen_compaction_id: str | None = None,
    idle_debounce_ms: int = CLAUDE_IDLE_DEBOUNCE_MS,
    inactivity_ms: int = DEFAULT_INACTIVITY_MS,
) -> Lifecycle:
    """Moments of a Claude Code session from its transcript lines.

    `process_alive` comes from Claude Code's live-process registry (None: no entry for the
    session), `mtime_ms` from the file: many rows carry no timestamp, and the file's time is
    when it was last written. There is no row for "compaction started": a new compact_boundary
    is JUST_COMPACTED, and the watcher emits compacting for it (the PreCompact hook is the live
    signal).
    """
    if mtime_ms is not None:
        # A line is stamped before it is written: the file's time is never older than its
        # newest stamp, and it also covers the rows without one.
        last_activity: int | None = mtime_ms
    else:
        times = [iso_to_ms(line.get("timestamp")) for line in lines if isinstance(line, dict)]
        last_activity = max((moment for moment in times if moment is not None), default=None)
    quiet_ms = now_ms - last_activity if last_activity is not None else None
    moments: set[Moment] = set()
    state, reply = claude_turn(lines)
    busy = state == "busy"

    ending_reason = None
    if claude_exited(lines) and process_alive is not True:
        ending_reason = "shutdown"
    elif process_alive is False:
        ending_reason = "crashed"  # its registry entry names a process that is gone
    elif not busy and quiet_ms is not None and quiet_ms >= inactivity_ms:
        ending_reason = "inactive"
    if ending_reason is not None:
        moments.add(Moment.ENDING)

    idle = state in ("idle", "idle_confirmed")
    if ending_reason not in ("shutdown", "crashed"):
        if busy:
            moments.add(Moment.BUSY)
        elif state == "idle_confirmed" or (idle and quiet_ms is not None and quiet_ms >= idle_debounce_ms):
            moments.add(Moment.IDLE)
    compaction_id = claude_last_compaction(lines)
    if compaction_id is not None and compaction_id != seen_compaction_id:
        moments.add(Moment.JUST_COMPACTED)
    return Lifecycle(frozenset(moments), ending_reason, last_activity, compaction_id,
                     reply_id=reply if idle else None, last_turn_id=claude_last_turn_id(lines),
                     turn_started_ms=claude_turn_started_ms(lines))


# ---------------------------------------------------------------- Codex CLI

# Codex flushes a rollout line per item: a turn's closing line lands with the ones before it.
CODEX_IDLE_DEBOUNCE_MS = 500
_CODEX_TURN_CLOSERS = frozenset({"task_complete", "turn_aborted"})
_CODEX_TURN_MARKS = frozenset({"task_started", *_CODEX_TURN_CLOSERS})


class CodexMark(NamedTuple):
    """The lifecycle view of one rollout line: its id (byte offset), what it is (the item type,
    or the event's type for an `event_msg`), the turn it names and when it was written."""

    id: str
    kind: str
    turn_id: str | None
    at_ms: int | None


def _codex_turn_state(marks: Sequence[CodexMark]) -> tuple[CodexMark | None, CodexMark | None]:
    """(the newest task_started, the line that closed it or None while the turn runs)."""
    for position in range(len(marks) - 1, -1, -1):
        started = marks[position]
        if started.kind != "task_started":
            continue
        closer = next((mark for mark in marks[position + 1:]
                       if mark.kind in _CODEX_TURN_CLOSERS
                       and (mark.turn_id is None or started.turn_id is None or mark.turn_id == started.turn_id)),
                      None)
        return started, closer
    return None, None


def codex_lifecycle(
    marks: Sequence[CodexMark],
    now_ms: int,
    *,
    mtime_ms: int | None = None,
    seen_compaction_id: str | None = None,
    idle_debounce_ms: int = CODEX_IDLE_DEBOUNCE_MS,
    inactivity_ms: int = DEFAULT_INACTIVITY_MS,
) -> Lifecycle:
    """Moments of a Codex thread from its rollout's lines (`mtime_ms`: the file's, when known).

    Busy while the newest task_started has no task_complete / turn_aborted; idle once it has.
    A compaction shows only after the fact, as a `compacted` line (JUST_COMPACTED). No line
    marks an end: idle and no write for `inactivity_ms` is an ending (the SessionEnd hook
    says it sooner).
    """
    times = [mark.at_ms for mark in marks if mark.at_ms is not None] + [mtime_ms]
    last_activity = max((moment for moment in times if moment is not None), default=None)
    quiet_ms = now_ms - last_activity if last_activity is not None else None
    started, closer = _codex_turn_state(marks)
    busy = started is not None and closer is None
    idle = closer is not None
    moments: set[Moment] = set()
    if busy:
        moments.add(Moment.BUSY)
    elif idle and quiet_ms is not None and quiet_ms >= idle_debounce_ms:
        moments.add(Moment.IDLE)
    compaction_id = next((mark.id for mark in reversed(marks) if mark.kind == "compacted"), None)
    if compaction_id is not None and compaction_id != seen_compaction_id:
        moments.add(Moment.JUST_COMPACTED)
    ending_reason = None
    if not busy and quiet_ms is not None and quiet_ms >= inactivity_ms:
        ending_reason = "inactive"
        moments.add(Moment.ENDING)
    last_turn = next((mark.id for mark in reversed(marks) if mark.kind in _CODEX_TURN_MARKS), None)
    return Lifecycle(frozenset(moments), ending_reason, last_activity, compaction_id,
                     reply_id=closer.id if idle else None, last_turn_id=last_turn,
                     turn_started_ms=started.at_ms if started else None)
