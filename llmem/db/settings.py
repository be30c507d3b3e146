"""Small key/value state kept in the store's `setting` table (index state, locks, heartbeats)."""

from __future__ import annotations


def get_setting(db, key: str, default: str | None = None) -> str | None:
    row = db.execute_sql("SELECT value FROM setting WHERE key = ?", (key,)).fetchone()
    return row[0] if row else default


def set_setting(db, key: str, value: str) -> None:
    db.execute_sql("INSERT INTO setting(key, value) VALUES (?, ?) "
                   "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))


def delete_setting(db, key: str) -> None:
    db.execute_sql("DELETE FROM setting WHERE key = ?", (key,))


def claim_setting(db, key: str, value: str) -> bool:
    """Write `key` only if no one has: True for the one writer that did (one statement, so
    of several processes or machines claiming at once exactly one wins on either backend)."""
    cursor = db.execute_sql("INSERT INTO setting(key, value) VALUES (?, ?) ON CONFLICT(key) DO NOTHING", (key, value))
    return cursor.rowcount == 1


def delete_settings_before(db, prefix: str, key: str) -> None:
    """Delete the settings named `prefix…` that sort before `key` (old claims)."""
    db.execute_sql("DELETE FROM setting WHERE key >= ? AND key < ?", (prefix, key))
