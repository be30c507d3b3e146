"""Open the memory store: pick a SQLite driver that can load sqlite-vec, set the pragmas.

Many Python builds (pyenv's among them) ship a `sqlite3` without `enable_load_extension`,
so sqlite-vec cannot load through it. We prefer the stdlib when it can load extensions,
then sqlean.py / pysqlite3 (bundled modern SQLite), and otherwise run without vec0: search
then falls back to brute-force cosine in numpy, with the same results.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sqlite3 as stdlib_sqlite3
from pathlib import Path

import peewee

from ..errors import StoreError, store_failure
from ..paths import ensure_private_dir, private_file
from . import packed_text

log = logging.getLogger(__name__)

BUSY_TIMEOUT_SECONDS = 10.0


def _can_load_extensions(module) -> bool:
    return hasattr(module.Connection, "enable_load_extension")


def _pick_driver():
    """The best available DB-API module for SQLite, preferring one that loads extensions."""
    if _can_load_extensions(stdlib_sqlite3):
        return stdlib_sqlite3
    for name in ("sqlean", "pysqlite3.dbapi2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if _can_load_extensions(module):
            return module
    return stdlib_sqlite3


_DRIVER = None
_VEC_PATH: str | None | bool = False  # False: not looked up yet; None: unavailable


def driver():
    """The SQLite DB-API module llmem uses (chosen once per process)."""
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _pick_driver()
    return _DRIVER


def _vec_extension_path() -> str | None:
    """Where the sqlite-vec loadable library lies, found without importing the package.

    `import sqlite_vec` pulls in numpy (~80 ms), which commands that never touch vectors
    should not pay for; the library is the package's `vec0` file either way.
    """
    global _VEC_PATH
    if _VEC_PATH is False:
        _VEC_PATH = None
        spec = importlib.util.find_spec("sqlite_vec")
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if any(Path(folder).glob("vec0.*")):
                _VEC_PATH = str(Path(folder) / "vec0")  # SQLite adds the platform suffix
    return _VEC_PATH


class MemoryDatabase(peewee.SqliteDatabase):
    """SqliteDatabase on the chosen driver, with sqlite-vec loaded on every connection."""

    def __init__(self, *args, **kwargs):
        self.vec_loaded = False
        self.read_only = False  # opened by open_read_only: writes fail
        self.vec_error: str | None = None
        self.vec_enabled = True  # tests and benchmarks may force the numpy path
        self.packs_text = False  # memory.content reads packed text back: episodes are written packed
        super().__init__(*args, **kwargs)
        # Packed episode text (db/packed_text.py): the FTS triggers index llmem_text(content).
        self.register_function(packed_text.sql_text, packed_text.SQL_FUNCTION, 1, deterministic=True)

    @property
    def location(self) -> str:
        """Where the store is, as outputs show it (a Postgres store's URL without its password)."""
        return str(self.database)

    def _connect(self):
        module = driver()
        packed_text.register_converter(module)
        # PARSE_DECLTYPES: a raw `SELECT content` returns text, packed or not (db/packed_text.py).
        conn = module.connect(self.database, timeout=self._timeout,
                              isolation_level=None, check_same_thread=False,
                              detect_types=module.PARSE_DECLTYPES, **self.connect_params)
        try:
            self._load_vec(conn)
            self._add_conn_hooks(conn)
        except Exception:
            conn.close()
            raise
        return conn

    def _load_vec(self, conn) -> None:
        self.vec_loaded = False
        if not self.vec_enabled:
            self.vec_error = "disabled"
            return
        path = _vec_extension_path()
        if path is None:
            self.vec_error = "the sqlite-vec package is not installed for this platform"
            return
        if not hasattr(conn, "enable_load_extension"):
            self.vec_error = "this Python's sqlite3 cannot load extensions"
            return
        try:
            conn.enable_load_extension(True)
            conn.load_extension(path)
            conn.enable_load_extension(False)
            self.vec_loaded = True
            self.vec_error = None
        except Exception as exc:  # wrong architecture, SQLite too old, …
            self.vec_error = str(exc)


PRAGMAS = (
    ("journal_mode", "wal"),
    ("synchronous", "normal"),
    ("foreign_keys", 1),
    ("busy_timeout", int(BUSY_TIMEOUT_SECONDS * 1000)),
    ("cache_size", -32000),
    ("temp_store", "memory"),
)


READ_PRAGMAS = tuple(p for p in PRAGMAS if p[0] not in ("journal_mode", "synchronous"))


def open_read_only(path: Path, *, vec: bool = True) -> MemoryDatabase:
    """Open the store for reading only: nothing is created, migrated or written, so a reading
    command works on a full disk or a read-only file system.

    `mode=ro` still needs the WAL index (`-shm`) sized, which needs free space when no other
    process has the store open; then, when the WAL holds nothing (every write checkpointed
    into the file, as the last connection to close leaves it), the file alone is the whole
    store and is opened `immutable` (no locks, no index).
    """
    from .migrations import MIGRATIONS, applied_migrations

    if not path.is_file():
        raise StoreError(f"there is no memory store at {path}",
                         hint="run any llmem command that writes (`llmem init`) to create it")
    wal = path.with_name(path.name + "-wal")
    # The side files a failed attempt leaves are removed: reading creates nothing.
    absent = [f for f in (wal, path.with_name(path.name + "-shm")) if not f.exists()]
    last: Exception | None = None
    for query in ("mode=ro", "mode=ro&immutable=1"):
        if "immutable" in query and wal.exists() and wal.stat().st_size > 0:
            break  # writes not yet in the file: reading the file alone would miss them
        db = MemoryDatabase(None, pragmas=READ_PRAGMAS, timeout=BUSY_TIMEOUT_SECONDS)
        db.vec_enabled = vec
        db.init(f"{path.resolve().as_uri()}?{query}", uri=True)
        try:
            db.connect()
            names = set(applied_migrations(db))
        except peewee.DatabaseError as exc:
            db.close()
            last = exc
            continue
        if not {name for name, _ in MIGRATIONS} <= names:
            db.close()
            raise StoreError(f"the memory store {path} needs its schema brought up to date, which writes",
                             hint="run any llmem command that writes (`llmem init`) once there is room")
        db.read_only = True
        return db
    for side_file in absent:
        side_file.unlink(missing_ok=True)
    raise store_failure(last, path) or StoreError(
        f"cannot open the memory store {path} for reading: {last}",
        hint="check the path (db_path in config.yaml) and its permissions") from None


def file_damage(path: Path) -> str | None:
    """What SQLite's quick_check says is wrong with the SQLite file at `path` (opened
    read-only: any llmem file, or huey's queue), or None when it is sound."""
    try:
        conn = driver().connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_SECONDS)
    except Exception as exc:  # the driver's own error family
        return str(exc)
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except Exception as exc:
        return str(exc)
    finally:
        conn.close()
    problems = [row[0] for row in rows if row[0] != "ok"]
    return "; ".join(problems[:3]) if problems else None


def open_database(path: Path, *, vec: bool = True) -> MemoryDatabase:
    """Open (creating if needed) the store at `path` and bring its schema up to date."""
    from .migrations import content_is_packed, migrate

    new_file = not path.exists()
    ensure_private_dir(path.parent)
    # Every transaction opened with db.atomic() takes the write lock up front (IMMEDIATE):
    # with the default deferred BEGIN, read-then-write transactions of concurrent
    # processes fail with "database is locked" despite the busy timeout.
    db = MemoryDatabase(None, pragmas=PRAGMAS, timeout=BUSY_TIMEOUT_SECONDS,
                        lock_type="IMMEDIATE")
    db.vec_enabled = vec
    db.init(str(path))
    try:
        db.connect()
    except peewee.DatabaseError as exc:
        raise store_failure(exc, path) or StoreError(
            f"cannot open the memory store {path}: {exc}",
            hint="check the path (db_path in config.yaml) and its permissions") from None
    if new_file:
        private_file(path)
    try:
        migrate(db)
    except peewee.DatabaseError as exc:
        db.close()
        raise store_failure(exc, path) or StoreError(
            f"cannot migrate the memory store {path}: {exc}",
            hint="is it an llmem database? `llmem doctor` checks it") from None
    db.packs_text = content_is_packed(db)  # episodes are written deflated (db/packed_text.py)
    return db


def open_store_database(location, *, vec: bool = True, read_only: bool = False,
                        connect_timeout: float | None = None):
    """Open the store that `location` names, on the backend it names: a path or a
    `sqlite:///…` URL is a SQLite file (read-only when asked), a `postgresql://…` URL a
    server (db/postgres/connection.py). The one place a backend is chosen."""
    from .backend import is_server_url, sqlite_path

    if is_server_url(location):
        from .postgres.connection import open_postgres

        return open_postgres(location, vec=vec, connect_timeout=connect_timeout)
    path = sqlite_path(location)
    return open_read_only(path, vec=vec) if read_only else open_database(path, vec=vec)


def names_this_store(db, location) -> bool:
    """Whether `location` (a store URL or a SQLite path) names the store `db` is open on: a
    file by its identity on disk, a server's database by its URL without the password."""
    import os

    from .backend import is_server_url, masked_url, sqlite_path

    if is_server_url(location):
        return masked_url(location) == str(db.location)
    target = sqlite_path(location)
    try:
        return target.exists() and os.path.samefile(target, str(db.location))
    except OSError:
        return False
