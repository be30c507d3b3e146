"""The SqliteHuey instance, built from config (its own queue.db, never memory.db)."""

from __future__ import annotations

from huey import SqliteHuey

from llmem.paths import ensure_private_dir, private_file


def build_huey(config) -> SqliteHuey:
    """A huey on the configured queue file; tasks are attached by workers.tasks.register."""
    path = config.queue_path
    ensure_private_dir(path.parent)
    # store_intermediate_errors=False: Result.get() waits for a task's final outcome, not
    # for the error of each retry (TECH-NOTES).
    huey = SqliteHuey("llmem", filename=str(path), results=True, store_none=False, utc=False,
                      timeout=10.0, store_intermediate_errors=False)
    if path.exists():
        private_file(path)
    return huey
