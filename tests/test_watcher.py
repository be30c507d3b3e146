"""The watcher on real watchdog events: a Copilot session folder appended to, and an
OpenCode database written by another process (WAL), appearing after the watcher started."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

import llmem.pipeline.watcher as watcher_module
from llmem.config import load_config
from llmem.pipeline.watcher import SessionWatcher

FIXTURE_SQL = Path(__file__).parent / "fixtures" / "opencode" / "opencode_fixture.sql"


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


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_line(kind: str, data: dict) -> str:
    return json.dumps({"type": kind, "data": data, "id": str(uuid.uuid4()), "timestamp": now_iso(),
                       "parentId": None}) + "\n"


def append(path: Path, *lines: str) -> None:
    with path.open("a") as fh:
        fh.writelines(lines)


def turn(text: str) -> list[str]:
    return [event_line("user.message", {"content": text}),
            event_line("assistant.turn_start", {"turnId": "0"}),
            event_line("assistant.message", {"messageId": str(uuid.uuid4()), "content": "done", "toolRequests": []}),
            event_line("assistant.turn_end", {"turnId": "0"})]


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
        append(events, event_line("session.start", {"sessionId": session_id, "context": {"cwd": "/w"}}))
        recorder.wait_for(("copilot", session_id, "created"))
        append(events, *turn("remember that we use tabs"))
        recorder.wait_for(("copilot", session_id, "idle"))
        append(events, event_line("user.message", {"content": "next"}),
               event_line("assistant.turn_start", {"turnId": "1"}))
        time.sleep(0.8)
        assert recorder.kinds(session_id).count("idle") == 1  # busy: no new idle
        append(events, event_line("assistant.message", {"messageId": "m2", "content": "ok", "toolRequests": []}),
               event_line("assistant.turn_end", {"turnId": "1"}))
        deadline = time.monotonic() + 8
        while recorder.kinds(session_id).count("idle") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert recorder.kinds(session_id).count("idle") == 2
        append(events, event_line("session.shutdown", {"shutdownType": "routine"}))
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
        append(events, event_line("session.start", {"sessionId": session_id}), *turn("first"))
        recorder.wait_for(("copilot", session_id, "idle"))
        append(events, *turn("second"))  # prompt to reply in one write: never busy to a look
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
        append(events, event_line("session.start", {"sessionId": session_id}), *turn("first"),
               event_line("session.shutdown", {"shutdownType": "routine"}))
        recorder.wait_for(("copilot", session_id, "ending"))
        # `copilot --resume`, one more turn and quit, all before the watcher looks again.
        append(events, event_line("session.resume", {}), *turn("second"),
               event_line("session.shutdown", {"shutdownType": "routine"}))
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
        append(copilot / session_id / "events.jsonl",
               event_line("session.start", {"sessionId": session_id}), *turn("hello"))
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


OPENCODE_WRITER = r"""
import json, sqlite3, sys, time
db, session = sys.argv[1], sys.argv[2]
conn = sqlite3.connect(db, isolation_level=None)
conn.execute("PRAGMA journal_mode=WAL")
now = int(time.time() * 1000)
project = conn.execute("SELECT id, worktree FROM project LIMIT 1").fetchone()
columns = [r[1] for r in conn.execute("PRAGMA table_info(session)")]
row = {c: None for c in columns}
row.update(id=session, project_id=project[0], slug="new-otter", directory=project[1], title="new session",
           version="1.18.33", time_created=now, time_updated=now)
for c in ("cost", "tokens_input", "tokens_output", "tokens_reasoning", "tokens_cache_read", "tokens_cache_write"):
    if c in row: row[c] = 0
conn.execute(f"INSERT INTO session ({','.join(row)}) VALUES ({','.join('?' * len(row))})", list(row.values()))
user = {"role": "user", "time": {"created": now}, "agent": "build", "model": {"providerID": "p", "modelID": "m"}}
conn.execute("INSERT INTO message VALUES (?, ?, ?, ?, ?)", ("msg_u1", session, now, now, json.dumps(user)))
conn.execute("INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)", ("prt_u1", "msg_u1", session, now, now,
             json.dumps({"type": "text", "text": "remember that the api uses port 8080"})))
time.sleep(0.2)
done = int(time.time() * 1000)
assistant = {"role": "assistant", "time": {"created": done, "completed": done}, "parentID": "msg_u1",
             "modelID": "m", "providerID": "p", "mode": "build", "agent": "build",
             "path": {"cwd": project[1], "root": project[1]}, "cost": 0,
             "tokens": {"input": 1, "output": 1, "reasoning": 0, "cache": {"read": 0, "write": 0}},
             "finish": "stop"}
conn.execute("INSERT INTO message VALUES (?, ?, ?, ?, ?)", ("msg_a1", session, done, done, json.dumps(assistant)))
conn.execute("INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)", ("prt_a1", "msg_a1", session, done, done,
             json.dumps({"type": "text", "text": "noted"})))
conn.close()
"""


def test_opencode_db_appearing_later_and_written_by_another_process(agent_dirs, tmp_path):
    opencode, _ = agent_dirs
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    watcher.start()  # the OpenCode folder does not exist yet
    try:
        opencode.mkdir()
        conn = __import__("sqlite3").connect(opencode / "opencode.db")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(FIXTURE_SQL.read_text())
        conn.close()
        time.sleep(1.0)  # picked up as a baseline: the fixture sessions are old
        assert recorder.events == []
        session = "ses_0newsession00000000000001"
        subprocess.run([sys.executable, "-c", OPENCODE_WRITER, str(opencode / "opencode.db"), session],
                       check=True, timeout=30)
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
        append(copilot / session_id / "events.jsonl",
               event_line("session.start", {"sessionId": session_id}), *turn("hello"))
        recorder.wait_for(("copilot", session_id, "idle"))
    finally:
        odd.rollback()
        odd.close()
        watcher.stop()
