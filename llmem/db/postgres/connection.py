"""Open a PostgreSQL + pgvector store: peewee's PostgresqlDatabase over psycopg 3.

db/'s raw SQL is written once, in SQLite's `?` placeholders, in the SQL both dialects speak;
the cursor of this database turns `?` into psycopg's `%s` (outside quoted text), so that SQL
runs here unchanged, and only what truly differs (DDL, full-text search, vectors) has a
sibling module in this package. peewee's own queries already use `%s` and pass through.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading

import peewee
import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Json, Jsonb

from ...errors import StoreError, StoreUnreachable
from ..backend import masked_url

log = logging.getLogger(__name__)

# PostgreSQL 15 is the oldest release still supported upstream (14 ended in November 2026), and
# the schema's word count needs its regexp_count; pgvector's HNSW index came in 0.5.0.
MIN_SERVER_VERSION = 150000
MIN_PGVECTOR = (0, 5, 0)
CONNECT_TIMEOUT_SECONDS = 5  # store.connect_timeout_seconds; a hook's is shorter (App.in_hook)
# psycopg (as libpq) waits at least 2 s for each address a host name gives: a shorter budget
# is held around its connect (Psycopg3Adapter.connect).
PSYCOPG_MIN_TIMEOUT_SECONDS = 2
STATEMENT_TIMEOUT_MS = 60_000
# A session's HNSW search width, and iterative scans in distance order, set when it connects
# (db/postgres/vec.py): a search that needs no wider asks in one statement, without the
# transaction and the two SET LOCALs that were four more round trips. Custom plans: a
# prepared tsquery match given a generic plan scanned every memory (62 → 12 ms at 10k).
SESSION_EF_SEARCH = 200  # a search asks for limit × candidate_multiplier (10 × 20) nearest


def qmark_to_format(sql: str) -> str:
    """`sql` with each `?` placeholder as `%s` and each literal `%` doubled, leaving quoted
    strings and identifiers alone; SQL without a `?` placeholder is returned unchanged."""
    out: list[str] = []
    quote: str | None = None
    found = False
    for char in sql:
        if quote:
            out.append("%%" if char == "%" else char)
            if char == quote:
                quote = None
        elif char in ("'", '"'):
            quote = char
            out.append(char)
        elif char == "?":
            out.append("%s")
            found = True
        elif char == "%":
            out.append("%%")
        else:
            out.append(char)
    return "".join(out) if found else sql


def disk_full(exc: BaseException, location: str) -> StoreError | None:
    """A write the server's disk could not take, said with the fix (None: another failure).
    A full disk is SQLSTATE 53100; a file the server may not grow (a quota, a size limit) is
    "could not extend file" with another code: the same for the user."""
    seen = exc
    while seen is not None:
        text = str(seen)
        if getattr(seen, "sqlstate", None) == "53100" or "could not extend file" in text:
            first = text.strip().splitlines()[0] if text.strip() else type(seen).__name__
            return StoreError(f"the disk of the PostgreSQL server at {location} is full ({first}); "
                              "nothing of it was saved",
                              hint="free space on the server's disk (its data folder or tablespace), "
                                   "then run the command again")
        seen = seen.__cause__ or seen.__context__
    return None


class QmarkCursor:
    """A psycopg cursor that takes db/'s `?` placeholders."""

    def __init__(self, cursor, location: str = ""):
        self._cursor = cursor
        self._location = location

    def execute(self, sql, params=None):
        try:
            self._cursor.execute(qmark_to_format(sql), params if params else None)
        except psycopg.Error as exc:
            full = disk_full(exc, self._location)
            if full is None:
                raise
            raise full from None
        return self

    def executemany(self, sql, rows):
        try:
            self._cursor.executemany(qmark_to_format(sql), list(rows))
        except psycopg.Error as exc:
            full = disk_full(exc, self._location)
            if full is None:
                raise
            raise full from None
        return self

    @contextlib.contextmanager
    def copy(self, sql):
        """psycopg's COPY … FROM STDIN (bulk loads: db/postgres/vec.py, queries.py), a full disk
        said as `execute` says it."""
        try:
            with self._cursor.copy(sql) as copy:
                yield copy
        except psycopg.Error as exc:
            full = disk_full(exc, self._location)
            if full is None:
                raise
            raise full from None

    def __iter__(self):
        return iter(self._cursor)

    def __getattr__(self, name):
        return getattr(self._cursor, name)


class Psycopg3Adapter(peewee.Psycopg3Adapter):
    """peewee's psycopg 3 adapter over the psycopg imported here: peewee itself is imported
    without the drivers (llmem/__init__.py), so its own module-level psycopg names are None."""

    txn_idle = TransactionStatus.IDLE
    txn_inerror = TransactionStatus.INERROR
    txn_unknown = TransactionStatus.UNKNOWN

    def __init__(self):
        super().__init__()
        self.json_type, self.jsonb_type = Json, Jsonb

    def check_driver(self):
        pass  # imported above

    def get_binary_type(self):
        return psycopg.Binary

    def connect(self, db, **params):
        if db._encoding:
            params.setdefault("client_encoding", db._encoding)
        if db.database.startswith("postgresql://"):
            params.setdefault("conninfo", db.database)
        else:
            params.setdefault("dbname", db.database)
        budget = float(params.pop("connect_timeout", CONNECT_TIMEOUT_SECONDS))
        params["connect_timeout"] = max(PSYCOPG_MIN_TIMEOUT_SECONDS, math.ceil(budget))
        if budget >= params["connect_timeout"]:
            return psycopg.connect(**params)
        return _connect_within(budget, params)

def _connect_within(budget: float, params: dict):
    """psycopg.connect(**params), given up after `budget` seconds (shorter than psycopg's own
    floor): the attempt goes on in a thread of its own until psycopg's timeout, and closes
    the connection it may still get, which nobody waits for then. A hook's process, which
    fails open and exits, does not wait for that thread either (a daemon)."""
    outcome: dict = {}
    given_up = threading.Event()

    def attempt():
        try:
            conn = psycopg.connect(**params)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            outcome["error"] = exc
            return
        outcome["conn"] = conn
        if given_up.is_set():
            conn.close()

    worker = threading.Thread(target=attempt, name="llmem-pg-connect", daemon=True)
    worker.start()
    worker.join(budget)
    if worker.is_alive():
        given_up.set()
        if "conn" not in outcome:
            raise psycopg.errors.ConnectionTimeout(f"connection timeout expired (after {budget:g} s)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["conn"]


class PostgresStoreDatabase(peewee.PostgresqlDatabase):
    """A Postgres store: the same attributes db/'s callers read of a SQLite one."""

    backend = "postgres"
    # Whichever driver peewee found at its import (none, psycopg 2), the store runs on psycopg 3.
    psycopg2_adapter = psycopg3_adapter = Psycopg3Adapter

    def __init__(self, url: str, **kwargs):
        self.url = url
        self.read_only = False
        self.vec_loaded = True  # pgvector is checked at open: the KNN always runs in the server
        self.vec_error: str | None = None
        self.vec_enabled = True
        self.vec_version: str | None = None
        super().__init__(url, **kwargs)

    @property
    def location(self) -> str:
        """The store's URL as every output may show it (no password)."""
        return masked_url(self.url)

    def cursor(self, named_cursor=None):
        self._reconnect_if_lost()
        return QmarkCursor(super().cursor(named_cursor), self.location)

    def execute_sql(self, sql, params=None, *args, **kwargs):
        try:
            return super().execute_sql(sql, params, *args, **kwargs)
        except StoreError:
            raise  # said already (a full disk, through the cursor)
        except peewee.DatabaseError as exc:
            full = disk_full(exc, self.location)
            if full is not None:
                raise full from None
            # Lost outside a transaction: nothing ran on the dead connection, so the
            # statement runs again, once, on a new one.
            if (not isinstance(exc, peewee.OperationalError | peewee.InterfaceError)
                    or self.in_transaction() or not self._lost()):
                raise
            self._reconnect_if_lost()
            return super().execute_sql(sql, params, *args, **kwargs)

    def begin(self, *args, **kwargs):
        try:
            return super().begin(*args, **kwargs)
        except (peewee.OperationalError, peewee.InterfaceError):
            if not self._lost():
                raise
            self._reconnect_if_lost()
            return super().begin(*args, **kwargs)

    def _lost(self) -> bool:
        conn = self._state.conn
        return conn is not None and (conn.closed or conn.broken)

    def _reconnect_if_lost(self) -> None:
        """A connection the server dropped (restarted, or away and back) stays dead in
        peewee's state, and every later statement of a long-lived process (`llmem run`'s
        watcher and worker) would fail with "the connection is closed": open a new one, at the
        start of a statement outside any transaction (inside one, the statement fails and its
        transaction with it; the next one starts on a new connection)."""
        if self.in_transaction() or not self._lost():
            return
        log.info("the connection to %s was lost; connecting again", self.location)
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a dead connection may refuse even its close
            self._state.reset()
        self.connect()


def _connect_error(exc: Exception, url: str, timeout: float = CONNECT_TIMEOUT_SECONDS) -> StoreError:
    """A connection failure said in the user's terms, with the fix; no password in it."""
    shown = masked_url(url)
    text = str(exc).strip().replace(url, shown)
    low = text.lower()
    if "password authentication failed" in low or "no password supplied" in low:
        return StoreError(f"the PostgreSQL server at {shown} refused the password",
                          hint="check the user and password in store.url (or ~/.pgpass / PGPASSWORD)")
    if "does not exist" in low and "database" in low:
        return StoreError(f"the database named in {shown} does not exist",
                          hint="create it: `createdb -h HOST -U USER NAME` (or `CREATE DATABASE name`)")
    if "role" in low and "does not exist" in low:
        return StoreError(f"the PostgreSQL user named in {shown} does not exist",
                          hint="create it: `CREATE ROLE name LOGIN PASSWORD '…'`, or fix store.url")
    if "timeout" in low or "timed out" in low:
        return StoreUnreachable(f"the PostgreSQL server at {shown} did not answer within {timeout:g} s",
                                hint="is the host reachable? check store.url and the network")
    if "refused" in low or "no such file" in low or "could not connect" in low or "connection failed" in low:
        return StoreUnreachable(f"no PostgreSQL server answers at {shown}",
                                hint="start the server, or fix the host and port in store.url")
    if "no pg_hba.conf entry" in low or "permission denied" in low:
        return StoreError(f"the PostgreSQL server at {shown} does not let this user in: {text.splitlines()[0]}",
                          hint="allow this host and user in the server's pg_hba.conf, or grant CONNECT")
    return StoreError(f"cannot connect to the PostgreSQL server at {shown}: {text.splitlines()[0]}",
                      hint="check store.url (`llmem config show`) and that the server runs")


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def ensure_pgvector(db: PostgresStoreDatabase) -> str:
    """Create the `vector` extension when missing (when the user may); its version.

    Raises StoreError naming the command that fixes it when the server has no pgvector, or
    the user may not create the extension, or its version has no HNSW index.
    """
    row = db.execute_sql("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    if row is None:
        available = db.execute_sql("SELECT default_version FROM pg_available_extensions "
                                   "WHERE name = 'vector'").fetchone()
        if available is None:
            raise StoreError(f"the PostgreSQL server at {db.location} has no pgvector extension",
                             hint="install pgvector on the server (Debian/Ubuntu: `apt install "
                                  "postgresql-NN-pgvector`; or run the `pgvector/pgvector` image), "
                                  "then `psql -d DB -c 'CREATE EXTENSION vector'`")
        try:
            with db.atomic():
                db.execute_sql("CREATE EXTENSION IF NOT EXISTS vector")
        except peewee.DatabaseError as exc:
            raise StoreError(f"the pgvector extension is not enabled in {db.location}, and this user "
                             f"may not enable it ({str(exc).splitlines()[0]})",
                             hint="as a superuser: `psql -d DB -c 'CREATE EXTENSION vector'`") from None
        row = db.execute_sql("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    version = row[0]
    if _version_tuple(version) < MIN_PGVECTOR:
        raise StoreError(f"pgvector {version} in {db.location} has no HNSW index (0.5.0 or later is needed)",
                         hint="upgrade pgvector on the server, then `psql -d DB -c 'ALTER EXTENSION vector UPDATE'`")
    return version


def open_postgres(url: str, *, vec: bool = True, connect_timeout: float | None = None) -> PostgresStoreDatabase:
    """Connect to the Postgres store at `url`, check the server and pgvector, bring the
    schema up to date. Every failure is a StoreError with the fix and no password in it.
    `connect_timeout`: seconds the server has to answer, now and at each reconnect."""
    from .migrations import migrate

    timeout = CONNECT_TIMEOUT_SECONDS if connect_timeout is None else connect_timeout
    db = PostgresStoreDatabase(url, connect_timeout=timeout,
                               options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c plan_cache_mode=force_custom_plan "
                                       f"-c hnsw.ef_search={SESSION_EF_SEARCH} -c hnsw.iterative_scan=strict_order",
                               application_name="llmem", prefer_psycopg3=True)
    try:
        db.connect()
    except peewee.DatabaseError as exc:
        raise _connect_error(exc, url, timeout) from None
    except Exception as exc:  # psycopg's own error family (an unparsable URL: ProgrammingError)
        raise _connect_error(exc, url, timeout) from None
    try:
        version = db.connection().info.server_version
        if version < MIN_SERVER_VERSION:
            shown = f"{version // 10000}.{version % 10000}"
            raise StoreError(f"the server at {db.location} runs PostgreSQL {shown}; llmem needs {MIN_SERVER_VERSION // 10000} or later",
                             hint="upgrade the server, or point store.url at a newer one")
        db.vec_version = ensure_pgvector(db)
        migrate(db)
    except StoreError:
        db.close()
        raise
    except peewee.DatabaseError as exc:
        db.close()
        raise StoreError(f"cannot prepare the store at {db.location}: {str(exc).splitlines()[0]}",
                         hint="does this user own the database (or have CREATE on its schema)?") from None
    return db
