"""Fixtures for the web viewer's tests (llmem/ui), shared by every page's tests.

- `viewer`: the app over this test's store (FTS-only config), behind its guard, driven in-process through
  Starlette's TestClient (`viewer.client` has the token cookie, `viewer.anonymous` has none,
  `viewer.post(path, **fields)` posts a form with the CSRF token); `viewer.queue.enqueued`
  records what the app asked the injected queue to run. `open_viewer(app)` makes one over
  another App (e.g. with the fake embedder of `ollama_config`).
- `live_viewer`: the same app served by a real uvicorn on 127.0.0.1 in a thread (`.url`,
  `.entry_url` with the token).
- `browser_page`: a page of a real headless Chromium (Debian's /usr/bin/chromium driven by
  Playwright's Python API), already holding `live_viewer`'s token cookie; the test is
  skipped, saying why, when no Chromium is found. Mark browser tests `@pytest.mark.slow`.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TOKEN = "test-token-for-the-viewer"
# TestClient never opens this port: the guard only compares the Host header against it.
TEST_PORT = 8765


@dataclass
class RecordingQueue:
    """The QueueAccess the CLI would hand in, recording instead of enqueueing."""

    enqueued: list[int] = field(default_factory=list)

    def access(self):
        from llmem.ui.web import QueueAccess

        return QueueAccess(enqueue_event=self.enqueued.append,
                           counts=lambda: {"pending": len(self.enqueued), "scheduled": 0})


@dataclass
class ViewerClient:
    llmem: object  # llmem.app.App over this test's LLMEM_HOME
    client: object  # TestClient with the token cookie
    anonymous: object  # TestClient without it
    csrf_token: str
    queue: RecordingQueue
    token: str = TOKEN
    port: int = TEST_PORT

    @property
    def store(self):
        return self.llmem.store

    def get(self, path: str, **kwargs):
        return self.client.get(path, **kwargs)

    def post(self, path: str, follow_redirects: bool = False, **fields):
        return self.client.post(path, data={"csrf": self.csrf_token, **fields},
                                follow_redirects=follow_redirects)


def make_app(llmem, port: int, queue: RecordingQueue | None = None):
    from llmem.ui.server import create_app

    asgi = create_app(llmem, port=port, token=TOKEN, queue=queue.access() if queue else None)
    return asgi, asgi.app.state.viewer.csrf_token


@pytest.fixture
def llmem_app(fts_config):
    """An llmem App over this test's store, FTS-only (no embedder, no LLM)."""
    from llmem.app import App

    app = App()
    yield app
    app.close()


@contextmanager
def open_viewer(llmem):
    """A ViewerClient over `llmem` (any App: one with an embedder, say)."""
    from starlette.testclient import TestClient

    queue = RecordingQueue()
    asgi, csrf_token = make_app(llmem, TEST_PORT, queue)
    base = f"http://127.0.0.1:{TEST_PORT}"
    with TestClient(asgi, base_url=base) as client, TestClient(asgi, base_url=base) as anonymous:
        assert client.get("/", params={"token": TOKEN}).status_code == 200  # sets the cookie
        yield ViewerClient(llmem, client, anonymous, csrf_token, queue)


@pytest.fixture
def viewer(llmem_app):
    with open_viewer(llmem_app) as opened:
        yield opened


@dataclass
class LiveViewer:
    url: str  # http://127.0.0.1:PORT
    llmem: object
    queue: RecordingQueue

    @property
    def entry_url(self) -> str:
        return f"{self.url}/?token={TOKEN}"


@pytest.fixture
def live_viewer(llmem_app):
    from llmem.ui.server import ViewerServer, bind

    sock = bind(0)
    port = sock.getsockname()[1]
    queue = RecordingQueue()
    asgi, _ = make_app(llmem_app, port, queue)
    server = ViewerServer(asgi, sock).start()
    try:
        yield LiveViewer(f"http://127.0.0.1:{port}", llmem_app, queue)
    finally:
        server.stop()


def find_chromium() -> str | None:
    """Debian's chromium (Playwright's own download cannot run here), or $LLMEM_TEST_CHROMIUM."""
    for candidate in (os.environ.get("LLMEM_TEST_CHROMIUM"), "/usr/bin/chromium",
                      shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def chromium():
    """One headless Chromium per test process (starting one takes ~1-2 s)."""
    executable = find_chromium()
    # CI sets LLMEM_REQUIRE_BROWSER=1: there a missing browser is a failure, not a skip, so the
    # viewer can never land with its browser tests silently not run.
    missing = pytest.fail if os.environ.get("LLMEM_REQUIRE_BROWSER") == "1" else pytest.skip
    if executable is None:
        missing("no Chromium found (apt-get install -y chromium, or set LLMEM_TEST_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


@pytest.fixture
def browser_page(chromium, live_viewer):
    """A fresh browser context on `live_viewer`, past the token (the cookie is set)."""
    context = chromium.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    response = page.goto(live_viewer.entry_url)
    assert response.status == 200
    page.console_errors = errors  # a CSP violation shows up here
    yield page
    context.close()
