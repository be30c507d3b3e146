"""The watcher for Codex rollouts: a thread written into a dated folder made after the watch
began (created, idle, compacting, ending after inactivity), the fixture's old rollouts as a
baseline, and a sessions folder that appears later. Driven through poll(now); the test
marked slow runs on a real watchdog observer and the wall clock."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from session_writers import CodexRollout
from watch_driver import DrivenWatcher, Recorder

import llmem.pipeline.watcher as watcher_module
from llmem.config import load_config
from llmem.pipeline.watcher import SessionWatcher


@pytest.fixture
def codex_home(tmp_path, configure):
    home = tmp_path / "codex"
    configure(f"session:\n  adapter: codex\n  codex:\n    home: {home}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n")
    return home


def test_a_thread_gives_created_idle_compacting_and_ending(codex_home):
    (codex_home / "sessions").mkdir(parents=True)
    recorder = Recorder()
    driven = DrivenWatcher(SessionWatcher(load_config(), recorder))
    try:
        rollout = CodexRollout(codex_home)  # its dated folder does not exist yet
        rollout.begin("fix the flaky test")
        driven.run(60.0)
        assert recorder.kinds(rollout.id) == ["created"]  # busy: no idle, however long
        rollout.tool("pytest -q", "1 failed")
        rollout.finish("Fixed.")
        driven.run(1.0)
        assert recorder.kinds(rollout.id) == ["created", "idle"]
        written = rollout.compact("Summary: the flaky test is fixed.")
        driven.run(1.0)
        assert recorder.kinds(rollout.id) == ["created", "idle", "compacting", "idle"]  # the /compact turn ended too
        inactivity = driven.watcher.inactivity_ms / 1000  # the default: 30 minutes
        driven.run(written + inactivity - 30 - driven.now)
        assert "ending" not in recorder.kinds(rollout.id)
        driven.run(60.0)
        assert recorder.kinds(rollout.id) == ["created", "idle", "compacting", "idle", "ending"]
    finally:
        driven.close()


@pytest.mark.slow  # real inotify and the wall clock: 2-5 s
def test_on_a_real_observer_a_thread_gives_created_idle_compacting_and_ending(codex_home, monkeypatch):
    monkeypatch.setattr(watcher_module, "DIR_CHECK_SECONDS", 0.3)
    (codex_home / "sessions").mkdir(parents=True)
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.inactivity_ms = 2500
    watcher.start()
    try:
        rollout = CodexRollout(codex_home)  # its dated folder does not exist yet
        rollout.begin("fix the flaky test")
        recorder.wait_for(("codex", rollout.id, "created"))
        rollout.tool("pytest -q", "1 failed")
        rollout.finish("Fixed.")
        assert recorder.wait_count(rollout.id, "idle", 1) == 1, recorder.events
        rollout.compact("Summary: the flaky test is fixed.")
        recorder.wait_for(("codex", rollout.id, "compacting"))
        assert recorder.wait_count(rollout.id, "idle", 2) == 2, recorder.events  # the /compact turn ended too
        recorder.wait_for(("codex", rollout.id, "ending"), timeout=10)
        assert recorder.kinds(rollout.id) == ["created", "idle", "compacting", "idle", "ending"]
    finally:
        watcher.stop()


def test_old_rollouts_are_a_baseline_and_a_late_sessions_folder_is_attached(codex_home):
    recorder = Recorder()
    driven = DrivenWatcher(SessionWatcher(load_config(), recorder))  # no Codex home yet
    try:
        assert "not there yet" in driven.watcher.describe()
        shutil.copytree(Path(__file__).parent / "fixtures" / "codex", codex_home)
        driven.run(watcher_module.DIR_CHECK_SECONDS + 1)
        assert driven.watcher.folder("codex") in driven.watcher._watched
        assert recorder.events == []  # the fixture's threads are from 2026-11-29/30: old
        rollout = CodexRollout(codex_home)
        rollout.turn("a new thread")
        driven.run(1.0)
        assert recorder.kinds(rollout.id) == ["created", "idle"]
    finally:
        driven.close()
