"""The viewer's pages, in navigation order: each module has NAV (label, path) and ROUTES."""

from __future__ import annotations

from . import dreams, memories, overview, queue, sessions

PAGES = (overview, memories, sessions, queue, dreams)


def routes() -> list:
    return [route for page in PAGES for route in page.ROUTES]


def navigation() -> list[tuple[str, str]]:
    return [page.NAV for page in PAGES]
