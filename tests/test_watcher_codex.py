"""The watcher on real watchdog events for Codex rollouts: a thread written into a dated
folder made after the watch began (created, idle, compacting, ending after inactivity), the
fixture's old rollouts as a baseline, and a sessions folder that appears later."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from session_writers import CodexRollout
from test_watcher import Recorder

import llmem.pipeline.watcher as watcher_module
from llmem.config import load_config
from llmem.pipeline.watcher import SessionWatcher


@pytest.fixture
def codex_home(tmp_path, configure, monkeypatch):
    monkeypatch.setattr(watcher_module, "DIR_CHECK_SECONDS", 0.3)
    home = tmp_path / "codex"
    configure(f"session:\n  adapter: codex\n  codex:\n    home: {home}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n")
    return home


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_a_thread_gives_created_idle_compacting_and_ending(codex_home):
    (codex_home / "sessions").mkdir(parents=True)
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.inactivity_ms = 2500
    watcher.start()
    try:
        rollout = CodexRollout(codex_home)  # its dated folder does not exist yet
        rollout.begin("fix the flaky test")
        recorder.wait_for(("codex", rollout.id, "created"))
        time.sleep(0.6)
        assert recorder.kinds(rollout.id) == ["created"]  # busy: no idle yet
        rollout.tool("pytest -q", "1 failed")
        rollout.finish("Fixed.")
        assert recorder.wait_count(rollout.id, "idle", 1) == 1, recorder.events
        rollout.compact("Summary: the flaky test is fixed.")
        recorder.wait_for(("codex", rollout.id, "compacting"))
        assert recorder.wait_count(rollout.id, "idle", 2) == 2, recorder.events  # the /compact turn ended too
        recorder.wait_for(("codex", rollout.id, "ending"), timeout=10)
        time.sleep(0.3)
        assert recorder.kinds(rollout.id) == ["created", "idle", "compacting", "idle", "ending"]
    finally:
        watcher.stop()


def test_old_rollouts_are_a_baseline_and_a_late_sessions_folder_is_attached(codex_home):
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()  # no Codex home yet
    try:
        assert "not there yet" in watcher.describe()
        shutil.copytree(Path(__file__).parent / "fixtures" / "codex", codex_home)
        deadline = time.monotonic() + 5
        while watcher.codex_dir not in watcher._watched and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert recorder.events == []  # the fixture's threads are from 2026-11-29/30: old
        rollout = CodexRollout(codex_home)
        rollout.turn("a new thread")
        recorder.wait_for(("codex", rollout.id, "idle"))
        assert recorder.kinds(rollout.id) == ["created", "idle"]
    finally:
        watcher.stop()
