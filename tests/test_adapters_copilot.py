"""The Copilot CLI adapter on a copy of the recorded session-state dir and share export."""

import json
import os
import shutil
from pathlib import Path

import pytest
from session_writers import append_lines

from llmem.adapters import (
    CopilotAdapter,
    InvalidSessionId,
    SessionNotFound,
)
from llmem.adapters.base import TOOL_OUTPUT_CAP
from llmem.adapters.copilot import (
    parse_events,
    transcript_from_share_markdown,
)
from llmem.processes import pid_is_alive

FIXTURES = Path(__file__).parent / "fixtures" / "copilot"
DONE = "7d3c2b1a-5e4f-4a8b-9c0d-1e2f3a4b5c6d"
RUNNING = "e0a9b8c7-d6e5-4f43-a2b1-0c9d8e7f6a5b"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A private copy of the fixture `~/.copilot`-like tree, safe to modify."""
    shutil.copytree(FIXTURES, tmp_path / "copilot")
    return tmp_path / "copilot"


@pytest.fixture
def adapter(home: Path) -> CopilotAdapter:
    return CopilotAdapter(home / "session-state", share_dir=home)


def event(event_type: str, data: dict, event_id: str, timestamp="2026-10-01T09:00:00.000Z"):
    return {"type": event_type, "data": data, "id": event_id, "timestamp": timestamp}


def test_list_sessions_covers_dirs_and_exports(adapter, home):
    shutil.copy(home / f"copilot-session-{DONE}.md", home / "copilot-session-5f6e7d8c-only.md")
    sessions = {info.id: info for info in adapter.list_sessions()}
    assert set(sessions) == {DONE, RUNNING, "5f6e7d8c-only"}
    assert sessions[DONE].title == "Fix flaky pagination test"
    assert sessions[RUNNING].directory == "/home/dev/acme-api"


def test_finished_session_is_normalised(adapter):
    transcript = adapter.read_transcript(DONE)
    assert transcript.adapter == "copilot"
    assert transcript.title == "Fix flaky pagination test"
    assert (transcript.directory, transcript.project_root) == ("/home/dev/acme-api",) * 2
    assert transcript.created_ms == 1790840519880  # 2026-10-01T07:41:59.880Z
    assert (transcript.skipped_malformed, transcript.skipped_unknown) == (0, 0)
    messages = transcript.messages
    assert [(m.role, m.kind) for m in messages] == [
        ("system", "system_prompt"),
        ("user", "message"),
        ("assistant", "message"),
        ("assistant", "message"),
        ("assistant", "message"),
        ("assistant", "compaction_summary"),
        ("assistant", "message"),
        ("assistant", "message"),
    ]
    assert messages[1].text == "Why does test_list_orders_paginates fail intermittently? Fix it."
    bash = messages[2].tool_calls[0]
    assert (bash.name, bash.status, bash.call_id) == (
        "bash",
        "completed",
        "toolu_vrtx_01AbC3dEf5GhJ7",
    )
    assert bash.input["command"].startswith("pytest tests/test_orders.py")
    assert "2 failed, 8 passed" in bash.output
    assert messages[5].text.startswith("<overview>")
    assert messages[-1].text.startswith("Fixed.")
    assert all(m.time_ms for m in messages)
    assert len({m.id for m in messages}) == len(messages)


def test_running_session_has_tool_results_and_a_live_or_dead_lock(adapter, home):
    transcript = adapter.read_transcript(RUNNING)
    assert transcript.title is None  # workspace.yaml has no name yet
    assert transcript.messages[-1].tool_calls[0].status == "completed"
    assert adapter.lock_pids(RUNNING) == [48213]
    session_dir = home / "session-state" / RUNNING
    (session_dir / "inuse.48213.lock").unlink()
    (session_dir / f"inuse.{os.getpid()}.lock").write_text(str(os.getpid()))
    assert adapter.lock_alive(RUNNING) is True
    (session_dir / f"inuse.{os.getpid()}.lock").rename(session_dir / "inuse.999999999.lock")
    assert adapter.lock_alive(RUNNING) is False
    assert adapter.lock_alive(DONE) is None
    assert not pid_is_alive(0) and not pid_is_alive(-1)


def test_truncated_last_line_is_skipped_and_counted(adapter, home):
    events_path = home / "session-state" / RUNNING / "events.jsonl"
    before = len(adapter.read_transcript(RUNNING).messages)
    line = json.dumps(event("user.message", {"content": "half"}, "e-trunc"))
    append_lines(events_path, line[: len(line) // 2])  # no newline, invalid JSON
    transcript = adapter.read_transcript(RUNNING)
    assert transcript.skipped_malformed == 1
    assert len(transcript.messages) == before
    assert len(adapter.read_events(RUNNING).events) == 9


def test_malformed_lines_and_unknown_events(adapter, home):
    events_path = home / "session-state" / RUNNING / "events.jsonl"
    append_lines(
        events_path,
        "{oops\n",
        "[1, 2, 3]\n",
        '{"type": "user.message", "data": "not an object"}\n',
        "\n",
        json.dumps(event("session.hologram", {"x": 1}, "e-unknown")) + "\n",
        json.dumps(event("assistant.message", {"content": "after the noise"}, "e-ok")) + "\n",
    )
    transcript = adapter.read_transcript(RUNNING)
    assert transcript.skipped_malformed == 3
    assert transcript.skipped_unknown == 1
    assert transcript.messages[-1].text == "after the noise"


def test_tool_failures_unrequested_tools_and_long_output(adapter, home):
    events_path = home / "session-state" / RUNNING / "events.jsonl"
    append_lines(
        events_path,
        *(
            json.dumps(item) + "\n"
            for item in [
                event(
                    "assistant.message",
                    {
                        "content": "",
                        "toolRequests": [
                            {
                                "toolCallId": "t-fail",
                                "name": "bash",
                                "arguments": {"command": "false"},
                            },
                            {"toolCallId": "t-long", "name": "view", "arguments": {"path": "/big"}},
                        ],
                    },
                    "e-msg",
                ),  # fmt: skip
                event("tool.execution_start", {"toolCallId": "t-fail", "toolName": "bash"}, "e1"),
                event(
                    "tool.execution_complete",
                    {"toolCallId": "t-fail", "success": False, "error": {"message": "exit 1"}},
                    "e2",
                ),
                event(
                    "tool.execution_complete",
                    {"toolCallId": "t-long", "success": True, "result": {"content": "z" * 9000}},
                    "e3",
                ),
                event(
                    "tool.execution_start",
                    {"toolCallId": "t-sub", "toolName": "grep", "arguments": {"pattern": "x"}},
                    "e4",
                ),
            ]
        ),
    )
    messages = adapter.read_transcript(RUNNING).messages
    failed, long = messages[-2].tool_calls
    assert (failed.status, failed.output) == ("error", "exit 1")
    assert long.status == "completed" and len(long.output) < TOOL_OUTPUT_CAP + 100
    assert messages[-1].role == "tool"
    assert (messages[-1].tool_calls[0].name, messages[-1].tool_calls[0].status) == (
        "grep",
        "running",
    )


def test_cursor_by_event_id_and_by_line_index(adapter):
    whole = adapter.read_transcript(DONE)
    third = whole.messages[2]
    by_id = adapter.read_transcript(DONE, after=third.id)
    by_index = adapter.read_transcript(DONE, after=third.index)
    assert by_id.messages == by_index.messages == whole.messages[3:]
    assert adapter.read_transcript(DONE, after=whole.cursor).messages == []
    missing = adapter.read_transcript(DONE, after="no-such-event")
    assert not missing.cursor_found and missing.messages == whole.messages


def test_empty_sessions_are_transcripts_without_messages(adapter, home):
    no_events = home / "session-state" / "11111111-2222-4333-8444-555555555555"
    no_events.mkdir()
    (no_events / "workspace.yaml").write_text("id: x\nsummary: Named before the first prompt\n")
    transcript = adapter.read_transcript(no_events.name)
    assert transcript.messages == [] and transcript.title == "Named before the first prompt"
    assert adapter.read_events(no_events.name).events == []
    (no_events / "events.jsonl").write_text("")
    assert adapter.read_transcript(no_events.name).messages == []


def test_broken_workspace_yaml_is_counted_not_fatal(adapter, home):
    (home / "session-state" / DONE / "workspace.yaml").write_text("name: [unclosed\n")
    transcript = adapter.read_transcript(DONE)
    assert transcript.skipped_malformed == 1
    assert transcript.title is None and len(transcript.messages) == 8


@pytest.mark.parametrize(
    "bad_id", ["../x", "../../etc", "/etc/passwd", "..", ".", "a/b", "a\\b", "", " x", "x\x00"]
)
def test_session_ids_that_could_escape_are_rejected(adapter, bad_id):
    for read in (
        adapter.read_transcript,
        adapter.read_events,
        adapter.share_path,
        adapter.lock_pids,
    ):
        with pytest.raises(InvalidSessionId):
            read(bad_id)


def test_listing_ignores_names_that_are_not_session_ids(adapter, home):
    (home / "session-state" / ".hidden").mkdir()
    (home / "session-state" / "has space").mkdir()
    (home / "copilot-session-..%2Fx.md").write_text("# nope")
    ids = {info.id for info in adapter.list_sessions()}
    assert ids == {DONE, RUNNING}


def test_missing_session(adapter):
    with pytest.raises(SessionNotFound):
        adapter.read_transcript("00000000-0000-4000-8000-000000000000")
    with pytest.raises(SessionNotFound):
        adapter.read_events("00000000-0000-4000-8000-000000000000")


def test_share_markdown_is_the_fallback_without_session_state(home):
    shutil.rmtree(home / "session-state" / DONE)
    adapter = CopilotAdapter(home / "session-state", home)
    transcript = adapter.read_transcript(DONE)
    assert transcript.source_path.endswith(f"copilot-session-{DONE}.md")
    assert [(m.role, m.kind) for m in transcript.messages] == [
        ("user", "message"),
        ("assistant", "message"),
        ("tool", "message"),
        ("system", "compaction_marker"),
        ("assistant", "message"),
    ]
    call = transcript.messages[2].tool_calls[0]
    assert call.name == "bash" and call.status == "completed"
    assert call.input == "$ pytest tests/test_orders.py -k paginates --count 10 -q"
    assert call.output.startswith("..F.....F.") and call.output.endswith(
        "<exited with exit code 1>"
    )
    # Entries are timed from "Started" plus each entry's elapsed seconds.
    times = [m.time_ms for m in transcript.messages]
    assert [t - times[0] for t in times] == [0, 4000, 9000, 14000, 31000]


def test_share_markdown_keeps_rules_inside_messages_and_code(tmp_path):
    text = "\n".join(
        [
            "# 🤖 Copilot CLI Session",
            "",
            "---",
            "",
            "<sub>⏱️ 1m 5s</sub>",
            "",
            "### 💬 Copilot",
            "",
            "Part one.",
            "",
            "---",
            "",
            "Part two after a horizontal rule.",
            "",
            "---",
            "",
            "### ❌ `bash`",
            "",
            "$ cat notes.md",
            "",
            "```",
            "title",
            "---",
            "body",
            "```",
            "",
            "---",
            "",
            "### 🛸 Something new",
            "",
            "later format",
        ]
    )
    transcript = transcript_from_share_markdown("abc", text)
    assert transcript.skipped_unknown == 1
    assistant, tool = transcript.messages
    assert "Part one." in assistant.text and "Part two after a horizontal rule." in assistant.text
    call = tool.tool_calls[0]
    assert call.status == "error" and call.output == "title\n---\nbody"


def test_legacy_flat_jsonl_session(adapter, home):
    flat = home / "session-state" / "0f0e0d0c-0b0a-4909-8807-060504030201.jsonl"
    flat.write_text(json.dumps(event("user.message", {"content": "old style"}, "e-1")) + "\n")
    assert adapter.read_transcript(flat.stem).messages[0].text == "old style"
    assert flat.stem in {info.id for info in adapter.list_sessions()}


def test_parse_events_keeps_line_indexes():
    log = parse_events('{"type": "a", "data": {}}\n\n{"type": "b"}\n{"type": "c"')
    assert [(index, item["type"]) for index, item in log.events] == [(0, "a"), (2, "b")]
    assert log.skipped_malformed == 1
