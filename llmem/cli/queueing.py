"""The CLI's door to the queue: the only part of llmem that imports workers (and huey)."""

from __future__ import annotations

_queues: dict[str, tuple] = {}


def open_queue(config):
    """(huey, tasks) for this config's queue (its file, or its Redis URL), built once per process."""
    key = config.queue.url or str(config.queue_path)
    if key not in _queues:
        from workers.app import build_huey
        from workers.tasks import register

        huey = build_huey(config)
        _queues[key] = (huey, register(huey, config))
    return _queues[key]


def reset_queue(app) -> tuple[str | None, list[int]]:
    """Rebuild the queue from the store's event rows: the old queue file (damaged, or just
    lost) is moved aside, a new one made, and every event reconcile would requeue, whatever
    its age, enqueued. Returns (where the old file went, the event ids enqueued)."""

    from ..pipeline.events import events_to_reconcile

    path = app.config.queue_path
    url = app.config.queue.url
    _queues.pop(url or str(path), None)
    moved = None
    if url:
        # A Redis queue has no file to move aside: its waiting tasks are dropped instead
        # (every one of them is an event row that is enqueued again below).
        huey, _ = open_queue(app.config)
        huey.storage.flush_queue()
    elif path.exists():
        from ..times import file_stamp

        moved = path.with_name(f"{path.name}.damaged-{file_stamp()}")
        for suffix in ("", "-wal", "-shm"):  # the main file and its WAL side files, together
            side = path.with_name(path.name + suffix)
            if side.exists():
                side.rename(moved.with_name(moved.name + suffix))
    _, tasks = open_queue(app.config)
    running_after = app.config.pipeline.running_timeout_minutes * 60
    events = events_to_reconcile(app.store, pending_after=0, running_after=running_after)
    for event in events:
        tasks.process_event(event.id)
    return (str(moved) if moved else None), [event.id for event in events]


def open_consumer_queue(app):
    """(huey, tasks) for a consumer in this process, its tasks running with `app`."""
    from workers.tasks import use_app

    use_app(app)
    return open_queue(app.config)


def submit_event(app, adapter: str, session_id: str, kind: str, *, since: float | None = None) -> int:
    """Record a session event in the store, then enqueue its task; return the event id.

    The row is written first: if enqueueing fails or the worker dies, reconcile finds it.
    `since`: when the turn the event is about began (one recorded after it is reused).
    """
    from ..pipeline.events import record_event, waits_for_later

    event, is_new = record_event(app.store, adapter, session_id, kind, since=since)
    # A moment that joins a deferred event still runs now: its heuristics cost no LLM call.
    if is_new or waits_for_later(event):
        _, tasks = open_queue(app.config)
        tasks.process_event(event.id)
    return event.id


def viewer_queue(app):
    """The queue as the web viewer may use it (retry an event, count waiting tasks): functions
    handed to `llmem.ui`, which cannot import the queue itself."""
    from ..ui.web import QueueAccess

    def enqueue_event(event_id: int) -> None:
        _, tasks = open_queue(app.config)
        tasks.process_event(event_id)

    def counts() -> dict[str, int]:
        huey, _ = open_queue(app.config)
        return {"pending": huey.pending_count(), "scheduled": huey.scheduled_count()}

    return QueueAccess(enqueue_event=enqueue_event, counts=counts)
