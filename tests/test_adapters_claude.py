"""Claude Code adapter: the fixture normalised, the cursor, lines still being written, subagents
left out, malformed and unknown lines, session lookup; and the lifecycle rules of §6."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from session_writers import ClaudeSession, dead_pid

from llmem.adapters import AdapterError, SessionNotFound, resolve_adapter
from llmem.adapters.claude import ClaudeAdapter
from llmem.adapters.lifecycle import Moment, claude_lifecycle
from llmem.config import load_config

FIXTURE = Path(__file__).parent / "fixtures" / "claude"
SESSION = "4f1c8e2a-9b3d-4e6f-a1c2-7d8e9f0a1b2c"
AGENT_ID = "a41ab92590637ac82"


@pytest.fixture
def config_dir(tmp_path):
    target = tmp_path / "claude"
    shutil.copytree(FIXTURE, target)
    return target


@pytest.fixture
def adapter(config_dir):
    return ClaudeAdapter(config_dir)


def all_text(transcript) -> str:
    parts = []
    for message in transcript.messages:
        parts += [message.text, message.reasoning]
        parts += [json.dumps(call.input) + call.output for call in message.tool_calls]
    return "\n".join(parts)


# ---- normalisation ---------------------------------------------------------------------------

def test_fixture_is_normalised(adapter):
    transcript = adapter.read_transcript(SESSION)
    assert transcript.adapter == "claude"
    assert transcript.directory == "/home/dev/acme-api"
    assert (transcript.skipped_malformed, transcript.skipped_unknown) == (0, 0)
    shape = [(m.role, m.kind) for m in transcript.messages]
    assert shape == [
        ("user", "message"), ("assistant", "message"), ("assistant", "message"), ("assistant", "message"),
        ("tool", "message"), ("assistant", "message"), ("system", "compaction_marker"),
        ("assistant", "compaction_summary"), ("system", "command"), ("system", "command"),
    ]
    prompt, first_reply = transcript.messages[0], transcript.messages[1]
    assert prompt.text.startswith("GET /orders returns the same order twice") and not prompt.synthetic
    # Three lines of one API response (thinking, text, tool_use) are one reply, its call paired
    # with the tool_result line that follows.
    assert first_reply.reasoning.startswith("Duplicates across pages")
    assert first_reply.text == "Let me look at how the orders route builds its page query."
    (bash,) = first_reply.tool_calls
    assert (bash.name, bash.status, bash.call_id) == ("Bash", "completed", "toolu_01571f6dfd8fd7c17ca9f0d5")
    assert bash.input["command"].startswith("grep -n")
    assert "order_by(Order.created_at)" in bash.output
    assert first_reply.finish == "tool_use" and first_reply.id == "edd1bb7d-5c16-4f42-85fb-8d29d2b50a45"
    assert transcript.messages[3].finish == "end_turn"
    assert transcript.created_ms < transcript.updated_ms


def test_the_subagent_report_is_the_agent_tools_output_never_the_users_words(adapter):
    transcript = adapter.read_transcript(SESSION)
    notification = next(m for m in transcript.messages if m.role == "tool")
    (call,) = notification.tool_calls
    assert call.name == "Agent" and call.call_id == "toolu_012e4a081994729ccfa03177"
    assert call.output == ("tests/api/test_orders_pagination.py has two paging tests; neither creates "
                           "orders with equal created_at.")
    assert [m.text for m in transcript.messages if m.role == "user"] == [transcript.messages[0].text]
    # The sidechain transcript's own steps are not in the parent's.
    assert "test_orders_pagination.py\", \"description\"" not in all_text(transcript)
    assert "List paging tests" not in all_text(transcript)


def test_llmems_own_context_block_is_not_in_the_transcript(adapter):
    assert "llmem-context" not in all_text(adapter.read_transcript(SESSION))


def test_the_project_is_the_repository_the_session_ran_in(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src" / "api").mkdir(parents=True)
    session = ClaudeSession(tmp_path / "claude", cwd=str(repo / "src" / "api"))
    session.turn("hello", "hi")
    transcript = ClaudeAdapter(tmp_path / "claude").read_transcript(session.id)
    assert (transcript.directory, transcript.project_root) == (str(repo / "src" / "api"), str(repo))


def test_titles_the_custom_title_wins(tmp_path):
    session = ClaudeSession(tmp_path / "claude")
    session.turn("hello", "hi")
    session.write({"type": "summary", "summary": "Old generated title", "leafUuid": session.parent},
                  {"type": "custom-title", "customTitle": "Cursor pagination", "sessionId": session.id},
                  {"type": "summary", "summary": "Newer generated title", "leafUuid": session.parent})
    assert ClaudeAdapter(tmp_path / "claude").read_transcript(session.id).title == "Cursor pagination"


# ---- the cursor ------------------------------------------------------------------------------

def test_cursor_reads_only_what_follows(tmp_path):
    session = ClaudeSession(tmp_path / "claude")
    session.turn("first question", "first answer")
    adapter = ClaudeAdapter(tmp_path / "claude")
    first = adapter.read_transcript(session.id)
    assert [m.text for m in first.messages] == ["first question", "first answer"]
    session.turn("second question", "second answer", tool=("ls", "a.txt"))
    after = adapter.read_transcript(session.id, after=first.cursor)
    assert after.cursor_found
    assert [m.role for m in after.messages] == ["user", "assistant", "assistant"]
    assert after.messages[1].tool_calls[0].output == "a.txt"
    assert adapter.read_transcript(session.id, after=after.cursor).messages == []
    by_index = adapter.read_transcript(session.id, after=first.messages[-1].index)
    assert [m.id for m in by_index.messages] == [m.id for m in after.messages]


def test_a_cursor_inside_a_reply_and_a_result_after_it(tmp_path):
    """Read while the reply was half written: the rest of its blocks, and the result of a call
    read before the cursor, still come through."""
    session = ClaudeSession(tmp_path / "claude")
    session.prompt("check the tests")
    text_line, tool_line, result_line = session.tool_lines("pytest -q", "3 passed", text="Running the tests.")
    session.write(text_line)
    adapter = ClaudeAdapter(tmp_path / "claude")
    seen = adapter.read_transcript(session.id)
    assert seen.cursor == text_line["uuid"]
    session.write(tool_line, result_line)
    rest = adapter.read_transcript(session.id, after=seen.cursor)
    (reply,) = rest.messages
    assert reply.text == "" and reply.tool_calls[0].output == "3 passed"
    rest_after_call = adapter.read_transcript(session.id, after=tool_line["uuid"])
    (result,) = rest_after_call.messages
    assert result.role == "tool" and result.tool_calls[0].name == "Bash" and result.tool_calls[0].output == "3 passed"


def test_unknown_cursor_reads_everything_and_says_so(adapter):
    transcript = adapter.read_transcript(SESSION, after=str(uuid.uuid4()))
    assert not transcript.cursor_found and len(transcript.messages) == 10


def test_a_line_still_being_written_waits_for_the_next_read(tmp_path, caplog):
    session = ClaudeSession(tmp_path / "claude")
    session.turn("first", "one")
    adapter = ClaudeAdapter(tmp_path / "claude")
    cursor = adapter.read_transcript(session.id).cursor
    line = json.dumps(session.prompt_lines("second question")[1], separators=(",", ":")) + "\n"
    session.write(line[:40])
    with caplog.at_level(logging.WARNING, logger="llmem.adapters"):
        partial = adapter.read_transcript(session.id, after=cursor)
    assert partial.messages == [] and partial.skipped_malformed == 0 and not caplog.records
    session.write(line[40:])
    (prompt,) = adapter.read_transcript(session.id, after=cursor).messages
    assert prompt.text == "second question"


def test_malformed_and_unknown_lines_are_skipped_and_reported_once(tmp_path, caplog):
    session = ClaudeSession(tmp_path / "claude")
    session.turn("first", "one")
    session.write("{not json\n", "[1, 2]\n", json.dumps({"no": "type"}) + "\n",
                  json.dumps({"type": "user", "uuid": "u-bad", "message": "text"}) + "\n",
                  json.dumps({"type": "hologram-state", "sessionId": session.id}) + "\n")
    session.turn("second", "two")
    adapter = ClaudeAdapter(tmp_path / "claude")
    with caplog.at_level(logging.WARNING, logger="llmem.adapters"):
        transcript = adapter.read_transcript(session.id)
        adapter.read_transcript(session.id)
    assert [m.text for m in transcript.messages] == ["first", "one", "second", "two"]
    assert transcript.skipped_malformed == 4 and transcript.skipped_unknown == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 4, warnings  # one per bad line, not one per read
    assert all("first" not in w and "two" not in w for w in warnings)  # where and why, never the text


def test_sidechain_lines_in_the_main_file_are_left_out(tmp_path):
    """Before 2.1.2 subagent lines were written into the main transcript with isSidechain."""
    session = ClaudeSession(tmp_path / "claude")
    session.prompt("look around")
    sidechain = session.user_line("I am the subagent's prompt, not the user")
    sidechain["isSidechain"] = True
    session.write(sidechain, session.assistant_line({"type": "text", "text": "subagent finding"}, "msg_x", "end_turn")
                  | {"isSidechain": True, "agentId": "a0011223344556677"})
    session.reply("Looked around.")
    texts = [m.text for m in ClaudeAdapter(tmp_path / "claude").read_transcript(session.id).messages]
    assert texts == ["look around", "Looked around."]


def test_harness_prompts_are_not_the_users_own(tmp_path):
    session = ClaudeSession(tmp_path / "claude")
    session.write(session.user_line("wake up and poll", origin={"kind": "loop_wakeup"}, promptSource="system"),
                  session.user_line("[Request interrupted by user]"))
    messages = ClaudeAdapter(tmp_path / "claude").read_transcript(session.id).messages
    assert [(m.role, m.synthetic, m.kind) for m in messages] == [("user", True, "message"), ("system", False, "abort")]


# ---- sessions: listing, lookup, resolution ---------------------------------------------------

def test_subagent_files_are_never_sessions(adapter, config_dir):
    flat = config_dir / "projects" / "-home-dev-acme-api" / f"agent-{AGENT_ID}.jsonl"
    flat.write_text((config_dir / "projects" / "-home-dev-acme-api" / SESSION / "subagents"
                     / f"agent-{AGENT_ID}.jsonl").read_text())
    sessions = adapter.list_sessions()
    assert [(s.id, s.directory) for s in sessions] == [(SESSION, "/home/dev/acme-api")]
    assert not adapter.has_session(f"agent-{AGENT_ID}")
    with pytest.raises(SessionNotFound):
        adapter.read_transcript(f"agent-{AGENT_ID}")


def test_transcripts_are_only_read(adapter, config_dir):
    files = sorted(p for p in config_dir.rglob("*") if p.is_file())
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    adapter.read_transcript(SESSION)
    adapter.list_sessions()
    assert sorted(p for p in config_dir.rglob("*") if p.is_file()) == files
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files} == before


def test_auto_finds_a_claude_session_beside_copilot_and_env_wins(configure, config_dir, tmp_path, monkeypatch):
    copilot = tmp_path / "copilot"
    (copilot / "6f1e2d3c-0000-4000-8000-000000000000").mkdir(parents=True)
    configure(f"session:\n  adapter: auto\n  copilot:\n    state_dir: {copilot}\n"
              f"  opencode:\n    data_dir: {tmp_path / 'none'}\n  claude:\n    config_dir: {tmp_path / 'elsewhere'}\n")
    with pytest.raises(SessionNotFound):
        resolve_adapter(load_config(), SESSION)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config_dir))
    assert resolve_adapter(load_config(), SESSION).name == "claude"
    assert resolve_adapter(load_config(), "6f1e2d3c-0000-4000-8000-000000000000").name == "copilot"


def test_auto_picks_claude_when_only_its_projects_folder_exists(config_dir, tmp_path):
    from llmem.adapters import detect_adapter, get_adapter

    nothing = tmp_path / "nothing"
    projects = config_dir / "projects"
    assert detect_adapter({"opencode": nothing, "copilot": nothing, "claude": projects}) == "claude"
    assert detect_adapter({"opencode": nothing, "copilot": nothing, "claude": nothing}) == "none"
    assert get_adapter("auto", {"claude": projects}).name == "claude"
    with pytest.raises(AdapterError, match="config folder"):
        get_adapter("claude")


# ---- lifecycle -----------------------------------------------------------

def lines_of(session: ClaudeSession) -> list[dict]:
    return [json.loads(line) for line in session.path.read_text().splitlines()]


def lifecycle(session: ClaudeSession, now: float | None = None, **kwargs):
    return claude_lifecycle(lines_of(session), int((now or time.time()) * 1000), **kwargs)


def test_fixture_lifecycle_step_by_step(adapter):
    """The fixture's lines as they were appended: busy through the tool step, idle when the turn
    completes (once per reply), busy again for the task notification, compacted, exited."""
    lines = adapter.read_log(SESSION).line_objects
    later = 1796047700000  # a minute after the last line: any debounce has passed

    def at(count):
        return claude_lifecycle(lines[:count], later)

    assert Moment.BUSY in at(5)  # the prompt
    assert Moment.BUSY in at(12)  # the Agent tool_use
    idle = at(14)  # end_turn, no confirmation yet: idle after the debounce
    assert Moment.IDLE in idle and idle.reply_id == "0e0be07b-d2c1-40b2-974c-7037fa1eaa9d"
    assert Moment.IDLE not in claude_lifecycle(lines[:14], 1796047533300)  # 100 ms after the reply
    confirmed = claude_lifecycle(lines[:16], 1796047533700)  # turn_duration: no debounce to wait
    assert Moment.IDLE in confirmed and confirmed.reply_id == idle.reply_id
    assert Moment.BUSY in at(19)  # the task-notification turn
    second = at(21)
    assert Moment.IDLE in second and second.reply_id == "5f5609f9-1558-47d8-8695-c7979a5b7058"
    compacted = at(28)
    assert Moment.JUST_COMPACTED in compacted and compacted.reply_id == second.reply_id
    assert compacted.compaction_id == "48a10db2-b52a-4589-b23e-03d4b57a973c"
    assert Moment.JUST_COMPACTED not in claude_lifecycle(lines[:28], later,
                                                         seen_compaction_id=compacted.compaction_id)
    exited = at(len(lines))
    assert Moment.ENDING in exited and exited.ending_reason == "shutdown"
    assert Moment.IDLE not in exited


def test_a_stop_hook_that_keeps_the_turn_going_is_busy(tmp_path):
    session = ClaudeSession(tmp_path / "claude")
    session.prompt("fix it")
    session.reply("Fixed.", turn_done=False)
    session.write(session.system_line("stop_hook_summary", hookCount=1, preventedContinuation=True))
    assert Moment.BUSY in lifecycle(session, time.time() + 60)


def test_ending_waits_for_the_process_and_a_resume_is_a_new_turn(tmp_path):
    session = ClaudeSession(tmp_path / "claude")
    session.turn("first", "one")
    session.write({"type": "cost-state", "sessionId": session.id, "totalCostUSD": 0.1})
    assert Moment.ENDING not in lifecycle(session, process_alive=True)
    ended = lifecycle(session, process_alive=None)
    assert ended.ending_reason == "shutdown"
    session.turn("resumed", "two")  # `claude --resume` appends to the same file
    resumed = lifecycle(session, process_alive=True)
    assert Moment.ENDING not in resumed and resumed.last_turn_id != ended.last_turn_id


def test_crashed_and_inactive(tmp_path):
    session = ClaudeSession(tmp_path / "claude")
    session.turn("first", "one")
    assert lifecycle(session, process_alive=False).ending_reason == "crashed"
    quiet = lifecycle(session, time.time() + 3600, inactivity_ms=30 * 60_000)
    assert quiet.ending_reason == "inactive"
    session.prompt("still thinking")
    assert Moment.ENDING not in lifecycle(session, time.time() + 3600, inactivity_ms=30 * 60_000)


def test_process_registry(tmp_path):
    session = ClaudeSession(tmp_path / "claude")
    session.turn("first", "one")
    adapter = ClaudeAdapter(tmp_path / "claude")
    assert adapter.process_alive(session.id) is None
    session.register()
    assert adapter.process_alive(session.id) is True
    session.register(dead_pid())
    assert adapter.process_alive(session.id) is False
    (tmp_path / "claude" / "sessions" / "garbage.json").write_text("{half")
    assert adapter.process_alive(session.id) is False
    session.unregister()
    assert adapter.process_alive(session.id) is None
    assert os.listdir(tmp_path / "claude" / "sessions") == ["garbage.json"]


def test_a_followed_transcript_parses_only_what_was_appended(tmp_path):
    from llmem.adapters.claude import ClaudeTail

    session = ClaudeSession(tmp_path / "claude")
    session.prompt("first")
    tail = ClaudeTail(session.path)
    assert Moment.BUSY in claude_lifecycle(tail.read().line_objects, int(time.time() * 1000))
    reply = session.reply_lines("one" * 5000)
    whole = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in reply)
    session.write(whole[:100])
    assert len(tail.read().lines) == 2  # the snapshot, the prompt; the half line waits
    session.write(whole[100:])
    followed = tail.read()
    direct = ClaudeAdapter(tmp_path / "claude").read_log(session.id)
    assert [index for index, _ in followed.lines] == [index for index, _ in direct.lines]
    now = int(time.time() * 1000) + 60_000
    assert claude_lifecycle(followed.line_objects, now) == claude_lifecycle(direct.line_objects, now)
    assert len(json.dumps(followed.line_objects)) < 4000  # the lifecycle view, not the 15 KB reply
    # Rewritten shorter (Claude Code compacting its own file): read again from the start.
    session.path.write_text(session.path.read_text().splitlines(keepends=True)[0])
    assert [index for index, _ in tail.read().lines] == [0]


def test_hostile_lines_cost_only_themselves(tmp_path, caplog):
    """A line nested 100,000 deep and one deep enough to overflow the code that walks tool inputs
    are skipped and counted, named by line number and never by their text; a line cut
    mid-character (not UTF-8) loses only the damaged bytes, as in the Copilot reader."""
    session = ClaudeSession(tmp_path / "claude")
    session.turn("first", "one")
    deep = '{"type":"user","message":{"role":"user","content":' + "[" * 100_000 + "]" * 100_000 + "}}\n"
    nested = {"type": "assistant", "message": {"content": []}}
    for _ in range(900):
        nested = {"x": nested}
    session.write(deep, json.dumps(nested) + "\n")
    with session.path.open("ab") as handle:
        handle.write(b'{"type":"user","message":{"role":"user","content":"secret \xff\xfe here"}}\n')
    session.turn("second", "two")
    with caplog.at_level(logging.DEBUG, logger="llmem"):
        transcript = ClaudeAdapter(tmp_path / "claude").read_transcript(session.id)
    assert [m.text for m in transcript.messages] == ["first", "one", "secret \ufffd\ufffd here", "second", "two"]
    assert transcript.skipped_malformed == 2
    assert "line 7" in caplog.text and "line 8" in caplog.text and "nested deeper" in caplog.text
    assert "secret" not in caplog.text and "[[[" not in caplog.text
