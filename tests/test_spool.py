"""The watcher's spool (pipeline/spool.py): moments the store could not take, kept on this
disk and delivered once, in order, when it answers — also by a watcher started while the
store was away. On a real SQLite store; driven through poll(now), no sleeps. The same with a
PostgreSQL server really stopped and a watcher restarted meanwhile: tests/test_offline_store.py."""

from __future__ import annotations

import os
import stat
import time
import uuid
from dataclasses import replace

import pytest
from session_writers import append_lines, copilot_line, copilot_turn_lines
from watch_driver import DrivenWatcher, Recorder

import llmem.pipeline.events as events_module
import llmem.pipeline.spool as spool_module
import llmem.pipeline.watcher as watcher_module
from llmem.app import App
from llmem.config import load_config
from llmem.pipeline.events import finish_event, record_event
from llmem.pipeline.spool import Spool, default_spool_path
from llmem.pipeline.watcher import SessionWatcher


class Away:
    """An emit (or store opener) that fails while `away` is set, as one whose server is gone."""

    def __init__(self, then):
        self.away = True
        self.then = then

    def __call__(self, *args, **kwargs):
        if self.away:
            raise ConnectionError("no PostgreSQL server answers at postgresql://db.example/llmem")
        return self.then(*args, **kwargs)


@pytest.fixture
def copilot(tmp_path, configure):
    state = tmp_path / "copilot" / "session-state"
    state.mkdir(parents=True)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: copilot\n"
              f"  copilot:\n    state_dir: {state}\npipeline:\n  idle_debounce_seconds: 0.2\n")
    return state


def a_session(state, text: str) -> str:
    session_id = str(uuid.uuid4())
    (state / session_id).mkdir()
    append_lines(state / session_id / "events.jsonl",
                 copilot_line("session.start", {"sessionId": session_id}), *copilot_turn_lines(text))
    return session_id


def one_more_turn(state, session_id: str, text: str, at: float | None = None) -> None:
    append_lines(state / session_id / "events.jsonl", *copilot_turn_lines(text, at=at))


def recording_spool(recorded: list) -> Spool:
    return Spool(default_spool_path(), lambda moment: recorded.append(
        (moment.adapter, moment.session_id, moment.kind)))


def test_kept_moments_are_fsynced_private_lines_delivered_in_order_then_the_file_goes(llmem_home):
    delivered = []
    spool = recording_spool(delivered)
    assert spool.keep("copilot", "s1", "idle", since=10.0, now=11.0)
    assert spool.keep("copilot", "s2", "ending", since=12.0, now=12.0)
    assert stat.S_IMODE(os.stat(spool.path).st_mode) == 0o600
    assert spool.path.parent == llmem_home and spool.waiting() == 2
    assert Spool(spool.path, delivered.append).waiting() == 2  # on disk, for a restarted watcher
    assert spool.deliver() == 2
    assert delivered == [("copilot", "s1", "idle"), ("copilot", "s2", "ending")]
    assert not spool.path.exists() and spool.waiting() == 0
    assert spool.deliver() == 0 and len(delivered) == 2  # none twice


def test_a_delivery_that_fails_leaves_the_rest_for_later_and_the_next_resumes(llmem_home):
    delivered = []
    flaky = Away(lambda moment: delivered.append(moment.session_id))
    calls = []

    def deliver(moment):
        calls.append(moment.session_id)
        if len(calls) == 2:  # the server goes away again after the first
            raise ConnectionError("server closed the connection unexpectedly")
        delivered.append(moment.session_id)

    spool = Spool(default_spool_path(), deliver)
    for name in ("s1", "s2", "s3"):
        spool.keep("copilot", name, "idle", since=1.0, now=1.0)
    with pytest.raises(ConnectionError):
        spool.deliver()
    assert delivered == ["s1"] and spool.waiting() == 2
    again = Spool(default_spool_path(), deliver)  # a restarted watcher reads the marks
    assert again.waiting() == 2 and again.deliver() == 2
    assert delivered == ["s1", "s2", "s3"] and not again.path.exists()
    assert flaky.away  # (the helper itself was not needed)


def test_a_torn_last_line_is_skipped_and_the_next_moment_is_not_glued_to_it(llmem_home):
    delivered = []
    spool = recording_spool(delivered)
    spool.keep("copilot", "s1", "idle", since=1.0, now=1.0)
    with open(spool.path, "ab") as fh:  # a crash in the middle of an append
        fh.write(b'{"kept":{"id":"ab')
    fresh = recording_spool(delivered)
    assert fresh.waiting() == 1
    assert fresh.keep("copilot", "s2", "idle", since=2.0, now=2.0)
    assert recording_spool(delivered).deliver() == 2
    assert [session for _, session, _ in delivered] == ["s1", "s2"]


def test_the_spool_is_bounded_and_refuses_files_it_does_not_own(llmem_home, tmp_path, monkeypatch):
    monkeypatch.setattr(spool_module, "MAX_MOMENTS", 2)
    spool = recording_spool([])
    assert spool.keep("copilot", "s1", "idle", since=1.0, now=1.0)
    assert spool.keep("copilot", "s2", "idle", since=1.0, now=1.0)
    assert not spool.keep("copilot", "s3", "idle", since=1.0, now=1.0)  # full: the watcher keeps it
    spool.path.unlink()
    target = tmp_path / "not-llmems.txt"
    target.write_text("someone else's\n")
    spool.path.symlink_to(target)
    assert not recording_spool([]).keep("copilot", "s1", "idle", since=1.0, now=1.0)
    assert target.read_text() == "someone else's\n"  # never written through the link
    spool.path.unlink()
    os.link(target, spool.path)  # a second name of another file
    assert not recording_spool([]).keep("copilot", "s1", "idle", since=1.0, now=1.0)
    assert target.read_text() == "someone else's\n"


def test_a_delivery_repeated_after_a_crash_records_its_event_once(copilot):
    app = App()
    Event = app.store.models.Event
    spool = Spool(default_spool_path(), lambda moment: record_event(
        app.store, moment.adapter, moment.session_id, moment.kind, since=moment.since))
    spool.keep("copilot", "s1", "idle", since=100.0, now=100.0)
    before = spool.path.read_bytes()
    spool.deliver()
    # Killed after the event row was committed, before the delivered mark reached the disk:
    spool.path.write_bytes(before)
    assert Spool(spool.path, spool.deliver_one).deliver() == 1
    assert Event.select().where(Event.session_id == "s1").count() == 1
    app.close()


def test_a_watcher_keeps_what_it_cannot_record_and_delivers_it_when_the_store_answers(copilot):
    recorder = Recorder()
    emit = Away(recorder)
    delivered = []
    spool = Spool(default_spool_path(), lambda moment: (emit(moment.adapter, moment.session_id, moment.kind),
                                                        delivered.append(moment.kind)))
    watcher = SessionWatcher(load_config(), emit, spool=spool)
    driven = DrivenWatcher(watcher)
    session = a_session(copilot, "we deploy with make release")
    driven.run(2.0)
    assert recorder.events == [] and spool.waiting() == 2  # created and idle, on disk
    one_more_turn(copilot, session, "never from a branch")
    driven.run(2.0)
    assert spool.waiting() == 3 and recorder.events == []  # the new idle joins them, in order
    emit.away = False
    driven.run(watcher_module.RETRY_SECONDS * 2)
    assert recorder.kinds(session) == ["created", "idle", "idle"] and delivered == recorder.kinds(session)
    assert spool.waiting() == 0 and not spool.path.exists()
    one_more_turn(copilot, session, "and tag it first")
    driven.run(2.0)
    assert recorder.kinds(session) == ["created", "idle", "idle", "idle"]  # live again, nothing twice
    driven.close()


def test_a_watcher_started_while_the_store_is_away_waits_then_delivers_and_catches_up(copilot, monkeypatch):
    # The store's clock, which stamps the events, set by the test: a turn begins after the
    # events of the one before it were recorded, and its own are recorded after it began, as at
    # a human pace (the driven watcher's steps take no wall time).
    base = time.time()
    store_clock = [base]
    monkeypatch.setattr(events_module, "now", lambda: store_clock[0])
    app = App()
    Event = app.store.models.Event

    def record_and_run(adapter, session_id, kind, since=None):  # the worker runs each event at once
        event, _ = record_event(app.store, adapter, session_id, kind, since=since)
        finish_event(app.store, event.id)

    first_emit = Away(record_and_run)
    first = SessionWatcher(load_config(), first_emit, store=app.store,
                           spool=Spool(default_spool_path(), lambda m: first_emit(m.adapter, m.session_id, m.kind)))
    driven = DrivenWatcher(first)
    first_emit.away = False
    seen = a_session(copilot, "the api listens on 8080")
    driven.run(2.0)  # known to the store: created, idle and its state saved
    key = ("copilot", seen)
    before_outage = replace(first.states[key])
    first_emit.away = True
    one_more_turn(copilot, seen, "the queue is redis", at=base + 0.1)  # kept in the spool
    driven.run(2.0)
    driven.close()  # the watcher is stopped during the outage, its last state never saved ...
    first.saved.save(key, before_outage, driven.now)
    unseen = a_session(copilot, "the cache is memcached")  # ... and a session begins meanwhile

    submitted = []
    opener = Away(lambda: app.store)

    def submit(adapter, session_id, kind, since=None):  # the CLI's submit_event: through the store
        event, _ = record_event(opener(), adapter, session_id, kind, since=since)
        finish_event(app.store, event.id)
        submitted.append((session_id, kind))

    spool = Spool(default_spool_path(), lambda m: submit(m.adapter, m.session_id, m.kind, m.since))
    assert spool.waiting() == 1
    restarted = SessionWatcher(load_config(), submit, store=opener, spool=spool)
    again = DrivenWatcher(restarted)
    again.run(5.0)
    assert "waiting for the store" in restarted.describe() and submitted == []
    opener.away = False  # the server is back
    store_clock[0] = base + 0.5
    again.run(watcher_module.RETRY_SECONDS * 3)
    # The spool first; then what was written meanwhile; the idle it kept is not seen anew.
    assert submitted[0] == (seen, "idle")
    assert sorted(submitted[1:]) == sorted([(unseen, "created"), (unseen, "idle")])
    assert spool.waiting() == 0 and not spool.path.exists()
    assert Event.select().where((Event.session_id == seen) & (Event.kind == "idle")).count() == 2  # one a turn
    again.close()
    app.close()
