"""The huey tasks in-process: the real SqliteHuey from workers/app.py switched to huey's
immediate mode (memory storage, tasks run inline on enqueue), so each path of a task takes
milliseconds. A task with retry_delay > 0 is only scheduled in immediate mode, never retried
inline: the tests read the schedule and run what is due themselves, as the consumer would.
One real consumer process is kept in test_pipeline.py as the smoke test.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from session_writers import copilot_session

from llmem.app import App
from llmem.errors import LLMUnavailable
from llmem.pipeline import handlers
from llmem.pipeline.events import MAX_ATTEMPTS, record_event
from llmem.pipeline.handlers import EventResult
from workers import tasks
from workers.app import build_huey


@pytest.fixture
def state_dir(tmp_path):
    folder = tmp_path / "copilot" / "session-state"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def app(configure, state_dir):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
              "pipeline:\n  min_extraction_interval_seconds: 0\n")
    application = App()
    tasks.use_app(application)
    yield application
    tasks.use_app(None)
    application.close()


@pytest.fixture
def huey(app):
    queue = build_huey(app.config)
    queue.immediate = True
    return queue


@pytest.fixture
def registered(huey, app):
    return tasks.register(huey, app.config)


def new_event(app, session_id: str = "ses-1", kind: str = "idle"):
    event, _ = record_event(app.store, "copilot", session_id, kind)
    return event


def event_row(app, event_id: int):
    Event = app.store.models.Event
    return Event.get(Event.id == event_id)


def run_due(huey, at: datetime) -> list:
    """Run every scheduled task due at `at`, as the consumer's scheduler would; return them."""
    due = huey.read_schedule(at)
    for task in due:
        huey.execute(task, timestamp=at)
    return due


def test_an_event_runs_inline_and_is_done(app, state_dir, registered, huey):
    session = copilot_session(state_dir)
    session.turn("remember that the staging database listens on port 5433")
    event = new_event(app, session.id)

    registered.process_event(event.id)

    row = event_row(app, event.id)
    assert (row.status, row.attempts, row.last_error) == ("done", 1, None)
    assert huey.scheduled_count() == huey.pending_count() == 0
    assert any("5433" in m.content for m in app.store.models.Memory.select())


def test_a_transient_error_is_retried_with_backoff_until_the_event_fails(app, registered, huey, monkeypatch):
    runs = []

    def model_down(*args, **kwargs):
        runs.append(event_row(app, event.id).attempts)
        raise LLMUnavailable("the LLM at http://127.0.0.1:1 is down")

    monkeypatch.setattr(handlers, "handle_session_event", model_down)
    event = new_event(app)

    registered.process_event(event.id)
    delays = []
    while huey.scheduled_count():
        (retry,) = huey.scheduled()
        assert retry.name == "process_event" and retry.args == (event.id,)
        assert event_row(app, event.id).status == "pending"
        delays.append(round((retry.eta - datetime.now()).total_seconds()))
        assert [task.id for task in run_due(huey, retry.eta)] == [retry.id]

    assert delays == [15, 30, 60, 120]  # retry_delay=15, retry_backoff=2, retries=4
    assert runs == [1, 2, 3, 4, 5]  # each run claims the event once more
    row = event_row(app, event.id)
    assert (row.status, row.attempts) == ("failed", MAX_ATTEMPTS)
    assert "is down" in row.last_error


def test_an_error_no_retry_can_cure_fails_the_event_at_once(app, registered, huey, monkeypatch):
    def bug(*args, **kwargs):
        raise KeyError("a bug in a handler")

    monkeypatch.setattr(handlers, "handle_session_event", bug)
    event = new_event(app)

    registered.process_event(event.id)

    row = event_row(app, event.id)
    assert (row.status, row.attempts) == ("failed", 1)
    assert row.last_error.startswith("KeyError")
    assert huey.scheduled_count() == 0


def test_a_deferred_event_is_scheduled_at_its_retry_at_and_then_runs(app, registered, huey, monkeypatch):
    retry_at = time.time() + 3600
    replies = [EventResult("idle", "ses-1", deferred_until=retry_at,
                           deferred_reason="the LLM's token budget is spent"),
               EventResult("idle", "ses-1")]
    monkeypatch.setattr(handlers, "handle_session_event", lambda *args, **kwargs: replies.pop(0))
    event = new_event(app)

    registered.process_event(event.id)

    row = event_row(app, event.id)
    assert (row.status, row.attempts, row.not_before) == ("pending", 0, retry_at)
    assert row.last_error == "the LLM's token budget is spent"
    (later,) = huey.scheduled()
    assert later.name == "process_event" and later.args == (event.id,)
    assert later.eta == datetime.fromtimestamp(retry_at)
    assert run_due(huey, later.eta - timedelta(seconds=1)) == []  # not before its time

    assert [task.id for task in run_due(huey, later.eta)] == [later.id]
    assert event_row(app, event.id).status == "done"
    assert huey.scheduled_count() == 0


def test_sigterm_puts_the_running_event_back_to_pending(app, registered, huey, monkeypatch):
    """The consumer's SIGTERM handler calls notify_interrupted_tasks(): SIGNAL_INTERRUPTED for
    each task in flight, and the process exits without finishing them."""
    inside, stopped = threading.Event(), threading.Event()

    def slow_handler(*args, **kwargs):
        inside.set()
        stopped.wait(10)
        return EventResult("idle", "ses-1")

    monkeypatch.setattr(handlers, "handle_session_event", slow_handler)
    event = new_event(app)
    worker = threading.Thread(target=registered.process_event, args=(event.id,))
    worker.start()
    try:
        assert inside.wait(10)
        assert event_row(app, event.id).status == "running"

        huey.notify_interrupted_tasks()

        row = event_row(app, event.id)
        assert (row.status, row.attempts) == ("pending", 0)  # the stopped run is not counted
        assert "requeued" in row.last_error
    finally:
        stopped.set()
        worker.join(10)


def test_reconcile_enqueues_an_event_whose_task_was_lost(app, state_dir, registered, huey):
    session = copilot_session(state_dir)
    session.turn("remember that reconcile runs every few minutes")
    event = new_event(app, session.id)
    Event = app.store.models.Event
    Event.update(detected_at=time.time() - 3600).where(Event.id == event.id).execute()  # its task never ran

    registered.reconcile()

    assert event_row(app, event.id).status == "done"


def test_vectors_catch_up_by_themselves_in_the_worker(configure, model_server):
    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n  timeout: 2\n"
              "llm:\n  provider: none\n")
    application = App()
    tasks.use_app(application)
    try:
        queue = build_huey(application.config)
        queue.immediate = True
        registered = tasks.register(queue, application.config)
        assert "embed_catch_up" in {task.name for task in queue._registry.periodic_tasks}
        model_server.mode = "error"
        application.store.add("the staging database listens on port 5433")
        registered.embed_catch_up()  # down: no failure, the memory stays pending
        Embedding = application.store.models.Embedding
        assert Embedding.select().count() == 0
        model_server.mode = "ok"
        registered.embed_catch_up()
        assert Embedding.select().count() == 1
    finally:
        tasks.use_app(None)
        application.close()
