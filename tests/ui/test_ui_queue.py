"""The Queue and workers page: events by status, huey's counts, the heartbeat, retry of the
failed events, and the live log tail over server-sent events (read from a real server)."""

from __future__ import annotations

import json
import re
import time

import httpx

from llmem.config import load_config
from llmem.pipeline.events import worker_heartbeat
from llmem.times import now

from .conftest import TOKEN, make_app


def event(store, session_id, status="pending", *, error=None, not_before=None, kind="idle"):
    return store.models.Event.create(adapter="copilot", session_id=session_id, kind=kind, status=status,
                                     attempts=5 if status == "failed" else 0, last_error=error,
                                     detected_at=now(), not_before=not_before,
                                     started_at=now() if status == "running" else None,
                                     finished_at=now() if status in ("done", "failed") else None)


def tile(page: str, name: str) -> str:
    return re.search(rf'id="count-{name}">.*?<strong>(\d+)</strong>', page, re.S).group(1)


def heading_table(page: str, heading: str) -> str:
    return page.split(f"<h2>{heading}</h2>")[1].split("</table>")[0]


def no_inline_code(html: str) -> bool:
    return (not re.findall(r"<script(?![^>]*\bsrc=)", html) and " style=" not in html
            and "<style" not in html and not re.search(r"\son[a-z]+=", html))


def test_events_by_status_huey_counts_and_heartbeat(viewer):
    store = viewer.store
    ready = event(store, "ses_ready")
    later = event(store, "ses_later", not_before=now() + 3600)
    running = event(store, "ses_running", "running")
    failed = event(store, "ses_failed", "failed", error="LLM unreachable: <refused>")
    event(store, "ses_done", "done")
    viewer.queue.enqueued.extend([1, 2])  # what the recording queue reports as huey's pending
    page = viewer.get("/queue").text
    assert no_inline_code(page)
    assert [tile(page, n) for n in ("pending", "scheduled", "running", "failed")] == ["1", "1", "1", "1"]
    assert f'id="event-{ready.id}"' in heading_table(page, "Pending")
    assert f'id="event-{later.id}"' in heading_table(page, "Scheduled")
    assert f'id="event-{running.id}"' in heading_table(page, "Running")
    failed_rows = heading_table(page, "Failed")
    assert f'id="event-{failed.id}"' in failed_rows and "LLM unreachable: &lt;refused&gt;" in failed_rows
    assert "2 tasks waiting, 0 scheduled" in page
    assert "not seen" in page and "no heartbeat ever recorded" in page
    worker_heartbeat(store, at=now() - 30)
    page = viewer.get("/queue").text
    assert 'class="beat-ok">alive' in page and "(30 s ago)" in page


def test_retry_failed_requeues_every_failed_event(viewer):
    first = event(viewer.store, "ses_a", "failed", error="boom")
    second = event(viewer.store, "ses_b", "failed", error="boom")
    response = viewer.post("/queue/retry-failed")
    assert response.status_code == 303 and response.headers["location"].startswith("/queue?flash=")
    assert sorted(viewer.queue.enqueued) == [first.id, second.id]
    Event = viewer.store.models.Event
    assert {e.status for e in Event.select()} == {"pending"}
    assert "2 failed events queued again" in viewer.get(response.headers["location"]).text


def test_without_a_queue_the_page_says_so_and_retry_is_refused(llmem_app):
    from starlette.testclient import TestClient

    asgi, csrf = make_app(llmem_app, 8765)
    with TestClient(asgi, base_url="http://127.0.0.1:8765") as client:
        page = client.get("/queue", params={"token": TOKEN}).text
        assert "no queue is attached" in page
        assert client.post("/queue/retry-failed", data={"csrf": csrf}).status_code == 400


def write_log(config, *lines: str) -> None:
    config.log_dir.mkdir(parents=True, exist_ok=True)
    with (config.log_dir / "worker.log").open("a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def test_the_page_shows_the_log_tail_escaped_and_filtered(viewer):
    config = viewer.llmem.config
    write_log(config, "2026-11-30T10:00:00 INFO llmem.worker[1]: started",
              "2026-11-30T10:00:01 ERROR llmem.worker[1]: failed <script>alert(1)</script>",
              "Traceback (most recent call last):", '  File "x.py", line 1')
    page = viewer.get("/queue").text
    log = page.split('id="log"')[1].split("</pre>")[0]
    assert "started" in log and "&lt;script&gt;alert(1)" in log and "<script>" not in log
    assert 'class="log-ERROR">2026-11-30T10:00:01 ERROR' in log and 'line 1\n</span>' in log
    errors_only = viewer.get("/queue", params={"level": "ERROR"}).text.split('id="log"')[1]
    assert "started" not in errors_only.split("</pre>")[0]
    assert 'data-sse="/queue/logs/stream?level=ERROR"' in errors_only


def test_the_log_stream_sends_the_backlog_then_new_entries(live_viewer):
    config = load_config()
    write_log(config, "2026-11-30T10:00:00 INFO llmem.worker[1]: before the stream")
    url = f"{live_viewer.url}/queue/logs/stream"
    with httpx.Client(timeout=10) as client, client.stream("GET", url, params={"token": TOKEN}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "default-src 'self'" in response.headers["content-security-policy"]
        lines = response.iter_lines()
        backlog = read_events_from(lines, 1)
        assert backlog[0]["text"].endswith("before the stream") and backlog[0]["level"] == "INFO"
        write_log(config, "2026-11-30T10:00:05 WARNING llmem.worker[1]: while streaming",
                  "  a continuation line")
        write_log(config, "2026-11-30T10:00:06 ERROR llmem.hooks[2]: and one more")
        fresh = read_events_from(lines, 2)
    assert [e["level"] for e in fresh] == ["WARNING", "ERROR"]
    assert fresh[0]["text"] == ("2026-11-30T10:00:05 WARNING llmem.worker[1]: while streaming\n"
                                "  a continuation line")


def read_events_from(lines, count: int, timeout: float = 10.0) -> list[dict]:
    events, name = [], None
    deadline = time.monotonic() + timeout
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name == "entry":
            events.append(json.loads(line[6:]))
            if len(events) == count:
                break
        assert time.monotonic() < deadline, f"only {len(events)} events in {timeout} s"
    return events


def test_the_log_stream_needs_the_token(live_viewer):
    response = httpx.get(f"{live_viewer.url}/queue/logs/stream", timeout=5)
    assert response.status_code == 403


def test_an_open_log_stream_does_not_hold_the_server_at_shutdown(llmem_app):
    """uvicorn's shutdown waits for every response; the stream must end when it stops
    (before, Ctrl-C on `llmem ui` with the Queue page open hung until the tab closed)."""
    import threading

    from llmem.ui.server import ViewerServer, bind

    sock = bind(0)
    port = sock.getsockname()[1]
    asgi, _ = make_app(llmem_app, port)
    server = ViewerServer(asgi, sock).start()
    opened, ended = threading.Event(), threading.Event()

    def follow():
        url = f"http://127.0.0.1:{port}/queue/logs/stream"
        with httpx.Client(timeout=30) as client, client.stream("GET", url, params={"token": TOKEN}) as response:
            opened.set()
            for _ in response.iter_lines():
                pass
        ended.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert opened.wait(10)
    started = time.monotonic()
    server.stop(timeout=10)
    assert not server.thread.is_alive() and time.monotonic() - started < 5
    assert ended.wait(5)  # the client saw the stream end


def test_the_tail_reads_only_the_end_of_a_long_log(fts_config):
    """The page refreshes every 5 s: it reads the last TAIL_BYTES of each file, starting at a
    whole record (a traceback cut at its top is left out, not shown as a stray line)."""
    from llmem.logreader import TAIL_BYTES, tail_entries

    config = load_config()
    filler = "x" * 200
    lines = [f"2026-11-29T00:{i // 60 % 60:02d}:{i % 60:02d} INFO llmem.worker[1]: old {i} {filler}"
             for i in range(TAIL_BYTES // 200)]
    lines += ["2026-11-30T09:00:00 ERROR llmem.worker[1]: boom", "Traceback (most recent call last):",
              *[f"  frame {i} {filler}" for i in range(TAIL_BYTES // 150)],
              "2026-11-30T10:00:00 INFO llmem.worker[1]: the newest"]
    write_log(config, *lines)
    entries = tail_entries(config, None, 50)
    assert entries[-1].lines == ["2026-11-30T10:00:00 INFO llmem.worker[1]: the newest"]
    assert all(entry.time for entry in entries)  # no headless fragment of the cut traceback
    assert len(tail_entries(config, "ERROR", 50)) == 0  # the error's head is before the cut
    assert len(tail_entries(config, None, 1)) == 1
