"""Overview: the store at a glance (what `llmem stats` says)."""

from __future__ import annotations

from starlette.routing import Route

from ..web import render, store

NAV = ("Overview", "/")


def overview(request):
    return render(request, "overview.html", stats=store(request).stats())


ROUTES = [Route("/", overview)]
