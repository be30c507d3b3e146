"""Lifecycle rules on message and event sequences, and on the fixtures."""

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from session_writers import recorded_opencode_store

from llmem.adapters import CopilotAdapter, OpenCodeAdapter, ToolCall, Transcript
from llmem.adapters.base import TranscriptMessage
from llmem.adapters.lifecycle import (
    COPILOT_IDLE_DEBOUNCE_MS,
    DEFAULT_INACTIVITY_MS,
    Moment,
    copilot_is_compacting,
    copilot_is_idle,
    copilot_lifecycle,
    opencode_is_idle,
    opencode_lifecycle,
)

FIXTURES = Path(__file__).parent / "fixtures"
MAIN = "ses_f0d5df91fffeoLpXSBPHrYDK6h"
CHILD = "ses_f0d5d58f7ffeSsd6eXKN03Ifpf"
SECOND = 1000
MINUTE = 60 * SECOND

# ---------------------------------------------------------------- OpenCode


def user(message_id: str, at: int, kind: str = "message") -> TranscriptMessage:
    return TranscriptMessage(id=message_id, index=0, role="user", time_ms=at, kind=kind)


def assistant(
    message_id: str,
    answers: str,
    at: int,
    *,
    completed: bool = True,
    finish: str | None = "stop",
    tools: tuple[str, ...] = (),
    kind: str = "message",
    error: str | None = None,
) -> TranscriptMessage:
    return TranscriptMessage(
        id=message_id,
        index=0,
        role="assistant",
        time_ms=at,
        updated_ms=at,
        completed_ms=at if completed else None,
        reply_to=answers,
        finish=finish,
        tool_calls=tuple(ToolCall(name="bash", status=status) for status in tools),
        kind=kind,
        error=error,
    )


def session(*messages: TranscriptMessage, **fields) -> Transcript:
    return Transcript(adapter="opencode", session_id="ses_x", messages=list(messages), **fields)


T0 = 1_790_000_000_000


@pytest.fixture(scope="module")
def fixture_sessions(tmp_path_factory) -> tuple[Transcript, Transcript]:
    data_dir = tmp_path_factory.mktemp("opencode")
    recorded_opencode_store(data_dir)
    adapter = OpenCodeAdapter(data_dir)
    return adapter.read_transcript(MAIN), adapter.read_transcript(CHILD)


def test_finished_fixture_session_is_idle_and_just_compacted(fixture_sessions):
    main, _ = fixture_sessions
    now = main.updated_ms + 2 * SECOND
    state = opencode_lifecycle(main, now)
    assert state.moments == {Moment.IDLE, Moment.JUST_COMPACTED}
    summary = next(m for m in main.messages if m.kind == "compaction_summary")
    assert state.compaction_id == summary.id
    assert state.last_activity_ms == main.updated_ms
    seen = opencode_lifecycle(main, now, seen_compaction_id=summary.id)
    assert seen.moments == {Moment.IDLE}


def test_fixture_session_ends_after_inactivity(fixture_sessions):
    main, _ = fixture_sessions
    state = opencode_lifecycle(main, main.updated_ms + DEFAULT_INACTIVITY_MS)
    assert Moment.ENDING in state and state.ending_reason == "inactive"
    assert Moment.IDLE in state


def test_fixture_compaction_in_progress(fixture_sessions):
    main, _ = fixture_sessions
    request_at = next(i for i, m in enumerate(main.messages) if m.kind == "compaction_request")
    during = dataclasses.replace(main, messages=main.messages[: request_at + 1])
    state = opencode_lifecycle(during, main.updated_ms + MINUTE)
    assert state.moments == {Moment.BUSY, Moment.COMPACTING}
    assert state.compaction_id is None


@pytest.mark.parametrize(
    ("messages", "idle"),
    [
        ([user("u1", T0)], False),
        ([user("u1", T0), assistant("a1", "u1", T0 + 1)], True),
        ([user("u1", T0), assistant("a1", "u1", T0 + 1, finish="tool-calls")], False),
        ([user("u1", T0), assistant("a1", "u1", T0 + 1, finish="unknown")], False),
        ([user("u1", T0), assistant("a1", "u1", T0 + 1, finish=None)], False),
        ([user("u1", T0), assistant("a1", "u1", T0 + 1, completed=False)], False),
        ([user("u1", T0), assistant("a1", "u1", T0 + 1, tools=("completed", "running"))], False),
        ([user("u1", T0), assistant("a1", "u1", T0 + 1, tools=("pending",))], False),
        ([user("u1", T0), assistant("a1", "u1", T0 + 1, tools=("completed", "error"))], True),
        # A new prompt after a finished answer: the agent is working again.
        ([user("u1", T0), assistant("a1", "u1", T0 + 1), user("u2", T0 + 2)], False),
        ([assistant("a1", "u0", T0)], False),
        ([], False),
    ],
)
def test_opencode_idle_rule(messages, idle):
    assert opencode_is_idle(messages) is idle


def test_opencode_idle_is_debounced():
    transcript = session(user("u1", T0), assistant("a1", "u1", T0 + SECOND))
    assert opencode_lifecycle(transcript, T0 + SECOND + 500).moments == set()
    assert opencode_lifecycle(transcript, T0 + 3 * SECOND).moments == {Moment.IDLE}


def test_opencode_busy_and_empty_sessions():
    working = session(user("u1", T0), assistant("a1", "u1", T0 + 1, finish="tool-calls"))
    assert opencode_lifecycle(working, T0 + MINUTE).moments == {Moment.BUSY}
    # Busy sessions do not end by inactivity (a long tool run is not the end).
    assert opencode_lifecycle(working, T0 + 2 * DEFAULT_INACTIVITY_MS).moments == {Moment.BUSY}
    empty = session(updated_ms=T0)
    assert opencode_lifecycle(empty, T0 + 2 * DEFAULT_INACTIVITY_MS).moments == set()


def test_opencode_compaction_states():
    request = user("u2", T0 + 10, kind="compaction_request")
    base = [user("u1", T0), assistant("a1", "u1", T0 + 1), request]
    started = opencode_lifecycle(session(*base), T0 + MINUTE)
    assert Moment.COMPACTING in started and Moment.JUST_COMPACTED not in started
    streaming = assistant("s1", "u2", T0 + 11, completed=False, kind="compaction_summary")
    assert Moment.COMPACTING in opencode_lifecycle(session(*base, streaming), T0 + MINUTE)
    done = assistant("s1", "u2", T0 + 12, kind="compaction_summary")
    finished = opencode_lifecycle(session(*base, done), T0 + MINUTE)
    assert Moment.COMPACTING not in finished and Moment.JUST_COMPACTED in finished
    assert finished.compaction_id == "s1"
    failed = assistant(
        "s1", "u2", T0 + 12, kind="compaction_summary", finish="error", error="ContextOverflowError"
    )
    failed_state = opencode_lifecycle(session(*base, failed), T0 + MINUTE)
    assert Moment.COMPACTING not in failed_state and Moment.JUST_COMPACTED not in failed_state
    flagged = session(user("u1", T0), compacting_ms=T0 + 5)
    assert Moment.COMPACTING in opencode_lifecycle(flagged, T0 + MINUTE)


def test_opencode_archived_and_deleted_sessions_end():
    archived = session(user("u1", T0), archived_ms=T0 + 5)
    state = opencode_lifecycle(archived, T0 + SECOND)
    assert Moment.ENDING in state and state.ending_reason == "archived"
    gone = opencode_lifecycle(None, T0)
    assert gone.moments == {Moment.ENDING} and gone.ending_reason == "deleted"


# ---------------------------------------------------------------- Copilot


class Events:
    """Builds a Copilot event list with ids and timestamps 100 ms apart."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.clock = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)

    def add(self, event_type: str, agent_id: str | None = None, **data) -> "Events":
        self.clock += timedelta(milliseconds=100)
        event = {
            "type": event_type,
            "data": data,
            "id": f"e{len(self.events)}",
            "timestamp": self.clock.isoformat().replace("+00:00", "Z"),
        }
        if agent_id:
            event["agentId"] = agent_id
        self.events.append(event)
        return self

    @property
    def last_ms(self) -> int:
        return int(self.clock.timestamp() * 1000)

    def prompt(self) -> "Events":
        return self.add("user.message", content="do it").add("assistant.turn_start", turnId="0")

    def tool_turn(self, turn: str, call: str, complete: bool = True) -> "Events":
        self.add("assistant.turn_start", turnId=turn)
        request = {"toolCallId": call, "name": "bash", "arguments": {}}
        self.add("assistant.message", content="", toolRequests=[request], turnId=turn)
        self.add("tool.execution_start", toolCallId=call, toolName="bash", turnId=turn)
        if complete:
            self.add("tool.execution_complete", toolCallId=call, success=True, turnId=turn)
        return self.add("assistant.turn_end", turnId=turn)

    def final_turn(self, turn: str) -> "Events":
        self.add("assistant.turn_start", turnId=turn)
        self.add("assistant.message", content="Done.", toolRequests=[], turnId=turn)
        return self.add("assistant.turn_end", turnId=turn)


def started() -> Events:
    return Events().add("session.start", sessionId="s").add("system.message", content="...")


def test_copilot_finished_fixture_session_is_shut_down():
    adapter = CopilotAdapter(FIXTURES / "copilot" / "session-state")
    events = adapter.read_events("7d3c2b1a-5e4f-4a8b-9c0d-1e2f3a4b5c6d").event_objects
    state = copilot_lifecycle(events, 1_800_000_000_000)
    assert state.moments == {Moment.ENDING, Moment.JUST_COMPACTED}
    assert state.ending_reason == "shutdown"
    assert state.compaction_id == "c62930cd-b0f1-4e72-8059-e7c0c9f22ad1"


def test_copilot_running_fixture_session_is_busy_or_crashed():
    adapter = CopilotAdapter(FIXTURES / "copilot" / "session-state")
    events = adapter.read_events("e0a9b8c7-d6e5-4f43-a2b1-0c9d8e7f6a5b").event_objects
    last = copilot_lifecycle(events, 0).last_activity_ms
    assert copilot_lifecycle(events, last + SECOND, lock_alive=True).moments == {Moment.BUSY}
    crashed = copilot_lifecycle(events, last + SECOND, lock_alive=False)
    assert crashed.moments == {Moment.ENDING} and crashed.ending_reason == "crashed"


def test_copilot_turn_sequence():
    log = started()
    assert copilot_lifecycle(log.events, log.last_ms + SECOND).moments == set()  # waiting
    log.prompt()
    assert copilot_lifecycle(log.events, log.last_ms + SECOND).moments == {Moment.BUSY}
    log.tool_turn("1", "c1")
    # The turn ended with a tool request: the loop calls the model again.
    assert not copilot_is_idle(log.events)
    assert copilot_lifecycle(log.events, log.last_ms + SECOND).moments == {Moment.BUSY}
    log.final_turn("2")
    assert copilot_is_idle(log.events)
    assert copilot_lifecycle(log.events, log.last_ms + 100).moments == set()  # debounce
    settled = log.last_ms + COPILOT_IDLE_DEBOUNCE_MS
    assert copilot_lifecycle(log.events, settled).moments == {Moment.IDLE}
    quiet = copilot_lifecycle(log.events, log.last_ms + DEFAULT_INACTIVITY_MS)
    assert quiet.moments == {Moment.IDLE, Moment.ENDING} and quiet.ending_reason == "inactive"


def test_copilot_unfinished_tool_is_not_idle():
    log = started().prompt()
    log.add("tool.execution_start", toolCallId="stray", toolName="bash")
    log.final_turn("1")
    assert not copilot_is_idle(log.events)


def test_copilot_abort_is_idle():
    log = started().prompt().add("assistant.turn_start", turnId="1")
    log.add("tool.execution_start", toolCallId="c1", toolName="bash")
    log.add("abort", reason="user_initiated")
    assert copilot_lifecycle(log.events, log.last_ms + SECOND).moments == {Moment.IDLE}


def test_copilot_metadata_after_a_turn_keeps_it_idle():
    log = started().prompt().final_turn("1")
    log.add("session.info", message="x").add("session.model_change", newModel="gpt-5.1")
    log.add("hook.start", hookInvocationId="h1", hookType="postToolUse").add(
        "hook.end", hookInvocationId="h1", success=True
    )
    log.add("session.hologram", unknown=True)
    assert copilot_is_idle(log.events)


def test_copilot_agent_stop_hook_marks_idle():
    log = started().prompt().tool_turn("1", "c1")
    assert not copilot_is_idle(log.events)
    log.add("hook.start", hookInvocationId="h9", hookType="agentStop")
    log.add("hook.end", hookInvocationId="h9", success=True)
    assert copilot_is_idle(log.events)


def test_copilot_sub_agent_events_do_not_end_the_main_turn():
    log = started().prompt()
    log.add("assistant.turn_start", turnId="1")
    task = {"toolCallId": "task1", "name": "task", "arguments": {}}
    log.add("assistant.message", content="", toolRequests=[task], turnId="1")
    log.add("tool.execution_start", toolCallId="task1", toolName="task", turnId="1")
    log.add("assistant.turn_start", agent_id="sub1", turnId="0")
    log.add("assistant.message", agent_id="sub1", content="found it", toolRequests=[])
    log.add("assistant.turn_end", agent_id="sub1", turnId="0")
    assert not copilot_is_idle(log.events)
    assert Moment.BUSY in copilot_lifecycle(log.events, log.last_ms + SECOND)


def test_copilot_compaction_states():
    log = started().prompt().final_turn("1")
    log.add("session.compaction_start", conversationTokens=170000)
    assert copilot_is_compacting(log.events)
    state = copilot_lifecycle(log.events, log.last_ms + SECOND)
    # Background compaction does not make a finished turn busy.
    assert state.moments == {Moment.IDLE, Moment.COMPACTING}
    log.add("session.compaction_complete", success=False, error="too big")
    failed = copilot_lifecycle(log.events, log.last_ms + SECOND)
    assert failed.moments == {Moment.IDLE} and failed.compaction_id is None
    log.add("session.compaction_start").add(
        "session.compaction_complete", success=True, summaryContent="<overview/>"
    )
    done = copilot_lifecycle(log.events, log.last_ms + SECOND)
    assert done.moments == {Moment.IDLE, Moment.JUST_COMPACTED}
    assert copilot_lifecycle(
        log.events, log.last_ms + SECOND, seen_compaction_id=done.compaction_id
    ).moments == {Moment.IDLE}
    log.add("session.truncation", tokenLimit=1)
    assert (
        copilot_lifecycle(
            log.events, log.last_ms + SECOND, seen_compaction_id=done.compaction_id
        ).compaction_id
        == log.events[-1]["id"]
    )


def test_copilot_shutdown_resume_and_live_lock():
    log = started().prompt().final_turn("1").add("session.shutdown", shutdownType="routine")
    now = log.last_ms + SECOND
    assert copilot_lifecycle(log.events, now).ending_reason == "shutdown"
    # The process still holds the lock: it is writing its last events, not gone yet.
    assert Moment.ENDING not in copilot_lifecycle(log.events, now, lock_alive=True)
    log.add("session.resume", eventCount=9)
    reopened = copilot_lifecycle(log.events, log.last_ms + SECOND, lock_alive=True)
    assert Moment.ENDING not in reopened and reopened.moments == set()


def test_opencode_reply_id_names_the_finished_reply_whatever_was_seen_before():
    first = session(user("u1", T0), assistant("a1", "u1", T0 + 1))
    assert opencode_lifecycle(first, T0 + MINUTE).reply_id == "a1"
    # The next turn written in one transaction (prompt and finished reply together): a new
    # reply id, though no look ever saw the session busy.
    second = session(user("u1", T0), assistant("a1", "u1", T0 + 1), user("u2", T0 + 2),
                     assistant("a2", "u2", T0 + 3))
    state = opencode_lifecycle(second, T0 + MINUTE)
    assert Moment.IDLE in state and state.reply_id == "a2" and state.last_turn_id == "a2"
    # Not debounced yet: the reply is named all the same (the watcher looks again).
    early = opencode_lifecycle(second, T0 + 4)
    assert Moment.IDLE not in early and early.reply_id == "a2"
    working = session(user("u1", T0), assistant("a1", "u1", T0 + 1), user("u2", T0 + 2))
    state = opencode_lifecycle(working, T0 + MINUTE)
    assert state.reply_id is None and state.last_turn_id == "u2"


def test_copilot_reply_id_is_the_turn_end_of_each_finished_reply():
    log = started().prompt().final_turn("1")
    first = copilot_lifecycle(log.events, log.last_ms + SECOND)
    assert Moment.IDLE in first and first.reply_id == log.events[-1]["id"]
    log.prompt().final_turn("2")  # a whole turn between two looks
    second = copilot_lifecycle(log.events, log.last_ms + SECOND)
    assert Moment.IDLE in second and second.reply_id == log.events[-1]["id"] != first.reply_id
    log.add("session.info", message="metadata after the turn")
    assert copilot_lifecycle(log.events, log.last_ms + SECOND).reply_id == second.reply_id
    log.add("session.shutdown", shutdownType="routine")
    ended = copilot_lifecycle(log.events, log.last_ms + SECOND)
    assert ended.reply_id is None and ended.last_turn_id == log.events[-1]["id"]
    log.add("session.resume").prompt().final_turn("3").add("session.shutdown", shutdownType="routine")
    again = copilot_lifecycle(log.events, log.last_ms + SECOND)
    assert Moment.ENDING in again and again.last_turn_id != ended.last_turn_id
    sub_agent = Events().add("session.start").prompt().final_turn("1")
    sub_agent.add("assistant.turn_end", agent_id="sub", turnId="9")
    assert copilot_lifecycle(sub_agent.events, sub_agent.last_ms + SECOND).last_turn_id == "e5"


def test_turn_started_ms_is_the_newest_prompt():
    """The watcher takes an idle or ending a hook recorded after this time as the turn's."""
    two = session(user("u1", T0), assistant("a1", "u1", T0 + 1), user("u2", T0 + 2), assistant("a2", "u2", T0 + 3))
    assert opencode_lifecycle(two, T0 + MINUTE).turn_started_ms == T0 + 2
    assert opencode_lifecycle(session(), T0).turn_started_ms is None
    log = started().prompt().final_turn("1")
    first = copilot_lifecycle(log.events, log.last_ms + SECOND).turn_started_ms
    log.prompt().final_turn("2")
    second = copilot_lifecycle(log.events, log.last_ms + SECOND).turn_started_ms
    prompts = [event for event in log.events if event["type"] == "user.message"]
    assert first is not None and second is not None and first < second
    assert second == copilot_lifecycle(prompts[-1:], 0).last_activity_ms  # the second prompt's stamp
