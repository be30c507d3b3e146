"""A PostgreSQL store whose server's disk fills up (issue 23, bad input): the write that
cannot land is said in the user's terms with the fix, and nothing of it is left half-written
(an import is all or nothing); the store takes the next write that fits.

The disk is filled for real, by the kernel, as tests/test_full_disk.py does for SQLite: the
server runs under a file-size limit (RLIMIT_FSIZE), so a table's file that must grow past it
cannot (PostgreSQL ignores SIGXFSZ precisely so that such a limit fails like a full disk:
"could not extend file"). No mount, no root: a CI runner can do it.
"""

from __future__ import annotations

import json
import resource
import secrets
import shutil
import subprocess

import pytest
from servers import REQUIRED, PostgresServer, start_postgres

from llmem.store import Store

# Above a WAL segment (16 MB, made whole when the server starts one), below what the import writes.
FILE_LIMIT = 24 << 20


class LimitedServer(PostgresServer):
    """A server whose processes may not grow any file past FILE_LIMIT."""

    def _pg_ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        def limit():
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))

        return subprocess.run([str(self.bin / "pg_ctl"), "-D", str(self.data), *args], user=self.user,
                              capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


@pytest.fixture
def full_server():
    try:
        started = start_postgres()
    except RuntimeError as exc:
        if REQUIRED:
            pytest.fail(f"no PostgreSQL server: {exc}", pytrace=False)
        pytest.skip(f"no PostgreSQL server: {exc}")
    started.stop()
    server = LimitedServer(started.data, started.port, started.bin, started.user)
    server.start()
    server.psql("CREATE DATABASE llmem")
    server.psql("CREATE EXTENSION vector", database="llmem")
    yield server
    server.stop()
    shutil.rmtree(server.data, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.backend
def test_a_full_server_disk_fails_an_import_whole_and_names_the_fix(full_server, tmp_path, cli, configure):
    url = full_server.url("llmem")
    # Incompressible text (hex of random bytes compresses only to half): ~40 MB of memories.
    document = {"version": 1, "relations": [], "memories": [
        {"id": f"00000000-0000-4000-8000-{i:012d}", "type": "fact", "content": secrets.token_hex(10_000)}
        for i in range(2000)]}
    dump = tmp_path / "big.json"
    dump.write_text(json.dumps(document))
    configure(f"store:\n  url: {url}\nembedding:\n  provider: none\nllm:\n  provider: none\n")
    code, out, err = cli("import", str(dump))
    assert code == 1, (out, err)
    assert "disk" in err and "full" in err and "nothing of it was saved" in err, err
    assert "Traceback" not in err and "pg-Test-pass" not in err
    with Store.open(url) as store:
        assert store.models.Memory.select().count() == 0  # all or nothing
        store.add("a small memory still fits")
        assert store.models.Memory.select().count() == 1
