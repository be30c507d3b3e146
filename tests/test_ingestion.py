"""Every completed turn is extracted exactly once, however the session ends (issue 9.1, 9.3).

A real watcher (watchdog) over real agent files, with the store as the source of truth: each
emitted moment is recorded as an event row, and the test then runs the recorded events the way
the worker does (events.run_event) and searches the store.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest
from session_writers import append_lines, copilot_events_file, copilot_line, copilot_turn_lines

import llmem.db.connection as connection
import llmem.pipeline.watcher as watcher_module
from llmem.app import App
from llmem.pipeline.events import record_event, run_event
from llmem.pipeline.watcher import SessionWatcher
from llmem.search import SearchOptions

FIXTURE_SQL = Path(__file__).parent / "fixtures" / "opencode" / "opencode_fixture.sql"


@pytest.fixture
def dirs(tmp_path, configure, monkeypatch):
    monkeypatch.setattr(watcher_module, "DIR_CHECK_SECONDS", 0.3)
    monkeypatch.setattr(watcher_module, "RETRY_SECONDS", 0.3)
    opencode = tmp_path / "opencode"
    copilot = tmp_path / "copilot" / "session-state"
    copilot.mkdir(parents=True)
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {opencode}\n"
              f"  copilot:\n    state_dir: {copilot}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return opencode, copilot


class Pipeline:
    """Watcher → event rows → run_event, all in this process, on one store."""

    def __init__(self):
        self.app = App()
        self.recorded: list[tuple[str, str, str, int]] = []
        self.changed = threading.Condition()
        self.watcher: SessionWatcher | None = None

    def emit(self, adapter: str, session_id: str, kind: str) -> None:
        event, _ = record_event(self.app.store, adapter, session_id, kind)
        with self.changed:
            self.recorded.append((adapter, session_id, kind, event.id))
            self.changed.notify_all()

    def start(self, *, idle_debounce_seconds: float | None = None,
              inactivity_seconds: float | None = None) -> Pipeline:
        """`inactivity_seconds`: below the config's one-minute floor, so set on the watcher."""
        self.watcher = SessionWatcher(self.app.config, self.emit, store=self.app.store)
        if idle_debounce_seconds is not None:
            self.watcher.idle_debounce_ms = int(idle_debounce_seconds * 1000)
        if inactivity_seconds is not None:
            self.watcher.inactivity_ms = int(inactivity_seconds * 1000)
        self.looks: list[tuple[float, str, object]] = []  # (when, session, Lifecycle) of each look
        apply = self.watcher._apply

        def looked(adapter, session_id, lifecycle):
            self.looks.append((time.time(), session_id, lifecycle))
            apply(adapter, session_id, lifecycle)

        self.watcher._apply = looked
        self.watcher.start()
        return self

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None

    def close(self) -> None:
        self.stop()
        self.app.close()

    def kinds(self, session_id: str) -> list[str]:
        return [kind for _, sid, kind, _ in self.recorded if sid == session_id]

    def wait_for(self, session_id: str, *kinds: str, timeout: float = 10.0) -> None:
        """Until the session's recorded kinds end with `kinds` (in order)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while self.kinds(session_id)[-len(kinds):] != list(kinds):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{kinds} not emitted for {session_id}; got {self.kinds(session_id)}")
                self.changed.wait(left)

    def run_recorded(self) -> None:
        """Run every recorded event, as a worker would."""
        for _, _, _, event_id in list(self.recorded):
            outcome = run_event(self.app, event_id)
            assert outcome.status in ("done", "skipped"), outcome

    def found(self, query: str) -> list[str]:
        result = self.app.searcher().search(query, SearchOptions(mode="fts", track=False))
        return [hit.memory.content for hit in result.hits if hit.memory.source != "episode"]

    def memory_count(self) -> int:
        # Typed memories: the turns' episodes are counted by the episode tests.
        return self.app.store.db.execute_sql("SELECT COUNT(*) FROM memory WHERE source != 'episode'").fetchone()[0]


@pytest.fixture
def pipeline(dirs):
    running = Pipeline()
    yield running
    running.close()


def test_quick_shutdown_after_the_decision_turn_is_searchable(dirs, pipeline):
    _, copilot = dirs
    pipeline.start(idle_debounce_seconds=5.0)  # the default: the session ends before it is idle
    session_id, events = copilot_events_file(copilot, *copilot_turn_lines("We decided to keep the theme in localStorage"))
    time.sleep(1.0)
    append_lines(events, copilot_line("session.shutdown", {"shutdownType": "routine"}))
    pipeline.wait_for(session_id, "ending")
    assert pipeline.kinds(session_id) == ["created", "ending"]
    pipeline.run_recorded()
    assert pipeline.found("theme localStorage") == ["We decided to keep the theme in localStorage"]


def test_one_shot_session_is_extracted_from_its_ending(dirs, pipeline):
    _, copilot = dirs
    pipeline.start()
    # `copilot -p`: start, one turn and shutdown, written as one burst.
    session_id, _ = copilot_events_file(copilot, *copilot_turn_lines("remember that the build cache lives in /var/cache/acme"),
                                        copilot_line("session.shutdown", {"shutdownType": "routine"}))
    pipeline.wait_for(session_id, "ending")
    assert pipeline.kinds(session_id) == ["created", "ending"]
    pipeline.run_recorded()
    assert pipeline.found("build cache") == ["The build cache lives in /var/cache/acme"]
    pipeline.run_recorded()  # every event once more: nothing new
    assert pipeline.memory_count() == 1


def test_a_dead_lock_pid_ends_the_session_and_extracts_its_turn(dirs, pipeline):
    import subprocess
    import sys

    _, copilot = dirs
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that no longer runs: Copilot crashed
    pipeline.start()
    session_id = str(uuid.uuid4())
    (copilot / session_id).mkdir()
    (copilot / session_id / f"inuse.{child.pid}.lock").write_text(str(child.pid))
    append_lines(copilot / session_id / "events.jsonl", copilot_line("session.start", {"sessionId": session_id}),
                 *copilot_turn_lines("remember that the queue is drained nightly"))
    pipeline.wait_for(session_id, "ending")
    pipeline.run_recorded()
    assert pipeline.found("queue drained") == ["The queue is drained nightly"]


def opencode_db(folder: Path) -> sqlite3.Connection:
    folder.mkdir(exist_ok=True)
    conn = sqlite3.connect(folder / "opencode.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(FIXTURE_SQL.read_text())
    return conn


def opencode_turn(conn: sqlite3.Connection, session: str, number: int, text: str, *,
                  new_session: bool = False) -> None:
    """One user message and its finished reply, in ONE transaction (as OpenCode may commit them)."""
    now = int(time.time() * 1000)
    conn.execute("BEGIN IMMEDIATE")
    if new_session:
        project = conn.execute("SELECT id, worktree FROM project LIMIT 1").fetchone()
        columns = [r[1] for r in conn.execute("PRAGMA table_info(session)")]
        row = dict.fromkeys(columns)
        row.update(id=session, project_id=project[0], slug="quick-otter", directory=project[1],
                   title="quick session", version="1.18.33", time_created=now, time_updated=now)
        for column in ("cost", "tokens_input", "tokens_output", "tokens_reasoning",
                       "tokens_cache_read", "tokens_cache_write"):
            if column in row:
                row[column] = 0
        conn.execute(f"INSERT INTO session ({','.join(row)}) VALUES ({','.join('?' * len(row))})",
                     list(row.values()))
    user_id, reply_id = f"msg_u{number:04d}", f"msg_a{number:04d}"
    user = {"role": "user", "time": {"created": now}, "agent": "build",
            "model": {"providerID": "p", "modelID": "m"}}
    reply = {"role": "assistant", "time": {"created": now, "completed": now}, "parentID": user_id,
             "modelID": "m", "providerID": "p", "mode": "build", "agent": "build",
             "path": {"cwd": "/w", "root": "/w"}, "cost": 0,
             "tokens": {"input": 1, "output": 1, "reasoning": 0, "cache": {"read": 0, "write": 0}},
             "finish": "stop"}
    for message_id, data, part_text in ((user_id, user, text), (reply_id, reply, "Noted.")):
        conn.execute("INSERT INTO message VALUES (?, ?, ?, ?, ?)", (message_id, session, now, now, json.dumps(data)))
        conn.execute("INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)",
                     (f"prt_{message_id[4:]}", message_id, session, now, now,
                      json.dumps({"type": "text", "text": part_text})))
    conn.execute("UPDATE session SET time_updated = ? WHERE id = ?", (now, session))
    conn.execute("COMMIT")


def test_opencode_whole_turn_transactions_are_each_an_idle(dirs, pipeline):
    opencode, _ = dirs
    conn = opencode_db(opencode)
    try:
        pipeline.start()
        session = "ses_0wholeturn0000000000000001"
        opencode_turn(conn, session, 1, "remember that the api listens on port 8080", new_session=True)
        pipeline.wait_for(session, "created", "idle")
        opencode_turn(conn, session, 2, "remember that the worker pool has eight threads")
        pipeline.wait_for(session, "idle", "idle")
        assert pipeline.kinds(session) == ["created", "idle", "idle"]
        pipeline.run_recorded()
        assert pipeline.found("port 8080") and pipeline.found("eight threads")
    finally:
        conn.close()


def test_a_restarted_watcher_announces_nothing_twice_and_catches_up(dirs):
    _, copilot = dirs
    first = Pipeline().start()
    try:
        known, events = copilot_events_file(copilot, *copilot_turn_lines("remember that fact number 0 is zero"))
        first.wait_for(known, "created", "idle")
        first.stop()  # the watcher goes down; the sessions go on
        facts = [f"remember that fact number {n} is {n * 7}" for n in range(1, 4)]
        append_lines(events, *[line for fact in facts for line in copilot_turn_lines(fact)])
        meanwhile, _ = copilot_events_file(copilot, *copilot_turn_lines("remember that fact number 9 is sixty three"))
        first.run_recorded()
    finally:
        first.close()

    second = Pipeline().start()
    try:
        second.wait_for(known, "idle")
        second.wait_for(meanwhile, "created", "idle")
        time.sleep(0.5)
        assert second.kinds(known) == ["idle"]  # known: no second created
        second.run_recorded()
        contents = {m for n in range(10) for m in second.found(f"fact number {n}")}
        assert len(contents) == 5 and second.memory_count() == 5
    finally:
        second.close()


# Another process (a CLI write, a worker) holding the store's write lock until told to let go.
LOCK_HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=5)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


def test_an_event_written_while_the_store_is_locked_arrives_after(dirs, monkeypatch):
    import subprocess
    import sys

    # A short busy timeout, so the store stays locked well past it.
    monkeypatch.setattr(connection, "BUSY_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(connection, "PRAGMAS", tuple(
        (name, 200 if name == "busy_timeout" else value) for name, value in connection.PRAGMAS))
    _, copilot = dirs
    pipeline = Pipeline().start()
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(pipeline.app.config.db_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        session_id, _ = copilot_events_file(copilot, *copilot_turn_lines("remember that the lock test passed"))
        deadline = time.monotonic() + 10
        while pipeline.watcher.errors < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pipeline.watcher.errors >= 2 and pipeline.kinds(session_id) == []
        holder.communicate("\n", timeout=10)  # the lock goes
        pipeline.wait_for(session_id, "created", "idle")
        rows = pipeline.app.store.db.execute_sql(
            "SELECT kind FROM event WHERE session_id = ? ORDER BY id", (session_id,)).fetchall()
        assert [r[0] for r in rows] == ["created", "idle"]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        pipeline.close()


# ---- a session that ended by inactivity and then got one more turn (soak: after_long_idle) ----

DEBOUNCE_S, INACTIVITY_S = 1.0, 2.0


def first_look_after(pipeline: Pipeline, session_id: str, written: float, timeout: float = 5.0):
    """The Lifecycle of the watcher's first look at the session after `written` (epoch s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        looks = [(at, lifecycle) for at, sid, lifecycle in list(pipeline.looks) if sid == session_id and at > written]
        if looks:
            return looks[0]
        time.sleep(0.02)
    raise AssertionError(f"no look at {session_id} after the write")


def assert_looked_inside_the_debounce(pipeline: Pipeline, session_id: str, written: float) -> None:
    """The case under test: the first look after the new turn sees its finished reply, but the
    session is neither busy nor idle yet (the idle debounce has not passed)."""
    from llmem.adapters.lifecycle import Moment

    at, lifecycle = first_look_after(pipeline, session_id, written)
    assert at - written < DEBOUNCE_S, "the first look came too late to test this case"
    assert Moment.BUSY not in lifecycle and Moment.IDLE not in lifecycle and Moment.ENDING not in lifecycle


def wait_for_count(pipeline: Pipeline, session_id: str, kind: str, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while pipeline.kinds(session_id).count(kind) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pipeline.kinds(session_id).count(kind) >= count, pipeline.kinds(session_id)


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_copilot_turn_after_an_inactivity_ending_is_extracted_once(dirs, pipeline):
    _, copilot = dirs
    pipeline.start(idle_debounce_seconds=DEBOUNCE_S, inactivity_seconds=INACTIVITY_S)
    session_id, events = copilot_events_file(copilot, *copilot_turn_lines("remember that the api listens on port 8080"))
    pipeline.wait_for(session_id, "created", "idle", "ending")  # ended by inactivity
    written = time.time()
    append_lines(events, *copilot_turn_lines("remember that the deploy runs at midnight"))  # user + finished reply, one write
    assert_looked_inside_the_debounce(pipeline, session_id, written)
    wait_for_count(pipeline, session_id, "ending", 2)
    time.sleep(0.3)
    assert pipeline.kinds(session_id) == ["created", "idle", "ending", "idle", "ending"]
    pipeline.run_recorded()
    assert pipeline.found("deploy midnight") == ["The deploy runs at midnight"]
    assert pipeline.found("port 8080") == ["The api listens on port 8080"]
    pipeline.run_recorded()  # every event once more: nothing new
    assert pipeline.memory_count() == 2


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_opencode_turn_after_an_inactivity_ending_is_extracted_once(dirs, pipeline):
    opencode, _ = dirs
    conn = opencode_db(opencode)
    try:
        pipeline.start(idle_debounce_seconds=DEBOUNCE_S, inactivity_seconds=INACTIVITY_S)
        session = "ses_0afterlongidle00000000001"
        opencode_turn(conn, session, 1, "remember that the api listens on port 8080", new_session=True)
        pipeline.wait_for(session, "created", "idle", "ending")  # ended by inactivity
        written = time.time()
        opencode_turn(conn, session, 2, "remember that the deploy runs at midnight")  # one transaction
        assert_looked_inside_the_debounce(pipeline, session, written)
        wait_for_count(pipeline, session, "ending", 2)
        time.sleep(0.3)
        assert pipeline.kinds(session) == ["created", "idle", "ending", "idle", "ending"]
        pipeline.run_recorded()
        assert pipeline.found("deploy midnight") == ["The deploy runs at midnight"]
        pipeline.run_recorded()
        assert pipeline.memory_count() == 2
    finally:
        conn.close()


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_a_turn_after_an_inactivity_ending_survives_a_restart_inside_the_debounce(dirs, pipeline):
    """The look that saw the session move on is kept in watch_session: a watcher restarted
    before the idle debounce passed still emits the idle."""
    _, copilot = dirs
    pipeline.start(idle_debounce_seconds=DEBOUNCE_S, inactivity_seconds=INACTIVITY_S)
    session_id, events = copilot_events_file(copilot, *copilot_turn_lines("remember that the api listens on port 8080"))
    pipeline.wait_for(session_id, "created", "idle", "ending")
    written = time.time()
    append_lines(events, *copilot_turn_lines("remember that the deploy runs at midnight"))
    assert_looked_inside_the_debounce(pipeline, session_id, written)
    pipeline.stop()
    ended = pipeline.app.store.db.execute_sql(
        "SELECT ended FROM watch_session WHERE session_id = ?", (session_id,)).fetchone()[0]
    assert ended == 0  # live again, as saved
    pipeline.start(idle_debounce_seconds=DEBOUNCE_S, inactivity_seconds=INACTIVITY_S)
    wait_for_count(pipeline, session_id, "ending", 2)
    time.sleep(0.3)
    assert pipeline.kinds(session_id) == ["created", "idle", "ending", "idle", "ending"]
    pipeline.run_recorded()
    assert pipeline.found("deploy midnight") == ["The deploy runs at midnight"]
    assert pipeline.memory_count() == 2
