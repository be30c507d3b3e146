"""Several machines on one store (issue 23): each machine's events, watcher state and worker
heartbeat are its own, so one machine never takes, reconciles or retries another's work.

A machine is an llmem home (its id is kept in the data folder): two homes over one store URL
are two machines, on either backend.
"""

from __future__ import annotations

import os
import sqlite3

import pytest

from llmem.db.watch_sessions import save_watch_session, watch_session_rows
from llmem.machine import MACHINE_FILE, machine_id
from llmem.pipeline.events import (
    claim_event,
    events_to_reconcile,
    fail_event,
    record_event,
    retry_events,
    worker_heartbeat,
    worker_seen_recently,
)
from llmem.store import Store


@pytest.fixture
def machines(tmp_path, monkeypatch, store_url):
    """Switch between two machines' homes over one shared store: `on("a")`, `on("b")`."""
    homes = {name: tmp_path / f"machine-{name}" for name in ("a", "b")}

    def on(name: str) -> str:
        monkeypatch.setenv("LLMEM_HOME", str(homes[name]))
        return machine_id()

    on("a")
    store = Store.open(store_url)
    yield on, store
    store.close()


def test_a_machine_is_its_home_and_keeps_its_id(machines, tmp_path):
    on, _ = machines
    a, b = on("a"), on("b")
    assert a != b and len(a) == 16
    assert (tmp_path / "machine-a" / MACHINE_FILE).read_text().strip() == a
    assert os.stat(tmp_path / "machine-a" / MACHINE_FILE).st_mode & 0o777 == 0o600
    assert on("a") == a


def test_each_machine_runs_only_its_own_events(machines):
    on, store = machines
    on("a")
    from_a, new = record_event(store, "claude", "ses-1", "idle")
    assert new
    # The same session seen on machine b (a synced agent folder): b's own event, not a's.
    on("b")
    from_b, new = record_event(store, "claude", "ses-1", "idle")
    assert new and from_b.id != from_a.id
    assert [e.id for e in events_to_reconcile(store, pending_after=-1, running_after=0)] == [from_b.id]
    assert claim_event(store, from_a.id) is None  # a task of a's delivered to b's worker
    assert claim_event(store, from_b.id).status == "running"
    fail_event(store, from_b.id, "boom", final=True)
    on("a")
    fail_event(store, from_a.id, "boom", final=True)
    assert [e.id for e in retry_events(store)] == [from_a.id]
    assert [e.id for e in retry_events(store, [from_b.id])] == []
    assert [e.id for e in events_to_reconcile(store, pending_after=-1, running_after=0)] == [from_a.id]


def test_an_event_from_before_machines_is_taken_by_any(machines):
    on, store = machines
    Event = store.models.Event
    on("a")
    legacy, _ = record_event(store, "codex", "ses-old", "ending")
    Event.update(machine=None).where(Event.id == legacy.id).execute()
    on("b")
    assert claim_event(store, legacy.id) is not None


def test_each_machine_keeps_its_own_watcher_state_and_heartbeat(machines):
    on, store = machines
    on("a")
    save_watch_session(store.db, "copilot", "ses-1", idle_reply="r1", compacting=False, ended=True,
                       ended_turn="t1", seen_compaction_id=None, at=100.0)
    worker_heartbeat(store)
    assert worker_seen_recently(store)
    on("b")
    assert watch_session_rows(store.db) == []
    assert not worker_seen_recently(store)  # a's worker runs none of b's events
    save_watch_session(store.db, "copilot", "ses-1", idle_reply=None, compacting=True, ended=False,
                       ended_turn=None, seen_compaction_id=None, at=200.0)
    on("a")
    assert watch_session_rows(store.db) == [("copilot", "ses-1", "r1", 0, 1, "t1", None)]


def test_a_store_from_before_machines_gives_its_rows_to_the_machine_that_opens_it(llmem_home):
    path = llmem_home / "memory.db"
    llmem_home.mkdir(parents=True)
    with Store.open(path):
        pass
    # Undo 0020 as an older llmem's store would be: no machine column, the old key.
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE watch_session")
        db.execute("CREATE TABLE watch_session (adapter TEXT NOT NULL, session_id TEXT NOT NULL, idle_reply TEXT, "
                   "compacting INTEGER NOT NULL DEFAULT 0, ended INTEGER NOT NULL DEFAULT 0, ended_turn TEXT, "
                   "seen_compaction_id TEXT, updated_at REAL NOT NULL, PRIMARY KEY (adapter, session_id))")
        db.execute("INSERT INTO watch_session VALUES ('claude', 'ses-1', NULL, 0, 1, 'u9', NULL, 5.0)")
        db.execute("DROP INDEX IF EXISTS event_machine_status")
        db.execute("ALTER TABLE event DROP COLUMN machine")
        db.execute("INSERT INTO event (adapter, session_id, kind, status, attempts, detected_at) "
                   "VALUES ('claude', 'ses-1', 'idle', 'pending', 0, 1.0)")
        db.execute("DELETE FROM schema_migration WHERE name = '0020_machines'")
    with Store.open(path) as store:
        assert watch_session_rows(store.db) == [("claude", "ses-1", None, 0, 1, "u9", None)]
        assert [e.machine for e in store.models.Event.select()] == [machine_id()]


def test_the_nights_dream_runs_once_per_store_whichever_machine_comes_first(machines):
    from llmem.db.settings import get_setting
    from llmem.db.visibility import store_author
    from llmem.dream.lock import SLOT_PREFIX, claim_scheduled_slot

    on, store = machines
    a, b = on("a"), on("b")
    night = "2026-12-02T03:00+01:00"
    assert claim_scheduled_slot(store.db, night, b) is None
    assert claim_scheduled_slot(store.db, night, a) == b  # a's run of the same minute skips
    assert claim_scheduled_slot(store.db, "2026-12-03T03:00+01:00", a) is None
    key = f"{SLOT_PREFIX}{store_author(store.db) or ''}:{night}"
    assert get_setting(store.db, key) is None  # older claims are dropped
