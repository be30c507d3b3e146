"""A moment told twice is queued once (issue 21, defect 8): the agent's hook (Claude Code's
Stop and SessionEnd, Copilot's agentStop and sessionEnd, Codex's Stop, notify and SessionEnd)
and the watcher reading the transcript both see a turn end and a session end. Whichever
comes second finds the first one's event, recorded after the turn began, and adds none.

The hooks run through the real CLI with a worker seen alive (so they queue); each queued
event is run as the worker would before the watcher looks (a pending one would be reused
anyway); the watcher is driven through poll(now) on the same store.
"""

from __future__ import annotations

import io
import json
import sys

import pytest
from session_writers import (
    ClaudeSession,
    CodexRollout,
    append_lines,
    copilot_events_file,
    copilot_line,
    copilot_turn_lines,
)
from test_ingestion import Pipeline

from llmem.pipeline.events import run_event, worker_heartbeat

PROJECT = "/work/acme"


@pytest.fixture
def agents(tmp_path, configure):
    folders = {"claude": tmp_path / "claude", "copilot": tmp_path / "copilot" / "session-state",
               "codex": tmp_path / "codex"}
    (folders["claude"] / "projects").mkdir(parents=True)
    folders["copilot"].mkdir(parents=True)
    (folders["codex"] / "sessions").mkdir(parents=True)
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {tmp_path / 'no-opencode'}\n"
              f"  copilot:\n    state_dir: {folders['copilot']}\n  claude:\n    config_dir: {folders['claude']}\n"
              f"  codex:\n    home: {folders['codex']}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return folders


@pytest.fixture
def pipeline(agents):
    running = Pipeline().start()
    worker_heartbeat(running.app.store)  # hooks queue their events
    yield running
    running.close()


def hook(cli, monkeypatch, pipeline, *args: str, stdin: dict | None = None) -> None:
    """One `llmem hook` as the agent runs it; its queued event is then run, as the worker would."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(stdin) if stdin is not None else ""))
    code, _, err = cli("hook", *args)
    assert code == 0 and "queued as event" in err, err
    for event_id in pending(pipeline):
        assert run_event(pipeline.app, event_id).status == "done"


def pending(pipeline) -> list[int]:
    Event = pipeline.app.store.models.Event
    return [event.id for event in Event.select().where(Event.status == "pending").order_by(Event.id)]


def recorded(pipeline, session_id: str) -> list[str]:
    Event = pipeline.app.store.models.Event
    return [event.kind for event in Event.select().where(Event.session_id == session_id).order_by(Event.id)]


def test_a_claude_turn_and_exit_told_by_hook_and_watcher_are_one_idle_and_one_ending(agents, pipeline, cli, monkeypatch):
    session = ClaudeSession(agents["claude"], cwd=PROJECT)
    session.register()
    session.turn("remember that the release train leaves on Thursdays", "Noted.")
    claude = ("--adapter", "claude", "--format", "claude")
    payload = {"session_id": session.id, "transcript_path": str(session.path), "cwd": PROJECT}
    hook(cli, monkeypatch, pipeline, *claude, "--type", "idle", stdin=payload | {"hook_event_name": "Stop"})
    pipeline.run(5.0)
    assert recorded(pipeline, session.id) == ["idle", "created"]  # the watcher's idle: the hook's
    hook(cli, monkeypatch, pipeline, *claude, "--type", "ending", stdin=payload | {"hook_event_name": "SessionEnd"})
    session.exit()
    pipeline.run(5.0)
    assert recorded(pipeline, session.id) == ["idle", "created", "ending"]
    assert pipeline.kinds(session.id) == ["created"]  # all the watcher emitted itself
    # The next turn is a new one: its idle is the watcher's again.
    session.register()
    session.turn("remember that the train is skipped in August", "Noted.")
    pipeline.run(5.0)
    assert recorded(pipeline, session.id) == ["idle", "created", "ending", "idle"]


def test_a_copilot_session_ended_by_its_hook_gets_no_second_ending_from_the_watcher(agents, pipeline, cli, monkeypatch):
    session_id, events = copilot_events_file(agents["copilot"], *copilot_turn_lines("remember that staging is frozen"))
    copilot = ("--adapter", "copilot", "--session-id", session_id)
    hook(cli, monkeypatch, pipeline, *copilot, "--type", "idle")  # agentStop
    pipeline.run(5.0)
    assert recorded(pipeline, session_id) == ["idle", "created"]
    hook(cli, monkeypatch, pipeline, *copilot, "--type", "ending")  # sessionEnd
    append_lines(events, copilot_line("session.shutdown", {"shutdownType": "routine"}))
    pipeline.run(5.0)
    assert recorded(pipeline, session_id) == ["idle", "created", "ending"]


def test_a_codex_turn_told_by_stop_notify_and_the_watcher_is_one_idle(agents, pipeline, cli, monkeypatch):
    rollout = CodexRollout(agents["codex"], cwd=PROJECT)
    rollout.turn("Remember that the billing service runs on port 8443.", "Noted.")
    stop = {"session_id": rollout.id, "turn_id": rollout.turn_id, "cwd": PROJECT, "hook_event_name": "Stop",
            "stop_hook_active": False, "last_assistant_message": "Noted."}
    hook(cli, monkeypatch, pipeline, "--adapter", "codex", "--format", "codex", "--type", "idle", stdin=stop)
    notify = {"type": "agent-turn-complete", "thread-id": rollout.id, "turn-id": rollout.turn_id, "cwd": PROJECT,
              "client": "codex-tui", "input-messages": ["Remember that …"], "last-assistant-message": "Noted."}
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, _, err = cli("hook", "--adapter", "codex", "--type", "idle", json.dumps(notify))
    assert code == 0, err
    assert recorded(pipeline, rollout.id) == ["idle"]  # notify found the Stop hook's idle
    pipeline.run(5.0)
    assert recorded(pipeline, rollout.id) == ["idle", "created"]
    # The next turn (a new turn id) is a new idle, told once again.
    rollout.turn("Remember that invoices go out on the first.", "Noted.")
    hook(cli, monkeypatch, pipeline, "--adapter", "codex", "--format", "codex", "--type", "idle",
         stdin=stop | {"turn_id": rollout.turn_id})
    code, _, err = cli("hook", "--adapter", "codex", "--type", "idle", json.dumps(notify | {"turn-id": rollout.turn_id}))
    assert code == 0, err
    pipeline.run(5.0)
    assert recorded(pipeline, rollout.id) == ["idle", "created", "idle"]
    end = {"session_id": rollout.id, "cwd": PROJECT, "hook_event_name": "SessionEnd", "reason": "exit"}
    hook(cli, monkeypatch, pipeline, "--adapter", "codex", "--format", "codex", "--type", "ending", stdin=end)
    pipeline.run(pipeline.watcher.inactivity_ms / 1000 + 60)  # the watcher's inactivity ending comes due
    assert recorded(pipeline, rollout.id) == ["idle", "created", "idle", "ending"]
