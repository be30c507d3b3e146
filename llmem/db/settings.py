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
