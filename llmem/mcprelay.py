"""`llmem mcp` as a relay: an agent's MCP session served by a resident llmem (stdlib only).

The MCP SDK's import alone is ~0.5-0.7 s of CPU here, and the first search of a new server
loads the embedding model and pages the vectors in. When a worker, `llmem run` or another
`llmem mcp` is alive, its resident (cli/resident.py) has all of that open already: the agent's
`llmem mcp` then sends a first line on resident.sock (its working folder, which scopes the
tools, and the environment the answers depend on, hookclient.environment), and, once the
resident has taken the session, copies the MCP byte stream between its stdin/stdout and the
socket. The resident runs the same tools (mcp_server.RelayedSessions). Reached from the console
entry point (llmem/__main__.py) before the CLI is imported, as a hook is.

Fail safe: no socket, someone else's, nobody listening, a decline (another environment) or no
answer within SESSION_TIMEOUT, and the CLI serves the session in-process with stdin unread.
When the server of a session goes away mid-session (the worker restarts, the other agent's
`llmem mcp` is stopped), the relay moves the session on: each call that was in flight gets a
JSON-RPC error (it may or may not have been done), the agent's `initialize` is replayed to a
new server (the resident again, or an `llmem mcp` of the relay's own, which serves in-process)
and its answer dropped, and the session goes on where it was. Only complete lines are passed
on, so that neither side ever reads a message cut by the move.
"""

from __future__ import annotations

import json
import os
import sys

from .hookclient import PROTOCOL, connect, environment

# How long a relay waits for the resident to take its session before the CLI serves it itself
# (~1 s of SDK import and model load): a resident answers in a few ms, one busy with a hook in
# ~50 ms, one that has just started may still be importing the SDK.
SESSION_TIMEOUT = 1.0
CHUNK = 65536
MAX_MOVES = 3  # new servers for one session, after which the relay gives up (exit 1)
LOST_CALL = -32603  # JSON-RPC's "internal error"
LOST_CALL_TEXT = ("llmem: the process serving this session stopped during this call, which may or "
                  "may not have been done; the session goes on: call again")


def relay(argv: list[str]) -> bool:
    """`llmem mcp` (or `llmem mcp serve`) served through the resident (True), or False: the CLI
    runs it (any other command line, or no resident to take the session)."""
    return argv in (["mcp"], ["mcp", "serve"]) and relay_mcp()


def relay_mcp(*, path=None, stdin_fd: int = 0, stdout_fd: int = 1,
              timeout: float = SESSION_TIMEOUT) -> bool:
    """Serve `llmem mcp` through the resident: False (nothing read from stdin, nothing written)
    when it does not take the session within `timeout`, and the CLI serves it in-process; else
    relay the session until the agent ends it (True). SystemExit(1), said on stderr, when its
    server went away and no other could take it on."""
    upstream = _resident(path, timeout)
    if upstream is None:
        return False
    _Relay(stdin_fd, stdout_fd, path).run(upstream)
    return True


def _resident(path, timeout: float) -> _Socket | None:
    """The resident's socket once it has taken the session, else None (and the socket closed)."""
    import time

    try:
        header = {"v": PROTOCOL, "mcp": {"cwd": os.getcwd()}, "env": environment()}
    except OSError:  # the working folder is gone
        return None
    conn = connect(path)
    if conn is None:
        return None
    deadline = time.monotonic() + timeout
    try:
        conn.sendall(json.dumps(header).encode("utf-8") + b"\n")
        received = b""
        while b"\n" not in received:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            conn.settimeout(left)
            chunk = conn.recv(CHUNK)
            if not chunk:
                raise ConnectionResetError
            received += chunk
        line, after = received.split(b"\n", 1)
        answer = json.loads(line)
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            raise ValueError(answer)
    except (OSError, ValueError):
        conn.close()
        return None
    conn.settimeout(None)
    return _Socket(conn, answer.get("pid"), after)


class _Socket:
    """A session's server: the resident, over its socket."""

    def __init__(self, conn, pid, early: bytes = b""):
        self.conn, self.early = conn, early  # early: what it sent with its answer
        self.name = f"the llmem process serving this session (pid {pid})"

    def fileno(self) -> int:
        return self.conn.fileno()

    def read(self) -> bytes:
        try:
            return self.conn.recv(CHUNK)
        except OSError:
            return b""

    def write(self, data: bytes) -> bool:
        try:
            self.conn.sendall(data)
            return True
        except OSError:
            return False

    def end_input(self) -> None:
        import socket

        try:
            self.conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.conn.close()


class _Child:
    """A session's server: an `llmem mcp` of the relay's own (in-process, when no resident takes
    it), in a session of its own, so that the agent ending the relay's process group leaves it
    to finish what it serves for others (cli/mcp.py: it stays until their sessions end)."""

    early = b""

    def __init__(self):
        import subprocess

        self.proc = subprocess.Popen([sys.executable, "-m", "llmem", "mcp"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        self.name = f"the llmem mcp started for this session (pid {self.proc.pid})"

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def read(self) -> bytes:
        try:
            return os.read(self.proc.stdout.fileno(), CHUNK)
        except OSError:
            return b""

    def write(self, data: bytes) -> bool:
        return _write_all(self.proc.stdin.fileno(), data)

    def end_input(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        self.end_input()
        self.proc.stdout.close()


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:  # the reader is gone
            return False
    return True


def _message(line: bytes) -> dict | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _key(request_id) -> str:
    return json.dumps(request_id)  # 1 and "1" are two ids


class _Relay:
    """One agent's session, copied line by line between its stdio and a server, which may change."""

    def __init__(self, stdin_fd: int, stdout_fd: int, path):
        self.stdin_fd, self.stdout_fd, self.path = stdin_fd, stdout_fd, path
        self.stdin_open = True
        self.from_agent = self.from_server = b""  # a line not complete yet
        self.handshake: list[bytes] = []  # the agent's initialize and initialized, as it sent them
        self.pending: dict[str, tuple] = {}  # the agent's requests not answered yet: (id, method)
        self.dropped: set[str] = set()  # the replayed initialize, whose answer the agent has

    def run(self, upstream) -> None:
        for moves in range(MAX_MOVES + 1):
            if upstream.early and not self._to_agent(upstream.early):
                return
            ended_by_agent = self._pump(upstream)
            upstream.close()
            if ended_by_agent:
                return
            gone = upstream.name
            if not self._answer_lost_calls():
                return
            upstream = self._next_server() if moves < MAX_MOVES else None
            if upstream is None:
                break
            for line in self.handshake:
                message = _message(line)
                if "id" in message and _key(message["id"]) not in self.pending:
                    self.dropped.add(_key(message["id"]))
                upstream.write(line)
        try:
            sys.stderr.write(f"llmem mcp: {gone} stopped; start the MCP server again\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        raise SystemExit(1)

    def _next_server(self):
        upstream = _resident(self.path, SESSION_TIMEOUT)  # restarted, or another took over
        if upstream is not None:
            return upstream
        try:
            return _Child()
        except OSError:
            return None

    def _pump(self, upstream) -> bool:
        """Copy both ways until the server closes: True when the agent ended the session
        first (its stdin closed, or its stdout no longer read), False when the server did."""
        import select

        poller = select.poll()  # poll, not epoll: stdin may be a regular file
        if self.stdin_open:
            poller.register(self.stdin_fd, select.POLLIN)
        server_fd = upstream.fileno()
        poller.register(server_fd, select.POLLIN)
        while True:
            # The server's end first when both are ready: an agent's call that came after the
            # server went then waits for the next server instead of going into the closed
            # socket, where it would be lost (poll lists stdin first, registered first).
            for fd, _ in sorted(poller.poll(), key=lambda event: event[0] != server_fd):
                if fd == server_fd:
                    data = upstream.read()
                    if not data:
                        return not self.stdin_open
                    if not self._to_agent(data):
                        return True
                    continue
                try:
                    data = os.read(self.stdin_fd, CHUNK)
                except OSError:
                    data = b""
                if data:
                    lines = self._agent_lines(data)
                    if lines and not upstream.write(lines):
                        return False
                    continue
                # The agent is done: the server answers what it was asked, then closes.
                poller.unregister(self.stdin_fd)
                self.stdin_open = False
                upstream.end_input()

    def _agent_lines(self, data: bytes) -> bytes:
        """The complete lines of the agent's so far, noting its requests and its handshake."""
        self.from_agent += data
        if b"\n" not in self.from_agent:
            return b""
        complete, self.from_agent = self.from_agent.rsplit(b"\n", 1)
        complete += b"\n"
        for line in complete.splitlines(keepends=True):
            message = _message(line)
            if message is None:
                continue
            method = message.get("method")
            if method is not None and "id" in message:
                self.pending[_key(message["id"])] = (message["id"], method)
                if method == "initialize":
                    self.handshake = [line]
            elif method == "notifications/initialized":
                self.handshake.append(line)
        return complete

    def _to_agent(self, data: bytes) -> bool:
        """Write the server's complete lines to the agent (False: it no longer reads), all but
        the answer to a replayed initialize."""
        self.from_server += data
        if b"\n" not in self.from_server:
            return True
        complete, self.from_server = self.from_server.rsplit(b"\n", 1)
        kept = []
        for line in (complete + b"\n").splitlines(keepends=True):
            message = _message(line)
            if message is not None and "id" in message and "method" not in message:  # an answer
                key = _key(message["id"])
                if key in self.dropped:
                    self.dropped.discard(key)
                    continue
                self.pending.pop(key, None)
            kept.append(line)
        return _write_all(self.stdout_fd, b"".join(kept))

    def _answer_lost_calls(self) -> bool:
        """Tell the agent its calls in flight are lost (all but an initialize, which is replayed);
        False when it no longer reads."""
        self.from_server = b""  # a line cut short by the server's end
        lost = [(key, request_id) for key, (request_id, method) in self.pending.items()
                if method != "initialize"]
        errors = b"".join(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {
            "code": LOST_CALL, "message": LOST_CALL_TEXT}}).encode("utf-8") + b"\n" for _, request_id in lost)
        for key, _ in lost:
            del self.pending[key]
        return not errors or _write_all(self.stdout_fd, errors)
