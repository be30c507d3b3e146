"""Build the viewer's ASGI app and serve it on 127.0.0.1 with uvicorn."""

from __future__ import annotations

import logging
import secrets
import socket
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ..errors import LlmemError, NotFound, UsageError, failed_in_queue, queue_failure, store_failure
from . import pages
from .security import Guard
from .web import QueueAccess, Viewer, render

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger(__name__)

HOST = "127.0.0.1"  # never anything else: the viewer is for this machine's user alone


def create_app(llmem: App, *, port: int, token: str | None = None,
               queue: QueueAccess | None = None) -> Guard:
    """The viewer for `llmem`'s store, answering on 127.0.0.1:`port` with `token`.

    `queue` comes from the CLI (the library does not import the queue); without it the
    pages that would enqueue say that no queue is attached.
    """
    token = token or secrets.token_urlsafe(32)
    csrf_token = secrets.token_urlsafe(32)
    app = Starlette(
        routes=[*pages.routes(),
                Mount("/static", StaticFiles(packages=[("llmem.ui", "static")]), name="static")],
        exception_handlers={LlmemError: _llmem_error, 500: _server_error})
    app.state.viewer = Viewer(llmem=llmem, queue=queue, token=token, csrf_token=csrf_token,
                              navigation=pages.navigation(), flashes=OrderedDict())
    return Guard(app, token=token, csrf_token=csrf_token, port=port)


def _llmem_error(request, exc: LlmemError):
    status = 404 if isinstance(exc, NotFound) else 400 if isinstance(exc, UsageError) else 500
    return render(request, "error.html", status_code=status, message=exc.message, hint=exc.hint)


def _server_error(request, exc: Exception):
    """A SQLite failure said as what it means for the store (busy, full, read-only), else a
    plain failure; the traceback goes to the log, not the page."""
    config = request.app.state.viewer.llmem.config
    said = queue_failure(exc, config.queue_path) if failed_in_queue(exc) else store_failure(exc, config.db_path)
    if said is None:
        log.exception("llmem ui: %s %s failed", request.method, request.url.path, exc_info=exc)
        return render(request, "error.html", status_code=500,
                      message=f"unexpected failure: {exc.__class__.__name__}", hint="see `llmem logs`")
    return render(request, "error.html", status_code=503, message=said.message, hint=said.hint)


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:`port` (0: a free port, read back from the socket)."""
    # IPPROTO_TCP said outright: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and without it every keep-alive response after the first waited ~40 ms (Nagle
    # holding the body until the browser's delayed ACK of the headers).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {HOST}:{port}: {exc.strerror}",
                         hint="pick another --port, or --port 0 for a free one") from None
    sock.listen(LISTEN_BACKLOG)
    return sock


def url_of(sock: socket.socket, token: str) -> str:
    return f"http://{HOST}:{sock.getsockname()[1]}/?token={token}"


# Bounds on what unauthenticated clients can hold (issue 20 item 9). A browser opens ~6
# connections; each held one is a file descriptor of the process, which under `llmem run --ui`
# the watcher and the worker need too (1,100 idle sockets once made the watcher fail with "Too
# many open files"). uvicorn itself never times out a connection that has not sent a request
# yet, and its limit_concurrency answers 503 only once a request has arrived.
MAX_CONNECTIONS = 64  # open at once; the next is closed as soon as it is accepted
HEADER_TIMEOUT_SECONDS = 10.0  # from accept to a whole request head, else closed
MAX_HEADER_BYTES = 16 * 1024  # h11's bound on an incomplete request head
LISTEN_BACKLOG = 128  # the kernel's queue of connections not yet accepted
REFUSAL_LOG_INTERVAL = 60.0  # a flood of refusals is logged once per this many seconds


class _RefusalLog:
    """Says a storm of refused connections once per interval, with the count, not per socket."""

    def __init__(self, interval: float = REFUSAL_LOG_INTERVAL):
        self.interval = interval
        self.lock = threading.Lock()
        self.refused = 0
        self.said_at: float | None = None

    def refused_one(self, why: str, at: float) -> None:
        with self.lock:
            self.refused += 1
            if self.said_at is not None and at - self.said_at < self.interval:
                return
            count, self.refused, self.said_at = self.refused, 0, at
        log.warning("llmem ui: closed %d connection(s) (%s); a local program may be flooding the viewer",
                    count, why)


def bounded_protocol(max_connections: int, header_timeout: float):
    """uvicorn's h11 protocol with a cap on open connections and a deadline for the request
    head, both enforced before anything is read: the refused socket is closed at once."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    refusals = _RefusalLog()

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            if len(self.connections) >= max_connections:
                transport.abort()  # its descriptor is freed now, nothing is answered
                refusals.refused_one(f"more than {max_connections} open", self.loop.time())
                return
            super().connection_made(transport)
            self._arm_head_deadline()

        def _arm_head_deadline(self) -> None:
            # Armed at accept and after each response (keep-alive): a request head must follow
            # within the timeout, however slowly its bytes trickle in.
            previous = getattr(self, "_head_deadline", None)
            if previous is not None:
                previous.cancel()
            self._head_deadline = self.loop.call_later(header_timeout, self._head_too_slow, self.cycle)

        def _head_too_slow(self, cycle_then) -> None:
            idle = self.cycle is cycle_then and (self.cycle is None or self.cycle.response_complete)
            if idle and not self.transport.is_closing():  # no new request head since
                refusals.refused_one(f"no request within {header_timeout:g} s", self.loop.time())
                self.transport.abort()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_head_deadline()

        def connection_lost(self, exc) -> None:
            deadline = getattr(self, "_head_deadline", None)
            if deadline is not None:
                deadline.cancel()
            if self.transport is None:  # refused in connection_made: nothing was set up
                return
            super().connection_lost(exc)

    BoundedH11Protocol.refusals = refusals
    return BoundedH11Protocol


def _announcing_server(config, on_serving):
    """uvicorn.Server calling `on_serving()` at the end of a start-up that was not stopped."""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)  # inside uvicorn's signal capture
            if self.started and not self.should_exit:
                on_serving()

    return AnnouncingServer(config)


class ViewerServer:
    """uvicorn serving `asgi` on an already listening socket, in this thread or another."""

    def __init__(self, asgi, sock: socket.socket, *, max_connections: int = MAX_CONNECTIONS,
                 header_timeout: float = HEADER_TIMEOUT_SECONDS, on_serving=None):
        """`on_serving()` is called once, when the server accepts connections and (in the main
        thread) Ctrl-C and SIGTERM stop it: `llmem ui` prints its URL there, so whoever reads
        the URL and then interrupts reaches a server that stops cleanly. Printed earlier, a
        Ctrl-C landed in the start-up code as a KeyboardInterrupt, which Python drops when it
        lands in a weakref callback or a __del__ (seen: importlib's module-lock callback),
        and the viewer then served on forever."""
        import uvicorn

        self.sock = sock
        self.protocol = bounded_protocol(max_connections, header_timeout)
        # No access log and nothing below warnings: `llmem ui` prints its URL and nothing else.
        config = uvicorn.Config(asgi, log_level="warning", access_log=False, lifespan="off",
                                server_header=False, http=self.protocol,
                                # 503 once more requests than connections run (never for a
                                # connection the cap let in: it counts connections too).
                                limit_concurrency=max_connections + 1, timeout_keep_alive=5,
                                h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                                # asyncio accepts up to this many sockets per wake-up before
                                # any is refused: the burst a flood can open at once.
                                backlog=LISTEN_BACKLOG)
        self.server = _announcing_server(config, on_serving) if on_serving else uvicorn.Server(config)
        # A streaming response (the Queue page's log tail) never ends by itself, and uvicorn's
        # shutdown waits for every response: the stream asks this between polls and ends.
        asgi.app.state.stopping = lambda: self.server.should_exit
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve until Ctrl-C or SIGTERM (uvicorn handles both in the main thread)."""
        try:
            self.server.run(sockets=[self.sock])
        except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it stopped on: a normal stop
            pass

    def start(self) -> ViewerServer:
        """Serve from a daemon thread (beside `llmem run`'s consumer)."""
        self.thread = threading.Thread(target=self.run, name="llmem-ui", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
        self.sock.close()
