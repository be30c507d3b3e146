"""Every completed turn is extracted exactly once, however the session ends (issue 9.1, 9.3).

A real watcher over real agent files, driven through poll(now) (no sleeps), with the store as
the source of truth: each emitted moment is recorded as an event row, and the test then runs
the recorded events the way the worker does (events.run_event) and searches the store.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
from session_writers import append_lines, copilot_events_file, copilot_line, copilot_turn_lines
from watch_driver import DrivenWatcher

import llmem.db.connection as connection
import llmem.pipeline.watcher as watcher_module
from llmem.app import App
from llmem.pipeline.events import record_event, run_event
from llmem.pipeline.watcher import SessionWatcher
from llmem.search import SearchOptions

FIXTURE_SQL = Path(__file__).parent / "fixtures" / "opencode" / "opencode_fixture.sql"


@pytest.fixture
def dirs(tmp_path, configure):
    opencode = tmp_path / "opencode"
    copilot = tmp_path / "copilot" / "session-state"
    copilot.mkdir(parents=True)
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {opencode}\n"
              f"  copilot:\n    state_dir: {copilot}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return opencode, copilot


class Pipeline:
    """Watcher → event rows → run_event, all in this process, on one store; the watcher is
    driven: `run(seconds)` moves its time on."""

    def __init__(self):
        self.app = App()
        self.recorded: list[tuple[str, str, str, int]] = []
        self.drive: DrivenWatcher | None = None

    def emit(self, adapter: str, session_id: str, kind: str) -> None:
        event, _ = record_event(self.app.store, adapter, session_id, kind)
        self.recorded.append((adapter, session_id, kind, event.id))

    def start(self, *, idle_debounce_seconds: float | None = None,
              inactivity_seconds: float | None = None, now: float | None = None) -> Pipeline:
        """`inactivity_seconds`: below the config's one-minute floor, so set on the watcher."""
        watcher = SessionWatcher(self.app.config, self.emit, store=self.app.store)
        if idle_debounce_seconds is not None:
            watcher.idle_debounce_ms = int(idle_debounce_seconds * 1000)
        if inactivity_seconds is not None:
            watcher.inactivity_ms = int(inactivity_seconds * 1000)
        self.looks: list[tuple[float, str, object]] = []  # (when, session, Lifecycle) of each look
        apply = watcher._apply

        def looked(adapter, session_id, lifecycle, now):
            self.looks.append((now, session_id, lifecycle))
            apply(adapter, session_id, lifecycle, now)

        watcher._apply = looked
        self.drive = DrivenWatcher(watcher, now)
        return self

    @property
    def watcher(self) -> SessionWatcher:
        return self.drive.watcher

    @property
    def now(self) -> float:
        return self.drive.now

    def run(self, seconds: float = 1.0) -> float:
        return self.drive.run(seconds)

    def stop(self) -> None:
        if self.drive is not None:
            self.drive.close()
            self.drive = None

    def close(self) -> None:
        self.stop()
        self.app.close()

    def kinds(self, session_id: str) -> list[str]:
        return [kind for _, sid, kind, _ in self.recorded if sid == session_id]

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
    pipeline.run(1.0)
    append_lines(events, copilot_line("session.shutdown", {"shutdownType": "routine"}))
    pipeline.run(10.0)
    assert pipeline.kinds(session_id) == ["created", "ending"]
    pipeline.run_recorded()
    assert pipeline.found("theme localStorage") == ["We decided to keep the theme in localStorage"]


def test_one_shot_session_is_extracted_from_its_ending(dirs, pipeline):
    _, copilot = dirs
    pipeline.start()
    # `copilot -p`: start, one turn and shutdown, written as one burst.
    session_id, _ = copilot_events_file(copilot, *copilot_turn_lines("remember that the build cache lives in /var/cache/acme"),
                                        copilot_line("session.shutdown", {"shutdownType": "routine"}))
    pipeline.run(10.0)
    assert pipeline.kinds(session_id) == ["created", "ending"]
    pipeline.run_recorded()
    assert pipeline.found("build cache") == ["The build cache lives in /var/cache/acme"]
    pipeline.run_recorded()  # every event once more: nothing new
    assert pipeline.memory_count() == 1


def test_a_dead_lock_pid_ends_the_session_and_extracts_its_turn(dirs, pipeline):
    from session_writers import dead_pid

    _, copilot = dirs
    pid = dead_pid()  # a pid that no longer runs: Copilot crashed
    pipeline.start()
    session_id = str(uuid.uuid4())
    (copilot / session_id).mkdir()
    (copilot / session_id / f"inuse.{pid}.lock").write_text(str(pid))
    append_lines(copilot / session_id / "events.jsonl", copilot_line("session.start", {"sessionId": session_id}),
                 *copilot_turn_lines("remember that the queue is drained nightly"))
    pipeline.run(1.0)
    assert pipeline.kinds(session_id)[-1] == "ending"
    pipeline.run_recorded()
    assert pipeline.found("queue drained") == ["The queue is drained nightly"]


def opencode_db(folder: Path) -> sqlite3.Connection:
    folder.mkdir(exist_ok=True)
    conn = sqlite3.connect(folder / "opencode.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(FIXTURE_SQL.read_text())
    return conn


def opencode_turn(conn: sqlite3.Connection, session: str, number: int, text: str, *,
                  new_session: bool = False, at: float | None = None) -> None:
    """One user message and its finished reply, in ONE transaction (as OpenCode may commit them),
    stamped `at` (default: now)."""
    now = int((time.time() if at is None else at) * 1000)
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
        pipeline.run(2.0)
        assert pipeline.kinds(session) == ["created", "idle"]
        opencode_turn(conn, session, 2, "remember that the worker pool has eight threads")
        pipeline.run(2.0)
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
        first.run(1.0)
        assert first.kinds(known) == ["created", "idle"]
        stopped_at = first.now
        first.stop()  # the watcher goes down; the sessions go on
        facts = [f"remember that fact number {n} is {n * 7}" for n in range(1, 4)]
        append_lines(events, *[line for fact in facts for line in copilot_turn_lines(fact)])
        meanwhile, _ = copilot_events_file(copilot, *copilot_turn_lines("remember that fact number 9 is sixty three"))
        first.run_recorded()
    finally:
        first.close()

    second = Pipeline().start(now=stopped_at + 1)
    try:
        second.run(5.0)
        assert second.kinds(known) == ["idle"]  # known: no second created
        assert second.kinds(meanwhile) == ["created", "idle"]
        second.run_recorded()
        contents = {m for n in range(10) for m in second.found(f"fact number {n}")}
        assert len(contents) == 5 and second.memory_count() == 5
    finally:
        second.close()


def test_a_restarted_watcher_announces_no_idle_for_a_session_archived_inside_its_debounce(dirs):
    """Archived right after its last reply, the session ends before its idle debounce passes:
    the ending extracts that reply. A restarted watcher re-read it (no new writes) and used
    to announce the idle it never saw."""
    from session_writers import OpenCodeStore

    opencode, _ = dirs
    agent = OpenCodeStore(opencode)
    first = Pipeline().start(idle_debounce_seconds=5.0)
    try:
        session = agent.session()
        session.turn("remember that the archive test passed", "Noted.", whole=True)
        session.archive()
        first.run(1.0)
        assert first.kinds(session.id) == ["created", "ending"]
        first.run(60.0)
        assert first.kinds(session.id) == ["created", "ending"]
        stopped_at = first.now
    finally:
        first.close()
    second = Pipeline().start(idle_debounce_seconds=5.0, now=stopped_at + 60)
    try:
        second.run(60.0)
        assert second.kinds(session.id) == []
    finally:
        second.close()
        agent.close()


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
        pipeline.run(watcher_module.RETRY_SECONDS * 1.5)  # one look and one retry
        assert pipeline.watcher.errors >= 2 and pipeline.kinds(session_id) == []
        holder.communicate("\n", timeout=10)  # the lock goes
        pipeline.run(watcher_module.RETRY_SECONDS * 2)
        assert pipeline.kinds(session_id) == ["created", "idle"]
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


def assert_looked_inside_the_debounce(pipeline: Pipeline, session_id: str, written: float) -> None:
    """The case under test: the first look after the new turn sees its finished reply, but the
    session is neither busy nor idle yet (the idle debounce has not passed)."""
    from llmem.adapters.lifecycle import Moment

    at, lifecycle = next((at, lifecycle) for at, sid, lifecycle in pipeline.looks if sid == session_id and at > written)
    assert at - written < DEBOUNCE_S, "the first look came too late to test this case"
    assert Moment.BUSY not in lifecycle and Moment.IDLE not in lifecycle and Moment.ENDING not in lifecycle


def test_copilot_turn_after_an_inactivity_ending_is_extracted_once(dirs, pipeline):
    _, copilot = dirs
    pipeline.start(idle_debounce_seconds=DEBOUNCE_S, inactivity_seconds=INACTIVITY_S)
    session_id, events = copilot_events_file(copilot, *copilot_turn_lines("remember that the api listens on port 8080"))
    pipeline.run(INACTIVITY_S + 1)
    assert pipeline.kinds(session_id) == ["created", "idle", "ending"]  # ended by inactivity
    written = pipeline.now
    # user + finished reply, one write (stamped at the driven time: the watcher's clock is ahead of the wall's)
    append_lines(events, *copilot_turn_lines("remember that the deploy runs at midnight", at=written))
    pipeline.run(DEBOUNCE_S / 2)
    assert_looked_inside_the_debounce(pipeline, session_id, written)
    pipeline.run(INACTIVITY_S + 1)
    assert pipeline.kinds(session_id) == ["created", "idle", "ending", "idle", "ending"]
    pipeline.run_recorded()
    assert pipeline.found("deploy midnight") == ["The deploy runs at midnight"]
    assert pipeline.found("port 8080") == ["The api listens on port 8080"]
    pipeline.run_recorded()  # every event once more: nothing new
    assert pipeline.memory_count() == 2


def test_opencode_turn_after_an_inactivity_ending_is_extracted_once(dirs, pipeline):
    opencode, _ = dirs
    conn = opencode_db(opencode)
    try:
        pipeline.start(idle_debounce_seconds=DEBOUNCE_S, inactivity_seconds=INACTIVITY_S)
        session = "ses_0afterlongidle00000000001"
        opencode_turn(conn, session, 1, "remember that the api listens on port 8080", new_session=True)
        pipeline.run(INACTIVITY_S + 1)
        assert pipeline.kinds(session) == ["created", "idle", "ending"]  # ended by inactivity
        written = pipeline.now
        opencode_turn(conn, session, 2, "remember that the deploy runs at midnight", at=written)  # one transaction
        pipeline.run(DEBOUNCE_S / 2)
        assert_looked_inside_the_debounce(pipeline, session, written)
        pipeline.run(INACTIVITY_S + 1)
        assert pipeline.kinds(session) == ["created", "idle", "ending", "idle", "ending"]
        pipeline.run_recorded()
        assert pipeline.found("deploy midnight") == ["The deploy runs at midnight"]
        pipeline.run_recorded()
        assert pipeline.memory_count() == 2
    finally:
        conn.close()


def test_a_turn_after_an_inactivity_ending_survives_a_restart_inside_the_debounce(dirs, pipeline):
    """The look that saw the session move on is kept in watch_session: a watcher restarted
    before the idle debounce passed still emits the idle."""
    _, copilot = dirs
    pipeline.start(idle_debounce_seconds=DEBOUNCE_S, inactivity_seconds=INACTIVITY_S)
    session_id, events = copilot_events_file(copilot, *copilot_turn_lines("remember that the api listens on port 8080"))
    pipeline.run(INACTIVITY_S + 1)
    assert pipeline.kinds(session_id) == ["created", "idle", "ending"]
    written = pipeline.now
    append_lines(events, *copilot_turn_lines("remember that the deploy runs at midnight", at=written))
    pipeline.run(DEBOUNCE_S / 2)
    assert_looked_inside_the_debounce(pipeline, session_id, written)
    stopped_at = pipeline.now
    pipeline.stop()
    ended = pipeline.app.store.db.execute_sql(
        "SELECT ended FROM watch_session WHERE session_id = ?", (session_id,)).fetchone()[0]
    assert ended == 0  # live again, as saved
    pipeline.start(idle_debounce_seconds=DEBOUNCE_S, inactivity_seconds=INACTIVITY_S, now=stopped_at + 0.1)
    pipeline.run(INACTIVITY_S + 1)
    assert pipeline.kinds(session_id) == ["created", "idle", "ending", "idle", "ending"]
    pipeline.run_recorded()
    assert pipeline.found("deploy midnight") == ["The deploy runs at midnight"]
    assert pipeline.memory_count() == 2
