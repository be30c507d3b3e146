"""db/visibility.py on Postgres: this user is the database role (current_user)."""

from __future__ import annotations


def store_author(db) -> str | None:
    return db.execute_sql("SELECT current_user").fetchone()[0]


def _this_user(db) -> tuple[str, str]:
    return "author = current_user", "author = current_user"
