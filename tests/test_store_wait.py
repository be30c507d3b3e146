"""`llmem worker` and `llmem run` started while the store's server is away (issue 23, offline
tolerance): each says once that the store does not answer (its URL with the password masked,
and the fix) and waits for it, as `llmem watch` does, then starts when the server is back; a
stop while waiting is a clean stop. A failure waiting cannot fix (a refused password) exits 1
at once. A real PostgreSQL server, really stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psycopg
import pytest
from fakes import wait_until
from servers import PG_PASSWORD

pytestmark = pytest.mark.backend

LLMEM = [sys.executable, "-m", "llmem"]
WAITING = "no PostgreSQL server answers at"


def machine(tmp_path, url):
    """The environment of a machine whose store is `url` (no agents, no embedder)."""
    home = tmp_path / "llmem-home"
    home.mkdir()
    (home / "config.yaml").write_text(
        f"store:\n  url: {url}\nembedding:\n  provider: none\nllm:\n  provider: none\n"
        "session:\n  adapter: none\npipeline:\n  workers: 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    return env | {"LLMEM_HOME": str(home), "HOME": str(tmp_path)}


def start(tmp_path, env, *args) -> tuple[subprocess.Popen, object]:
    out = tmp_path / f"{args[0]}.out"
    process = subprocess.Popen([*LLMEM, *args], env=env, cwd=tmp_path, stdout=out.open("w"),
                               stderr=subprocess.STDOUT)
    return process, lambda: out.read_text(errors="replace")


def heartbeat_pid(url) -> int | None:
    """The pid of the worker whose heartbeat the store holds (None: none yet)."""
    with psycopg.connect(url) as conn:
        if not conn.execute("SELECT to_regclass('setting')").fetchone()[0]:
            return None  # the worker has not made the store yet
        row = conn.execute("SELECT value FROM setting WHERE key LIKE 'worker_owner:%'").fetchone()
    return json.loads(row[0])["pid"] if row else None


def stopped(process: subprocess.Popen, sig=signal.SIGTERM) -> int:
    process.send_signal(sig)
    try:
        return process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


@pytest.mark.parametrize("command", ["worker", "run"])
def test_started_while_the_server_is_down_it_waits_then_starts(tmp_path, servers, command):
    url = servers.fresh_database()
    server = servers.postgres()
    env = machine(tmp_path, url)
    server.stop()
    try:
        process, output = start(tmp_path, env, command)
        wait_until(lambda: WAITING in output(), timeout=60)
        said = output()
        assert PG_PASSWORD not in said and ":***@" in said and "start the server" in said, said
        assert "Traceback" not in said and process.poll() is None, said
    finally:
        server.start()
    try:
        wait_until(lambda: heartbeat_pid(url) == process.pid, timeout=60)
        assert "the store answers; starting" in output() and said.count(WAITING) == 1
        if command == "run":
            wait_until(lambda: "  store postgresql://" in output(), timeout=30)  # its start-up line
            assert PG_PASSWORD not in output()
    finally:
        code = stopped(process, signal.SIGINT)
    assert code == 0 and "Traceback" not in output(), output()


def test_a_stop_while_waiting_is_a_clean_stop(tmp_path, servers):
    url = servers.fresh_database()
    server = servers.postgres()
    env = machine(tmp_path, url)
    server.stop()
    try:
        process, output = start(tmp_path, env, "worker")
        wait_until(lambda: WAITING in output(), timeout=60)
        code = stopped(process)  # systemd's stop (SIGTERM)
    finally:
        server.start()
    assert code == 0 and "stopped while waiting for the store" in output() and "Traceback" not in output()


def test_a_refused_password_is_not_waited_for(tmp_path, servers):
    url = servers.fresh_database().replace(PG_PASSWORD, "not-the-password")
    done = subprocess.run([*LLMEM, "worker"], env=machine(tmp_path, url), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "refused the password" in done.stderr, done.stderr
    assert "waiting" not in done.stderr and "Traceback" not in done.stderr and "not-the-password" not in done.stderr
