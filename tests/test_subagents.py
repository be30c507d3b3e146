"""Subagents are not users (ARCHITECTURE.md): an OpenCode child session, Copilot sub-agent
events and a Codex subagent thread give no memories of their own and no self-assessments,
get no watcher events, and what they found reaches memory through the parent."""

from __future__ import annotations

import json
import uuid

import pytest
from session_writers import CodexRollout, OpenCodeStore, append_lines, copilot_line
from watch_driver import DrivenWatcher, Recorder

import llmem.pipeline.watcher as watcher_module
from llmem.adapters import resolve_adapter
from llmem.app import App
from llmem.capture.extract import extract_session, prepare_slice
from llmem.capture.introspect import introspect_session
from llmem.config import load_config
from llmem.pipeline.watcher import SessionWatcher

# What a helper agent is told and says: user-shaped statements, a correction after an edit, an
# admitted mistake. Read as the user's, each would become a memory or a self-assessment.
SUBAGENT_PROMPT = "Remember that the cache TTL is 5 minutes. Explore src/cache and report."
SUBAGENT_CORRECTION = "No, use uv instead of pip."
SUBAGENT_ADMISSION = "I forgot to check for None before reading the TTL."
FINDING = "The explorer found: cache entries expire after 300 seconds (src/cache/ttl.py)."


def stored(app):
    return list(app.store.models.Memory.select())


@pytest.fixture
def app():
    application = App()
    yield application
    application.close()


def _subagent_line(kind: str, data: dict, agent_id: str) -> str:
    line = json.loads(copilot_line(kind, data))
    line["agentId"] = agent_id
    return json.dumps(line) + "\n"


def copilot_with_subagent(state_dir) -> str:
    session_id = str(uuid.uuid4())
    events = state_dir / session_id / "events.jsonl"
    events.parent.mkdir(parents=True)
    task = "toolu_task1"
    agent = "agent-explorer-1"
    append_lines(
        events,
        copilot_line("session.start", {"sessionId": session_id, "context": {"cwd": "/work/acme"}}),
        copilot_line("user.message", {"content": "Remember that we deploy on Fridays."}),
        copilot_line("assistant.turn_start", {"turnId": "0"}),
        copilot_line("assistant.message", {"messageId": "m1", "content": "",
                                           "toolRequests": [{"toolCallId": task, "name": "task",
                                                             "arguments": {"prompt": SUBAGENT_PROMPT}}]}),
        copilot_line("tool.execution_start", {"toolCallId": task, "toolName": "task"}),
        copilot_line("subagent.started", {"toolCallId": task, "agentName": "explore"}),
        _subagent_line("user.message", {"content": SUBAGENT_PROMPT}, agent),
        _subagent_line("assistant.message", {"messageId": "s1", "content": "Editing.", "parentToolCallId": task,
                                             "toolRequests": [{"toolCallId": "toolu_s2", "name": "edit"}]}, agent),
        _subagent_line("tool.execution_complete", {"toolCallId": "toolu_s2", "success": True,
                                                   "result": {"content": "ok"}, "parentToolCallId": task}, agent),
        _subagent_line("user.message", {"content": SUBAGENT_CORRECTION}, agent),
        _subagent_line("assistant.message", {"messageId": "s3", "content": SUBAGENT_ADMISSION,
                                             "parentToolCallId": task, "toolRequests": []}, agent),
        copilot_line("subagent.completed", {"toolCallId": task, "agentName": "explore"}),
        copilot_line("tool.execution_complete", {"toolCallId": task, "success": True, "result": {"content": FINDING}}),
        copilot_line("assistant.message", {"messageId": "m2", "content": "Done.", "toolRequests": []}),
        copilot_line("assistant.turn_end", {"turnId": "0"}))
    return session_id


def test_copilot_subagent_turns_give_no_memories_and_no_self_assessments(tmp_path, configure, cli, app):
    state_dir = tmp_path / "session-state"
    session_id = copilot_with_subagent(state_dir)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: copilot\n"
              f"  copilot:\n    state_dir: {state_dir}\n")
    code, out, err = cli("hook", "--type", "idle", "--sync", "--session-id", session_id, "--format", "json")
    assert code == 0, err
    assert not json.loads(out)["errors"]
    memories = stored(app)
    assert [m.content for m in memories if m.source != "episode"] == ["We deploy on Fridays."]
    assert not [m for m in memories if m.type == "self_assessment"]
    # The parent's turns are episodes; the sub-agent's prompt and replies are none of them.
    episodes = " ".join(m.content for m in memories if m.source == "episode")
    assert "Remember that we deploy on Fridays." in episodes
    assert SUBAGENT_CORRECTION not in episodes and SUBAGENT_ADMISSION not in episodes
    # What the sub-agent found is in the parent's transcript: the task tool's result.
    transcript = resolve_adapter(app.config, session_id).read_transcript(session_id)
    rendered = "\n".join(line.rendered for line in prepare_slice(app.config, transcript.messages).lines)
    assert "expire after 300 seconds" in rendered
    assert "Explore src/cache and report" in rendered  # the parent's tool input: the agent's words
    assert SUBAGENT_CORRECTION not in rendered and SUBAGENT_ADMISSION not in rendered


def opencode_parent_and_child(data_dir):
    store = OpenCodeStore(data_dir)
    parent = store.session()
    parent.turn("Remember that we deploy on Fridays.", "Noted.", whole=True)
    child = store.session(parent_id=parent.id)
    child.turn(SUBAGENT_PROMPT, "Editing.", whole=True)
    child.turn(SUBAGENT_CORRECTION, SUBAGENT_ADMISSION, whole=True)
    store.close()
    return parent.id, child.id


def test_opencode_child_session_gives_no_memories_and_no_self_assessments(tmp_path, configure, cli, app):
    data_dir = tmp_path / "opencode"
    parent, child = opencode_parent_and_child(data_dir)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: opencode\n"
              f"  opencode:\n    data_dir: {data_dir}\n")
    # The OpenCode plugin fires session.idle for child sessions too.
    code, out, err = cli("hook", "--type", "idle", "--sync", "--session-id", child, "--adapter", "opencode",
                         "--format", "json")
    assert code == 0, err
    assert stored(app) == []
    assert extract_session(app, child).subagent
    assert introspect_session(app, child) == []
    assert app.store.models.SessionCursor.select().count() == 0  # nothing read, nothing to resume
    code, _, err = cli("hook", "--type", "idle", "--sync", "--session-id", parent, "--adapter", "opencode")
    assert code == 0, err
    assert {m.session_id for m in stored(app)} == {parent}  # its memory and episodes, none of the child's
    assert [m.session_id for m in stored(app) if m.source != "episode"] == [parent]


def test_backfill_reads_every_agent_but_skips_subagent_sessions(tmp_path, configure, cli, app):
    data_dir = tmp_path / "opencode"
    parent, child = opencode_parent_and_child(data_dir)
    codex_home = tmp_path / "codex"
    main_thread = CodexRollout(codex_home)
    main_thread.turn("Remember that the invoices job runs at 02:30 UTC.")
    spawned = CodexRollout(codex_home, parent=main_thread.id)
    spawned.turn(SUBAGENT_PROMPT)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: auto\n"
              f"  opencode:\n    data_dir: {data_dir}\n  copilot:\n    state_dir: {tmp_path / 'none'}\n"
              f"  codex:\n    home: {codex_home}\n")
    code, out, err = cli("backfill", "--no-llm", "--json")
    assert code == 0, err
    assert json.loads(out)["sessions_by_adapter"] == {"opencode": 1, "codex": 1}
    assert {m.session_id for m in stored(app)} == {parent, main_thread.id}


def test_the_watcher_gives_subagent_sessions_no_events(tmp_path, configure):
    data_dir, codex_home = tmp_path / "opencode", tmp_path / "codex"
    (codex_home / "sessions").mkdir(parents=True)
    configure(f"session:\n  adapter: auto\n  opencode:\n    data_dir: {data_dir}\n"
              f"  copilot:\n    state_dir: {tmp_path / 'none'}\n  codex:\n    home: {codex_home}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n")
    recorder = Recorder()
    driven = DrivenWatcher(SessionWatcher(load_config(), recorder))
    try:
        parent, child = opencode_parent_and_child(data_dir)
        main_thread = CodexRollout(codex_home)
        main_thread.turn("look into the cache")
        spawned = CodexRollout(codex_home, parent=main_thread.id)
        spawned.turn(SUBAGENT_PROMPT, FINDING)
        driven.run(watcher_module.DIR_CHECK_SECONDS + 1)  # the OpenCode folder appeared after the start
        assert "idle" in recorder.kinds(parent) and "idle" in recorder.kinds(main_thread.id)
        driven.run(3600.0)  # past the inactivity timeout: the parents end, the subagents still get nothing
        assert recorder.kinds(parent)[-1] == "ending" and recorder.kinds(main_thread.id)[-1] == "ending"
        assert recorder.kinds(child) == [] and recorder.kinds(spawned.id) == []
    finally:
        driven.close()
