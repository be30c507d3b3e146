"""Every test runs in its own LLMEM_HOME and HOME: the user's real files are never touched."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from pathlib import Path

import pytest

# Compile each module once per checkout, not once per process: with PYTHONDONTWRITEBYTECODE
# set (as in some shells and CI images) every worker re-runs pytest's assertion rewriting of
# every test file (~3 s of CPU a worker here) and every `llmem` subprocess compiles the
# modules it imports from source. The caches go to __pycache__ (ignored by git).
sys.dont_write_bytecode = False

sys.path.insert(0, str(Path(__file__).parent))

from fakes import FakeModelServer  # noqa: E402

# LLMEM_TEST_STORE=postgres runs every test on a fresh PostgreSQL database of its own
# (LLMEM_STORE_URL, which every llmem process the test starts inherits), but the tests
# marked `sqlite_only` (they look into the SQLite file itself): `.ci/run` runs the suite so.
ON_POSTGRES = os.environ.get("LLMEM_TEST_STORE") == "postgres"
NOT_ON_POSTGRES = Path(__file__).with_name("not_on_postgres.txt")


# ---- xdist: a module whose tests share a module-scoped fixture runs on one worker -----------
# xdist's `load` sends tests in chunks, so such a module's tests were spread over both
# workers and each set the fixture up for itself (test_mcp.py: four `llmem mcp` servers, not
# two). Its `loadgroup` marks do not reach the scheduler under pytest 9 (it renames the test
# by `item._nodeid`, which pytest 9 no longer reads), hence a scheduler of the suite's own.
# The controller does not collect, so the modules are found by reading the test files.
SHARED_SCOPE = re.compile(r"""scope\s*=\s*["'](?:module|class|package)["']""")


def _modules_with_shared_fixtures(root: Path) -> set[str]:
    return {path.relative_to(root).as_posix() for path in (root / "tests").rglob("test_*.py")
            if SHARED_SCOPE.search(path.read_text(encoding="utf-8", errors="replace"))}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":  # a --dist the user chose
        return None
    from xdist.scheduler import LoadScopeScheduling

    grouped = _modules_with_shared_fixtures(config.rootpath)

    class SharedFixtureScheduling(LoadScopeScheduling):
        """Each test its own unit, as `load`, but a module of `grouped` one unit: the
        units with the most tests go first (LoadScopeScheduling's order)."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in grouped else nodeid

        def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
            # A finished unit leaves the node's work: the scheduler counts what is pending
            # on every test's completion, over every unit the node was given.
            nodeid = self.registered_collections[node][item_index]
            scope = self._split_scope(nodeid)
            unit = self.assigned_work[node][scope]
            unit[nodeid] = True
            if all(unit.values()):
                del self.assigned_work[node][scope]
            self._reschedule(node)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if not ON_POSTGRES:
        return
    listed = {line.strip() for line in NOT_ON_POSTGRES.read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.sqlite_only)


def pytest_configure(config):
    """tmp_path on tmpfs when the machine has one (/dev/shm) and no --basetemp was given: the
    tests' stores are real SQLite files all the same, but every commit's fsync on this
    machine's virtual disk made the suite wait on I/O (~1.8 GB written a run)."""
    import os
    import tempfile

    shm = Path("/dev/shm")
    if (config.option.basetemp is None and not os.environ.get("PYTEST_DEBUG_TEMPROOT")
            and not hasattr(config, "workerinput")  # a worker is handed its controller's basetemp
            and shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)):
        tempfile.tempdir = str(shm)


@pytest.fixture
def fresh_vector_indexes():
    """No vector index kept from another test: each test maps the vector file as a new process
    would (db/vector_file.py keeps one index per store, process-wide)."""
    from llmem.db import vector_file

    vector_file._indexes.clear()
    yield
    vector_file._indexes.clear()


@pytest.fixture(autouse=True)
def vector_file_at_any_size(monkeypatch):
    """A vector file for a table of any size: the tests' stores are small, and what most of
    them test is the file (tests/test_vector_file.py sets the real threshold where it tests it)."""
    from llmem.db import vector_file

    monkeypatch.setattr(vector_file, "FILE_MIN_ROWS", 0)


@pytest.fixture(autouse=True)
def llmem_home(tmp_path, monkeypatch, request):
    home = tmp_path / "llmem-home"
    monkeypatch.setenv("LLMEM_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # see sys.dont_write_bytecode
    for var in ("LLMEM_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "CLAUDE_CONFIG_DIR",
                "CODEX_HOME", "COPILOT_HOME", "LLMEM_STORE_URL"):
        monkeypatch.delenv(var, raising=False)
    if ON_POSTGRES and request.node.get_closest_marker("sqlite_only") is None:
        monkeypatch.setenv("LLMEM_STORE_URL", request.getfixturevalue("servers").fresh_database())
    return home


# ---- a new SQLite store is a copy of one migrated once per worker ------------------------
# Creating a store runs every migration (~16 ms of CPU, ~1,000 times a run), where a copy of
# a store that ran them is ~7 ms to open (its migrations are found applied). A test whose
# subject is a new store's own creation (its migrations running, their output, the file's
# mode as created) is marked `creates_store` and gets the real thing; llmem processes a test
# starts always create theirs.

def _copying_template(real_open, template: Path):
    def open_database(path: Path, *, vec: bool = True):
        copied = False
        if not path.exists():
            from llmem.paths import ensure_private_dir

            try:
                ensure_private_dir(path.parent)
                with template.open("rb") as source, open(path, "xb") as copy:
                    shutil.copyfileobj(source, copy)
                os.chmod(path, 0o600)
                copied = True
            except OSError:  # a folder it may not write: the real open says what is wrong
                path.unlink(missing_ok=True)
        db = real_open(path, vec=vec)
        if copied:  # each store its own random token (migration 0016), as if created here
            from llmem.db.vector_file import TOKEN_KEY

            db.execute_sql("UPDATE setting SET value = lower(hex(randomblob(16))) WHERE key = ?", (TOKEN_KEY,))
        return db

    return open_database


@pytest.fixture(scope="session")
def store_template(tmp_path_factory) -> Path:
    """A store that ran every migration, closed (no -wal beside it): what a new store is."""
    from llmem.db.connection import open_database

    template = tmp_path_factory.mktemp("template") / "memory.db"
    # Made under a home of its own: it is made during the first test that opens a store, and
    # its migrations ask for the machine id (llmem/machine.py), which would otherwise be
    # written into that test's home (a test that then copies a home there found it taken).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMEM_HOME", str(template.parent / "llmem-home"))
        open_database(template).close()
    return template


@pytest.fixture(autouse=True)
def new_stores_are_copies(request, monkeypatch):
    if ON_POSTGRES or request.node.get_closest_marker("creates_store") is not None:
        return
    from llmem.db import connection

    template = request.getfixturevalue("store_template")
    monkeypatch.setattr(connection, "open_database", _copying_template(connection.open_database, template))


@pytest.fixture
def home(llmem_home):
    """LLMEM_HOME under the short name the dream tests use (a test file may define its own
    `home`, a prepared one, over it)."""
    return llmem_home


@pytest.fixture
def model_server():
    server = FakeModelServer().start()
    yield server
    server.stop()


@pytest.fixture
def move_home(monkeypatch, request):
    """Point llmem at another, empty home (an import into a fresh store). On the PostgreSQL run
    the new home gets a fresh database too: LLMEM_STORE_URL would keep the first home's store."""
    def move(home: Path) -> Path:
        home.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv("LLMEM_HOME", str(home))
        if ON_POSTGRES and os.environ.get("LLMEM_STORE_URL"):
            monkeypatch.setenv("LLMEM_STORE_URL", request.getfixturevalue("servers").fresh_database())
        return home
    return move


def free_port_url() -> str:
    """A loopback URL where nothing listens (an embedder that is down)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def store_location():
    """The store this test's llmem opens: the SQLite file, or on the PostgreSQL run its database."""
    from llmem.config import load_config

    return load_config().store_location


def write_config(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def configure(llmem_home):
    """Write $LLMEM_HOME/config.yaml from YAML text."""
    return lambda text: write_config(llmem_home, text)


@pytest.fixture
def cli(capsys):
    """Run the real `llmem` entry point in-process; returns (exit code, stdout, stderr)."""
    from inproc import close_queues, forget_stderr_logging

    from llmem.cli import main

    def run(*args: str):
        forget_stderr_logging()  # the CLI's stderr handler must write to this test's capture
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    close_queues()  # as the process would at its exit: no queue connection outlives the test


@pytest.fixture
def fts_config(configure):
    """A config with no embedder: FTS-only search."""
    return configure("embedding:\n  provider: none\nllm:\n  provider: none\n")


@pytest.fixture
def ollama_config(configure, model_server):
    """A config pointing the embedder and the LLM at the fake server."""
    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"llm:\n  provider: ollama\n  base_url: {model_server.url}\n")
    return model_server


# ---- real database servers (tests/servers.py): the backend tests -----------------------

@pytest.fixture(scope="session")
def servers():
    """The session's PostgreSQL and Redis servers, started on first use, stopped at the end."""
    from servers import ServerPool

    pool = ServerPool()
    yield pool
    pool.stop()


@pytest.fixture
def postgres_url(servers):
    """A fresh database of its own on the session's PostgreSQL (pgvector enabled)."""
    return servers.fresh_database()


# A store test takes `store_url` to run on both backends: the Postgres run is marked
# `backend` (`.ci/run` runs those with LLMEM_REQUIRE_SERVERS=1, so a server that cannot
# start fails them there; elsewhere they skip, saying why).
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.backend)])
def store_url(request, llmem_home, monkeypatch):
    if request.param == "sqlite":
        monkeypatch.delenv("LLMEM_STORE_URL", raising=False)  # the SQLite run stays on SQLite
        return f"sqlite:///{llmem_home / 'memory.db'}"
    return request.getfixturevalue("servers").fresh_database()


@pytest.fixture
def homes(configure, tmp_path, monkeypatch):
    """Every agent's folder under tmp, for the installers' tests: CLAUDE_CONFIG_DIR,
    CODEX_HOME, COPILOT_HOME and OpenCode's folders."""
    found = {name: tmp_path / name for name in ("claude", "codex", "copilot", "opencode")}
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(found["claude"]))
    monkeypatch.setenv("CODEX_HOME", str(found["codex"]))
    monkeypatch.setenv("COPILOT_HOME", str(found["copilot"]))
    configure("embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: none\n"
              f"  opencode:\n    plugins_dir: {found['opencode'] / 'plugins'}\n"
              f"    config_dir: {found['opencode']}\n    data_dir: {tmp_path / 'oc-data'}\n"
              f"  copilot:\n    hooks_dir: {found['copilot'] / 'hooks'}\n"
              f"    state_dir: {found['copilot'] / 'session-state'}\n")
    return found


# ---- the suite's own cost: CPU per test, children included (LLMEM_TEST_CPU=file) ---------
# Wall time on a shared 2-core machine says little; user+sys of the test and of every process
# it ran (resource's RUSAGE_CHILDREN counts waited-for children) is what the suite costs.

def _cpu_seconds() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import os

    target = os.environ.get("LLMEM_TEST_CPU")
    if not target:
        yield
        return
    import subprocess
    import time

    spawned: list[str] = []
    real_init = subprocess.Popen.__init__

    def counting_init(self, args, *rest, **kwargs):
        spawned.append(" ".join(map(str, args[:4])) if isinstance(args, list | tuple) else str(args)[:60])
        return real_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = counting_init
    cpu, wall, started = _cpu_seconds(), time.monotonic(), time.time()
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real_init
    # The start (epoch seconds) and the xdist worker: a run's idle tail is read off these.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    with open(target, "a") as out:
        out.write(f"{_cpu_seconds() - cpu:.3f}\t{time.monotonic() - wall:.3f}\t{item.nodeid}"
                  f"\t{len(spawned)}\t{' | '.join(sorted(set(spawned)))[:300]}"
                  f"\t{started:.3f}\t{worker}\n")
