"""The hook's side of a resident llmem: where its socket is, and asking it (stdlib only).

An agent runs `llmem hook …` on every turn. When a worker, `llmem run` or `llmem mcp` is
alive it serves hooks over a Unix socket in llmem's home (`cli/resident.py`) with the store
and the embedding model already open, so the hook process only forwards its command line
and the agent's JSON and prints the reply. This module is the hook's whole start-up on that
path: stdlib only (no click, peewee, numpy, httpx or onnxruntime), reached by the console
entry point (`llmem/__main__.py`) before the CLI is imported. Anything unexpected (no socket,
someone else's socket, a refused request, a timeout, a dropped connection) falls back to the
in-process CLI with the same stdin, which answers as it always did.
"""

from __future__ import annotations

import os
import sys

SOCKET_NAME = "resident.sock"
AGENT_CALL_ENV = "LLMEM_AGENT_CALL"  # paths.AGENT_CALL_ENV, without importing pathlib
PROTOCOL = 1
# A hook's budget is 15-30 s (3 s for Codex's SessionEnd, setup/agents.py): waiting this long
# for a hung resident and then answering in-process (~1 s) still fits all of them.
CONNECT_TIMEOUT = 0.5
REPLY_TIMEOUT = 1.5
REQUEST_LIMIT = 8 * 1024 * 1024
# What the answer depends on besides the command line and stdin: a resident started under
# other values (another home, config or agent folders) declines, and the hook runs in-process.
ENV_KEYS = ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "CLAUDE_CONFIG_DIR",
            "CODEX_HOME", "OPENCODE_CONFIG_CONTENT")
# The commands a resident answers, each with its options that take a value and its flags
# (cli/session.py, cli/search.py): `hook` (every agent's hooks), `context` (OpenCode's plugin
# asks for the session-start block with it) and `search` (a fresh process would load the
# embedding model for its one query). An option not named here (say --help) goes to the CLI.
_COMMANDS = {
    "hook": ({"--type", "--session-id", "--project", "--model", "--base-url", "--adapter", "--format",
              "--run-lock-fd"}, {"--sync", "--detach"}),
    "context": ({"--session-id", "--max-tokens", "--project", "--adapter"}, {"--compacting", "--json"}),
    "search": ({"--limit", "-n", "--type", "-t", "--project", "--min-relevance"},
               {"--fts-only", "--semantic-only", "--valid-only", "--include-invalid", "--related",
                "--explain", "--no-track", "--json"}),
}
# `mcp` too: an agent's MCP server relays its session to a resident (mcprelay.py, which
# __main__ asks for it: it builds on this module).
FORWARDED = (*_COMMANDS, "mcp")
# Commands whose arguments are words (search's query), not one payload.
_WORDS = {"search"}
# --sync runs a session's whole extraction inline and --run-lock-fd hands a lock over: those
# belong to the process that asked, never to the resident.
_IN_PROCESS_ONLY = {"--sync", "--run-lock-fd"}


def environment() -> dict:
    """The environment an answer depends on (see ENV_KEYS), as the resident compares it."""
    return {key: value for key, value in os.environ.items()
            if key in ENV_KEYS or (key.startswith("LLMEM_") and key != AGENT_CALL_ENV)}


def socket_path() -> str:
    """resident.sock in llmem's home: `paths.default_paths().config_dir`, said again with
    os.path because importing pathlib would cost every hook more than the rest of this module
    (tests/test_resident.py holds the two equal)."""
    home = os.environ.get("LLMEM_HOME")
    if home:
        return os.path.join(os.path.expanduser(home), SOCKET_NAME)
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config, "llmem", SOCKET_NAME)


def _reads_stdin(argv: list[str]) -> bool | None:
    """Whether `llmem argv` reads the agent's JSON from stdin (a hook without --session-id or
    PAYLOAD); None when the resident must not answer it."""
    if not argv or argv[0] not in _COMMANDS:
        return None
    value_options, flags = _COMMANDS[argv[0]]
    session_id = payload = False
    index = 1
    while index < len(argv):
        word = argv[index]
        name = word.split("=", 1)[0]
        if name in _IN_PROCESS_ONLY:
            return None
        if name in value_options:
            session_id = session_id or name == "--session-id"
            index += 1 if "=" in word else 2
            continue
        if word in flags:
            index += 1
            continue
        if word.startswith("-"):
            return None  # an option this client does not know (or `--`): the CLI says
        if argv[0] in _WORDS:
            index += 1
            continue
        if payload or argv[0] != "hook":
            return None  # a second argument: the CLI says
        payload = True
        index += 1
    return argv[0] == "hook" and not session_id and not payload


def ask_resident(argv: list[str], stdin_text: str | None, *, path=None,
                 reply_timeout: float = REPLY_TIMEOUT) -> dict | None:
    """The resident's answer to `llmem argv` ({"stdout", "stderr"}), or None: run it in-process."""
    import json
    import socket
    import time

    request = json.dumps({"v": PROTOCOL, "argv": argv, "stdin": stdin_text, "env": environment()})
    deadline = time.monotonic() + reply_timeout
    try:
        conn = connect(path)
        if conn is None:
            return None
        with conn:
            conn.sendall(request.encode("utf-8"))
            conn.shutdown(socket.SHUT_WR)
            received = receive_all(conn, deadline)
        if received is None:
            return None
        reply = json.loads(received)
    except (OSError, ValueError):  # refused, reset, timed out, cut short: the in-process path
        return None
    if not isinstance(reply, dict) or not reply.get("ok"):
        return None
    out, err = reply.get("stdout"), reply.get("stderr")
    if not isinstance(out, str) or not isinstance(err, str):
        return None
    return {"stdout": out, "stderr": err}


def connect(path=None):
    """A socket connected to the resident at `path` (default: socket_path()), or None: no
    socket there, one that is not a private socket of this user's, or nobody listening."""
    import socket
    import stat
    import struct

    path = str(path or socket_path())
    try:
        found = os.lstat(path)
    except OSError:
        return None
    # Only a socket of our own, private to us: another user's socket could answer anything.
    if not stat.S_ISSOCK(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT)
        conn.connect(path)
        if hasattr(socket, "SO_PEERCRED"):  # and the process behind it is ours too
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] != os.getuid():
                conn.close()
                return None
    except OSError:
        conn.close()
        return None
    return conn


def receive_all(conn, deadline: float | None = None) -> bytes | None:
    """Everything the peer sends until it closes its side (both ends of the socket read this
    way); None past REQUEST_LIMIT bytes or past `deadline` (time.monotonic()); without a
    deadline, the socket's own timeout bounds each read."""
    import time

    chunks, size = [], 0
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            conn.settimeout(left)
        chunk = conn.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > REQUEST_LIMIT:
            return None


def run_hook(argv: list[str]) -> bool:
    """Answer `llmem hook|context|search …` through the resident; False when the CLI must run
    it (sys.stdin is then what the hook was given, read or not)."""
    if argv[0] == "hook" and os.environ.get(AGENT_CALL_ENV):
        return True  # the agent runs for llmem itself: no session of the user's (cli/session.py)
    reads = _reads_stdin(argv)
    if reads is None:
        return False
    stdin_text = None
    if reads and sys.stdin is not None and not sys.stdin.isatty():
        stdin_text = sys.stdin.read()
    try:
        reply = ask_resident(argv, stdin_text)
    except Exception:  # whatever it was, the agent's JSON still reaches the CLI below
        reply = None
    if reply is None:
        if stdin_text is not None:
            import io

            sys.stdin = io.StringIO(stdin_text)  # the CLI reads what the agent sent
        return False
    try:
        if reply["stdout"]:
            sys.stdout.write(reply["stdout"])
            sys.stdout.flush()
        if reply["stderr"]:
            sys.stderr.write(reply["stderr"])
            sys.stderr.flush()
    except (OSError, ValueError):  # the agent stopped reading: nothing to fail about
        pass
    return True

