"""The Sessions pages: sessions per agent, their events, their memories, retry."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from llmem.pipeline.events import record_event
from llmem.times import now


def event(store, session_id, kind="idle", status="done", adapter="copilot", error=None, at=None):
    Event = store.models.Event
    return Event.create(adapter=adapter, session_id=session_id, kind=kind, status=status,
                        attempts=1 if status in ("done", "failed") else 0, last_error=error,
                        detected_at=at or now(), finished_at=now() if status in ("done", "failed") else None)


def test_sessions_are_listed_per_agent_with_their_counts(viewer):
    store = viewer.store
    event(store, "ses_one", "created", at=100.0)
    event(store, "ses_one", "idle", "failed", error="LLM unreachable", at=200.0)
    event(store, "ses_one", "ending", "pending", at=300.0)
    event(store, "oc-two", "idle", adapter="opencode", at=400.0)
    store.add("the api listens on 8080", session_id="ses_one")
    store.add("deploys need the vpn", session_id="ses_one")
    store.models.SessionCursor.create(adapter="copilot", session_id="ses_one", project="/work/api",
                                      updated_at=350.0)
    page = viewer.get("/sessions").text
    assert page.index("oc-two") < page.index("ses_one")  # latest activity first
    row = page.split('href="/sessions/ses_one"')[1].split("</tr>")[0]
    cells = [re.sub(r"<[^>]+>", "", "<td" + cell).strip() for cell in row.split("<td")[1:]]
    assert cells[0] == "/work/api"
    assert cells[2:] == ["3", "1", "1", "2"]  # events, failed, waiting, memories
    only_opencode = viewer.get("/sessions", params={"agent": "opencode"}).text
    assert "oc-two" in only_opencode and "ses_one" not in only_opencode


def test_a_session_page_shows_its_events_errors_and_memories(viewer):
    store = viewer.store
    done = event(store, "ses_one", "idle")
    failed = event(store, "ses_one", "ending", "failed", error="LLM unreachable: connection refused")
    memory = store.add("the api listens on 8080", session_id="ses_one").memory
    store.add("unrelated", session_id="ses_other")
    page = viewer.get("/sessions/ses_one").text
    assert f'id="event-{done.id}"' in page and f'id="event-{failed.id}"' in page
    assert "LLM unreachable: connection refused" in page
    assert f"/memories/{memory.id}" in page and "unrelated" not in page
    assert page.count(">Retry</button>") == 1
    assert f'action="/sessions/events/{failed.id}/retry"' in page


def test_a_session_page_shows_its_episodes_in_the_order_they_were_said(viewer):
    store = viewer.store
    event(store, "ses_one", "idle")
    store.add("the api listens on 8080", session_id="ses_one")
    with store.db.atomic():
        store.add_many([("Which web framework should we use?", {"role": "user", "turn": 1}, "user"),
                        ("Let's use FastAPI with Postgres.", {"role": "assistant", "turn": 2}, "agent")],
                       "conversation", confidence=0.5, source="episode", project=None, session_id="ses_one")
    page = viewer.get("/sessions/ses_one").text
    episodes = page.split('id="episodes"')[1]
    assert "2 episodes" in page and "1 memory" in page  # the typed memory is counted apart
    assert episodes.index("Which web framework") < episodes.index("FastAPI with Postgres")
    assert ">user<" in episodes and ">assistant<" in episodes and "the api listens" not in episodes


def test_an_unknown_session_is_a_404(viewer):
    assert viewer.get("/sessions/ses_nothing").status_code == 404


def test_retry_puts_a_failed_event_back_to_pending_and_enqueues_it(viewer):
    failed = event(viewer.store, "ses_one", "idle", "failed", error="boom")
    response = viewer.post(f"/sessions/events/{failed.id}/retry")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/sessions/ses_one?flash=")
    again = viewer.store.models.Event.get_by_id(failed.id)
    assert (again.status, again.attempts) == ("pending", 0)
    assert viewer.queue.enqueued == [failed.id]
    assert "queued again" in viewer.get(response.headers["location"]).text


def test_retry_of_an_event_that_did_not_fail_changes_nothing(viewer):
    done = event(viewer.store, "ses_one", "idle", "done")
    running, _ = record_event(viewer.store, "copilot", "ses_one", "ending")
    for target in (done, running):
        response = viewer.post(f"/sessions/events/{target.id}/retry", follow_redirects=True)
        assert "only a failed event is retried" in response.text
        assert viewer.store.models.Event.get_by_id(target.id).status == target.status
    assert viewer.queue.enqueued == []
    assert viewer.post("/sessions/events/999999/retry").status_code == 404
    # Past SQLite's 64-bit integers the id cannot name an event either: 404, not a 500.
    for huge in ("99999999999999999999999999", str(2**63)):
        response = viewer.post(f"/sessions/events/{huge}/retry")
        assert response.status_code == 404 and "no event" in response.text
    assert viewer.client.get(f"/sessions/events/{done.id}/retry").status_code == 405


def test_without_a_queue_retry_is_refused_and_no_button_is_shown(llmem_app):
    from .conftest import TOKEN, make_app

    asgi, csrf_token = make_app(llmem_app, 8766)
    failed = event(llmem_app.store, "ses_one", "idle", "failed", error="boom")
    with TestClient(asgi, base_url="http://127.0.0.1:8766") as client:
        assert "Retry" not in client.get("/sessions/ses_one", params={"token": TOKEN}).text
        response = client.post(f"/sessions/events/{failed.id}/retry", data={"csrf": csrf_token})
    assert response.status_code == 400 and "no queue attached" in response.text
    assert llmem_app.store.models.Event.get_by_id(failed.id).status == "failed"


def test_a_session_read_without_an_event_is_listed_too(viewer):
    """A backfill or an inline hook reads a session without recording an event: its cursor
    and memories still make it a session of the list."""
    viewer.store.models.SessionCursor.create(adapter="claude", session_id="cl-backfilled",
                                             project="/work/old", messages_read=12, updated_at=now())
    viewer.store.add("the old api used soap", session_id="cl-backfilled")
    event(viewer.store, "ses_one", "idle", at=1.0)
    page = viewer.get("/sessions").text
    assert page.index("cl-backfilled") < page.index("ses_one")
    row = page.split('href="/sessions/cl-backfilled"')[1].split("</tr>")[0]
    cells = [re.sub(r"<[^>]+>", "", "<td" + cell).strip() for cell in row.split("<td")[1:]]
    assert cells[0] == "/work/old" and cells[2:] == ["0", "0", "0", "1"]
    assert "cl-backfilled" not in viewer.get("/sessions", params={"agent": "copilot"}).text
    assert "12 messages read" in viewer.get("/sessions/cl-backfilled").text


def test_a_session_page_lists_its_latest_memories_and_counts_them_all(viewer):
    from llmem.ui.pages.sessions import SESSION_MEMORIES

    with viewer.store.db.atomic():
        for n in range(SESSION_MEMORIES + 3):
            viewer.store.add(f"note {n} of a long session", session_id="ses_long", created_at=1000.0 + n)
    page = viewer.get("/sessions/ses_long").text
    assert f"{SESSION_MEMORIES + 3} memories, newest first; the latest {SESSION_MEMORIES} shown" in page
    assert page.count('class="card result"') == SESSION_MEMORIES
    assert f"note {SESSION_MEMORIES + 2} of" in page and "note 2 of" not in page


def test_sessions_show_the_agents_title_and_wrap_nothing(configure, tmp_path):
    import shutil
    from pathlib import Path

    from llmem.app import App

    from .conftest import open_viewer

    state = tmp_path / "copilot" / "session-state"
    shutil.copytree(Path(__file__).parent.parent / "fixtures" / "copilot" / "session-state", state)
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n")
    app = App()
    try:
        with open_viewer(app) as viewer:
            titled = "7d3c2b1a-5e4f-4a8b-9c0d-1e2f3a4b5c6d"
            event(viewer.store, titled, "idle")
            event(viewer.store, "ses_gone", "idle")  # no store holds it any more
            page = viewer.get("/sessions").text
            row = page.split(f'href="/sessions/{titled}"')[0].rsplit("<tr>", 1)[1]
            assert "Fix flaky pagination test" in row
            gone = page.split('href="/sessions/ses_gone"')[0].rsplit("<tr>", 1)[1]
            assert "untitled" in gone
            assert '<table class="nowrap">' in page
            assert "<h1>Fix flaky pagination test" in viewer.get(f"/sessions/{titled}").text
    finally:
        app.close()


def test_sessions_are_paged_in_order_with_one_total(viewer):
    """The list is merged (events and cursors of a session are one row), ordered and cut to
    the page in SQL: every session once, latest activity first, across pages."""
    from llmem.ui.pages.sessions import PAGE_SIZE

    store = viewer.store
    count = PAGE_SIZE + 7
    for n in range(count):
        event(store, f"ses_{n:03d}", at=1000.0 + n)
        if n % 2:  # a cursor newer than the session's event moves it up
            store.models.SessionCursor.create(adapter="copilot", session_id=f"ses_{n:03d}", project=f"/p{n}",
                                              updated_at=5000.0 + n)
    store.models.SessionCursor.create(adapter="claude", session_id="cl-only", updated_at=9000.0)

    def listed(page):
        text = viewer.get("/sessions", params={"page": page}).text
        return re.findall(r'href="/sessions/([\w-]+)"', text), text

    first, text = listed(1)
    second, _ = listed(2)
    expected = (["cl-only"] + [f"ses_{n:03d}" for n in range(count - 1, -1, -1) if n % 2]
                + [f"ses_{n:03d}" for n in range(count - 1, -1, -1) if not n % 2])
    assert first + second == expected
    assert len(first) == PAGE_SIZE
    assert f"{count + 1} sessions, latest activity first" in text  # the total over every page
    assert listed(9)[0] == []
