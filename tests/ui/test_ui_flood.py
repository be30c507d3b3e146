"""Unauthenticated half-open connections (issue 20 item 9): a real viewer on 127.0.0.1 holds a
bounded number of them, closes the rest at once and the slow ones after the header deadline,
logs the storm once, and keeps serving. The full 1,100 against `llmem run --ui` is `slow`."""

from __future__ import annotations

import logging
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from session_writers import CopilotSession

from llmem.ui.server import MAX_CONNECTIONS, ViewerServer, bind
from ui.conftest import TOKEN, make_app


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def closed_by_server(sockets, want: int, timeout: float = 10.0) -> list[socket.socket]:
    """Wait (on the sockets themselves, with epoll: there may be more than 1,024) until `want`
    of them are closed by the server."""
    closed: list[socket.socket] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            selector.register(sock, selectors.EVENT_READ)
        while len(closed) < want and time.monotonic() < deadline:
            for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                try:
                    data = key.fileobj.recv(1)
                except ConnectionResetError:
                    data = b""
                if data == b"":
                    closed.append(key.fileobj)
                    selector.unregister(key.fileobj)
    return closed


def test_half_open_connections_are_bounded_refused_early_and_logged_once(llmem_app, caplog):
    sock = bind(0)
    port = sock.getsockname()[1]
    asgi, _ = make_app(llmem_app, port)
    server = ViewerServer(asgi, sock, max_connections=8, header_timeout=0.4).start()
    caplog.set_level(logging.WARNING, logger="llmem.ui.server")
    clients: list[socket.socket] = []
    try:
        url = f"http://127.0.0.1:{port}/?token={TOKEN}"
        assert httpx.get(url, timeout=10).status_code == 200
        base = open_fds()
        for _ in range(40):  # connect, then say nothing: a half-open client
            clients.append(socket.create_connection(("127.0.0.1", port)))
        refused = closed_by_server(clients, 32)
        assert len(refused) == 32  # beyond the cap: closed as soon as accepted
        held = [c for c in clients if c not in refused]
        assert len(server.server.server_state.connections) <= 8
        assert open_fds() - base - len(clients) <= 8 + 2  # the server holds at most the cap
        # The held ones sent no request head within the deadline: closed too.
        assert len(closed_by_server(held, len(held))) == len(held)
        assert httpx.get(url, timeout=10).status_code == 200  # and the viewer still serves
        said = [r for r in caplog.records if "closed" in r.getMessage() and "connection" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]  # the storm, said once
        assert not any(r.exc_info for r in caplog.records)  # no traceback
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_a_request_head_trickled_in_slower_than_the_deadline_is_cut(llmem_app):
    sock = bind(0)
    port = sock.getsockname()[1]
    asgi, _ = make_app(llmem_app, port)
    server = ViewerServer(asgi, sock, max_connections=8, header_timeout=0.25).start()
    try:
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # ... and the rest never comes
        assert closed_by_server([slow], 1, timeout=5.0) == [slow]
        # After a whole request, the keep-alive connection gets the same deadline again.
        kept = socket.create_connection(("127.0.0.1", port))
        kept.sendall(f"GET /?token={TOKEN} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert kept.recv(12).startswith(b"HTTP/1.1")
        kept.sendall(b"GET / HTT")
        assert closed_by_server([kept], 1, timeout=5.0) == [kept]
    finally:
        server.stop()


# ---- the measured flood: 1,100 sockets against `llmem run --ui` under a 1,024-descriptor limit ----

def wait_for_event(session_id: str, timeout: float = 30.0) -> bool:
    """Whether the store this test's llmem writes (its SQLite file, or on the suite's
    PostgreSQL run its database) records an event of the session, within `timeout`."""
    from llmem.config import load_config
    from llmem.store import Store

    location = load_config().store_location
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with Store.open(location) as store:
            Event = store.models.Event
            if Event.select().where(Event.session_id == session_id).exists():
                return True
        time.sleep(0.2)
    return False


def _low_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.slow
def test_1100_slow_connections_leave_llmem_run_ui_its_descriptors(configure, tmp_path, llmem_home):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip("this test opens 1,100 sockets itself")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 4096, hard))
    state = tmp_path / "copilot" / "session-state"
    state.mkdir(parents=True)
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n")
    out = tmp_path / "run.out"
    with out.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "llmem", "run", "--ui", "--no-browser", "-w", "1"],
                                   stdout=sink, stderr=subprocess.PIPE, env=os.environ.copy(),
                                   preexec_fn=_low_fd_limit)
    clients: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while not out.read_text().endswith("\n"):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        url = out.read_text().strip()
        port = int(url.split(":")[2].split("/")[0])
        for _ in range(1100):
            clients.append(socket.create_connection(("127.0.0.1", port)))
        refused = closed_by_server(clients, 1100 - MAX_CONNECTIONS, timeout=60.0)
        assert len(refused) >= 1100 - MAX_CONNECTIONS  # beyond the cap: closed at once
        held_fds = len(os.listdir(f"/proc/{process.pid}/fd"))
        assert held_fds < MAX_CONNECTIONS + 100, held_fds  # the cap (and the process's own), not 1,100
        # While the held ones wait for their deadline, the watcher beside the viewer still
        # has descriptors: a new session is seen and its event recorded.
        session = CopilotSession(state)
        session.start()
        session.user("Remember that the flood test writes this session.")
        session.reply("Noted.")
        assert wait_for_event(session.id), "the watcher missed the session"
        rest = [c for c in clients if c not in refused]
        assert len(closed_by_server(rest, len(rest), timeout=60.0)) == len(rest)  # the header deadline
        assert httpx.get(url, timeout=10).status_code == 200
        assert process.poll() is None  # the watcher and the worker beside it still run
    finally:
        for client in clients:
            client.close()
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
    logs = sum(p.stat().st_size for p in llmem_home.rglob("*.log"))
    assert logs + len(err) < 64 * 1024, (logs, err[-2000:])  # no flood of tracebacks
    assert b"Too many open files" not in err
