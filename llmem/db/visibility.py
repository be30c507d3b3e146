"""Who may read a memory: its author, or everyone with access to the store once shared.

A memory is private until its author shares its project (`llmem share PROJECT`): then the
project's facts, decisions and procedures (models.SHAREABLE_TYPES) are shared, those already
stored and those to come. On a PostgreSQL store the author is the database role and the
server enforces who reads what (row-level security, db/postgres/migrations.py VISIBILITY);
a SQLite file is one user's, who is every memory's author (a null author, '' in
shared_project).
"""

from __future__ import annotations

from .backend import per_backend
from .models import SHAREABLE_TYPES

_TYPES = ", ".join(f"'{kind}'" for kind in SHAREABLE_TYPES)


@per_backend
def store_author(db) -> str | None:
    """Whom the store knows the user as: None for a SQLite file's one user."""
    return None


@per_backend
def _this_user(db) -> tuple[str, str]:
    """SQL for this user: (in shared_project, as the author of a memory). A SQLite file's one
    user is '' there and a null author."""
    return "author = ''", "author IS NULL"


def shares_project(db, project: str) -> bool:
    """Whether this user shares `project`."""
    sharer, _ = _this_user(db)
    return db.execute_sql(f"SELECT 1 FROM shared_project WHERE project = ? AND {sharer}", (project,)).fetchone() is not None


def set_project_shared(db, project: str, shared: bool, at: float) -> int:
    """Share (or stop sharing) this user's memories of `project` that may be shared; return
    how many memories changed. Call inside a transaction."""
    sharer, author = _this_user(db)
    if shared:  # the author column's default is this user on either backend
        db.execute_sql("INSERT INTO shared_project (project, shared_at) VALUES (?, ?) "
                       "ON CONFLICT (project, author) DO NOTHING", (project, at))
    else:
        db.execute_sql(f"DELETE FROM shared_project WHERE project = ? AND {sharer}", (project,))
    visibility = "shared" if shared else "private"
    return db.execute_sql(
        "UPDATE memory SET visibility = ?, version = version + 1, updated_at = ? "
        f"WHERE project = ? AND type IN ({_TYPES}) AND {author} AND visibility <> ?",
        (visibility, at, project, visibility)).rowcount


def shared_projects(db) -> list[tuple[str, str, float]]:
    """(project, who shares it, since when) of every shared project."""
    return db.execute_sql("SELECT project, author, shared_at FROM shared_project ORDER BY project, author").fetchall()
