"""Codex hooks through the CLI: SessionStart's JSON answer within
Codex's cap, the `notify` payload as a trailing argument, the TUI's title thread ignored, a
hook inside a subagent doing nothing, failing open; and end to end, a fact said in a Codex
session becoming a searchable memory (heuristics, no LLM)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid

import pytest
from session_writers import CodexRollout, uuid7
from test_hooks import BASE, one_line, seed

from llmem.adapters.registry import get_agent
from llmem.app import App

CODEX_CONTEXT_CHARS = get_agent("codex").context_cap

PROJECT = "/work/acme"


@pytest.fixture
def codex_home(tmp_path, configure):
    home = tmp_path / "codex"
    (home / "sessions").mkdir(parents=True)
    configure(BASE + "context:\n  max_tokens: 8000\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {tmp_path / 'no-opencode'}\n"
              f"  copilot:\n    state_dir: {tmp_path / 'no-copilot'}\n  codex:\n    home: {home}\n")
    return home


def hook_stdin(monkeypatch, payload: dict) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(payload)))


def codex_stdin(session_id: str, event: str, **extra) -> dict:
    return {"session_id": session_id, "transcript_path": None, "cwd": PROJECT, "hook_event_name": event,
            "model": "gpt-5.5-codex", "permission_mode": "default", **extra}


def events():
    app = App()
    try:
        Event = app.store.models.Event
        return [(e.adapter, e.session_id, e.kind) for e in Event.select().order_by(Event.id)]
    finally:
        app.close()


def test_session_start_answers_with_the_block_cut_to_codex_cap(cli, codex_home, monkeypatch):
    # Before the first turn there is no rollout yet (Codex writes it at the first turn).
    thread = uuid7()
    seed(*[(f"Preference {n}: " + "page orders by (created_at, id) so that ties never skip a row; " * 4,
            "preference", PROJECT) for n in range(120)])
    code, whole, _ = cli("context", "--project", PROJECT)
    assert code == 0 and len(whole) > CODEX_CONTEXT_CHARS  # uncut, Codex would spill it into a file
    hook_stdin(monkeypatch, codex_stdin(thread, "SessionStart", source="startup"))
    code, out, err = cli("hook", "--adapter", "codex", "--format", "codex", "--type", "created")
    assert code == 0 and err == ""
    answer = json.loads(out)
    assert list(answer) == ["hookSpecificOutput"]
    assert answer["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    block = answer["hookSpecificOutput"]["additionalContext"]
    assert block.startswith("<llmem-context>") and block.endswith("\n</llmem-context>")
    assert CODEX_CONTEXT_CHARS - 400 < len(block) <= CODEX_CONTEXT_CHARS
    assert all(line in whole for line in block.splitlines()[:-1])  # whole lines, nothing mangled


@pytest.mark.parametrize("kind, event", [("idle", "Stop"), ("compacting", "PreCompact"), ("ending", "SessionEnd")])
def test_other_events_print_nothing_for_codex(cli, codex_home, monkeypatch, kind, event):
    rollout = CodexRollout(codex_home, cwd=PROJECT)
    rollout.turn("hello")
    hook_stdin(monkeypatch, codex_stdin(rollout.id, event, turn_id=rollout.turn_id))
    code, out, err = cli("hook", "--adapter", "codex", "--format", "codex", "--type", kind, "--sync")
    assert code == 0 and out == "", err


def test_notify_payload_argument_runs_the_turn(cli, codex_home):
    rollout = CodexRollout(codex_home, cwd=PROJECT)
    rollout.turn("Remember that the billing service runs on port 8443.", "Noted.")
    payload = {"type": "agent-turn-complete", "thread-id": rollout.id, "turn-id": rollout.turn_id,
               "cwd": PROJECT, "client": "codex-tui", "input-messages": ["Remember that …"],
               "last-assistant-message": "Noted."}
    code, out, err = cli("hook", "--adapter", "codex", "--type", "idle", "--sync", "--format", "json",
                         json.dumps(payload))
    assert code == 0, err
    result = json.loads(out)
    assert result["session_id"] == rollout.id and not result["errors"]
    assert result["steps"]["extract"]["result"]["memories_added"] == 1


def test_notify_for_the_title_thread_is_ignored(cli, codex_home, llmem_home):
    payload = {"type": "agent-turn-complete", "thread-id": uuid7(), "cwd": PROJECT, "client": "codex-tui",
               "input-messages": ["Generate a title for this conversation"], "last-assistant-message": "Title"}
    code, out, err = cli("hook", "--adapter", "codex", "--type", "idle", json.dumps(payload))
    assert (code, out, err) == (0, "", "")
    assert events() == []


def test_a_hook_inside_a_subagent_does_nothing(cli, codex_home, monkeypatch):
    rollout = CodexRollout(codex_home, cwd=PROJECT)
    rollout.turn("Remember that the billing service runs on port 8443.")
    hook_stdin(monkeypatch, codex_stdin(rollout.id, "Stop", agent_id="agent-1", agent_type="explorer"))
    code, out, err = cli("hook", "--adapter", "codex", "--format", "codex", "--type", "idle", "--sync")
    assert (code, out, err) == (0, "", "")
    app = App()
    try:
        assert app.store.models.Memory.select().count() == 0
    finally:
        app.close()


@pytest.mark.parametrize("payload", ["{not json", "[1, 2]", json.dumps({"thread-id": "../../etc/passwd"})])
def test_bad_payload_fails_open(cli, codex_home, payload):
    code, out, err = cli("hook", "--adapter", "codex", "--format", "codex", "--type", "idle", payload)
    assert code == 0 and out == ""
    one_line(err)


def test_a_fact_said_in_a_codex_session_becomes_searchable(cli, codex_home):
    rollout = CodexRollout(codex_home, cwd=PROJECT, agents_md="- Remember that the agents file is not a memory.")
    rollout.turn("Remember that the invoices job runs nightly at 02:30 UTC.", "Noted.",
                 hook_context='<llmem-context project="acme">\n- Remember that injected text is not new.\n'
                              "</llmem-context>")
    rollout.turn("Remember to run make check before every commit.", "Will do.")
    # As Codex runs its Stop hook: a fresh process, the hook's JSON on stdin.
    stdin = json.dumps(codex_stdin(rollout.id, "Stop", turn_id=rollout.turn_id, stop_hook_active=False,
                                   last_assistant_message="Will do."))
    proc = subprocess.run([sys.executable, "-m", "llmem", "hook", "--adapter", "codex", "--format", "codex",
                           "--type", "idle", "--sync"], input=stdin, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    code, out, err = cli("search", "invoices job nightly", "--json")
    assert code == 0, err
    assert "02:30 UTC" in json.loads(out)[0]["content"]
    app = App()
    try:
        everything = list(app.store.models.Memory.select())
        memories = {m.type: m for m in everything if m.source != "episode"}
        # What the user said, and nothing of AGENTS.md or llmem's own block, in the typed
        # memories or in the turns kept as episodes.
        assert sorted(memories) == ["fact", "procedure"]
        episodes = " ".join(m.content for m in everything if m.source == "episode")
        assert "02:30 UTC" in episodes
        assert "agents file" not in episodes and "injected text" not in episodes
        assert memories["fact"].content.startswith("The invoices job runs nightly")
        assert {m.project for m in memories.values()} == {PROJECT}
    finally:
        app.close()

    # Shared by every agent: a Claude Code session starting in the same project is given the
    # procedure learnt in Codex.
    claude_start = {"session_id": str(uuid.uuid4()), "transcript_path": None, "cwd": PROJECT,
                    "hook_event_name": "SessionStart", "source": "startup"}
    proc = subprocess.run([sys.executable, "-m", "llmem", "hook", "--adapter", "claude", "--format", "claude",
                           "--type", "created"], input=json.dumps(claude_start), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "make check" in json.loads(proc.stdout)["hookSpecificOutput"]["additionalContext"]
