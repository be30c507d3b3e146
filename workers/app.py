"""The huey instance, built from config: SqliteHuey on its own queue.db (never memory.db), or
RedisHuey when `queue.url` names a Redis server (one server for the machines sharing a store,
each machine on a queue of its own there: only it can read its sessions' transcripts)."""

from __future__ import annotations

from huey import Huey, SqliteHuey

from llmem.paths import ensure_private_dir, private_file


def build_huey(config) -> Huey:
    """A huey on the configured queue (file, or Redis); tasks are attached by workers.tasks.register."""
    url = config.queue.url
    if url:
        from huey import RedisHuey

        # The same settings as the file's queue; huey's Redis storage keeps no results either.
        # The connection pool connects on first use: a Redis that is down fails the enqueue,
        # which leaves the event row pending for reconcile (cli/queueing.py submit_event).
        from llmem.machine import machine_id

        return RedisHuey(f"llmem-{machine_id()}", url=url, results=False, utc=False)
    path = config.queue_path
    ensure_private_dir(path.parent)
    # results=False: nothing reads a task's return value (the store records each event's
    # outcome), and huey would keep one row per task in queue.db forever.
    huey = SqliteHuey("llmem", filename=str(path), results=False, utc=False, timeout=10.0)
    if path.exists():
        private_file(path)
    return huey
