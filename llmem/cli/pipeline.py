"""Pipeline commands: watch, worker, run, enqueue, queue, logs."""

from __future__ import annotations

import signal
import sys
import threading
import time

import click

from ..pipeline.kinds import EventKind
from .output import MAX_ROW_ID, bounded_int, json_option, print_json
from .session import ADAPTER_CHOICE
from .ui import NO_BROWSER_OPTION, port_option, prepare_viewer


def _start_watcher(app):
    from ..pipeline.spool import Spool, default_spool_path
    from ..pipeline.watcher import SessionWatcher
    from .queueing import submit_event

    # What the store cannot take while its server is away waits in the spool, on this disk.
    spool = Spool(default_spool_path(), lambda moment: submit_event(
        app, moment.adapter, moment.session_id, moment.kind, since=moment.since))
    watcher = SessionWatcher(app.config, lambda adapter, sid, kind: submit_event(app, adapter, sid, kind),
                             store=lambda: app.store, spool=spool)
    watcher.start()
    return watcher


# How often `worker` and `run` ask again for a store whose server does not answer: a refused
# connection costs nothing, one that times out takes store.connect_timeout_seconds besides.
STORE_RETRY_SECONDS = 2.0


def _store_when_it_answers(app, command: str) -> bool:
    """Open the store, waiting for it while its server does not answer (down, refused, timed
    out), as `llmem watch` does: started at boot before the server or the network, or on a
    laptop away from it, the worker starts once the store answers, instead of exiting for
    systemd to restart it every few seconds. Says so once, with the fix. Any other failure
    (a refused password, a missing database, no pgvector) is raised: waiting would not fix it.
    SIGINT or SIGTERM while waiting stops cleanly: returns False."""
    from ..errors import StoreUnreachable

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    said = None
    try:
        while True:
            try:
                _ = app.store
            except StoreUnreachable as exc:
                if exc.message != said:
                    click.echo(f"llmem {command}: {exc.message}; waiting for it (asking again every "
                               f"{STORE_RETRY_SECONDS:g} s; Ctrl-C stops)\n  hint: {exc.hint}", err=True)
                    said = exc.message
                if stop.wait(STORE_RETRY_SECONDS):
                    click.echo(f"llmem {command}: stopped while waiting for the store", err=True)
                    return False
                continue
            if stop.is_set():  # asked to stop while the store was opening
                return False
            if said is not None:
                click.echo(f"llmem {command}: the store answers; starting", err=True)
            return True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# Ctrl-C (SIGINT) lets in-flight tasks finish for this long, then stops like SIGTERM: the
# interrupted events go back to pending (tasks are idempotent), so a stop never waits on a
# slow LLM call.
STOP_GRACE_SECONDS = 5.0


def _consumer(app, workers: int):
    from ..pipeline.events import worker_heartbeat
    from .queueing import open_consumer_queue

    huey, tasks = open_consumer_queue(app)
    # Results and locks an older llmem left in queue.db: nothing reads or takes them now.
    huey.storage.flush_results()
    worker_heartbeat(app.store)
    tasks.reconcile()  # events a killed worker left behind go back on the queue first
    return huey.create_consumer(workers=workers, worker_type="thread", periodic=True,
                                check_worker_health=True, initial_delay=0.1, backoff=1.15,
                                max_delay=2.0, shutdown_timeout=STOP_GRACE_SECONDS)


@click.command()
@click.pass_obj
def watch(app):
    """Watch the agents' session stores and enqueue lifecycle events (foreground)."""
    from ..errors import StoreError
    from ..logconfig import setup_file_logging

    log_path = setup_file_logging(app.config, "watch")
    try:
        _ = app.store  # open (and migrate) before the first event arrives
    except StoreError as exc:  # its server away: watch anyway, the moments wait in the spool
        click.echo(f"llmem watch: {exc.message}; watching anyway, what it sees waits on this disk "
                   "until the store answers", err=True)
    watcher = _start_watcher(app)
    click.echo(f"llmem watch: {watcher.describe()}; log {log_path}; Ctrl-C stops", err=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    watcher.stop()


@click.command()
@click.option("-w", "--workers", type=click.IntRange(1, 64), help="Worker threads (default: pipeline.workers).")
@click.pass_obj
def worker(app, workers):
    """Run the queue consumer: session events, embeddings, reconcile, nightly dream."""
    from ..logconfig import setup_file_logging
    from .resident import start_resident

    setup_file_logging(app.config, "worker")
    if not _store_when_it_answers(app, "worker"):
        return
    resident = None
    try:
        consumer = _consumer(app, workers or app.config.pipeline.workers)
        resident = start_resident(app)
        consumer.run()  # handles SIGINT (finish in-flight tasks, up to the grace) and SIGTERM itself
    except KeyboardInterrupt:
        pass  # Ctrl-C during start-up, before the consumer's own handler: a clean stop all the same
    finally:
        if resident is not None:
            resident.stop()


@click.command()
@click.option("-w", "--workers", type=click.IntRange(1, 64), help="Worker threads (default: pipeline.workers).")
@click.option("--ui", "with_ui", is_flag=True, help="Serve the web viewer too (its URL is printed).")
@port_option("--ui-port")
@NO_BROWSER_OPTION
@click.pass_obj
def run(app, workers, with_ui, port, no_browser):
    """Watcher + workers + scheduler in one foreground process (the everyday command)."""
    from ..logconfig import setup_file_logging

    log_path = setup_file_logging(app.config, "run")
    from ..redact import masked_url
    from .resident import start_resident

    # The watcher starts once the store answers too: its saved states say what is new, so the
    # turns finished while waiting are caught up then (as a `llmem watch` started so does).
    if not _store_when_it_answers(app, "run"):
        return
    watcher = viewer = resident = None
    try:
        consumer = _consumer(app, workers or app.config.pipeline.workers)
        watcher = _start_watcher(app)
        resident = start_resident(app)
        if with_ui:
            viewer = prepare_viewer(app, port, open_browser=not no_browser).start()
        click.echo(f"llmem run: {watcher.describe()}\n  store {masked_url(str(app.config.store_location))}, "
                   f"queue {app.config.queue_path}, log {log_path}; Ctrl-C stops", err=True)
        consumer.run()
    except KeyboardInterrupt:
        # Ctrl-C during start-up, before the consumer put in its own handler (which stops it
        # cleanly from then on): the same clean stop, not a traceback and exit 1.
        pass
    finally:
        if watcher is not None:
            watcher.stop()
        if viewer is not None:
            viewer.stop()
        if resident is not None:
            resident.stop()


@click.command()
@click.argument("task", type=click.Choice(["process_event", "embed_pending", "dream", "reconcile",
                                           *(kind.value for kind in EventKind)]))
@click.argument("args", nargs=-1)
@click.option("--adapter", type=ADAPTER_CHOICE,
              help="For session events: the agent (default: the one whose store holds the session).")
@json_option("Print the task id as JSON.")
@click.pass_obj
def enqueue(app, task, args, adapter, as_json):
    """Put a task on the queue and print its id (a session event takes a SESSION_ID)."""
    from ..errors import UsageError
    from .queueing import open_queue, submit_event

    huey, tasks = open_queue(app.config)
    event_id = None
    if task in tuple(EventKind):
        if len(args) != 1:
            raise UsageError(f"enqueue {task} takes one SESSION_ID", hint=f"llmem enqueue {task} ses_abc123")
        from ..adapters import resolve_adapter

        owner = resolve_adapter(app.config, args[0], adapter).name
        event_id = submit_event(app, owner, args[0], task)
        task_id = f"event:{event_id}"
    elif task == "process_event":
        if len(args) != 1 or not args[0].isdigit():
            raise UsageError("enqueue process_event takes one EVENT_ID (see `llmem queue`)")
        task_id = _enqueue(huey, tasks.process_event.s(int(args[0])))
    elif args:
        raise UsageError(f"{task} takes no arguments")
    else:
        task_id = _enqueue(huey, getattr(tasks, task).s())
    if as_json:
        print_json({"task": task, "id": task_id, "event_id": event_id})
    else:
        click.echo(task_id)


def _enqueue(huey, task) -> str:
    """Put a task on the queue; its id (huey keeps no results, so it returns none)."""
    huey.enqueue(task)
    return task.id


@click.group(invoke_without_command=True)
@json_option()
@click.option("-n", "--recent", type=bounded_int(), default=15, show_default=True,
              help="Recent events shown.")
@click.option("--clear-stale-locks", is_flag=True,
              help="Remove a dream lock whose process died (the next dream would take it over).")
@click.option("--reset", is_flag=True,
              help="Rebuild the queue (queue.db) from the store's event rows; the old file is kept beside it.")
@click.pass_context
def queue(ctx, as_json, recent, clear_stale_locks, reset):
    """Show the queue: pending, scheduled, running and failed work, recent events, locks."""
    if ctx.invoked_subcommand is not None:
        return
    from ..dream.lock import clear_stale_lock, lock_is_live, read_lock
    from ..times import to_iso
    from .queueing import open_queue, reset_queue

    app = ctx.obj
    if reset:
        moved, requeued = reset_queue(app)
        click.echo((f"Moved the old queue to {moved}; " if moved else "")
                   + f"rebuilt {app.config.queue_path} with {len(requeued)} event(s) from the store"
                   + " (restart a running worker so it opens the new file)", err=as_json)
    Event = app.store.models.Event
    cleared = clear_stale_lock(app.store.db) if clear_stale_locks else None
    huey, _ = open_queue(app.config)
    counts = {status: Event.select().where(Event.status == status).count()
              for status in ("pending", "running", "done", "failed")}
    events = [{"id": e.id, "adapter": e.adapter, "session_id": e.session_id, "kind": e.kind,
               "status": e.status, "attempts": e.attempts, "error": e.last_error,
               "detected_at": to_iso(e.detected_at), "finished_at": to_iso(e.finished_at)}
              for e in Event.select().order_by(Event.id.desc()).limit(recent)]
    holder = read_lock(app.store.db)
    locks = [_lock_info(holder, stale=not lock_is_live(holder, app.store.db))] if holder else []
    data = {"queue": {"pending": huey.pending_count(), "scheduled": huey.scheduled_count()},
            "events": counts, "recent": events, "locks": locks}
    if clear_stale_locks:
        data["cleared_locks"] = [_lock_info(cleared, stale=True)] if cleared else []
    if as_json:
        print_json(data)
        return
    click.echo(f"queue:  {data['queue']['pending']} pending, {data['queue']['scheduled']} scheduled")
    click.echo("events: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    for e in events:
        line = f"  #{e['id']:<5} {e['status']:<8} {e['kind']:<10} {e['adapter']:<8} {e['session_id']}"
        click.echo(line + (f"  ({e['attempts']} tries: {e['error']})" if e["error"] else ""))
    if clear_stale_locks:
        click.echo(f"cleared stale {_describe_lock(data['cleared_locks'][0])}" if cleared
                   else "no stale lock to clear")
    for lock in locks:
        if lock["stale"]:
            click.echo(f"lock:   STALE {_describe_lock(lock)}; the next dream takes it over, "
                       "`llmem queue --clear-stale-locks` removes it now")
        else:
            click.echo(f"lock:   {_describe_lock(lock)}")


def _lock_info(holder: dict, *, stale: bool) -> dict:
    from ..times import to_iso

    return {"name": "dream", "what": holder.get("what", "dream"), "run_id": holder.get("run_id"),
            "pid": holder.get("pid"), "host": holder.get("host"),
            "started_at": to_iso(holder.get("started_at")), "stale": stale}


def _describe_lock(lock: dict) -> str:
    owner = "dead process" if lock["stale"] else "process"
    return (f"dream lock: {lock['what']} run {lock['run_id']}, {owner} {lock['pid']} on {lock['host']}, "
            f"since {lock['started_at']}")


@queue.command("retry")
@click.argument("event_ids", nargs=-1, type=bounded_int(1, MAX_ROW_ID))
@click.option("--failed", is_flag=True, help="Retry every failed event.")
@click.pass_obj
def queue_retry(app, event_ids, failed):
    """Put failed events (or the given ids) back on the queue."""
    from ..errors import NotFound, UsageError
    from ..pipeline.events import retry_events
    from .queueing import open_queue

    if not event_ids and not failed:
        raise UsageError("give event ids or --failed", hint="`llmem queue` lists events")
    if event_ids:
        Event = app.store.models.Event
        known = {row[0] for row in Event.select(Event.id).where(Event.id.in_(event_ids)).tuples()}
        unknown = [str(event_id) for event_id in event_ids if event_id not in known]
        if unknown:
            raise NotFound(f"no event {', '.join(unknown)}; nothing was requeued",
                           hint="`llmem queue` lists events")
    events = retry_events(app.store, None if failed else list(event_ids))
    _, tasks = open_queue(app.config)
    for event in events:
        tasks.process_event(event.id)
    click.echo(f"Requeued {len(events)} event(s)")


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new entries.")
@click.option("-n", "--lines", type=bounded_int(0), default=50, show_default=True,
              help="Entries shown (a traceback stays with the line it belongs to).")
@click.option("--level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), help="Minimum level.")
@json_option("Print JSON (with --follow: one object per line).")
@click.pass_obj
def logs(app, follow, lines, level, as_json):
    """Show the watcher's, workers' and hooks' log entries (newest last)."""
    import json

    from ..logreader import LogFollower, at_least, read_entries

    def show(entries):
        for entry in entries:
            if not at_least(entry, level):
                continue
            if as_json and follow:
                click.echo(json.dumps(entry.as_dict(), ensure_ascii=False))
            else:
                click.echo("\n".join(entry.lines))

    entries = read_entries(app.config, level)
    shown = entries[-lines:] if lines else []
    if as_json and not follow:
        print_json([entry.as_dict() for entry in shown])
        return
    if not entries and not follow:
        click.echo(f"No logs yet in {app.config.log_dir}", err=True)
        return
    show(shown)
    if not follow:
        return
    follower = LogFollower(app.config)
    try:
        while True:
            time.sleep(0.5)
            show(follower.poll())
            sys.stdout.flush()
    except KeyboardInterrupt:
        return


@click.command("systemd")
@click.option("--uninstall", is_flag=True, help="Disable and remove the units.")
@click.option("--unit-dir", type=click.Path(file_okay=False), help="Folder for the units (default: ~/.config/systemd/user).")
@click.option("--no-enable", is_flag=True, help="Only write the unit files.")
@click.option("--dream-timer", is_flag=True, help="Also enable the nightly dream timer (for setups without a worker).")
@json_option("Print the outcome as JSON.")
@click.pass_obj
def install_systemd(app, uninstall, unit_dir, no_enable, dream_timer, as_json):
    """Install the systemd user units (watch, worker, dream) for this Python and enable them.
    The dream timer fires on dream.schedule, read in dream.timezone."""
    from pathlib import Path

    from ..setup import systemd

    target = Path(unit_dir).expanduser() if unit_dir else None
    if uninstall:
        outcome = systemd.uninstall(target=target, disable=not no_enable)
    else:
        dream = app.config.dream
        outcome = systemd.install(target=target, enable=not no_enable, dream_timer=dream_timer,
                                  schedule=dream.schedule, timezone=dream.timezone)
    if as_json:
        print_json(vars(outcome))
        return
    for path in outcome.written:
        click.echo(f"wrote   {path}")
    for path in outcome.unchanged:
        click.echo(f"same    {path}")
    for path in outcome.removed:
        click.echo(f"removed {path}")
    for command in outcome.commands:
        click.echo(f"ran     {command}")
    for warning in outcome.warnings:
        click.echo(f"llmem: {warning}", err=True)
