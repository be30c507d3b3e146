"""The Memories and Sessions pages in a real headless Chromium (slow: a browser per process)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from session_writers import CopilotSession

from llmem.times import now

pytestmark = pytest.mark.slow

expect = pytest.importorskip("playwright.sync_api").expect


def test_memories_page_lists_searches_and_draws_the_breakdown(browser_page, live_viewer):
    store = live_viewer.llmem.store
    store.add("deploys to staging need the vpn turned on", "procedure", project="/work/api")
    store.add("the vpn client is wireguard", "fact")
    store.add("lunch is at noon <script>window.pwned = 1</script>", "event")
    page = browser_page
    page.goto(f"{live_viewer.url}/memories")
    expect(page.locator("#memory-list article")).to_have_count(3)
    expect(page.locator("#memory-list")).to_contain_text("<script>window.pwned = 1</script>")
    assert page.evaluate("window.pwned") is None  # shown as text, never run
    page.fill("input[name=q]", "vpn staging")
    page.press("input[name=q]", "Enter")
    page.wait_for_url(re.compile(r"/memories\?q=vpn\+staging"))
    results = page.locator("#results article")
    expect(results.first).to_contain_text("deploys to staging need the vpn turned on")
    bar = results.first.locator("rect.bar-fts")
    assert float(bar.get_attribute("width")) > 0
    results.first.locator("summary").click()
    expect(results.first.locator("table")).to_contain_text("bm25")
    # The type filter narrows a query both memories answer: for "vpn staging" the fact (it
    # shares "vpn" alone) is below the minimum relevance and not listed at all (search.py).
    page.fill("input[name=q]", "vpn")
    page.select_option("select[name=type]", "fact")  # submits on change (app.js)
    page.wait_for_url(re.compile(r"q=vpn&.*type=fact|type=fact&.*q=vpn"))
    expect(page.locator("#results article")).to_have_count(1)
    expect(page.locator("#results")).to_contain_text("wireguard")
    assert page.console_errors == []  # no CSP violation, no script error


def test_edit_a_memory_in_the_browser(browser_page, live_viewer):
    memory = live_viewer.llmem.store.add("the api listens on 8080", "fact").memory
    page = browser_page
    page.goto(f"{live_viewer.url}/memories/{memory.id}")
    page.click("text=Edit")
    page.fill("textarea[name=content]", "the api listens on 9090")
    page.select_option("select[name=type]", "decision")
    page.click("button:has-text('Save')")
    expect(page.locator(".flash")).to_contain_text("Saved")
    expect(page.locator("#memory-content")).to_have_text("the api listens on 9090")
    edited = live_viewer.llmem.store.get(memory.id)
    assert (edited.content, edited.type) == ("the api listens on 9090", "decision")
    assert page.console_errors == []


def test_invalidate_a_memory_in_the_browser_after_one_confirm(browser_page, live_viewer):
    memory = live_viewer.llmem.store.add("the cache is redis", "fact").memory
    page = browser_page
    page.goto(f"{live_viewer.url}/memories/{memory.id}")
    page.click("text=Invalidate")
    expect(page.locator("h1")).to_have_text("Invalidate this memory?")
    assert live_viewer.llmem.store.get(memory.id).invalidated_at is None
    page.fill("input[name=reason]", "moved to memcached")
    page.click("button:has-text('Invalidate')")
    expect(page.locator(".flash")).to_contain_text("Invalidated")
    expect(page.locator("h1 .tag-invalid")).to_have_text("invalid")
    assert live_viewer.llmem.store.get(memory.id).metadata["invalidation_reason"] == "moved to memcached"
    page.goto(f"{live_viewer.url}/memories")
    expect(page.locator("#memory-list")).not_to_contain_text("the cache is redis")
    assert page.console_errors == []


def test_correct_then_delete_in_the_browser(browser_page, live_viewer):
    store = live_viewer.llmem.store
    memory = store.add("the staging db listens on 5432", "fact").memory
    page = browser_page
    page.goto(f"{live_viewer.url}/memories/{memory.id}")
    page.click("text=Correct")
    page.fill("textarea[name=content]", "the staging db listens on 6543")
    page.click("button:has-text('Supersede')")
    expect(page.locator(".flash")).to_contain_text("now supersedes")
    expect(page.locator("#memory-content")).to_have_text("the staging db listens on 6543")
    assert store.get(memory.id).invalidated_at is not None
    page.click("text=Delete")
    expect(page.locator("h1")).to_have_text("Delete this memory for good?")
    page.click("button:has-text('Delete')")
    expect(page.locator(".flash")).to_contain_text("Deleted")
    assert page.url.split("?")[0].endswith("/memories")
    expect(page.locator("#memory-list")).not_to_contain_text("6543")
    assert store.models.Memory.select().count() == 1  # the corrected one stays, invalidated
    assert page.console_errors == []


def test_sessions_page_shows_an_event_and_the_memories_it_produced(browser_page, live_viewer):
    store = live_viewer.llmem.store
    Event = store.models.Event
    Event.create(adapter="copilot", session_id="ses_browser", kind="idle", status="done", attempts=1,
                 detected_at=now(), finished_at=now())
    failed = Event.create(adapter="copilot", session_id="ses_browser", kind="ending", status="failed",
                          attempts=5, last_error="LLM unreachable", detected_at=now())
    store.add("the build needs node 22", session_id="ses_browser")
    page = browser_page
    page.goto(f"{live_viewer.url}/sessions")
    page.click("text=ses_browser")
    expect(page.locator("#events")).to_contain_text("LLM unreachable")
    expect(page.locator("#session-live")).to_contain_text("the build needs node 22")
    page.click(f"#event-{failed.id} button:has-text('Retry')")
    expect(page.locator(".flash")).to_contain_text("queued again")
    expect(page.locator(f"#event-{failed.id}")).to_contain_text("pending")
    assert live_viewer.queue.enqueued == [failed.id]
    assert page.console_errors == []


def test_a_memory_appears_on_the_open_page_while_the_worker_ingests_a_session(
        chromium, llmem_home, tmp_path, configure):
    """`llmem run --ui`: the real watcher and worker ingest a Copilot session while the
    Memories page stays open; its live list shows the new memory without a reload."""
    state = tmp_path / "copilot" / "session-state"
    state.mkdir(parents=True)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n"
              f"  opencode:\n    data_dir: {tmp_path / 'no-opencode'}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with out.open("w") as sink, err.open("w") as said:
        runner = subprocess.Popen([sys.executable, "-m", "llmem", "run", "--ui", "--no-browser", "-w", "2"],
                                  stdout=sink, stderr=said, env=os.environ.copy())
    context = chromium.new_context()
    try:
        deadline = time.monotonic() + 20
        while not out.read_text().endswith("\n"):
            assert runner.poll() is None and time.monotonic() < deadline, "llmem run --ui printed no URL"
            time.sleep(0.05)
        entry = out.read_text().strip()
        page = context.new_page()
        page.goto(entry)
        page.goto(entry.split("/?")[0] + "/memories")
        expect(page.locator("#memory-list")).to_contain_text("0 memories")
        # run says "Ctrl-C stops" once its watcher is attached: a turn written before is not seen.
        while "Ctrl-C stops" not in err.read_text():
            assert runner.poll() is None and time.monotonic() < deadline + 40, "llmem run never started"
            time.sleep(0.05)
        session = CopilotSession(state)
        session.start(locked=False)
        session.turn("remember that the release train leaves on thursdays", "noted", flush=False)
        session.write()
        expect(page.locator("#memory-list")).to_contain_text("release train leaves on thursdays",
                                                             timeout=45_000)
        page.goto(entry.split("/?")[0] + f"/sessions/{session.id}")
        expect(page.locator("#events")).to_contain_text("done")
        expect(page.locator("#session-live")).to_contain_text("release train")
    finally:
        context.close()
        runner.send_signal(signal.SIGINT)
        try:
            runner.wait(20)
        finally:
            if runner.poll() is None:
                runner.kill()
    assert Path(out).read_text().count("\n") == 1
