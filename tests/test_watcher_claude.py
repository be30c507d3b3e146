"""The watcher for Claude Code: transcripts appended under projects/, subagent files beside
them, the live-process registry; each moment emitted once. Driven through poll(now); the
tests marked slow run on a real watchdog observer and the wall clock."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from session_writers import ClaudeSession
from watch_driver import DrivenWatcher, Recorder

import llmem.pipeline.watcher as watcher_module
from llmem.config import load_config
from llmem.pipeline.watcher import SessionWatcher

FIXTURE = Path(__file__).parent / "fixtures" / "claude"


@pytest.fixture
def claude_dir(tmp_path, configure):
    claude = tmp_path / "claude"
    (claude / "projects").mkdir(parents=True)
    configure(f"session:\n  adapter: auto\n  opencode:\n    data_dir: {tmp_path / 'opencode'}\n"
              f"  copilot:\n    state_dir: {tmp_path / 'copilot'}\n  claude:\n    config_dir: {claude}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return claude


@pytest.fixture
def driven(claude_dir):
    recorder = Recorder()
    drive = DrivenWatcher(SessionWatcher(load_config(), recorder))
    drive.emitted = recorder
    yield drive
    drive.close()


def test_a_claude_session_gives_created_idle_compacting_and_ending(claude_dir, driven):
    emitted = driven.emitted
    assert f"claude {claude_dir / 'projects'} (watching)" in driven.watcher.describe()
    session = ClaudeSession(claude_dir, cwd="/work/acme")
    session.register()
    session.prompt("Why do the order pages repeat?")
    driven.run(30.0)
    assert emitted.kinds(session.id) == ["created"]  # busy: the model is working
    session.reply("Sorting by created_at alone is not stable.")
    driven.run(1.0)
    assert emitted.kinds(session.id) == ["created", "idle"]
    session.subagent("Which tests page through /orders?", "Two tests; none has tied timestamps.")
    driven.run(1.0)
    # The launch reply and the notification turn, written together: one look, one new idle.
    assert emitted.kinds(session.id) == ["created", "idle", "idle"]
    session.compaction("We found the unstable sort.")
    driven.run(1.0)
    assert emitted.kinds(session.id)[3:] == ["compacting"]
    session.write({"type": "cost-state", "sessionId": session.id, "totalCostUSD": 0.2})
    driven.run(60.0)
    assert "ending" not in emitted.kinds(session.id)  # its process still runs
    session.unregister()  # Claude Code exited: the registry entry goes
    driven.run(1.0)
    assert emitted.kinds(session.id) == ["created", "idle", "idle", "compacting", "ending"]
    # The subagent's transcript is no session of its own.
    assert {session_id for _, session_id, _ in emitted.events} == {session.id}
    assert list((session.folder / session.id / "subagents").glob("agent-*.jsonl"))


@pytest.mark.slow  # real inotify and the wall clock: 2-5 s
def test_on_a_real_observer_a_claude_session_gives_created_idle_and_ending(claude_dir, monkeypatch):
    monkeypatch.setattr(watcher_module, "DIR_CHECK_SECONDS", 0.3)
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()
    try:
        session = ClaudeSession(claude_dir, cwd="/work/acme")
        session.register()
        session.prompt("Why do the order pages repeat?")
        recorder.wait_for(("claude", session.id, "created"))
        session.reply("Sorting by created_at alone is not stable.")
        recorder.wait_for(("claude", session.id, "idle"))
        session.exit()  # the cost-state row, and the registry entry goes
        recorder.wait_for(("claude", session.id, "ending"))
        assert recorder.kinds(session.id) == ["created", "idle", "ending"]
    finally:
        watcher.stop()


def test_sessions_already_there_are_a_baseline_and_subagent_writes_are_ignored(claude_dir):
    shutil.copytree(FIXTURE / "projects", claude_dir / "projects", dirs_exist_ok=True)
    recorder = Recorder()
    driven = DrivenWatcher(SessionWatcher(load_config(), recorder))
    try:
        driven.run(1.0)
        subagents = next((claude_dir / "projects").glob("*/*/subagents"))
        (subagents / "agent-a0000000000000001.jsonl").write_text('{"type":"user","isSidechain":true}\n')
        driven.run(3600.0)
        assert recorder.events == []
    finally:
        driven.close()


@pytest.mark.slow  # the real observer's fallback, a polling observer on the wall clock: 5-15 s
def test_a_folder_appearing_when_inotify_is_exhausted_is_polled(claude_dir, monkeypatch):
    """Each inotify watch takes an instance, capped per user (128 by default) and shared with
    every other watcher of the machine: a late folder that cannot get one is polled, where
    the error used to end the watcher's loop (nothing seen again)."""
    monkeypatch.setattr(watcher_module, "DIR_CHECK_SECONDS", 0.3)
    shutil.rmtree(claude_dir / "projects")
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()
    try:
        def exhausted(*args, **kwargs):
            raise OSError(errno.EMFILE, "inotify instance limit reached")

        watcher._observer.schedule = exhausted
        session = ClaudeSession(claude_dir)
        session.turn("remember that we deploy on Fridays", "Noted.")
        # A missing folder is looked for every DIR_CHECK_SECONDS, then polled (1 s) and
        # debounced: under a loaded CI machine that is more than 10 s.
        recorder.wait_for(("claude", session.id, "idle"), timeout=30)
        session.turn("remember that we also deploy on Tuesdays", "Noted.")  # seen by polling
        assert recorder.wait_count(session.id, "idle", 2, timeout=20) >= 2, recorder.events
        assert recorder.kinds(session.id) == ["created", "idle", "idle"]
    finally:
        watcher.stop()


def test_the_projects_folder_appearing_later_is_watched(claude_dir):
    shutil.rmtree(claude_dir / "projects")
    recorder = Recorder()
    driven = DrivenWatcher(SessionWatcher(load_config(), recorder))
    try:
        assert "not there yet" in driven.watcher.describe()
        session = ClaudeSession(claude_dir)
        session.turn("remember that we deploy on Fridays", "Noted.")
        driven.run(1.0)
        assert recorder.events == []  # the folder is looked for every DIR_CHECK_SECONDS
        driven.run(watcher_module.DIR_CHECK_SECONDS + 1)
        assert "(watching)" in driven.watcher.describe()
        assert recorder.kinds(session.id) == ["created", "idle"]
    finally:
        driven.close()
