"""peewee imports every database driver it finds at its own import; psycopg (the `postgres`
extra, installed here) costs ~100 ms of CPU, most of a command's or a hook's start-up on a
SQLite store. llmem imports peewee without it (llmem/__init__.py), and a PostgreSQL store
brings its own driver (db/postgres/connection.py). Each check runs in a fresh interpreter:
what this test process imported first would decide it otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from llmem.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
loaded = "psycopg" in sys.modules
import peewee, psycopg  # still importable once peewee is in
print(json.dumps({"loaded": loaded, "peewee_sees": peewee.psycopg is not None, "later": psycopg.__name__}))
"""


def _probe(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_command_on_a_sqlite_store_never_imports_the_postgres_driver(configure):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    found = _probe("add", "-c", "the api listens on 8080")
    assert found == {"loaded": False, "peewee_sees": False, "later": "psycopg"}


@pytest.mark.backend
def test_a_postgres_store_works_with_peewee_imported_without_the_driver(configure, servers):
    configure(f"store:\n  url: {servers.fresh_database()}\nembedding:\n  provider: none\n"
              "llm:\n  provider: none\n")
    done = subprocess.run([sys.executable, "-c", PROBE.replace("import peewee, psycopg", "import peewee, psycopg\n"
                           "from llmem.app import App\nmemories = App().store.list()\n"
                           "assert [m.content for m in memories] == ['the api listens on 8080'], memories"),
                           "add", "-c", "the api listens on 8080"],
                          capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # The store on PostgreSQL loaded psycopg itself; peewee's own reference stays empty.
    assert found == {"loaded": True, "peewee_sees": False, "later": "psycopg"}
