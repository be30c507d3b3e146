"""Queue and workers: the session events by status (pending, deferred, running, failed), the
huey queue's own counts, the workers' heartbeat, and a live tail of the log files over
server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging

import peewee as pw
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse
from starlette.routing import Route

from ...errors import UsageError
from ...logreader import LEVELS, LogFollower, at_least, tail_entries
from ...pipeline.events import (
    WORKER_STALE_SECONDS,
    retry_events,
    worker_last_seen,
    worker_seen_recently,
)
from ...times import now
from ..web import redirect, render, store, viewer

log = logging.getLogger(__name__)

NAV = ("Queue", "/queue")

ROWS = 50  # events listed per kind of wait
BACKLOG = 200  # log entries a page shows (and a stream sends) before following
POLL_SECONDS = 0.5  # as `llmem logs --follow`
KEEPALIVE_SECONDS = 15.0  # a comment line now and then, so an idle stream is seen to be alive


def _level(request) -> str | None:
    level = (request.query_params.get("level") or "").upper()
    return level if level in LEVELS else None


def _huey_counts(request) -> tuple[dict[str, int] | None, str | None]:
    queue = viewer(request).queue
    if queue is None:
        return None, "no queue is attached to this viewer (started without the queue: `llmem ui` attaches it)"
    try:
        return queue.counts(), None
    except Exception as exc:  # the queue's own database missing or locked: say so, keep the page
        log.warning("llmem ui: cannot count the queue: %s", exc)
        return None, f"cannot read the queue: {exc.__class__.__name__}: {exc}"


def queue_page(request):
    current_store = store(request)
    Event = current_store.models.Event
    at = now()
    by_status = dict(Event.select(Event.status, pw.fn.COUNT(Event.id)).group_by(Event.status).tuples())
    deferred = (Event.status == "pending") & Event.not_before.is_null(False) & (Event.not_before > at)
    ready = (Event.status == "pending") & (Event.not_before.is_null() | (Event.not_before <= at))
    lists = {
        "running": Event.select().where(Event.status == "running").order_by(Event.started_at.desc()),
        "pending": Event.select().where(ready).order_by(Event.detected_at),
        "scheduled": Event.select().where(deferred).order_by(Event.not_before),
        "failed": Event.select().where(Event.status == "failed").order_by(Event.finished_at.desc(nulls="last")),
    }
    counts = {"pending": Event.select().where(ready).count(), "scheduled": Event.select().where(deferred).count(),
              "running": by_status.get("running", 0), "failed": by_status.get("failed", 0),
              "done": by_status.get("done", 0)}
    seen = worker_last_seen(current_store)
    huey, huey_problem = _huey_counts(request)
    level = _level(request)
    entries = tail_entries(viewer(request).llmem.config, level, BACKLOG)
    return render(request, "queue.html", counts=counts,
                  lists={name: list(query.limit(ROWS)) for name, query in lists.items()},
                  rows=ROWS, huey=huey, huey_problem=huey_problem,
                  heartbeat=seen, worker_alive=worker_seen_recently(current_store),
                  stale_after=WORKER_STALE_SECONDS, now=at, entries=entries, level=level, levels=LEVELS,
                  log_dir=viewer(request).llmem.config.log_dir,
                  queue_attached=viewer(request).queue is not None)


def retry_failed(request):
    """Every failed event back to pending and onto the queue, as `llmem queue retry --failed`."""
    queue = viewer(request).queue
    if queue is None:
        raise UsageError("this viewer has no queue attached, so it cannot retry",
                         hint="`llmem queue retry` from a terminal")
    retried = retry_events(store(request), None)
    for event in retried:
        queue.enqueue_event(event.id)
    return redirect(request, "/queue", f"{len(retried)} failed events queued again" if retried
                    else "No failed event to retry")


def _sse(entry) -> str:
    # One JSON line per event (json escapes newlines, so a traceback stays one data: line).
    return f"event: entry\ndata: {json.dumps(entry.as_dict(), ensure_ascii=False)}\n\n"


async def log_stream(request):
    """The log files as server-sent events: the last entries, then each new one as written."""
    config = viewer(request).llmem.config
    level = _level(request)

    async def events():
        # The follower starts before the backlog is read: an entry written in between is
        # sent twice rather than lost.
        follower = await run_in_threadpool(LogFollower, config)
        backlog = await run_in_threadpool(tail_entries, config, level, BACKLOG)
        yield "retry: 2000\n\n"
        for entry in backlog:
            yield _sse(entry)
        quiet = 0.0
        stopping = getattr(request.app.state, "stopping", lambda: False)  # set by ViewerServer
        while not (stopping() or await request.is_disconnected()):
            fresh = [entry for entry in await run_in_threadpool(follower.poll) if at_least(entry, level)]
            for entry in fresh:
                yield _sse(entry)
            quiet = 0.0 if fresh else quiet + POLL_SECONDS
            if quiet >= KEEPALIVE_SECONDS:
                yield ": still here\n\n"
                quiet = 0.0
            await asyncio.sleep(POLL_SECONDS)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"x-accel-buffering": "no"})


ROUTES = [
    Route("/queue", queue_page),
    Route("/queue/retry-failed", retry_failed, methods=["POST"]),
    Route("/queue/logs/stream", log_stream),
]
