"""The watcher on Copilot session folders appended to and an OpenCode database written by
another process (WAL), appearing after the watcher started. Driven through poll(now) (no
sleeps); the tests marked slow run the same on a real watchdog observer and the wall clock."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from session_writers import append_lines, copilot_line, copilot_turn_lines, recorded_opencode_store
from watch_driver import DrivenWatcher, Recorder

import llmem.pipeline.watcher as watcher_module
from llmem.config import load_config
from llmem.pipeline.watcher import SessionWatcher


@pytest.fixture
def agent_dirs(tmp_path, configure):
    opencode = tmp_path / "opencode"
    copilot = tmp_path / "copilot" / "session-state"
    copilot.mkdir(parents=True)
    configure(f"session:\n  adapter: auto\n  opencode:\n    data_dir: {opencode}\n"
              f"  copilot:\n    state_dir: {copilot}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return opencode, copilot


@pytest.fixture
def quick_attach(monkeypatch):
    """A real observer looks for a late folder every 0.3 s, not 5 s."""
    monkeypatch.setattr(watcher_module, "DIR_CHECK_SECONDS", 0.3)


@pytest.mark.slow  # real inotify and the wall clock: 2-5 s
def test_copilot_session_appended_gives_created_idle_and_ending(agent_dirs, quick_attach):
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


@pytest.fixture
def driven(agent_dirs):
    """A watcher on the test's folders, driven through poll(now); its Recorder is .emitted."""
    recorder = Recorder()
    drive = DrivenWatcher(SessionWatcher(load_config(), recorder))
    drive.emitted = recorder
    yield drive
    drive.close()


def test_a_copilot_session_gives_created_idle_and_ending_each_once(agent_dirs, driven):
    _, copilot = agent_dirs
    emitted = driven.emitted
    session_id = str(uuid.uuid4())
    folder = copilot / session_id
    folder.mkdir()
    events = folder / "events.jsonl"
    append_lines(events, copilot_line("session.start", {"sessionId": session_id, "context": {"cwd": "/w"}}))
    driven.run(1.0)
    assert emitted.kinds(session_id) == ["created"]
    append_lines(events, *copilot_turn_lines("remember that we use tabs"))
    driven.run(1.0)
    assert emitted.kinds(session_id) == ["created", "idle"]
    append_lines(events, copilot_line("user.message", {"content": "next"}),
                 copilot_line("assistant.turn_start", {"turnId": "1"}))
    driven.run(60.0)
    assert emitted.kinds(session_id) == ["created", "idle"]  # busy: no new idle, however long
    append_lines(events, copilot_line("assistant.message", {"messageId": "m2", "content": "ok", "toolRequests": []}),
                 copilot_line("assistant.turn_end", {"turnId": "1"}))
    driven.run(1.0)
    assert emitted.kinds(session_id) == ["created", "idle", "idle"]
    append_lines(events, copilot_line("session.shutdown", {"shutdownType": "routine"}))
    driven.run(60.0)
    assert emitted.kinds(session_id) == ["created", "idle", "idle", "ending"]


def test_an_idle_waits_for_the_debounce_and_a_quiet_session_ends_after_the_inactivity(agent_dirs, driven):
    _, copilot = agent_dirs
    emitted = driven.emitted
    driven.watcher.idle_debounce_ms = 5_000
    session_id = str(uuid.uuid4())
    (copilot / session_id).mkdir()
    append_lines(copilot / session_id / "events.jsonl", copilot_line("session.start", {"sessionId": session_id}),
                 *copilot_turn_lines("first"))
    written = time.time()
    driven.run(4.0)
    assert emitted.kinds(session_id) == ["created"]  # the reply is done, the debounce is not
    driven.run(written + 5.5 - driven.now)
    assert emitted.kinds(session_id) == ["created", "idle"]
    inactivity = driven.watcher.inactivity_ms / 1000  # the default: 30 minutes
    driven.run(written + inactivity - 10 - driven.now)
    assert emitted.kinds(session_id) == ["created", "idle"]
    driven.run(20.0)
    assert emitted.kinds(session_id) == ["created", "idle", "ending"]
    assert driven.steps < 1000  # from one due moment to the next, not tick by tick


def test_a_turn_never_seen_busy_is_a_new_idle(agent_dirs, driven):
    _, copilot = agent_dirs
    session_id = str(uuid.uuid4())
    (copilot / session_id).mkdir()
    events = copilot / session_id / "events.jsonl"
    append_lines(events, copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines("first"))
    driven.run(1.0)
    assert driven.emitted.kinds(session_id) == ["created", "idle"]
    append_lines(events, *copilot_turn_lines("second"))  # prompt to reply in one write: never busy to a look
    driven.run(1.0)
    assert driven.emitted.kinds(session_id) == ["created", "idle", "idle"]


def test_a_session_reopened_and_ended_again_between_two_looks_ends_again(agent_dirs, driven):
    _, copilot = agent_dirs
    session_id = str(uuid.uuid4())
    (copilot / session_id).mkdir()
    events = copilot / session_id / "events.jsonl"
    append_lines(events, copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines("first"),
                 copilot_line("session.shutdown", {"shutdownType": "routine"}))
    driven.run(1.0)
    assert driven.emitted.kinds(session_id) == ["created", "ending"]
    # `copilot --resume`, one more turn and quit, all before the watcher looks again.
    append_lines(events, copilot_line("session.resume", {}), *copilot_turn_lines("second"),
                 copilot_line("session.shutdown", {"shutdownType": "routine"}))
    driven.run(1.0)
    assert driven.emitted.kinds(session_id) == ["created", "ending", "ending"]


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


def test_a_failed_emit_keeps_the_state_and_is_retried(agent_dirs):
    _, copilot = agent_dirs
    flaky = FlakyEmit(failures=3)
    watcher = SessionWatcher(load_config(), flaky)
    driven = DrivenWatcher(watcher)
    session_id = str(uuid.uuid4())
    (copilot / session_id).mkdir()
    append_lines(copilot / session_id / "events.jsonl",
                 copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines("hello"))
    driven.run(watcher_module.RETRY_SECONDS * 2)
    assert watcher.errors == 2 and flaky.kinds(session_id) == []  # one look and one retry so far
    driven.run(watcher_module.RETRY_SECONDS * 3)
    assert watcher.errors == 3
    assert flaky.kinds(session_id) == ["created", "idle"]  # each once, in order
    driven.close()


def test_existing_sessions_are_a_baseline_not_new_events(agent_dirs):
    _, copilot = agent_dirs
    source = Path(__file__).parent / "fixtures" / "copilot" / "session-state"
    for child in source.iterdir():
        shutil.copytree(child, copilot / child.name)
    recorder = Recorder()
    again = DrivenWatcher(SessionWatcher(load_config(), recorder))
    again.run(3600.0)  # an hour: the fixture sessions are old, nothing comes due
    again.close()
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


def write_opencode_turn_in_another_process(opencode: Path) -> str:
    written = subprocess.run([sys.executable, "-c", OPENCODE_WRITER, str(opencode), str(Path(__file__).parent)],
                             check=True, timeout=30, capture_output=True, text=True)
    return written.stdout.strip()


def test_opencode_db_appearing_later_and_written_by_another_process(agent_dirs, driven):
    opencode, _ = agent_dirs
    assert "not there yet" in driven.watcher.describe()  # the OpenCode folder does not exist yet
    recorded_opencode_store(opencode, journal_mode="WAL")
    driven.run(watcher_module.DIR_CHECK_SECONDS + 1)
    assert f"opencode {opencode} (watching)" in driven.watcher.describe()
    assert driven.emitted.events == []  # picked up as a baseline: the fixture sessions are old
    session = write_opencode_turn_in_another_process(opencode)
    driven.run(3.0)
    assert driven.emitted.kinds(session) == ["created", "idle"]
    assert (opencode / "opencode.db").exists()


@pytest.mark.slow  # real inotify, the wall clock and another process: 2-5 s
def test_on_a_real_observer_a_late_opencode_db_written_by_another_process_is_seen(agent_dirs, quick_attach):
    opencode, _ = agent_dirs
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()  # the OpenCode folder does not exist yet
    try:
        recorded_opencode_store(opencode, journal_mode="WAL")
        recorder.wait_until(lambda: opencode in watcher._watched, 8.0, "the OpenCode folder not attached")
        session = write_opencode_turn_in_another_process(opencode)
        recorder.wait_for(("opencode", session, "created"))
        recorder.wait_for(("opencode", session, "idle"))
        assert [event for event in recorder.events if event[1] != session] == []  # the fixture's: a baseline
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
    driven = DrivenWatcher(watcher)
    try:
        odd.execute("INSERT INTO something_else VALUES (1)")  # a commit the watcher must read
        odd.commit()
        odd.execute("BEGIN EXCLUSIVE")  # and now nobody may read it at all
        driven.run(1.0)
        assert watcher.errors >= 1
        assert any("could not read" in r.getMessage() for r in caplog.records)
        session_id = str(uuid.uuid4())  # the other agent is still watched
        (copilot / session_id).mkdir()
        append_lines(copilot / session_id / "events.jsonl",
                     copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines("hello"))
        driven.run(1.0)
        assert recorder.kinds(session_id) == ["created", "idle"]
    finally:
        odd.rollback()
        odd.close()
        driven.close()
