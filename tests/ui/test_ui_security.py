"""The viewer's guard, request by request: token, Host, CSRF, headers, escaping."""

from __future__ import annotations

import re

import pytest
from markupsafe import escape

HOSTILE = [
    "<script>alert('memory')</script>",
    '<img src=x onerror="alert(1)">',
    "{{ 7 * 7 }} {% if true %}jinja{% endif %}",
    "--> <!-- closing a comment",
    "\" onmouseover=\"alert(2)\" '",
]


def test_no_token_is_refused_everywhere(viewer):
    for path in ("/", "/memories", "/memories?q=x", "/sessions", "/static/app.css", "/nowhere"):
        response = viewer.anonymous.get(path)
        assert response.status_code == 403, path
        assert "token" in response.text


def test_a_wrong_token_is_refused_and_sets_no_cookie(viewer):
    response = viewer.anonymous.get("/memories", params={"token": viewer.token + "x"})
    assert response.status_code == 403
    assert "set-cookie" not in response.headers
    viewer.anonymous.cookies.set(f"llmem_token_{viewer.port}", "guessed")
    assert viewer.anonymous.get("/memories").status_code == 403


def test_the_token_in_the_query_sets_a_strict_httponly_cookie_that_then_suffices(viewer):
    response = viewer.anonymous.get("/memories", params={"token": viewer.token})
    assert response.status_code == 200
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"llmem_token_{viewer.port}={viewer.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert viewer.anonymous.get("/memories").status_code == 200  # the cookie alone


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1:{other}",
                                  "127.0.0.1", "0.0.0.0:{port}", "[::1]:{port}", "127.0.0.1.evil.example:{port}"])
def test_a_host_other_than_loopback_on_our_port_is_refused_even_with_the_token(viewer, host):
    host = host.format(port=viewer.port, other=viewer.port + 1)
    response = viewer.client.get("/", params={"token": viewer.token}, headers={"host": host})
    assert response.status_code == 403
    assert "127.0.0.1" in response.text


def test_localhost_on_our_port_is_served(viewer):
    response = viewer.client.get("/", params={"token": viewer.token}, headers={"host": f"localhost:{viewer.port}"})
    assert response.status_code == 200


def test_every_response_has_the_strict_headers_even_refusals_and_errors(viewer):
    for response in (viewer.get("/"), viewer.get("/memories/ffffffff"), viewer.anonymous.get("/"),
                     viewer.get("/static/app.js")):
        csp = response.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-content-type-options"] == "nosniff"


def test_pages_have_no_inline_script_or_style(viewer):
    memory = viewer.store.add("a memory to show").memory
    for path in ("/", "/memories", f"/memories/{memory.id}", f"/memories/{memory.id}/edit",
                 f"/memories/{memory.id}/delete", "/sessions", "/queue", "/dreams"):
        html = viewer.get(path).text
        assert re.findall(r"<script(?![^>]*\bsrc=)", html) == [], path
        assert " style=" not in html and "<style" not in html, path
        assert not re.search(r"\son[a-z]+=", html), path


def test_a_post_without_or_with_a_wrong_csrf_token_changes_nothing(viewer):
    memory = viewer.store.add("the build runs on port 8080").memory
    for fields in ({}, {"csrf": "wrong"}, {"csrf": ""}):
        response = viewer.client.post(f"/memories/{memory.id}/invalidate",
                                      data={**fields, "reason": "stale"}, follow_redirects=False)
        assert response.status_code == 403
        assert "CSRF" in response.text
    response = viewer.client.post(f"/memories/{memory.id}/delete", follow_redirects=False)
    assert response.status_code == 403
    kept = viewer.store.get(memory.id)
    assert kept.invalidated_at is None


@pytest.mark.parametrize("headers", [{"origin": "http://evil.example"},
                                     {"origin": "http://127.0.0.1:1"},
                                     {"sec-fetch-site": "cross-site"},
                                     {"sec-fetch-site": "same-site", "origin": "null"}])
def test_a_post_from_another_site_is_refused_even_with_the_csrf_token(viewer, headers):
    memory = viewer.store.add("the build runs on port 8080").memory
    response = viewer.client.post(f"/memories/{memory.id}/delete", data={"csrf": viewer.csrf_token},
                                  headers=headers, follow_redirects=False)
    assert response.status_code == 403
    assert viewer.store.get(memory.id).id == memory.id


def test_a_post_from_the_viewers_own_page_is_served(viewer):
    """What Chromium sends with its own form under no-referrer: Origin null, same-origin."""
    memory = viewer.store.add("the build runs on port 8080").memory
    response = viewer.client.post(f"/memories/{memory.id}/delete", data={"csrf": viewer.csrf_token},
                                  headers={"origin": "null", "sec-fetch-site": "same-origin"},
                                  follow_redirects=False)
    assert response.status_code == 303


def test_a_post_without_the_token_is_refused_before_its_form_is_read(viewer):
    memory = viewer.store.add("the build runs on port 8080").memory
    response = viewer.anonymous.post(f"/memories/{memory.id}/delete", data={"csrf": viewer.csrf_token})
    assert response.status_code == 403
    assert viewer.store.get(memory.id).id == memory.id


def test_other_methods_are_refused(viewer):
    memory = viewer.store.add("the build runs on port 8080").memory
    for method in ("PUT", "DELETE", "PATCH"):
        assert viewer.client.request(method, f"/memories/{memory.id}").status_code == 405
    assert viewer.store.get(memory.id).id == memory.id


def test_an_oversized_form_is_refused(viewer):
    memory = viewer.store.add("the build runs on port 8080").memory
    response = viewer.post(f"/memories/{memory.id}/edit", content="x" * (2 << 20))
    assert response.status_code == 413
    assert viewer.store.get(memory.id).content == "the build runs on port 8080"


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_memory_text_is_escaped_on_every_page_that_shows_it(viewer, text):
    memory = viewer.store.add(f"hostile note {text}", project=f"/work/{text}",
                              session_id="ses_hostile", summary=text,
                              metadata={"why": text}).memory
    viewer.store.models.Event.create(adapter="copilot", session_id="ses_hostile", kind="idle",
                                     status="failed", last_error=text, detected_at=1.0)
    pages = ["/memories", "/memories?q=hostile", f"/memories/{memory.id}",
             f"/memories/{memory.id}/edit", f"/memories/{memory.id}/correct",
             f"/memories/{memory.id}/invalidate", f"/memories/{memory.id}/delete",
             "/sessions", "/sessions/ses_hostile"]
    for path in pages:
        html = viewer.get(path).text
        assert html.count("hostile note") >= 1 or path == "/sessions", path
        if str(escape(text)) != text:
            assert text not in html, path
        for raw in ("<script>alert", "<img src=x", "\" onmouseover="):
            assert raw not in html, path
    # Shown as the text it is (a template expression stays unevaluated), not dropped.
    assert f"hostile note {escape(text)}" in viewer.get(f"/memories/{memory.id}").text


def test_a_search_query_is_escaped_where_it_is_echoed(viewer):
    html = viewer.get("/memories", params={"q": "<script>alert(3)</script>"}).text
    assert "<script>alert(3)" not in html
    assert "&lt;script&gt;alert(3)" in html
