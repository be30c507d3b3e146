"""The SqliteHuey instance, built from config (its own queue.db, never memory.db)."""

from __future__ import annotations

from huey import SqliteHuey

from llmem.paths import ensure_private_dir, private_file


def build_huey(config) -> SqliteHuey:
    """A huey on the configured queue file; tasks are attached by workers.tasks.register."""
    path = config.queue_path
    ensure_private_dir(path.parent)
    # results=False: nothing reads a task's return value (the store records each event's
    # outcome), and huey would keep one row per task in queue.db forever.
    huey = SqliteHuey("llmem", filename=str(path), results=False, utc=False, timeout=10.0)
    if path.exists():
        private_file(path)
    return huey
