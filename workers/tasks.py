"""Thin huey tasks over the llmem library, registered on a huey built from config.

Tasks are attached by `register(huey)` rather than at import time, so the queue file comes
from the config (and LLMEM_HOME) of the process that builds it.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from datetime import datetime
from types import SimpleNamespace

import peewee
from huey import crontab
from huey.signals import SIGNAL_INTERRUPTED

from llmem.app import App
from llmem.errors import LLMUnavailable
from llmem.providers.embedders import EmbedderUnavailable

log = logging.getLogger("workers.tasks")

# Errors worth retrying with backoff: a model server down or restarting, a store busy.
TRANSIENT = (EmbedderUnavailable, LLMUnavailable, peewee.OperationalError, sqlite3.OperationalError)

_app: App | None = None


def current_app() -> App:
    """The process's App (config, store, embedder), opened on first use."""
    global _app
    if _app is None:
        _app = App()
    return _app


def use_app(app: App | None) -> None:
    """Make tasks use this App (tests, `llmem run`)."""
    global _app
    _app = app


def process_event(event_id: int) -> dict:
    """Extract / introspect / inject for one recorded session event."""
    from llmem.pipeline.events import run_event

    outcome = run_event(current_app(), event_id, transient=TRANSIENT)
    log.info("session=%s event=%s kind=%s duration=%.0fms outcome=%s%s", outcome.session_id or "-",
             event_id, outcome.kind or "-", outcome.seconds * 1000, outcome.status,
             f" error={outcome.error}" if outcome.error else "")
    return {"event_id": event_id, "status": outcome.status, "error": outcome.error,
            "retry_at": outcome.retry_at}


def embed_pending() -> dict:
    """Embed memories that have no current vector."""
    from llmem.vectors import embed_pending as run

    app = current_app()
    if not app.embedder.available:
        return {"embedded": 0}
    started = time.perf_counter()
    count = run(app.store, app.embedder)
    log.info("task=embed_pending embedded=%d duration=%.0fms", count, (time.perf_counter() - started) * 1000)
    return {"embedded": count}


def catch_up_embeddings() -> dict:
    """The periodic catch-up: vectors for whatever is pending (written while the embedder was
    down, by a dream, an import). A down embedder is no failure: the next period tries again."""
    from llmem.vectors import catch_up

    app = current_app()
    started = time.perf_counter()
    count, stopped = catch_up(app.store, app.embedder)
    if count or stopped:
        log.info("task=embed_catch_up embedded=%d duration=%.0fms%s", count,
                 (time.perf_counter() - started) * 1000, f" paused={stopped}" if stopped else "")
    return {"embedded": count, "paused": stopped}


def dream(apply: bool = True) -> dict:
    """The consolidation (the same entry point as `llmem dream --apply`)."""
    from llmem.dream.lock import DreamLocked
    from llmem.dream.sweep import run_dream

    app = current_app()
    started = time.perf_counter()
    try:
        outcome = run_dream(app.store, app.config, apply=apply)
    except DreamLocked as exc:
        log.info("task=dream skipped: %s", exc.message)
        return {"skipped": exc.message}
    log.info("task=dream duration=%.0fms", (time.perf_counter() - started) * 1000)
    if apply:  # merges and insights are new memories: searchable by meaning at once
        catch_up_embeddings()
    return {"run_id": getattr(outcome, "run_id", None)}


def scheduled_dream(at: datetime | None = None) -> dict:
    """The periodic dream: nothing while `llmem dream off` (or dream.enabled: false) holds,
    and nothing when another machine sharing the store has run this slot's dream."""
    from llmem.dream.lock import claim_scheduled_slot
    from llmem.dream.switch import dream_switch, dream_zone
    from llmem.machine import machine_id

    app = current_app()
    switch = dream_switch(app.store, app.config)
    if not switch.enabled:
        log.info("task=dream skipped: dreaming is off (%s)", switch.source)
        return {"skipped": "dreaming is off"}
    # huey runs this in the minute the schedule fires: that minute, read in the dream's
    # zone, names the slot on every machine whatever its own zone.
    moment = (at or datetime.now().astimezone()).astimezone(dream_zone(app.config))
    slot = moment.replace(second=0, microsecond=0).isoformat(timespec="minutes")
    taken_by = claim_scheduled_slot(app.store.db, slot, machine_id())
    if taken_by is not None:
        log.info("task=dream skipped: the %s dream ran on machine %s", slot, taken_by)
        return {"skipped": f"the {slot} dream ran on machine {taken_by}"}
    return dream()


def reconcile(enqueue_event=None) -> dict:
    """Re-enqueue events whose task was lost (killed worker) or left waiting too long."""
    from llmem.pipeline.events import events_to_reconcile

    app = current_app()
    pipeline = app.config.pipeline
    stuck = events_to_reconcile(app.store, pending_after=pipeline.reconcile_pending_seconds,
                                running_after=pipeline.running_timeout_minutes * 60)
    for event in stuck:
        enqueue_event(event.id)
    if stuck:
        log.info("task=reconcile requeued=%d", len(stuck))
    return {"requeued": [e.id for e in stuck]}


def heartbeat() -> None:
    """Tell hooks a consumer is alive, so they enqueue instead of running work themselves."""
    from llmem.pipeline.events import worker_heartbeat

    worker_heartbeat(current_app().store)


def register(huey, config) -> SimpleNamespace:
    """Attach llmem's tasks and periodic jobs to `huey`; return them by name."""
    pipeline = config.pipeline
    tasks = SimpleNamespace()
    def process_event_and_reschedule(event_id: int) -> dict:
        outcome = process_event(event_id)
        if outcome["retry_at"]:  # deferred (extraction interval, token budget): come back then
            tasks.process_event.schedule((event_id,), eta=datetime.fromtimestamp(outcome["retry_at"]))
        return outcome

    tasks.process_event = huey.task(retries=4, retry_delay=15, retry_backoff=2,
                                    name="process_event")(process_event_and_reschedule)
    tasks.embed_pending = huey.task(retries=3, retry_delay=30, retry_backoff=2,
                                    name="embed_pending")(embed_pending)
    # No huey.lock_task here: its lock outlives a killed worker and refuses every later dream.
    # run_dream's DreamLock records its owner (pid, host, start) and takes over a dead one's.
    tasks.dream = huey.task(name="dream")(dream)
    tasks.reconcile = huey.task(name="reconcile")(lambda: reconcile(tasks.process_event))
    every = max(1, int(pipeline.reconcile_interval_minutes))
    tasks.reconcile_periodic = huey.periodic_task(crontab(minute=f"*/{every}"), name="reconcile_periodic")(
        lambda: reconcile(tasks.process_event))
    tasks.embed_catch_up = huey.periodic_task(crontab(minute=f"*/{every}"), name="embed_catch_up")(
        catch_up_embeddings)
    tasks.heartbeat = huey.periodic_task(crontab(minute="*"), name="heartbeat")(heartbeat)

    @huey.signal(SIGNAL_INTERRUPTED)
    def requeue_interrupted(signal_name, task, *args):
        # SIGTERM interrupts a running task and huey drops it: put its event back to
        # pending so the next consumer's reconcile runs it again (tasks are idempotent).
        if task.name == "process_event" and task.args:
            from llmem.pipeline.events import release_event

            release_event(current_app().store, task.args[0])

    from llmem.dream.schedule import ZonedTrigger
    from llmem.dream.switch import dream_zone

    trigger = ZonedTrigger(config.dream.schedule, dream_zone(config))
    tasks.dream_periodic = huey.periodic_task(trigger, name="dream_periodic")(scheduled_dream)
    return tasks


TASK_NAMES = ("process_event", "embed_pending", "dream", "reconcile")
