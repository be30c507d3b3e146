"""An agent's hook on a PostgreSQL store that cannot be reached answers within its budget
(issue 23, offline tolerance): a process of its own connects with the hook's short timeout
(store.hook_connect_timeout_seconds, 1 s), below psycopg's own 2 s floor, then fails open
with the block last kept for the project; the worker and commands keep the long one
(store.connect_timeout_seconds, 5 s). Against a real socket on 127.0.0.1 that takes the
connection and never says a word, and a port where nothing listens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from servers import free_port
from test_hooks_claude import (
    HOOK,
    PROJECT,
    SESSION,
    claude_dir,  # noqa: F401 - the fixture, asked for as `claude` below
    seed,
    stdin_json,
)

from llmem.app import App
from llmem.errors import StoreError


class SilentServer:
    """Accepts every TCP connection on 127.0.0.1 and never answers (a hung server, a
    firewall that swallows packets after the handshake, a dead VPN)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def url(self) -> str:
        return f"postgresql://llmem:secret-pw@127.0.0.1:{self.port}/llmem"

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def claude(request):
    """Claude Code's folder (test_hooks_claude's fixture), with a config on the SQLite store."""
    return request.getfixturevalue("claude_dir")


@pytest.fixture
def silent():
    server = SilentServer()
    yield server
    server.close()


def _point_store_at(llmem_home, configure, url: str, extra: str = "") -> None:
    text = (llmem_home / "config.yaml").read_text()
    configure(text + f"store:\n  url: {url}\n{extra}")


def _kept_block(cli, monkeypatch, claude) -> str:
    """A session start on the SQLite store first: its block is kept for the project."""
    seed(("Order pages by (created_at, id)", "decision", PROJECT))
    stdin_json(monkeypatch, claude, "SessionStart", source="startup")
    code, out, _ = cli(*HOOK, "--type", "created")
    assert code == 0 and out
    return json.loads(out)["hookSpecificOutput"]["additionalContext"]


def _timed(cli, *args):
    started = time.monotonic()
    code, out, err = cli(*args)
    return code, out, err, time.monotonic() - started


def test_a_session_start_on_a_server_that_never_answers_fails_open_within_a_second(
        cli, claude, monkeypatch, configure, llmem_home, silent):
    kept = _kept_block(cli, monkeypatch, claude)
    _point_store_at(llmem_home, configure, silent.url())
    stdin_json(monkeypatch, claude, "SessionStart", source="startup")
    code, out, err, seconds = _timed(cli, *HOOK, "--type", "created")
    assert code == 0 and silent.accepted  # it did reach the socket, which said nothing
    assert "did not answer within 1 s" in err and "last one kept" in err and "secret-pw" not in err
    assert json.loads(out)["hookSpecificOutput"]["additionalContext"] == kept
    assert 0.9 <= seconds < 1.8  # the hook's 1 s, not psycopg's 2 s floor nor the worker's 5 s


def test_a_session_start_on_a_refused_port_fails_open_at_once(cli, claude, monkeypatch, configure,
                                                              llmem_home):
    kept = _kept_block(cli, monkeypatch, claude)
    _point_store_at(llmem_home, configure, f"postgresql://llmem@127.0.0.1:{free_port()}/llmem")
    stdin_json(monkeypatch, claude, "SessionStart", source="startup")
    code, out, err, seconds = _timed(cli, *HOOK, "--type", "created")
    assert code == 0 and "no PostgreSQL server answers" in err
    assert json.loads(out)["hookSpecificOutput"]["additionalContext"] == kept
    assert seconds < 0.8


def test_the_hooks_timeout_and_the_workers_are_each_configured(cli, claude, monkeypatch, configure,
                                                               llmem_home, silent):
    _point_store_at(llmem_home, configure, silent.url(),
                    "  connect_timeout_seconds: 1.0\n  hook_connect_timeout_seconds: 0.2\n")
    stdin_json(monkeypatch, claude, "Stop")  # a turn's end: nothing to print, exit 0 in time
    code, out, err, seconds = _timed(cli, *HOOK, "--type", "idle")
    assert code == 0 and out == "" and "did not answer within 0.2 s" in err
    assert seconds < 0.8  # the hook's own timeout, not the worker's (as much room as before)
    app = App()  # a command, the worker, the watcher: the long timeout
    started = time.monotonic()
    with pytest.raises(StoreError, match="did not answer within 1 s"):
        _ = app.store
    # The worker's 1 s: not the hook's 0.2 s, nor psycopg's 2 s floor, nor the default 5 s.
    assert 0.95 <= time.monotonic() - started < 2.0


@pytest.mark.slow  # a real hook process, as the agent starts it: interpreter start-up included
def test_a_hook_process_fails_open_inside_codexs_3_s_sessionend_budget(tmp_path, llmem_home, configure, silent):
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\nstore:\n  url: {silent.url()}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")} | {"LLMEM_HOME": str(llmem_home)}
    payload = json.dumps({"session_id": SESSION, "cwd": str(tmp_path), "hook_event_name": "SessionEnd"})
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "llmem", "hook", "--adapter", "codex", "--format", "codex",
                           "--type", "ending"], input=payload, env=env, capture_output=True, text=True, timeout=30)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "did not answer within 1 s" in done.stderr
    assert seconds < 3.0, f"{seconds:.2f} s"
