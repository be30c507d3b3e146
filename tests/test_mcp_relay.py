"""`llmem mcp` relayed to a resident llmem (hookclient.relay_mcp → cli/resident.py →
mcp_server.RelayedSessions): the spawned process imports nothing heavy, the session is scoped to
its own working folder, several run at once, and whenever the resident cannot take a session
(none, stale, foreign, hung, another environment) the process serves it itself; a resident
that goes away mid-session ends the relay with a message, never a hang.

The resident here is the test process's own (Resident(App())), with the tools on a thread of
its own as in a worker; tests/test_mcp.py runs every tool through a relay to a real `llmem mcp`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from fakes import wait_until
from mcp_client import McpClient
from test_mcp import _server_pids, loads_the_sdk, relay_pid
from test_mcp_edges import RawClient, _text
from test_resident import FakeResident

from llmem import hookclient, mcprelay
from llmem.app import App
from llmem.cli.resident import Resident

HEAVY = ("click", "peewee", "numpy", "httpx", "onnxruntime", "mcp", "pydantic", "anyio")


@pytest.fixture
def repos(tmp_path, configure):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    made = []
    for name in ("acme", "beta", "gamma"):
        (tmp_path / name / ".git").mkdir(parents=True)
        made.append(tmp_path / name)
    return made


def ready_for_relays(served: Resident) -> Resident:
    """`served` once it can take a relayed session: a resident imports the MCP SDK beside its
    first hooks, and a relay that connects meanwhile waits for it (the first import in a
    process, several seconds on a loaded machine, can outlast the relay's SESSION_TIMEOUT, and
    the relay then serves its session itself, rightly, but not what these tests are about)."""
    assert served is not None and served._relayed_sessions() is not None
    return served


@pytest.fixture
def resident(repos):
    served = ready_for_relays(Resident(App()).start())
    yield served
    served.stop()


@pytest.fixture
def devnull():
    with open(os.devnull, "w") as sink:
        yield sink


def memories():
    app = App()
    try:
        return {m.content: m.project for m in app.store.list(limit=None)}
    finally:
        app.close()


def imported_modules(stderr_text: str) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in stderr_text.splitlines()
            if line.startswith("import time:")}


def test_a_relayed_session_is_the_residents_and_imports_nothing_heavy(repos, resident, tmp_path, caplog):
    caplog.set_level("INFO", logger="llmem")  # as a worker's logging sets it
    acme = repos[0]
    errlog_path = tmp_path / "relay-stderr.txt"
    with errlog_path.open("w") as errlog:
        client = McpClient({**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}, cwd=acme, errlog=errlog).start()
        try:
            relay_pid(acme)
            assert len(client.list_tools().tools) == 7
            stored = client.text("remember", content="The acme service deploys from the release branch.")
            assert stored.startswith("Stored fact")
            assert "release branch" in client.text("search", query="acme deploys release")
        finally:
            client.close()
    # Stored by the resident (this process), in the relay's repository, not the resident's folder.
    assert memories() == {"The acme service deploys from the release branch.": str(acme)}
    imported = imported_modules(errlog_path.read_text())
    assert "socket" in imported and imported.isdisjoint(HEAVY), imported & set(HEAVY)
    wait_until(lambda: resident._sessions.count == 0, timeout=10, interval=0.01)
    # Logged to mcp.log, as `llmem mcp` logs (the host here is no MCP server of its own).
    logged = (resident.app.config.log_dir / "mcp.log").read_text()
    assert f"serving a relayed MCP session (project {acme})" in logged


def test_several_sessions_at_once_each_in_its_own_repository(repos, resident, devnull):
    replies, failures = {}, []

    def session(repo: Path):
        try:
            client = McpClient(dict(os.environ), cwd=repo, errlog=devnull).start()
            try:
                client.text("remember", content=f"The {repo.name} team owns the {repo.name} queue.")
                replies[repo.name] = client.text("search", query="team owns queue")
            finally:
                client.close()
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=session, args=(repo,)) for repo in repos]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    # Each search saw its own repository's memory only: the session's scope is its relay's.
    for repo in repos:
        assert f"The {repo.name} team" in replies[repo.name]
        assert all(f"The {other.name} team" not in replies[repo.name] for other in repos if other != repo)
    assert memories() == {f"The {repo.name} team owns the {repo.name} queue.": str(repo) for repo in repos}


def test_the_resident_stopping_mid_session_moves_the_session_to_a_new_server(repos, resident):
    client = RawClient(dict(os.environ), repos[0])
    try:
        relay_pid(repos[0])
        client.send(client.call_line(1, "remember", '{"content": "Remembered before the move."}'))
        assert _text(client.receive()).startswith("Stored fact")
        resident.stop()  # the worker stops (or restarts): its sessions are cut
        # The same session goes on, on an `llmem mcp` the relay started (no resident is left).
        client.send(client.call_line(2, "search", '{"query": "remembered before the move"}'))
        reply = client.receive()
        assert reply["id"] == 2 and "Remembered before the move." in _text(reply)
        client.send(client.call_line(3, "remember", '{"content": "Remembered after the move."}'))
        assert _text(client.receive()).startswith("Stored fact")
        assert client.finish() == (0, "")
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
    assert memories() == {"Remembered before the move.": str(repos[0]),
                          "Remembered after the move.": str(repos[0])}
    # The server it started became the resident, and went with its session.
    wait_until(lambda: not os.path.exists(hookclient.socket_path()), timeout=30, interval=0.02)


def test_a_call_in_flight_when_its_server_goes_gets_an_error_and_the_session_goes_on(repos):
    from concurrent.futures import ThreadPoolExecutor

    tools_thread = ThreadPoolExecutor(max_workers=1)
    served = ready_for_relays(Resident(App(), run_on=tools_thread).start())
    gate = threading.Event()
    client = RawClient(dict(os.environ), repos[0])
    try:
        relay_pid(repos[0])
        tools_thread.submit(gate.wait)  # the tools' thread is busy: the next call waits for it
        client.send(client.call_line(1, "search", '{"query": "anything"}'))
        wait_until(lambda: served._sessions.count == 1, timeout=10, interval=0.01)
        served.stop()
        lost = client.receive()
        assert lost["id"] == 1 and lost["error"]["code"] == mcprelay.LOST_CALL
        assert "may or may not have been done" in lost["error"]["message"]
        client.send(client.call_line(2, "remember", '{"content": "Stored after the lost call."}'))
        assert _text(client.receive()).startswith("Stored fact")
        assert client.finish() == (0, "")
    finally:
        gate.set()
        tools_thread.shutdown()
        if client.proc.poll() is None:
            client.proc.kill()


def test_a_relay_that_finds_no_new_server_ends_with_a_message(repos, resident, configure):
    client = RawClient(dict(os.environ), repos[0])
    try:
        relay_pid(repos[0])
        configure("search:\n  limit: many\n")  # every new `llmem mcp` stops at once
        resident.stop()
        assert client.receive(timeout=60) is None  # EOF: the agent sees its server end
        code, stderr = client.finish(timeout=60)
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
    assert code == 1 and "stopped; start the MCP server again" in stderr.splitlines()[-1], stderr


def test_a_relay_whose_agent_leaves_ends_its_session_on_the_resident(repos, resident):
    client = RawClient(dict(os.environ), repos[0])
    client.send(client.call_line(1, "search", '{"query": "anything"}'))
    assert client.receive()["id"] == 1
    assert resident._sessions.count == 1
    code, stderr = client.finish()
    assert code == 0 and stderr == ""
    wait_until(lambda: resident._sessions.count == 0, timeout=10, interval=0.01)


# ---- when the resident cannot take the session -------------------------------------------------

def relay_with(stdin_bytes: bytes = b"", **kwargs) -> tuple[bool, bytes]:
    """hookclient.relay_mcp in this process, on a pipe holding `stdin_bytes`: (its answer, what
    it left unread on stdin)."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, stdin_bytes)
    os.close(write_fd)
    with open(os.devnull, "wb") as stdout:
        try:
            answered = mcprelay.relay_mcp(stdin_fd=read_fd, stdout_fd=stdout.fileno(), **kwargs)
            return answered, os.read(read_fd, 65536)
        finally:
            os.close(read_fd)


def test_no_socket_or_a_stale_one_serves_in_process_and_becomes_the_resident(repos, devnull):
    acme = repos[0]
    assert relay_with(b"first line\n") == (False, b"first line\n")
    path = hookclient.socket_path()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    os.chmod(path, 0o600)
    stale.close()  # the file stays, nobody listens: a host killed with SIGKILL
    assert relay_with(b"first line\n") == (False, b"first line\n")
    client = McpClient(dict(os.environ), cwd=acme, errlog=devnull).start()
    try:
        [pid] = _server_pids()
        assert loads_the_sdk(pid)  # in its own process
        client.text("remember", content="Served in-process after a stale socket.")
        # …and it took the stale socket over: the next `llmem mcp` is relayed to it.
        wait_until(lambda: hookclient.connect() is not None, timeout=30, interval=0.02)
        beside = McpClient(dict(os.environ), cwd=repos[1], errlog=devnull).start()
        try:
            relay_pid(repos[1])
            assert "stale socket" in beside.text("search", query="served in-process", project="")
        finally:
            beside.close()
    finally:
        client.close()


def test_a_socket_that_is_not_private_is_not_used(repos, resident):
    os.chmod(resident.path, 0o666)
    started = time.monotonic()
    assert relay_with(b"{}\n") == (False, b"{}\n")
    assert time.monotonic() - started < 0.5


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner takes root")
def test_a_socket_owned_by_someone_else_is_not_used(repos, resident):
    os.chown(resident.path, 4242, 4242)
    assert relay_with(b"{}\n") == (False, b"{}\n")


def test_a_hung_resident_costs_the_relay_its_timeout_and_leaves_stdin_unread(repos):
    fake = FakeResident("hang")
    try:
        started = time.monotonic()
        assert relay_with(b'{"jsonrpc": "2.0"}\n', timeout=0.3) == (False, b'{"jsonrpc": "2.0"}\n')
        assert time.monotonic() - started < 1.5
    finally:
        fake.close()


def test_a_resident_of_another_environment_or_config_declines(repos, resident, monkeypatch):
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", "/elsewhere")  # the tools would read other sessions
    assert relay_with() == (False, b"")
    monkeypatch.delenv("CLAUDE_CONFIG_DIR")
    configured = Resident(App(), config_path="/elsewhere/config.yaml", path=Path(resident.path).with_name("c.sock"))
    assert configured.start() is not None
    try:
        assert relay_with(path=configured.path) == (False, b"")
    finally:
        configured.stop()
    assert relay_with(b"x") == (True, b"")  # the same environment: taken (and ended: stdin closed)


def test_a_first_line_that_is_not_a_session_is_declined_on_the_wire(repos, resident):
    for line in (b"not json", b'{"v": 1, "mcp": {"cwd": "relative/folder"}, "env": {}}',
                 json.dumps({"v": 99, "mcp": {"cwd": str(repos[0])}}).encode()):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(resident.path)
            conn.sendall(line + b"\n")
            reply = json.loads(conn.makefile("rb").readline())
        assert reply["ok"] is False and reply["why"], reply
    # …and hooks are still answered on the same socket.
    assert hookclient.ask_resident(["search", "anything", "--json"], None) is not None


# ---- an `llmem mcp` host whose own agent leaves -----------------------------------------------

def test_a_host_whose_agent_closes_stdin_serves_the_relayed_sessions_to_their_end(repos):
    env = dict(os.environ)
    host = RawClient(env, repos[0])
    try:
        wait_until(lambda: hookclient.connect() is not None, timeout=30, interval=0.02)
        relayed = RawClient(env, repos[1])
        relay_pid(repos[1])
        host.proc.stdin.close()  # the host's own agent is done
        relayed.send(relayed.call_line(1, "remember", '{"content": "Beta ships on Tuesdays."}'))
        assert _text(relayed.receive()).startswith("Stored fact")
        assert host.proc.poll() is None  # still serving the relayed session
        assert relayed.finish() == (0, "")
        assert host.finish()[0] == 0  # and gone once it ended
    finally:
        for client in (host, locals().get("relayed")):
            if client is not None and client.proc.poll() is None:
                client.proc.kill()
    assert memories() == {"Beta ships on Tuesdays.": str(repos[1])}


def test_only_the_serving_command_lines_are_relayed(repos, resident):
    for argv in (["mcp", "--help"], ["mcp", "serve", "extra"], ["mcp", "bogus"]):
        assert mcprelay.relay(argv) is False  # the CLI says what it says about them


def test_a_call_sent_after_the_server_went_waits_for_the_next_server_not_lost(tmp_path):
    """The server's end and the agent's next call ready at the same wake-up (a loaded machine:
    the resident stopped, then the call came, before the relay ran): the end is read first, so
    the call goes to the next server instead of into the closed socket, where it was lost."""
    ours, theirs = socket.socketpair()
    upstream = mcprelay._Socket(ours, pid=1)
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    try:
        relay = mcprelay._Relay(stdin_r, stdout_w, tmp_path / "resident.sock")
        theirs.shutdown(socket.SHUT_RDWR)  # the resident stopped: its sessions are cut
        theirs.close()
        os.write(stdin_w, b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {}}\n')
        assert relay._pump(upstream) is False  # the server ended, not the agent
        assert relay.pending == {}  # the call was not sent into the closed socket
        assert relay._answer_lost_calls()
        os.close(stdout_w)
        stdout_w = -1
        assert os.read(stdout_r, 4096) == b""  # nothing told lost: the call is still to be read
        assert b'"id": 2' in os.read(stdin_r, 4096)
    finally:
        upstream.close()
        for fd in (stdin_r, stdin_w, stdout_r, stdout_w):
            if fd >= 0:
                os.close(fd)
