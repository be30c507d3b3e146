"""A resident llmem answers hooks: a Unix socket in llmem's home, served by a long-lived process.

The worker, `llmem run` and `llmem mcp` start one (`start_resident`). A hook process
(`hookclient.py`, stdlib only) sends its command line, the agent's JSON and the environment
its answer depends on; this side runs the very `llmem hook` command (cli/session.py) on an App
whose store and embedding model are already open, with the hook's output captured, and sends
the bytes back. Whatever it cannot answer exactly as the hook process would (another
environment, --sync, a bad command line, a failure), it declines, and the hook runs
in-process. It lives in cli/ because it runs a CLI command.

An agent's `llmem mcp` asks it too (hookclient.relay_mcp): a first line with its working
folder and environment, then the MCP byte stream both ways, which a server of its own here
answers (mcp_server.RelayedSessions: the same tools, on the open store and model); declined
(another environment, --config, the SDK not ready), the relay serves the session itself.

The socket is the user's alone: created mode 0600 in the private home, never taken over from
another user (a socket there owned by someone else is left and reported), replaced when it is
stale (nobody listening), and removed at stop only while it is still this process's.
"""

from __future__ import annotations

import io
import json
import logging
import os
import select
import socket
import stat
import sys
import threading

import click

from ..hookclient import PROTOCOL, REQUEST_LIMIT, environment, socket_path

log = logging.getLogger("llmem.resident")
# One hook at a time: a SessionStart is ~20-50 ms here, and others wait in the backlog (a
# client gives up after hookclient.REPLY_TIMEOUT and answers in-process).
BACKLOG = 64
ACCEPT_POLL_SECONDS = 0.5
READ_TIMEOUT_SECONDS = 5.0


class Declined(Exception):
    """The resident does not answer this request: the hook runs in-process."""


class Resident:
    """The socket server of one long-lived process; `start()` returns None when it cannot serve."""

    def __init__(self, host_app, config_path: str | None = None, path=None, run_on=None,
                 linger: bool = False):
        # The host's App: its store (a connection per thread, as the worker's threads have)
        # and its embedder, so the model is loaded once per process. `run_on`: an executor
        # that must run every use of the store (`llmem mcp` keeps one thread on it).
        self.app = host_app
        self.run_on = run_on
        self.config_path = config_path
        self.path = os.fspath(path or socket_path())
        self.environment = environment()
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._stop = threading.Event()
        # Written at stop: wakes the accept loop at once rather than at its next poll (a
        # shutdown() does not wake an accept() on a Unix socket). Made at start.
        self._wake_r = self._wake_w = None
        self._thread: threading.Thread | None = None
        self._hook_log = None
        # The MCP sessions relayed here (mcp_server.RelayedSessions), made at the first one;
        # `linger`: at stop, wait for them to end instead of cutting them (cli/mcp.py).
        self._sessions = None
        self._sessions_lock = threading.Lock()
        self.linger = linger

    # ---- the socket ----------------------------------------------------------------------

    def start(self) -> Resident | None:
        _route_std_streams()
        try:
            listener = self._bind()
        except OSError as exc:
            log.warning("not serving hooks on %s: %s", self.path, exc.strerror or exc)
            listener = None
        if listener is None:
            _unroute_std_streams()
            return None
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="llmem-resident", daemon=True)
        self._thread.start()
        log.info("serving hooks on %s", self.path)
        return self

    def _bind(self) -> socket.socket | None:
        from pathlib import Path

        from ..paths import ensure_private_dir

        ensure_private_dir(Path(self.path).parent)
        try:
            found = os.lstat(self.path)
        except FileNotFoundError:
            found = None
        if found is not None:
            if found.st_uid != os.getuid():
                log.warning("not serving hooks: %s belongs to uid %d, not to this user; remove it",
                            self.path, found.st_uid)
                return None
            if not stat.S_ISSOCK(found.st_mode):
                log.warning("not serving hooks: %s is not a socket; remove it", self.path)
                return None
            if _answers(self.path):
                log.info("hooks are served by another llmem already (%s)", self.path)
                return None
        # Bound under a name of its own, then renamed over the final one: a client never sees
        # a socket that is not ready, nor one that is not private yet.
        staging = f"{self.path}.{os.getpid()}"
        try:
            os.unlink(staging)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(staging)
            os.chmod(staging, 0o600)
            listener.listen(BACKLOG)
            listener.settimeout(ACCEPT_POLL_SECONDS)
            os.replace(staging, self.path)  # a stale socket (nobody listening) goes
            self._inode = os.lstat(self.path).st_ino
        except OSError:
            listener.close()
            try:
                os.unlink(staging)
            except OSError:
                pass
            raise
        return listener

    def stop(self) -> None:
        self._stop.set()
        if self._wake_w is not None:
            self._wake_w.send(b"x")
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=READ_TIMEOUT_SECONDS + ACCEPT_POLL_SECONDS)
            _unroute_std_streams()
        if self._listener is not None:
            self._listener.close()
        try:  # removed only while it is still ours (a newer resident may have replaced it)
            if self._inode is not None and os.lstat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass
        with self._sessions_lock:  # after a preparation under way, if one is
            sessions, self._sessions = self._sessions, None
        if sessions is not None:
            sessions.stop(linger=self.linger)
        if self._hook_log is not None:
            logging.getLogger("llmem.hooks").removeHandler(self._hook_log)
            self._hook_log.close()
        self._close_wake()

    def _close_wake(self) -> None:
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()
        self._wake_r = self._wake_w = None

    def _serve(self) -> None:
        self._on_host(self._warm)
        # The SDK imported now, beside the hooks, not when an agent's first MCP session waits.
        threading.Thread(target=self._relayed_sessions, name="llmem-mcp-prepare", daemon=True).start()
        wake = self._wake_r
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._listener, wake], [], [], ACCEPT_POLL_SECONDS)
                if self._stop.is_set():
                    return
                if not ready:
                    continue
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except (OSError, ValueError):  # ValueError: closed by a stop that gave up waiting
                if self._stop.is_set():
                    return
                continue
            handed_over = False
            try:
                handed_over = self._answer(conn)
            except Exception as exc:  # one client's trouble never stops the server
                log.debug("resident: a request failed: %s", exc)
            finally:
                if not handed_over:
                    conn.close()

    def _warm(self) -> None:
        """Open the store and load the model now, so the first hook finds them ready."""
        from ..logconfig import file_handler
        from ..paths import ensure_private_dir
        from .session import HOOK_LOG

        try:
            settings = self.app.config.logging
            ensure_private_dir(self.app.config.log_dir)
            self._hook_log = file_handler(self.app.config.log_dir / HOOK_LOG,
                                          getattr(logging, settings.level, logging.INFO))
            logging.getLogger("llmem.hooks").addHandler(self._hook_log)
        except OSError as exc:
            log.warning("resident: not logging hooks to hooks.log: %s", exc)
        try:
            _ = self.app.store
            if self.app.embedder.available:
                self.app.embedder.embed_query("warm up")
        except Exception as exc:  # each hook meets it again and reports it as it always did
            log.warning("resident: warming up failed: %s", exc)

    def _answer(self, conn: socket.socket) -> bool:
        """Answer one connection; True when it became an MCP session (its socket is the
        session's now)."""
        conn.settimeout(READ_TIMEOUT_SECONDS)
        if not _same_user(conn):
            return False
        received, after = _receive_head(conn)
        if received is None:
            return False
        if after is not None:
            return self._open_session(conn, received, after)
        try:
            request = json.loads(received)
            reply = {"ok": True, **self._on_host(self.run, request)}
        except Declined as why:
            reply = {"ok": False, "why": str(why)}
        except Exception as exc:
            log.debug("resident: declined a hook after a failure: %s", exc, exc_info=True)
            reply = {"ok": False, "why": f"{exc.__class__.__name__}: {exc}"}
        conn.sendall(json.dumps(reply, ensure_ascii=False).encode("utf-8"))
        return False

    # ---- relayed MCP sessions ------------------------------------------------------------

    def _open_session(self, conn: socket.socket, head: bytes, after: bytes) -> bool:
        """A relay's first line (hookclient.relay_mcp): {"ok": true} and the session served
        from here on, or {"ok": false, "why"} and the relay serves it in its own process."""
        try:
            cwd = self._session_folder(json.loads(head))
            sessions = self._relayed_sessions()
            if sessions is None:
                raise Declined("the MCP SDK is not ready here")
        except (Declined, ValueError) as why:
            conn.sendall(json.dumps({"ok": False, "why": str(why)}).encode("utf-8") + b"\n")
            return False
        conn.sendall(json.dumps({"ok": True, "pid": os.getpid()}).encode("utf-8") + b"\n")
        sessions.open(conn, cwd, after)
        return True

    def _session_folder(self, request) -> str:
        """The working folder of a relay whose answers would be this process's (else Declined)."""
        if not isinstance(request, dict) or request.get("v") != PROTOCOL:
            raise Declined("another protocol version")
        session = request.get("mcp")
        cwd = session.get("cwd") if isinstance(session, dict) else None
        if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isdir(cwd):
            raise Declined("no working folder")
        if request.get("env") != self.environment:
            raise Declined("another environment (home, config or agent folders)")
        if self.config_path is not None:  # `llmem mcp` reads the default config, this host another
            raise Declined("this llmem runs with --config")
        return cwd

    def _relayed_sessions(self):
        """The MCP sessions served here, the SDK imported (None when it cannot be)."""
        with self._sessions_lock:
            if self._sessions is None and not self._stop.is_set():
                try:
                    from ..mcp_server import RelayedSessions

                    self._sessions = RelayedSessions(self.app, self.run_on).prepare()
                except Exception as exc:  # relays serve their sessions themselves
                    log.warning("resident: not serving MCP sessions: %s", exc)
                    return None
            return self._sessions

    def _on_host(self, work, *args):
        return work(*args) if self.run_on is None else self.run_on.submit(work, *args).result()

    # ---- the hook ------------------------------------------------------------------------

    def run(self, request) -> dict:
        """Run `llmem hook|context …` as the hook process would: {"stdout", "stderr"}, or Declined
        (a context that fails, say for an unknown session, is told by the CLI with its exit code)."""
        from . import session
        from .session import served

        if not isinstance(request, dict) or request.get("v") != PROTOCOL:
            raise Declined("another protocol version")
        argv, stdin_text = request.get("argv"), request.get("stdin")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) \
                or argv[:1] not in (["hook"], ["context"], ["search"]):
            raise Declined("neither a hook, a context nor a search")
        if argv[0] == "search":
            from .search import search as command
        else:
            command = session.hook if argv[0] == "hook" else session.context
        if stdin_text is not None and not isinstance(stdin_text, str):
            raise Declined("stdin is not text")
        if request.get("env") != self.environment:
            raise Declined("another environment (home, config or agent folders)")
        out, err = io.StringIO(), io.StringIO()
        root = click.Context(click.Command("llmem"), info_name="llmem", obj=self.app)
        root.params = {"verbose": False, "config_path": self.config_path}
        served.streams, served.log_path = (stdin_text, out, err), self._hook_log_path()
        _routed.streams = (out, err)  # what the command writes with click.echo (search's lines)
        try:
            with root:
                try:
                    ctx = command.make_context(argv[0], argv[1:], parent=root, obj=self.app)
                except click.ClickException as exc:
                    raise Declined(f"bad command line: {exc.format_message()}") from None
                with ctx:
                    command.invoke(ctx)
        finally:
            served.streams = served.log_path = None
            _routed.streams = None
        return {"stdout": out.getvalue(), "stderr": err.getvalue()}

    def _hook_log_path(self):
        return getattr(self._hook_log, "baseFilename", None) if self._hook_log else None


# The request a thread of this process is answering: its (stdout, stderr) buffers.
_routed = threading.local()


class _ThreadRouted:
    """sys.stdout or sys.stderr of a process that serves requests: a thread answering one
    writes into that request's buffer (click.echo looks the stream up on every call), every
    other thread, and everything else about the stream (`buffer`, which `llmem mcp`'s protocol
    uses, `fileno`, `encoding`), is the process's own."""

    def __init__(self, own, which: int):
        self._own, self._which = own, which

    def _target(self):
        streams = getattr(_routed, "streams", None)
        return self._own if streams is None else streams[self._which]

    def write(self, text):
        return self._target().write(text)

    def flush(self):
        return self._target().flush()

    def isatty(self):
        return self._target().isatty()

    def __getattr__(self, name):
        return getattr(self._own, name)


_routing_lock = threading.Lock()
_routing_users = [0]


def _route_std_streams() -> None:
    """Install _ThreadRouted as sys.stdout and sys.stderr while a resident runs here."""
    with _routing_lock:
        _routing_users[0] += 1
        if not isinstance(sys.stdout, _ThreadRouted) and sys.stdout is not None:
            sys.stdout = _ThreadRouted(sys.stdout, 0)
        if not isinstance(sys.stderr, _ThreadRouted) and sys.stderr is not None:
            sys.stderr = _ThreadRouted(sys.stderr, 1)


def _unroute_std_streams() -> None:
    """The process's own streams back, when the last resident here stops."""
    with _routing_lock:
        _routing_users[0] -= 1
        if _routing_users[0] > 0:
            return
        if isinstance(sys.stdout, _ThreadRouted):
            sys.stdout = sys.stdout._own
        if isinstance(sys.stderr, _ThreadRouted):
            sys.stderr = sys.stderr._own


def _receive_head(conn: socket.socket) -> tuple[bytes | None, bytes | None]:
    """What a client sends first: (its whole request, None) when it closes its side without a
    newline (a hook's JSON, which has none); (its first line, what came after it) when it sends
    one (an MCP relay); (None, None) past REQUEST_LIMIT bytes."""
    chunks, size = [], 0
    while True:
        chunk = conn.recv(65536)
        if b"\n" in chunk:
            head, after = (b"".join(chunks) + chunk).split(b"\n", 1)
            return head, after
        if not chunk:
            return b"".join(chunks), None
        chunks.append(chunk)
        size += len(chunk)
        if size > REQUEST_LIMIT:
            return None, None


def _answers(path: str) -> bool:
    """Whether a process listens on the socket at `path` (False: a stale file)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


def _same_user(conn: socket.socket) -> bool:
    if not hasattr(socket, "SO_PEERCRED"):
        return True  # the socket's mode (0600, in a private folder) keeps others out
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


def start_resident(app, run_on=None, linger: bool = False) -> Resident | None:
    """Serve hooks (and relayed MCP sessions) from this process for its life when
    `pipeline.resident_hooks` is on (None: not)."""
    try:
        if not app.config.pipeline.resident_hooks:
            return None
        config_path = click.get_current_context().find_root().params.get("config_path")
        return Resident(app, config_path, run_on=run_on, linger=linger).start()
    except Exception as exc:  # the host process runs on without it; hooks run in-process
        log.warning("not serving hooks: %s", exc)
        return None
