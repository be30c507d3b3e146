"""Moving a store's projects from folder paths to project keys (paths.project_key).

Memories and session cursors were keyed by a repository's root folder; a project is now
keyed by its repository's remote, so that `/home/a/src/api` and `/Users/b/code/api` share
their memories. Only the machine that holds a folder can read its remote: each project here
that is a repository on this machine's disk takes its key, the others are left as they are
(a folder gone since, or a repository with no remote keeps its path, which is its key).
Portable SQL: the same on both backends.
"""

from __future__ import annotations

from pathlib import Path

from ..paths import project_key

KEYED_TABLES = ("memory", "session_cursor")


def rekey_projects(db) -> dict[str, str]:
    """Rewrite each project folder of this machine to its key; returns {old: new}."""
    projects = {row[0] for table in KEYED_TABLES
                for row in db.execute_sql(f"SELECT DISTINCT project FROM {table} WHERE project IS NOT NULL")}
    moved = {}
    for folder in sorted(projects):
        try:
            if not Path(folder).is_dir():
                continue
        except (OSError, ValueError):  # not a path at all (a NUL, a name too long)
            continue
        key = project_key(folder)
        if key and key != folder:
            moved[folder] = key
    for folder, key in moved.items():
        for table in KEYED_TABLES:
            db.execute_sql(f"UPDATE {table} SET project = ? WHERE project = ?", (key, folder))
    return moved
