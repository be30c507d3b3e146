"""Which backend a store runs on, and the hook that sends a db/ function to its sibling.

A store is named by a URL: `sqlite:///path/memory.db` (or a plain path) for the default
SQLite file, `postgresql://user@host:port/db` for a PostgreSQL + pgvector server. The code
above `db/` never asks which one it has: it calls the functions of `db/fts.py`, `db/vec.py`,
`db/queries.py`, …, and a function whose SQL differs per backend is marked `@per_backend`,
so on a Postgres database it runs the function of the same name in `db/postgres/<module>.py`.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from urllib.parse import urlsplit

from ..redact import masked_url  # noqa: F401 - db/'s callers take it from here

POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_server_url(location) -> bool:
    """Whether `location` names a database server (not a SQLite file)."""
    return isinstance(location, str) and urlsplit(location).scheme in POSTGRES_SCHEMES


def sqlite_path(location) -> Path:
    """The file of a `sqlite:///…` URL (or of a plain path)."""
    text = str(location)
    if text.startswith("sqlite://"):
        text = text[len("sqlite://"):]
    return Path(text).expanduser()


def is_postgres(db) -> bool:
    return getattr(db, "backend", "sqlite") == "postgres"


def per_backend(function):
    """Run `db/postgres/<module>.<name>` instead of `function` when its first argument (the
    database, or a field of a model bound to one) is a Postgres one; the SQLite body stays
    where it is."""
    module = function.__module__.rpartition(".")[2]
    name = function.__name__

    @functools.wraps(function)
    def dispatch(db, *args, **kwargs):
        model = getattr(db, "model", None)  # a field: its expression is built for its model's database
        if getattr(db if model is None else model._meta.database, "backend", "sqlite") == "postgres":
            sibling = importlib.import_module(f"{__package__}.postgres.{module}")
            return getattr(sibling, name)(db, *args, **kwargs)
        return function(db, *args, **kwargs)

    return dispatch
