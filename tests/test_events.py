"""Session events as rows: dedupe, claim, retry, reconcile, and the per-session LLM interval."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from session_writers import append_lines, copilot_events_file, copilot_turn_lines

from llmem.app import App
from llmem.pipeline.events import (
    claim_event,
    events_to_reconcile,
    owner_died,
    record_event,
    release_event,
    retry_events,
    run_event,
)
from llmem.times import now


@pytest.fixture
def app(llmem_home, tmp_path, configure, model_server):
    state = tmp_path / "state"
    state.mkdir()
    configure(f"embedding:\n  provider: none\nllm:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n"
              "pipeline:\n  min_extraction_interval_seconds: 60\n")
    application = App()
    application.state_dir = state
    yield application
    application.close()


def test_record_reuses_a_waiting_event_and_claims_once(app):
    first, new = record_event(app.store, "copilot", "s1", "idle")
    again, new_again = record_event(app.store, "copilot", "s1", "idle")
    assert new and not new_again and again.id == first.id
    assert claim_event(app.store, first.id).attempts == 1
    second, new = record_event(app.store, "copilot", "s1", "idle")  # the first one is running now
    assert new and second.id != first.id


def test_reconcile_finds_lost_and_released_events(app):
    lost, _ = record_event(app.store, "copilot", "s1", "idle")
    claim_event(app.store, lost.id)
    Event = app.store.models.Event
    Event.update(started_at=now() - 3600).where(Event.id == lost.id).execute()
    waiting, _ = record_event(app.store, "copilot", "s2", "ending")
    assert [e.id for e in events_to_reconcile(app.store, pending_after=60, running_after=600)] == [lost.id]
    released, _ = record_event(app.store, "copilot", "s3", "idle")
    claim_event(app.store, released.id)
    release_event(app.store, released.id)
    found = [e.id for e in events_to_reconcile(app.store, pending_after=60, running_after=600)]
    assert released.id in found and waiting.id not in found
    Event.update(status="failed").where(Event.id == waiting.id).execute()
    assert [e.id for e in retry_events(app.store)] == [waiting.id]


def test_within_the_interval_heuristics_run_now_and_the_llm_waits(app, model_server):
    session_id, events_file = copilot_events_file(
        app.state_dir, *copilot_turn_lines("we use black for formatting"), cwd="/w")
    model_server.chat_replies = [json.dumps({"memories": [
        {"type": "decision", "content": "The team formats Python with black", "confidence": 0.7}]})]
    first, _ = record_event(app.store, "copilot", session_id, "idle")
    assert run_event(app, first.id).status == "done"
    chats = len([p for p, _ in model_server.requests if p == "/api/chat"])
    assert chats >= 1

    append_lines(events_file, *copilot_turn_lines("remember that releases happen on thursdays"))
    second, _ = record_event(app.store, "copilot", session_id, "idle")
    outcome = run_event(app, second.id)
    assert outcome.status == "pending" and outcome.result["deferred_until"] > now() + 50
    assert len([p for p, _ in model_server.requests if p == "/api/chat"]) == chats  # no LLM call
    Memory, Event = app.store.models.Memory, app.store.models.Event
    assert Memory.select().where(Memory.content.contains("thursdays")).exists()  # heuristics now
    assert Event.get_by_id(second.id).not_before == pytest.approx(outcome.result["deferred_until"])

    # once the interval has passed, the same slice goes to the LLM
    Event.update(finished_at=now() - 120).where(Event.id == first.id).execute()
    model_server.chat_replies = [json.dumps({"memories": [
        {"type": "procedure", "content": "Releases are cut on Thursdays", "confidence": 0.7}]})]
    assert run_event(app, second.id).status == "done"
    assert len([p for p, _ in model_server.requests if p == "/api/chat"]) > chats
    assert Memory.select().where(Memory.content == "Releases are cut on Thursdays").exists()
    # the heuristics' wording of the same turn gave way: the turn is stored once
    valid = [m for m in Memory.select().where(Memory.invalidated_at.is_null()
                                              & Memory.content.contains("hursday"))]
    assert [m.content for m in valid if m.source != "episode"] == ["Releases are cut on Thursdays"]
    # … and its episode once: the heuristic pass that held the cursor wrote it, the LLM pass
    # that read the same turn again did not (episodes keep their own cursor).
    assert len([m for m in valid if m.source == "episode"]) == 1
    Relation = app.store.models.Relation
    assert Relation.select().where(Relation.type == "supersedes").count() == 1


def test_a_clock_set_back_defers_the_llm_by_one_interval_at_most(app):
    """Issue 20 item 11: with the clock set back an hour, the last extraction's stamp is an
    hour ahead, and the LLM pass was deferred by ~3,558 s instead of the 60 s interval."""
    from llmem.pipeline.events import _next_llm_extraction

    first, _ = record_event(app.store, "copilot", "s-jump", "idle")
    claim_event(app.store, first.id)
    Event = app.store.models.Event
    at = 1_800_000_000.0
    llm_pass = {"steps": {"extract": {"result": {"used_llm": True}}}}  # the interval spaces LLM passes
    Event.update(status="done", finished_at=at + 3600, result=llm_pass).where(  # before the jump
        Event.id == first.id).execute()
    second, _ = record_event(app.store, "copilot", "s-jump", "idle")
    assert _next_llm_extraction(app, second, at=at) == at + 60
    Event.update(finished_at=at - 20).where(Event.id == first.id).execute()  # no jump: the rest of it
    assert _next_llm_extraction(app, second, at=at) == at + 40
    Event.update(finished_at=at - 60).where(Event.id == first.id).execute()
    assert _next_llm_extraction(app, second, at=at) is None


def test_a_provisional_memory_the_llm_did_not_restate_is_kept(app, model_server):
    session_id, events_file = copilot_events_file(app.state_dir, *copilot_turn_lines("hello"), cwd="/w")
    model_server.chat_replies = [json.dumps({"memories": []})]
    first, _ = record_event(app.store, "copilot", session_id, "idle")
    assert run_event(app, first.id).status == "done"
    append_lines(events_file, *copilot_turn_lines("remember that the staging port is 8443"))
    second, _ = record_event(app.store, "copilot", session_id, "idle")
    assert run_event(app, second.id).status == "pending"
    Event, Memory = app.store.models.Event, app.store.models.Memory
    Event.update(finished_at=now() - 120).where(Event.id == first.id).execute()
    model_server.chat_replies = [json.dumps({"memories": [
        {"type": "fact", "content": "The production port is 443", "confidence": 0.7}]})]
    assert run_event(app, second.id).status == "done"
    kept = Memory.get(Memory.content.contains("8443"))
    assert kept.invalidated_at is None and "provisional" not in kept.metadata


@pytest.mark.parametrize(("candidate", "provisional", "expected"), [
    ("Releases are cut on Thursdays", "Releases happen on thursdays", True),
    ("Theme preference is stored in localStorage", "We decided to keep the theme in localStorage", True),
    ("service-21 listens on port 9021", "service-12 listens on port 9012", False),
    ("The staging port is 8080", "The staging port is 8443", False),
    ("Never deploy on Fridays", "Deploys are frozen during the holidays", False),
])
def test_restates_needs_every_identifier_and_half_the_words(candidate, provisional, expected):
    from llmem.capture.extract import restates

    assert restates(candidate, provisional) is expected


def test_an_event_another_worker_is_running_is_not_run_twice(app):
    session_id, _ = copilot_events_file(
        app.state_dir, *copilot_turn_lines("remember that the cache ttl is ten minutes"), cwd=None)
    Event = app.store.models.Event
    event, _ = record_event(app.store, "copilot", session_id, "created")
    claim_event(app.store, event.id)  # a worker runs it now; reconcile delivers it once more
    assert run_event(app, event.id).status == "skipped"
    assert Event.get_by_id(event.id).attempts == 1
    # Running for longer than pipeline.running_timeout_minutes: that worker is gone.
    Event.update(started_at=now() - 3600).where(Event.id == event.id).execute()
    assert run_event(app, event.id).status == "done"


DEFAULT_RUNNING_TIMEOUT = 30 * 60.0  # pipeline.running_timeout_minutes


def claim_in_a_process_that_dies(app, event_id: int) -> int:
    """Claim the event from a short-lived process (a worker killed mid-task); return its pid."""
    code = ("import sys; from llmem.store import Store; from llmem.pipeline.events import claim_event\n"
            "with Store.open(sys.argv[1]) as store: assert claim_event(store, int(sys.argv[2]))")
    worker = subprocess.Popen([sys.executable, "-c", code, str(app.config.store_location), str(event_id)],
                              stderr=subprocess.PIPE, text=True)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    return worker.pid


def test_a_running_event_whose_worker_died_is_reconciled_at_once(app):
    Event = app.store.models.Event
    lost, _ = record_event(app.store, "copilot", "s1", "idle")
    dead_pid = claim_in_a_process_that_dies(app, lost.id)
    row = Event.get_by_id(lost.id)
    assert (row.status, row.attempts, row.owner_pid, row.owner_host) == (
        "running", 1, dead_pid, socket.gethostname())
    live, _ = record_event(app.store, "copilot", "s2", "idle")
    claim_event(app.store, live.id)  # this (live) process runs it
    assert Event.get_by_id(live.id).owner_pid == os.getpid()

    found = events_to_reconcile(app.store, pending_after=60, running_after=DEFAULT_RUNNING_TIMEOUT)
    assert [e.id for e in found] == [lost.id]
    row = Event.get_by_id(lost.id)
    # back to pending like a released event: the killed attempt is not a failure
    assert (row.status, row.attempts) == ("pending", 0) and "died" in row.last_error
    assert Event.get_by_id(live.id).status == "running"
    # the requeued task claims it as a first attempt
    assert claim_event(app.store, lost.id, running_after=DEFAULT_RUNNING_TIMEOUT).attempts == 1


def test_a_recycled_pid_or_another_host_is_not_taken_for_the_owner(app):
    Event = app.store.models.Event
    younger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        recycled, _ = record_event(app.store, "copilot", "s1", "idle")
        elsewhere, _ = record_event(app.store, "copilot", "s2", "idle")
        for event in (recycled, elsewhere):
            claim_event(app.store, event.id)
        # The owner started ten minutes ago; the process holding its pid now started just now.
        Event.update(owner_pid=younger.pid, owner_started_at=now() - 600).where(
            Event.id == recycled.id).execute()
        # A dead pid on another host: this host cannot tell, so the timeout rule holds.
        Event.update(owner_pid=2**22 + 7, owner_host="elsewhere.invalid").where(
            Event.id == elsewhere.id).execute()
        assert owner_died(Event.get_by_id(recycled.id))
        assert not owner_died(Event.get_by_id(elsewhere.id))
        found = events_to_reconcile(app.store, pending_after=60, running_after=DEFAULT_RUNNING_TIMEOUT)
        assert [e.id for e in found] == [recycled.id]
        Event.update(started_at=now() - 3600).where(Event.id == elsewhere.id).execute()
        found = events_to_reconcile(app.store, pending_after=60, running_after=DEFAULT_RUNNING_TIMEOUT)
        assert elsewhere.id in [e.id for e in found]
    finally:
        younger.kill()
        younger.wait()


def test_an_event_whose_worker_died_is_run_at_once_when_delivered_again(app):
    session_id, _ = copilot_events_file(
        app.state_dir, *copilot_turn_lines("remember that the cache ttl is ten minutes"), cwd=None)
    Event = app.store.models.Event
    event, _ = record_event(app.store, "copilot", session_id, "created")
    claim_in_a_process_that_dies(app, event.id)
    # started moments ago, but its worker is gone: no need to wait out the timeout
    assert run_event(app, event.id).status == "done"
    assert Event.get_by_id(event.id).attempts == 1


def test_with_no_llm_reachable_no_interval_holds_the_next_turn_back(app, configure, tmp_path):
    from conftest import free_port_url

    configure(f"embedding:\n  provider: none\nllm:\n  provider: ollama\n  base_url: {free_port_url()}\n"
              f"  timeout: 2\nsession:\n  adapter: copilot\n  copilot:\n    state_dir: {app.state_dir}\n"
              "pipeline:\n  min_extraction_interval_seconds: 60\n")
    down = App()
    try:
        session_id, events_file = copilot_events_file(
            app.state_dir, *copilot_turn_lines("remember that we use black for formatting"), cwd="/w")
        first, _ = record_event(down.store, "copilot", session_id, "idle")
        assert run_event(down, first.id).status == "done"  # heuristics only: no LLM pass was made
        append_lines(events_file, *copilot_turn_lines("remember that releases happen on thursdays"))
        second, _ = record_event(down.store, "copilot", session_id, "idle")
        outcome = run_event(down, second.id)
        assert outcome.status == "done" and outcome.retry_at is None
        Memory = down.store.models.Memory
        assert Memory.select().where(Memory.content.contains("thursdays")).exists()
    finally:
        down.close()


def test_a_moment_joining_a_deferred_event_runs_the_heuristics_now(app, model_server, monkeypatch):
    from llmem.cli import queueing
    from workers import tasks
    from workers.app import build_huey

    huey = build_huey(app.config)
    huey.immediate = True  # tasks run inline on enqueue; a scheduled retry waits in the schedule
    monkeypatch.setitem(queueing._queues, str(app.config.queue_path), (huey, tasks.register(huey, app.config)))
    tasks.use_app(app)
    try:
        session_id, events_file = copilot_events_file(
            app.state_dir, *copilot_turn_lines("we use black for formatting"), cwd="/w")
        model_server.chat_replies = [json.dumps({"memories": [
            {"type": "decision", "content": "The team formats Python with black", "confidence": 0.7}]})]
        first = queueing.submit_event(app, "copilot", session_id, "idle")  # an LLM pass: done
        append_lines(events_file, *copilot_turn_lines("remember that releases happen on thursdays"))
        second = queueing.submit_event(app, "copilot", session_id, "idle")  # within the interval
        Event, Memory = app.store.models.Event, app.store.models.Memory
        assert Event.get_by_id(second).not_before > now() + 50
        append_lines(events_file, *copilot_turn_lines("remember that the cache ttl is ten minutes"))
        third = queueing.submit_event(app, "copilot", session_id, "idle")
        assert third == second  # one LLM pass still waits for the session...
        assert Memory.select().where(Memory.content.contains("cache ttl")).exists()  # ...its turns don't
        assert Event.select().where(Event.session_id == session_id).count() == 2
        assert len(huey.scheduled()) == 1  # and the deferred pass is scheduled once
        assert first != second
    finally:
        tasks.use_app(None)


def test_the_worker_builds_no_context_block_nobody_reads(app):
    # The worker drops a created event's block (the hook that printed one built its own), so
    # building it cost a search and recorded context recalls for nobody: in a `llmem run`
    # replay those recalls touched 41 of 91 memories and outweighed relevance afterwards.
    session_id, _ = copilot_events_file(
        app.state_dir, *copilot_turn_lines("the cache ttl is ten minutes"), cwd=None)
    app.store.add("The cache ttl is ten minutes in every environment.", "fact")
    RecallEvent = app.store.models.RecallEvent
    for kind in ("created", "compacting"):
        event, _ = record_event(app.store, "copilot", session_id, kind)
        outcome = run_event(app, event.id)
        assert outcome.status == "done"
        assert "context" not in outcome.result["steps"]
    assert RecallEvent.select().count() == 0
