"""Giving a SQLite store's free pages back to the disk (VACUUM), best effort."""

from __future__ import annotations

import logging


def reclaim_space(db, share: float | None = 0.25) -> bool:
    """VACUUM when free pages are more than `share` of the file (after migration 0017 drops
    most of a store's vector bytes; after a first backfill's fts.compact_after_bulk_add, at
    any share; None: whatever is free, after rows shrank in place, migration 0024, which
    frees no page); True when it ran. Best effort: a reader holding the file open, or a disk
    without room for the copy, leaves the free pages for later writes."""
    pages = db.execute_sql("PRAGMA page_count").fetchone()[0]
    free = db.execute_sql("PRAGMA freelist_count").fetchone()[0]
    if not pages or (share is not None and free <= share * pages):
        return False
    try:
        db.execute_sql("VACUUM")
    except Exception as exc:  # the driver's error family: busy, full disk
        logging.getLogger(__name__).warning("the store was not vacuumed (%s): its %d free pages stay for later writes", exc, free)
        return False
    return True
