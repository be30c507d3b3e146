"""The watcher on real watchdog events: a Copilot session folder appended to, and an
OpenCode database written by another process (WAL), appearing after the watcher started."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from session_writers import append_lines, copilot_line, copilot_turn_lines, recorded_opencode_store

import llmem.pipeline.watcher as watcher_module
from llmem.config import load_config
from llmem.pipeline.watcher import SessionWatcher


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, str, str]] = []
        self.changed = threading.Condition()

    def __call__(self, adapter, session_id, kind):
        with self.changed:
            self.events.append((adapter, session_id, kind))
            self.changed.notify_all()

    def wait_for(self, wanted: tuple, timeout: float = 8.0) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while wanted not in self.events:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{wanted} not emitted; got {self.events}")
                self.changed.wait(left)

    def kinds(self, session_id):
        return [k for _, s, k in self.events if s == session_id]

    def wait_count(self, session_id: str, kind: str, count: int, timeout: float = 8.0) -> int:
        """Wait until `kind` was emitted `count` times for the session (or the time is up);
        how many times it was emitted."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while self.kinds(session_id).count(kind) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.changed.wait(left)
            return self.kinds(session_id).count(kind)


@pytest.fixture
def agent_dirs(tmp_path, configure, monkeypatch):
    monkeypatch.setattr(watcher_module, "DIR_CHECK_SECONDS", 0.3)
    opencode = tmp_path / "opencode"
    copilot = tmp_path / "copilot" / "session-state"
    copilot.mkdir(parents=True)
    configure(f"session:\n  adapter: auto\n  opencode:\n    data_dir: {opencode}\n"
              f"  copilot:\n    state_dir: {copilot}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return opencode, copilot


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_copilot_session_appended_gives_created_idle_and_ending(agent_dirs):
    _, copilot = agent_dirs
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()
    try:
        session_id = str(uuid.uuid4())
        folder = copilot / session_id
        folder.mkdir()
        events = folder / "events.jsonl"
        append_lines(events, copilot_line("session.start", {"sessionId": session_id, "context": {"cwd": "/w"}}))
        recorder.wait_for(("copilot", session_id, "created"))
        append_lines(events, *copilot_turn_lines("remember that we use tabs"))
        recorder.wait_for(("copilot", session_id, "idle"))
        append_lines(events, copilot_line("user.message", {"content": "next"}),
                     copilot_line("assistant.turn_start", {"turnId": "1"}))
        time.sleep(0.8)
        assert recorder.kinds(session_id).count("idle") == 1  # busy: no new idle
        append_lines(events, copilot_line("assistant.message", {"messageId": "m2", "content": "ok", "toolRequests": []}),
                     copilot_line("assistant.turn_end", {"turnId": "1"}))
        deadline = time.monotonic() + 8
        while recorder.kinds(session_id).count("idle") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert recorder.kinds(session_id).count("idle") == 2
        append_lines(events, copilot_line("session.shutdown", {"shutdownType": "routine"}))
        recorder.wait_for(("copilot", session_id, "ending"))
        time.sleep(0.5)
        assert recorder.kinds(session_id) == ["created", "idle", "idle", "ending"]
    finally:
        watcher.stop()


def test_a_turn_never_seen_busy_is_a_new_idle(agent_dirs):
    _, copilot = agent_dirs
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()
    try:
        session_id = str(uuid.uuid4())
        (copilot / session_id).mkdir()
        events = copilot / session_id / "events.jsonl"
        append_lines(events, copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines("first"))
        recorder.wait_for(("copilot", session_id, "idle"))
        append_lines(events, *copilot_turn_lines("second"))  # prompt to reply in one write: never busy to a look
        deadline = time.monotonic() + 8
        while recorder.kinds(session_id).count("idle") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert recorder.kinds(session_id) == ["created", "idle", "idle"]
    finally:
        watcher.stop()


def test_a_session_reopened_and_ended_again_between_two_looks_ends_again(agent_dirs):
    _, copilot = agent_dirs
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()
    try:
        session_id = str(uuid.uuid4())
        (copilot / session_id).mkdir()
        events = copilot / session_id / "events.jsonl"
        append_lines(events, copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines("first"),
                     copilot_line("session.shutdown", {"shutdownType": "routine"}))
        recorder.wait_for(("copilot", session_id, "ending"))
        # `copilot --resume`, one more turn and quit, all before the watcher looks again.
        append_lines(events, copilot_line("session.resume", {}), *copilot_turn_lines("second"),
                     copilot_line("session.shutdown", {"shutdownType": "routine"}))
        deadline = time.monotonic() + 8
        while recorder.kinds(session_id).count("ending") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert recorder.kinds(session_id) == ["created", "ending", "ending"]
    finally:
        watcher.stop()


class FlakyEmit(Recorder):
    """An emit whose first `failures` calls raise, as a store locked past its timeout does."""

    def __init__(self, failures: int):
        super().__init__()
        self.failures = failures
        self.calls = 0

    def __call__(self, adapter, session_id, kind):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("database is locked")
        super().__call__(adapter, session_id, kind)


def test_a_failed_emit_keeps_the_state_and_is_retried(agent_dirs, monkeypatch):
    monkeypatch.setattr(watcher_module, "RETRY_SECONDS", 0.2)
    _, copilot = agent_dirs
    flaky = FlakyEmit(failures=3)
    watcher = SessionWatcher(load_config(), flaky)
    watcher.start()
    try:
        session_id = str(uuid.uuid4())
        (copilot / session_id).mkdir()
        append_lines(copilot / session_id / "events.jsonl",
                     copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines("hello"))
        flaky.wait_for(("copilot", session_id, "idle"))
        assert watcher.errors == 3
        assert flaky.kinds(session_id) == ["created", "idle"]  # each once, in order
    finally:
        watcher.stop()


def test_existing_sessions_are_a_baseline_not_new_events(agent_dirs):
    _, copilot = agent_dirs
    source = Path(__file__).parent / "fixtures" / "copilot" / "session-state"
    for child in source.iterdir():
        shutil.copytree(child, copilot / child.name)
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()
    time.sleep(1.0)
    watcher.stop()
    assert recorder.events == []


# OpenCode in its own process: session_writers.OpenCodeStore on the store it finds there.
OPENCODE_WRITER = r"""
import sys
sys.path.insert(0, sys.argv[2])
from session_writers import OpenCodeStore
store = OpenCodeStore(sys.argv[1])
session = store.session()
print(session.id, flush=True)
session.turn("remember that the api uses port 8080", "noted")
store.close()
"""


def test_opencode_db_appearing_later_and_written_by_another_process(agent_dirs, tmp_path):
    opencode, _ = agent_dirs
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()  # the OpenCode folder does not exist yet
    try:
        recorded_opencode_store(opencode, journal_mode="WAL")
        time.sleep(1.0)  # picked up as a baseline: the fixture sessions are old
        assert recorder.events == []
        written = subprocess.run([sys.executable, "-c", OPENCODE_WRITER, str(opencode), str(Path(__file__).parent)],
                                 check=True, timeout=30, capture_output=True, text=True)
        session = written.stdout.strip()
        recorder.wait_for(("opencode", session, "created"))
        recorder.wait_for(("opencode", session, "idle"))
        assert (opencode / "opencode.db").exists()
    finally:
        watcher.stop()


def test_unknown_schema_and_locked_db_are_logged_and_the_watcher_goes_on(agent_dirs, caplog):
    import sqlite3

    opencode, copilot = agent_dirs
    opencode.mkdir()
    odd = sqlite3.connect(opencode / "opencode.db")
    odd.execute("PRAGMA journal_mode=WAL")
    odd.execute("CREATE TABLE something_else (x)")
    odd.commit()
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    caplog.set_level("WARNING", logger="llmem.pipeline.watcher")
    watcher.start()
    try:
        odd.execute("INSERT INTO something_else VALUES (1)")  # a commit the watcher must read
        odd.commit()
        odd.execute("BEGIN EXCLUSIVE")  # and now nobody may read it at all
        deadline = time.monotonic() + 8
        while not watcher.errors and time.monotonic() < deadline:
            time.sleep(0.1)
        assert watcher.errors >= 1
        assert any("could not read" in r.getMessage() for r in caplog.records)
        session_id = str(uuid.uuid4())  # the other agent is still watched
        (copilot / session_id).mkdir()
        append_lines(copilot / session_id / "events.jsonl",
                     copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines("hello"))
        recorder.wait_for(("copilot", session_id, "idle"))
    finally:
        odd.rollback()
        odd.close()
        watcher.stop()
