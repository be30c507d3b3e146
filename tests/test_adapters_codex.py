"""The Codex CLI adapter: the documented fixture rollouts (both history
modes) and rollouts written line by line as Codex writes them: cursor by byte offset, a
half-written last line, malformed and unknown lines, subagent threads, lookup by id."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from session_writers import CodexRollout, append_lines, codex_line, uuid7

from llmem.adapters import SessionNotFound, id_shape, resolve_adapter
from llmem.adapters.codex import CodexAdapter, rollout_thread_id
from llmem.config import load_config

FIXTURE = Path(__file__).parent / "fixtures" / "codex"
PAGINATED = "01a22cd3-d72c-741a-a925-90637ac82026"
LEGACY = "01a226ad-f00e-7d4f-83a9-7fa7c2aaf2c2"


@pytest.fixture
def fixture_home(tmp_path):
    home = tmp_path / "codex"
    shutil.copytree(FIXTURE, home)
    return home


def test_paginated_fixture_normalised(fixture_home):
    transcript = CodexAdapter(fixture_home).read_transcript(PAGINATED)
    assert transcript.adapter == "codex" and transcript.directory == "/home/dev/acme-api"
    assert transcript.created_ms is not None and transcript.updated_ms > transcript.created_ms
    assert (transcript.skipped_malformed, transcript.skipped_unknown) == (0, 0)
    assert not transcript.is_subagent
    assert transcript.title == "Find skipped orders cursor"  # from session_index.jsonl
    shape = [(m.role, m.kind) for m in transcript.messages]
    assert shape == [("user", "message"), ("assistant", "message"), ("assistant", "message"),
                     ("assistant", "compaction_summary")]
    prompt, tool_step, answer, summary = transcript.messages
    # The prompt once (the UserMessage item, not also its response_item copy), and none of the
    # harness text: AGENTS.md, the environment, llmem's own hook context.
    assert prompt.text.startswith("The orders page query sometimes skips")
    texts = " ".join(m.text for m in transcript.messages)
    assert "AGENTS.md" not in texts and "llmem-context" not in texts and "environment_context" not in texts
    (call,) = tool_step.tool_calls
    assert call.name == "exec_command" and call.status == "completed"
    assert call.input == {"cmd": 'rg -n "cursor" src/acme_api/routes/orders.py', "workdir": "/home/dev/acme-api"}
    assert "encode_cursor" in call.output
    assert tool_step.reasoning == "Check how the cursor is encoded in the orders route."
    assert "Encode `(created_at, id)` instead." in answer.text
    assert summary.text.startswith("[fixture] Summary:")
    (path,) = (fixture_home / "sessions" / "2026" / "11" / "30").glob("rollout-*.jsonl")
    assert transcript.cursor == f"offset:{path.stat().st_size}" and transcript.source_path == str(path)


def test_legacy_fixture_normalised(fixture_home):
    transcript = CodexAdapter(fixture_home).read_transcript(LEGACY)
    assert [(m.role, m.text[:20]) for m in transcript.messages] == [
        ("user", "List the pagination "), ("assistant", ""), ("assistant", "There are two pagina")]
    assert transcript.messages[1].tool_calls[0].input == {"cmd": "ls tests/api/*pagination*"}
    assert "test_orders_pagination.py" in transcript.messages[1].tool_calls[0].output


@pytest.mark.parametrize("mode", ["paginated", "legacy"])
def test_written_rollout_both_modes(tmp_path, mode):
    rollout = CodexRollout(tmp_path, mode=mode, cwd="/work/acme")
    rollout.begin("Remember that the staging database is pg-staging-2.",
                  hook_context='<llmem-context project="acme">\n- remember that tabs are used\n</llmem-context>')
    rollout.tool("ls", "Makefile")
    rollout.finish("Noted.")
    rollout.compact("Summary: staging database noted.")
    transcript = CodexAdapter(tmp_path).read_transcript(rollout.id)
    assert [(m.role, m.kind) for m in transcript.messages] == [
        ("user", "message"), ("assistant", "message"), ("assistant", "message"), ("assistant", "compaction_summary")]
    assert transcript.messages[0].text == "Remember that the staging database is pg-staging-2."
    assert all("tabs" not in m.text for m in transcript.messages)
    assert transcript.directory == "/work/acme"


def test_cursor_reads_only_what_was_appended(tmp_path):
    rollout = CodexRollout(tmp_path)
    rollout.turn("first prompt", "first answer")
    adapter = CodexAdapter(tmp_path)
    first = adapter.read_transcript(rollout.id)
    assert first.cursor == f"offset:{rollout.path.stat().st_size}"
    assert adapter.read_transcript(rollout.id, after=first.cursor).messages == []
    rollout.turn("second prompt", "second answer")
    second = adapter.read_transcript(rollout.id, after=first.cursor)
    assert [m.text for m in second.messages] == ["second prompt", "second answer"]
    # Past the cursor the session's metadata still comes from its first line.
    assert second.directory == "/work/acme" and second.cursor_found


def test_partial_last_line_waits_for_the_rest(tmp_path):
    rollout = CodexRollout(tmp_path)
    rollout.turn("first prompt")
    whole = codex_line("event_msg", {"type": "user_message", "message": "half written"})
    append_lines(rollout.path, whole[:25])
    adapter = CodexAdapter(tmp_path)
    transcript = adapter.read_transcript(rollout.id)
    assert transcript.skipped_malformed == 0
    assert [m.text for m in transcript.messages] == ["first prompt", "Done."]
    assert transcript.cursor == f"offset:{rollout.path.stat().st_size - 25}"
    append_lines(rollout.path, whole[25:])
    rest = adapter.read_transcript(rollout.id, after=transcript.cursor)
    assert [m.text for m in rest.messages] == ["half written"]


def test_malformed_and_unknown_lines_are_skipped_and_reported_once(tmp_path, caplog):
    rollout = CodexRollout(tmp_path)
    rollout.begin("a prompt")
    append_lines(rollout.path, "{not json\n", '{"no": "envelope"}\n',
                 codex_line("hologram_item", {"x": 1}),
                 codex_line("response_item", {"type": "future_item", "id": "f1"}))
    rollout.finish("an answer")
    adapter = CodexAdapter(tmp_path)
    with caplog.at_level(logging.WARNING, logger="llmem.adapters"):
        transcript = adapter.read_transcript(rollout.id)
        adapter.read_transcript(rollout.id)
    # Bad JSON is malformed; an object without the envelope (a pre-2025-09 bare item) and
    # unknown item types are unknown.
    assert (transcript.skipped_malformed, transcript.skipped_unknown) == (1, 3)
    assert [m.text for m in transcript.messages] == ["a prompt", "an answer"]
    reports = [r.getMessage() for r in caplog.records if "skipped line at byte" in r.getMessage()]
    assert len(reports) == 1 and "not valid JSON" in reports[0] and "{not json" not in reports[0]


def test_subagent_threads_are_marked(tmp_path):
    parent = CodexRollout(tmp_path)
    parent.turn("look into the flaky test")
    child = CodexRollout(tmp_path, parent=parent.id)
    child.turn("Explore tests/ and report what is flaky", "test_orders is flaky")
    review = CodexRollout(tmp_path, subagent=True)
    review.turn("Review the diff")
    adapter = CodexAdapter(tmp_path)
    child_transcript = adapter.read_transcript(child.id)
    assert child_transcript.is_subagent and child_transcript.parent_session_id == parent.id
    assert adapter.read_transcript(review.id).is_subagent
    assert not adapter.read_transcript(parent.id).is_subagent
    listed = {info.id: info.is_subagent for info in adapter.list_sessions()}
    assert listed == {parent.id: False, child.id: True, review.id: True}


def test_a_rewritten_rollout_is_read_whole(tmp_path):
    rollout = CodexRollout(tmp_path)
    rollout.turn("first prompt")
    adapter = CodexAdapter(tmp_path)
    cursor = adapter.read_transcript(rollout.id).cursor
    rollout.path.write_text(rollout.path.read_text()[:-7] + "\n")  # shorter: the offset is no line start
    again = adapter.read_transcript(rollout.id, after=cursor)
    assert not again.cursor_found and again.messages[0].text == "first prompt"


def test_lookup_by_id_archived_and_missing(tmp_path):
    rollout = CodexRollout(tmp_path)
    rollout.turn("archived later")
    archived = tmp_path / "archived_sessions" / rollout.path.name
    archived.parent.mkdir()
    rollout.path.rename(archived)
    adapter = CodexAdapter(tmp_path)
    assert adapter.rollout_path(rollout.id) == archived
    assert adapter.read_transcript(rollout.id).messages[0].text == "archived later"
    assert not adapter.has_session(uuid7()) and not adapter.has_session("ses_notcodex")
    with pytest.raises(SessionNotFound):
        adapter.read_transcript(uuid7())
    assert rollout_thread_id("rollout-2026-11-30T14-20-10-01a22cd3-d72c-741a-a925-90637ac82026.jsonl") == PAGINATED
    assert rollout_thread_id("history.jsonl") is None


def test_auto_resolves_a_codex_thread_and_codex_home_wins(tmp_path, configure, monkeypatch):
    configured, from_env = tmp_path / "configured", tmp_path / "from-env"
    rollout = CodexRollout(from_env)
    rollout.turn("hello")
    copilot = tmp_path / "copilot"
    copilot.mkdir()
    configure(f"session:\n  adapter: auto\n  copilot:\n    state_dir: {copilot}\n  codex:\n    home: {configured}\n"
              f"  opencode:\n    data_dir: {tmp_path / 'none'}\n")
    with pytest.raises(SessionNotFound):
        resolve_adapter(load_config(), rollout.id)
    monkeypatch.setenv("CODEX_HOME", str(from_env))
    assert id_shape(rollout.id) == "codex"
    assert resolve_adapter(load_config(), rollout.id).name == "codex"
