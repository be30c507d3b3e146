"""The viewer's guard: one ASGI layer in front of every route, static file and error page.

A page that forgets a check cannot exist, because no route sees a request the guard did not
pass: the Host must be the loopback name and port this server was started on (a rebound DNS
name reaching 127.0.0.1 is refused), the per-run token must come as `?token=` or as the cookie
the first such visit sets, only GET, HEAD and POST exist, and a POST must be a form carrying
the run's CSRF token (and, when the browser says where it comes from, come from this origin).
Every response leaves with a strict Content-Security-Policy and no referrer.
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qsl

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse

# A form is a few fields of memory text; anything larger is not one of ours.
MAX_FORM_BYTES = 1 << 20

# No inline script or style anywhere: the pages load /static/app.js and /static/app.css only.
# SVG charts use presentation attributes (width=, fill=), which the policy does not touch.
CONTENT_SECURITY_POLICY = ("default-src 'self'; object-src 'none'; base-uri 'none'; "
                           "form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    # Pages hold memory text and the CSRF token: nothing is kept in a disk cache.
    (b"cache-control", b"no-store"),
]
SECURITY_HEADER_NAMES = {name for name, _ in SECURITY_HEADERS}

CSRF_FIELD = "csrf"


def same_secret(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class Guard:
    """Wraps the viewer's ASGI app; `port` is the one it listens on (the Host must name it)."""

    def __init__(self, app, *, token: str, csrf_token: str, port: int):
        self.app = app
        self.token = token
        self.csrf_token = csrf_token
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}"}
        self.origins = {f"http://{host}" for host in self.hosts}
        # Cookies ignore ports: two viewers on one machine each keep their own.
        self.cookie_name = f"llmem_token_{port}"

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets here
            return
        await self._http(scope, receive, send)

    def _with_headers(self, send, cookie: str | None = None):
        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                given = message.get("headers", [])
                headers = [(k, v) for k, v in given if k.lower() not in SECURITY_HEADER_NAMES]
                headers += [(k, _sandboxed_policy(given) or v) if k == b"content-security-policy"
                            else (k, v) for k, v in SECURITY_HEADERS]
                if cookie:
                    headers.append((b"set-cookie", cookie.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)
        return send_with_headers

    async def _http(self, scope, receive, raw_send):
        send = self._with_headers(raw_send)
        headers = Headers(scope=scope)
        if headers.get("host") not in self.hosts:
            await _refuse(scope, receive, send, 403,
                          "llmem ui answers only to 127.0.0.1 or localhost on its own port")
            return
        method = scope["method"]
        if method not in ("GET", "HEAD", "POST"):
            await _refuse(scope, receive, send, 405, "only GET and POST are served")
            return
        request = Request(scope)
        from_query = same_secret(request.query_params.get("token"), self.token)
        if not (from_query or same_secret(request.cookies.get(self.cookie_name), self.token)):
            await _refuse(scope, receive, send, 403,
                          "this page needs the token: open the URL `llmem ui` printed")
            return
        if method == "POST":
            # Under no-referrer a browser sends `Origin: null` with its own forms, so the
            # origin is judged by Sec-Fetch-Site where the browser sends it, and by Origin
            # when that names a site.
            origin = headers.get("origin")
            site = headers.get("sec-fetch-site")
            if (site is not None and site not in ("same-origin", "none")) or (
                    origin not in (None, "null") and origin not in self.origins):
                await _refuse(scope, receive, send, 403, "a form from another site is refused")
                return
            body = await _read_body(receive)
            if body is None:
                await _refuse(scope, receive, send, 413, "the form is too large")
                return
            form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
            if not same_secret(form.get(CSRF_FIELD), self.csrf_token):
                await _refuse(scope, receive, send, 403,
                              "the form's CSRF token is missing or stale: reload the page and retry")
                return
            # Routes read the parsed form from request.state.form (no body parser needed).
            scope.setdefault("state", {})["form"] = form
            receive = _replay(body)
        if from_query:
            send = self._with_headers(raw_send, cookie=(
                f"{self.cookie_name}={self.token}; Path=/; HttpOnly; SameSite=Strict"))
        await self.app(scope, receive, send)


def _sandboxed_policy(headers) -> bytes | None:
    """A route's own policy when it starts with `sandbox` (the dream report, a document with
    inline CSS): stricter than the pages' one, as it gives the document a unique origin and
    no script. Any other policy a route sets is replaced by the pages' one."""
    for name, value in headers:
        if name.lower() == b"content-security-policy" and value.startswith(b"sandbox"):
            return value
    return None


async def _read_body(receive) -> bytes | None:
    """The whole request body, or None when it passes MAX_FORM_BYTES."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes):
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


async def _refuse(scope, receive, send, status: int, reason: str) -> None:
    await PlainTextResponse(f"{status}: {reason}\n", status_code=status)(scope, receive, send)
