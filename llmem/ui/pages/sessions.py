"""Sessions: the agents' sessions llmem has heard of, their events with status and error, the
memories each session produced, and retry for a failed event."""

from __future__ import annotations

import logging
import time

import peewee as pw
from starlette.routing import Route

from ...adapters.registry import agent_names
from ...db.models import EPISODE_SOURCE
from ...errors import NotFound, UsageError
from ...pipeline.events import retry_events
from ..web import page_number, redirect, render, store, viewer

log = logging.getLogger(__name__)

NAV = ("Sessions", "/sessions")

PAGE_SIZE = 50
# A session's page lists this many of its memories, newest first (the Memories page has the rest).
SESSION_MEMORIES = 200
SESSION_EPISODES = 300  # the session page shows the conversation's first episodes


def sessions(request):
    """Every session llmem knows, latest activity first: those it recorded events for and
    those an extraction read without one (a backfill, an inline hook), with their event
    counts (failed and waiting apart) and memory counts.

    Sessions number in the thousands, not millions: the two grouped reads are merged here
    rather than in a UNION the storage boundary would have to say for every backend."""
    current_store = store(request)
    Event, Memory = current_store.models.Event, current_store.models.Memory
    Cursor = current_store.models.SessionCursor
    agent = request.query_params.get("agent") or None
    page = page_number(request)
    failed = pw.fn.SUM(pw.Case(None, [(Event.status == "failed", 1)], 0))
    waiting = pw.fn.SUM(pw.Case(None, [(Event.status.in_(("pending", "running")), 1)], 0))
    grouped = (Event.select(Event.adapter, Event.session_id, pw.fn.COUNT(Event.id).alias("events"),
                            failed.alias("failed"), waiting.alias("waiting"),
                            pw.fn.MAX(Event.detected_at).alias("last_seen"))
               .group_by(Event.adapter, Event.session_id))
    cursors = Cursor.select(Cursor.adapter, Cursor.session_id, Cursor.project, Cursor.updated_at)
    if agent:
        grouped = grouped.where(Event.adapter == agent)
        cursors = cursors.where(Cursor.adapter == agent)
    known: dict[tuple[str, str], dict] = {}
    for row in grouped.dicts():
        known[(row["adapter"], row["session_id"])] = {**row, "project": None}
    for adapter, session_id, project, updated_at in cursors.tuples():
        row = known.setdefault((adapter, session_id), {
            "adapter": adapter, "session_id": session_id, "events": 0, "failed": 0, "waiting": 0,
            "last_seen": updated_at})
        row["project"] = project
        row["last_seen"] = max(row["last_seen"] or 0, updated_at or 0)
    ordered = sorted(known.values(), key=lambda r: (-(r["last_seen"] or 0), r["session_id"]))
    rows = ordered[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
    ids = [row["session_id"] for row in rows]
    memory_counts = dict(Memory.select(Memory.session_id, pw.fn.COUNT(Memory.id))
                         .where(Memory.session_id.in_(ids)).group_by(Memory.session_id).tuples()) if ids else {}
    for row in rows:
        row["memories"] = memory_counts.get(row["session_id"], 0)
    _add_titles(request, rows)
    agents = {row[0] for row in Event.select(Event.adapter).distinct().tuples()}
    agents |= {row[0] for row in Cursor.select(Cursor.adapter).distinct().tuples()}
    return render(request, "sessions.html", rows=rows, total=len(ordered), agent=agent, page=page,
                  page_size=PAGE_SIZE, agents=sorted(agents | set(agent_names())))


# A title is read from the agent's own store (its adapter) once and kept for the viewer's
# life; one not found is looked for again after this long (the list refreshes every 5 s).
TITLE_RETRY_SECONDS = 60.0
TITLES_KEPT = 5000


def _add_titles(request, rows: list[dict]) -> None:
    """row["title"]: the agent's title of each session (None when it has none or is gone)."""
    state = request.app.state
    if not hasattr(state, "session_titles"):
        state.session_titles = {}
    cache: dict[tuple[str, str], tuple[float, str | None]] = state.session_titles
    if len(cache) > TITLES_KEPT:
        cache.clear()
    config = viewer(request).llmem.config
    at = time.monotonic()
    for row in rows:
        key = (row["adapter"], row["session_id"])
        known = cache.get(key)
        if known is None or (known[1] is None and at - known[0] > TITLE_RETRY_SECONDS):
            known = cache[key] = (at, _agent_title(config, *key))
        row["title"] = known[1]


def _agent_title(config, adapter: str, session_id: str) -> str | None:
    from ...adapters import adapter_from_config

    try:
        return adapter_from_config(config, adapter).read_transcript(session_id).title or None
    except Exception as exc:  # a session the agent deleted, a store it holds locked: no title
        log.debug("no title for %s session %s: %s", adapter, session_id, exc)
        return None


def session_page(request):
    current_store = store(request)
    models = current_store.models
    session_id = request.path_params["session_id"]
    events = list(models.Event.select().where(models.Event.session_id == session_id)
                  .order_by(models.Event.detected_at.desc(), models.Event.id.desc()))
    cursors = list(models.SessionCursor.select().where(models.SessionCursor.session_id == session_id))
    Memory = models.Memory
    produced = Memory.select().where((Memory.session_id == session_id) & (Memory.source != EPISODE_SOURCE))
    memory_count = produced.count()
    memories = list(produced.order_by(Memory.created_at.desc(), Memory.seq.desc()).limit(SESSION_MEMORIES))
    # The conversation as llmem keeps it: its episodes in the order they were said.
    said = Memory.select().where((Memory.session_id == session_id) & (Memory.source == EPISODE_SOURCE))
    episode_count = said.count()
    episodes = list(said.order_by(Memory.seq).limit(SESSION_EPISODES))
    if not (events or cursors or memory_count or episode_count):
        raise NotFound(f"llmem has no session {session_id!r}", hint="the Sessions page lists them")
    adapter = (events[0].adapter if events else cursors[0].adapter if cursors else None)
    title = _agent_title(viewer(request).llmem.config, adapter, session_id) if adapter else None
    return render(request, "session.html", session_id=session_id, title=title, events=events,
                  cursors=cursors, memories=memories, memory_count=memory_count, episodes=episodes,
                  episode_count=episode_count, queue_attached=viewer(request).queue is not None)


def retry(request):
    """A failed event back to pending and onto the queue, as `llmem queue retry ID` does."""
    current_store = store(request)
    Event = current_store.models.Event
    event_id = request.path_params["event_id"]
    # An id past SQLite's 64-bit integers names no event (binding it would raise a 500).
    event = Event.get_or_none(Event.id == event_id) if event_id < 2**63 else None
    if event is None:
        raise NotFound(f"no event {request.path_params['event_id']}", hint="the Sessions page lists them")
    back = f"/sessions/{event.session_id}"
    if event.status != "failed":
        return redirect(request, back, f"Event #{event.id} is {event.status}: only a failed event is retried",
                        "error")
    queue = viewer(request).queue
    if queue is None:
        raise UsageError("this viewer has no queue attached, so it cannot retry",
                         hint=f"`llmem queue retry {event.id}`")
    for retried in retry_events(current_store, [event.id]):
        queue.enqueue_event(retried.id)
    return redirect(request, back, f"Event #{event.id} is queued again")


ROUTES = [
    Route("/sessions", sessions),
    Route("/sessions/{session_id}", session_page),
    Route("/sessions/events/{event_id:int}/retry", retry, methods=["POST"]),
]
