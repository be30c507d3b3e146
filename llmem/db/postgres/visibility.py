"""db/visibility.py on Postgres: the author is the database role (current_user)."""

from __future__ import annotations

from ..visibility import _TYPES


def store_author(db) -> str | None:
    return db.execute_sql("SELECT current_user").fetchone()[0]


def shares_project(db, project: str) -> bool:
    return db.execute_sql("SELECT 1 FROM shared_project WHERE project = ? AND author = current_user",
                          (project,)).fetchone() is not None


def set_project_shared(db, project: str, shared: bool, at: float) -> int:
    if shared:
        db.execute_sql("INSERT INTO shared_project (project, shared_at) VALUES (?, ?) "
                       "ON CONFLICT (project, author) DO NOTHING", (project, at))
    else:
        db.execute_sql("DELETE FROM shared_project WHERE project = ? AND author = current_user", (project,))
    return db.execute_sql(
        "UPDATE memory SET visibility = ?, version = version + 1, updated_at = ? "
        f"WHERE project = ? AND type IN ({_TYPES}) AND author = current_user AND visibility <> ?",
        ("shared" if shared else "private", at, project, "shared" if shared else "private")).rowcount
