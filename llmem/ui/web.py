"""What every page shares: the templates, the store, the form, redirects with a flash message.

Templates are Jinja2 with autoescaping on for every file whatever its name: memory text is
hostile input (it comes from transcripts), so it is only ever a value put into a template,
never a template itself, and never marked safe.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup
from starlette.responses import HTMLResponse, RedirectResponse

from ..text import one_line
from ..times import utc_minute
from .security import CSRF_FIELD

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.requests import Request

    from ..app import App

# Flash messages wait here between a POST and the page it redirects to; a page not followed
# (a closed tab) leaves its message behind, so only the newest few are kept.
MAX_FLASHES = 100


@dataclass
class QueueAccess:
    """What the viewer needs from the queue, handed in by the CLI: the library never imports
    huey or workers (ARCHITECTURE.md), so `llmem ui` passes these functions to the app factory."""

    enqueue_event: Callable[[int], None]  # put a recorded event's task on the queue
    counts: Callable[[], dict[str, int]]  # {"pending": n, "scheduled": n} in the huey queue


@dataclass
class Viewer:
    """One running viewer: the process's llmem App and the per-run secrets. Held in the
    Starlette app's state; `viewer(request)` returns it."""

    llmem: App
    queue: QueueAccess | None
    token: str
    csrf_token: str
    navigation: list[tuple[str, str]]
    flashes: OrderedDict[str, tuple[str, str]]

    @property
    def store(self):
        return self.llmem.store

    @property
    def memories(self):
        """The memory service, its writes journaled as made through the viewer."""
        return self.llmem.memories.via("viewer")


def viewer(request: Request) -> Viewer:
    return request.app.state.viewer


def store(request: Request):
    """The store the CLI and the workers use, through the same Store methods and transactions.

    One Store per process; peewee gives each request thread its own SQLite connection, reads
    run in WAL snapshots that never block a writer, and every write is a short IMMEDIATE
    transaction inside a Store or library function with the store's busy timeout.
    """
    return viewer(request).store


def form(request: Request) -> dict[str, str]:
    """The POSTed form, already read and CSRF-checked by the guard."""
    return getattr(request.state, "form", {})


# Deeper pages than this are not browsed; the bound keeps OFFSET within any integer type.
MAX_PAGE = 100_000


def page_number(request: Request) -> int:
    """The `page` query parameter, 1 when absent or not a number."""
    try:
        return max(1, min(int(request.query_params.get("page", "1")), MAX_PAGE))
    except ValueError:
        return 1


def _when(ts: float | None) -> str:
    return "–" if ts is None else utc_minute(ts)


def _short(text: str | None, width: int = 140) -> str:
    return one_line(text, width)


def _number(value: float | int | None, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("llmem.ui", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(when=_when, short=_short, number=_number)
    return env


TEMPLATES = _environment()


def url(path: str, **params: Any) -> str:
    """`path` with the given query parameters (None and "" left out), encoded."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{path}?{urlencode(kept)}" if kept else path


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A page from `template` (which extends base.html) with what the base needs."""
    current = viewer(request)
    flash = current.flashes.pop(request.query_params.get("flash", ""), None)
    csrf_input = Markup('<input type="hidden" name="{}" value="{}">').format(
        CSRF_FIELD, current.csrf_token)
    html = TEMPLATES.get_template(template).render(
        request=request, navigation=current.navigation, path=request.url.path, flash=flash,
        csrf_input=csrf_input, url=url, **context)
    return HTMLResponse(html, status_code=status_code)


def redirect(request: Request, path: str, message: str, kind: str = "ok") -> RedirectResponse:
    """After a POST: see `path` (303, so a reload does not post again), with `message` shown once."""
    flashes = viewer(request).flashes
    key = secrets.token_urlsafe(8)
    flashes[key] = (kind, message)
    while len(flashes) > MAX_FLASHES:
        flashes.popitem(last=False)
    path, _, fragment = path.partition("#")  # the flash goes in the query, before any #anchor
    separator = "&" if "?" in path else "?"
    anchor = f"#{fragment}" if fragment else ""
    return RedirectResponse(f"{path}{separator}flash={key}{anchor}", status_code=303)
