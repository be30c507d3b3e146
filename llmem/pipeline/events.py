"""Session events as rows: recorded before they are enqueued, claimed, finished, reconciled.

Every task is idempotent (extraction works from a per-session cursor), so running an event
twice — after a worker was killed, or by reconcile — adds nothing twice. An event belongs to
the machine that recorded it (llmem/machine.py): on a store several machines share, each
machine's worker claims, reconciles and retries only its own, since only it can read the
session's transcript, and each machine's worker beats its own heartbeat.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

from ..db.models import Event  # for type hints; queries use store.models
from ..errors import LlmemError, UsageError
from ..machine import machine_id
from ..processes import process_is_running, process_state
from ..text import error_line
from ..times import now
from .kinds import EventKind

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5


def record_event(store, adapter: str, session_id: str, kind: str, *,
                 since: float | None = None) -> tuple[Event, bool]:
    """Record a moment; an identical event still waiting is reused, and so is one recorded at
    or after `since` (epoch s, when the turn it is about began) that has not failed: the same
    moment told twice (Codex's Stop hook and its notify program). Returns (event, is_new)."""
    Event = store.models.Event
    if kind not in tuple(EventKind):
        raise UsageError(f"unknown event kind {kind!r}", hint="use one of: " + ", ".join(EventKind))
    with store.db.atomic():
        waiting = (Event.select().where((Event.adapter == adapter) & (Event.session_id == session_id)
                                        & (Event.kind == kind) & (Event.status == "pending") & _ours(Event))
                   .order_by(Event.id).first())
        if waiting is None and since is not None:
            waiting = recorded_since(store, adapter, session_id, kind, since)
        if waiting is not None:
            return waiting, False
        return Event.create(adapter=adapter, session_id=session_id, kind=kind, detected_at=now(),
                            machine=machine_id()), True


def _ours(Event):
    """The condition that an event is this machine's (or was recorded before machines were)."""
    return (Event.machine == machine_id()) | Event.machine.is_null()


def waits_for_later(event: Event) -> bool:
    """Whether a pending event was deferred to a time still ahead (the session's extraction
    interval, the token budget): a moment joining it must still be run now, for the
    heuristics that cost no LLM call (its LLM pass keeps its turn)."""
    return event.status == "pending" and event.not_before is not None and event.not_before > now()


def recorded_since(store, adapter: str, session_id: str, kind: str, since: float) -> Event | None:
    """The first `kind` event of the session recorded at or after `since` that has not failed
    (a hook's, or the watcher's), if any."""
    Event = store.models.Event
    return (Event.select().where((Event.adapter == adapter) & (Event.session_id == session_id)
                                 & (Event.kind == kind) & (Event.detected_at >= since)
                                 & (Event.status != "failed") & _ours(Event))
            .order_by(Event.id).first())


def claim_event(store, event_id: int, *, running_after: float | None = None) -> Event | None:
    """Mark an event running (attempts + 1) by this process; None when it is done, unknown,
    or another machine's (a task delivered through a queue that machines share).

    With `running_after` (seconds), an event another worker started less than that long ago
    is left to it (None): reconcile and a scheduled retry may deliver the same event twice,
    and one run at a time is enough. Older runs are presumed lost with their worker, and so
    is a run whose worker on this host has died (its lost attempt is not counted).
    """
    Event = store.models.Event
    with store.db.atomic():
        event = Event.get_or_none((Event.id == event_id) & _ours(Event))
        if event is None or event.status == "done":
            return None
        orphaned = event.status == "running" and owner_died(event)
        if (running_after is not None and event.status == "running" and not orphaned
                and event.started_at is not None and event.started_at > now() - running_after):
            return None
        event.status, event.started_at = "running", now()
        event.owner_pid, event.owner_started_at, event.owner_host = this_process()
        if not orphaned:
            event.attempts += 1
        event.save()
        return event


def this_process() -> tuple[int, float, str]:
    """(pid, start time, host) of this process, as recorded in the events it claims."""
    pid = os.getpid()
    state = process_state(pid)
    # Without /proc, now is a bound on when this process started that a later holder of
    # the same pid cannot meet either.
    return pid, state[1] if state else now(), socket.gethostname()


def owner_died(event: Event) -> bool:
    """Whether the process that claimed the event is known to be gone: on this host and dead
    (or its pid now belongs to a later process). An owner on another host is never known."""
    if event.owner_pid is None or event.owner_host != socket.gethostname():
        return False
    return not process_is_running(event.owner_pid, event.owner_started_at or 0.0)


def finish_event(store, event_id: int, result: dict | None = None) -> None:
    Event = store.models.Event
    with store.db.atomic():
        Event.update(status="done", finished_at=now(), last_error=None, result=result).where(
            Event.id == event_id).execute()


def fail_event(store, event_id: int, error: str, *, final: bool) -> None:
    """Record an error; the event goes back to pending unless this was its last chance."""
    Event = store.models.Event
    with store.db.atomic():
        event = Event.get_or_none(Event.id == event_id)
        if event is None:
            return
        event.last_error = error[:2000]
        event.status = "failed" if final or event.attempts >= MAX_ATTEMPTS else "pending"
        event.finished_at = now() if event.status == "failed" else None
        event.save()


def release_event(store, event_id: int) -> None:
    """A running event whose worker was stopped goes back to pending, attempt not counted."""
    Event = store.models.Event
    with store.db.atomic():
        Event.update(status="pending", attempts=Event.attempts - 1, not_before=now(),
                     last_error="interrupted by a worker stop; requeued").where(
            (Event.id == event_id) & (Event.status == "running")).execute()


def defer_event(store, event_id: int, until: float, reason: str) -> None:
    """Put an event back to pending, not to run before `until` (reconcile picks it up)."""
    Event = store.models.Event
    with store.db.atomic():
        Event.update(status="pending", not_before=until, last_error=reason,
                     attempts=Event.attempts - 1).where(Event.id == event_id).execute()


def release_orphaned_events(store) -> list[int]:
    """Running events whose worker on this host died (kill -9, a crash) go back to pending
    at once, the lost attempt not counted (like `release_event`); return their ids."""
    Event = store.models.Event
    host = socket.gethostname()
    released = []
    with store.db.atomic():
        for event in Event.select().where((Event.status == "running") & (Event.owner_host == host)
                                          & Event.owner_pid.is_null(False) & _ours(Event)):
            if not owner_died(event):
                continue
            Event.update(status="pending", attempts=Event.attempts - 1, not_before=now(),
                         last_error=f"its worker (pid {event.owner_pid}) died; requeued").where(
                (Event.id == event.id) & (Event.status == "running")
                & (Event.owner_pid == event.owner_pid)).execute()
            released.append(event.id)
    if released:
        log.info("events %s: their worker died; back to pending", released)
    return released


def events_to_reconcile(store, *, pending_after: float, running_after: float) -> list[Event]:
    """This machine's events whose task was lost: pending for long, running under a worker
    on this host that died (released to pending first), or running longer than any task runs
    (a worker whose death this host cannot see)."""
    release_orphaned_events(store)
    Event = store.models.Event
    at = now()
    return list(Event.select().where(_ours(Event) & (
        # pending with no task for long, or released / deferred until a time now passed
        ((Event.status == "pending") & (
            (Event.not_before.is_null() & (Event.detected_at < at - pending_after))
            | (Event.not_before <= at)))
        | ((Event.status == "running") & (Event.started_at < at - running_after)))
    ).order_by(Event.id))


def retry_events(store, event_ids: list[int] | None = None) -> list[Event]:
    """Put this machine's failed events (or the given ones of its events) back to pending;
    return them."""
    Event = store.models.Event
    with store.db.atomic():
        query = Event.select().where((Event.status == "failed") if event_ids is None else Event.id.in_(event_ids))
        query = query.where(_ours(Event))
        events = list(query)
        for event in events:
            event.status, event.attempts, event.not_before = "pending", 0, None
            event.save()
    return events


# Settings, each with ":<machine id>" after it: a worker on another machine sharing the store
# runs none of this machine's events, so its beat must not make this machine's hooks queue.
WORKER_HEARTBEAT_KEY = "worker_seen_at"
WORKER_OWNER_KEY = "worker_owner"  # {"pid", "started_at", "host"} of the consumer that beat last
WORKER_STALE_SECONDS = 180  # a live consumer beats every minute


def worker_heartbeat(store, at: float | None = None) -> None:
    """Say a consumer is alive (hooks enqueue only when one is), and which process it is."""
    import json

    from ..db.settings import set_setting

    pid, started_at, host = this_process()
    with store.db.atomic():
        set_setting(store.db, _this_machines(WORKER_HEARTBEAT_KEY), repr(now() if at is None else at))
        set_setting(store.db, _this_machines(WORKER_OWNER_KEY),
                    json.dumps({"pid": pid, "started_at": started_at, "host": host}))


def _this_machines(key: str) -> str:
    return f"{key}:{machine_id()}"


def worker_last_seen(store) -> float | None:
    """When this machine's consumer last beat (None: never)."""
    from ..db.settings import get_setting

    seen = get_setting(store.db, _this_machines(WORKER_HEARTBEAT_KEY))
    return float(seen) if seen is not None else None


def worker_seen_recently(store) -> bool:
    """A consumer beat within the window and is not known to be dead: after a `kill -9` of
    the worker on this host, hooks see it at once (pid + start time) and run the work without
    it, rather than queueing for nobody until the heartbeat goes stale."""
    from ..db.settings import get_setting

    seen = worker_last_seen(store)
    if seen is None or now() - seen >= WORKER_STALE_SECONDS:
        return False
    return not _worker_died(get_setting(store.db, _this_machines(WORKER_OWNER_KEY)))


def _worker_died(owner_text: str | None) -> bool:
    import json

    try:
        owner = json.loads(owner_text) if owner_text else None
        pid, started_at, host = int(owner["pid"]), float(owner["started_at"]), owner["host"]
    except (ValueError, TypeError, KeyError):  # written by an older llmem, or damaged: unknown
        return False
    return host == socket.gethostname() and not process_is_running(pid, started_at)


@dataclass
class EventOutcome:
    event_id: int
    status: str  # done | failed | pending | skipped
    result: dict | None = None
    error: str | None = None
    seconds: float = 0.0
    session_id: str | None = None
    kind: str | None = None
    retry_at: float | None = None  # pending: when the event may run again


def run_event(app, event_id: int, *, transient: tuple[type[BaseException], ...] = ()) -> EventOutcome:
    """Process one recorded event through the session handler, recording the outcome.

    Errors in `transient` (embedder or LLM down, a locked store) leave the event pending and
    are re-raised so the queue can retry with backoff; any other error fails the event.
    """
    from .handlers import handle_session_event

    started = time.perf_counter()
    event = claim_event(app.store, event_id,
                        running_after=app.config.pipeline.running_timeout_minutes * 60)
    if event is None:
        return EventOutcome(event_id, "skipped")
    scheduled_for = event.not_before  # a deferred event already has its retry scheduled then
    llm_allowed_at = _next_llm_extraction(app, event)
    if llm_allowed_at is not None:
        return _extract_heuristics_now(app, event, llm_allowed_at, started, scheduled_for)
    try:
        # The block would be dropped below (each session start builds its own): not built.
        result = handle_session_event(app, event.kind, event.session_id, adapter_name=event.adapter,
                                      with_context=False)
    except transient as exc:
        fail_event(app.store, event_id, error_line(exc), final=False)
        raise
    except Exception as exc:
        fail_event(app.store, event_id, error_line(exc), final=_can_never_succeed(exc))
        log.warning("event %s (%s %s) failed: %s", event_id, event.kind, event.session_id, error_line(exc))
        return EventOutcome(event_id, "failed", error=error_line(exc),
                            seconds=time.perf_counter() - started, session_id=event.session_id,
                            kind=event.kind)
    if result.deferred_until:
        defer_event(app.store, event_id, result.deferred_until, result.deferred_reason)
        return EventOutcome(event_id, "pending", result=result.as_json(),
                            seconds=time.perf_counter() - started, session_id=event.session_id,
                            kind=event.kind, retry_at=_unless_scheduled(result.deferred_until, scheduled_for))
    summary = result.as_json(with_context=False)
    finish_event(app.store, event_id, summary)
    return EventOutcome(event_id, "done", result=summary, seconds=time.perf_counter() - started,
                        session_id=event.session_id, kind=event.kind)


def _next_llm_extraction(app, event: Event, at: float | None = None) -> float | None:
    """When this idle event may call the LLM, if the session's last extraction was too recent.

    Never later than one interval from `at` (now): after the clock is set back, the last
    extraction's stamp lies in the future, and waiting for stamp + interval would defer the
    LLM by the size of the jump."""
    import peewee as pw

    from ..db.queries import metadata_equals

    Event = app.store.models.Event
    interval = app.config.pipeline.min_extraction_interval_seconds
    if event.kind != "idle" or interval <= 0 or app.config.llm.provider == "none":
        return None
    # The interval spaces LLM passes: it runs from the last extraction that reached the LLM.
    # With no LLM reachable, each moment's heuristics-only pass runs at once.
    used_llm = metadata_equals(Event.result, "steps.extract.result.used_llm", True)
    last = (Event.select(pw.fn.MAX(Event.finished_at))
            .where((Event.adapter == event.adapter) & (Event.session_id == event.session_id)
                   & Event.kind.in_(("idle", "compacting")) & (Event.status == "done")
                   & used_llm & (Event.id != event.id)).scalar())
    at = now() if at is None else at
    if last is None or at - last >= interval:
        return None
    return min(last, at) + interval


def _unless_scheduled(retry_at: float, scheduled_for: float | None) -> float | None:
    """The retry to schedule, or None when the event's retry is already scheduled then (a
    moment that joined a deferred event must not add a second run of its LLM pass)."""
    return None if scheduled_for is not None and abs(retry_at - scheduled_for) < 1e-3 else retry_at


def _extract_heuristics_now(app, event: Event, llm_allowed_at: float, started: float,
                            scheduled_for: float | None = None) -> EventOutcome:
    """Within the interval: what costs no LLM call runs now, the LLM pass waits its turn."""
    from ..capture.extract import extract_session

    try:
        report = extract_session(app, event.session_id, adapter_name=event.adapter,
                                 use_llm=False, hold_cursor=True)
        summary = {"heuristic_memories": report.memories_added, "deferred_until": llm_allowed_at}
    except Exception as exc:  # the LLM pass later will try again
        log.warning("event %s: heuristic extraction failed: %s", event.id, error_line(exc))
        summary = {"deferred_until": llm_allowed_at}
    defer_event(app.store, event.id, llm_allowed_at, "waiting for the session's extraction interval")
    return EventOutcome(event.id, "pending", result=summary, seconds=time.perf_counter() - started,
                        session_id=event.session_id, kind=event.kind,
                        retry_at=_unless_scheduled(llm_allowed_at, scheduled_for))


def _can_never_succeed(exc: Exception) -> bool:
    """Errors a retry cannot cure: bugs, bad input, a session no store holds, an unknown adapter."""
    from ..adapters.base import InvalidSessionId, SessionNotFound, UnknownAdapter

    if isinstance(exc, SessionNotFound | UnknownAdapter | InvalidSessionId | UsageError):
        return True
    return not isinstance(exc, LlmemError)

