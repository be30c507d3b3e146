"""The Overview, Queue and Dreams pages in a real headless Chromium (slow): the charts drawn,
the live log tail, undo of a dream run, accepting a skill patch."""

from __future__ import annotations

import re

import pytest
from proposals_support import propose_changes

from llmem.dream.review import list_proposals

pytestmark = pytest.mark.slow

expect = pytest.importorskip("playwright.sync_api").expect


def test_overview_draws_its_charts(browser_page, live_viewer):
    store = live_viewer.llmem.store
    store.add("the api listens on 8080", "fact")
    store.add("always run the linter", "procedure")
    page = browser_page
    page.goto(f"{live_viewer.url}/")
    for chart in ("memories", "coverage", "recalls", "tokens"):
        expect(page.locator(f"#chart-{chart} svg")).to_be_visible()
    assert page.locator("#chart-memories svg rect[fill]").count() >= 2
    page.select_option("select[name=days]", "7")  # submits on change (app.js)
    page.wait_for_url(re.compile(r"days=7"))
    expect(page.locator("#chart-memories svg")).to_be_visible()
    assert page.console_errors == []


def test_queue_tails_the_logs_live(browser_page, live_viewer):
    config = live_viewer.llmem.config
    config.log_dir.mkdir(parents=True, exist_ok=True)
    log_file = config.log_dir / "worker.log"
    log_file.write_text("2026-11-30T10:00:00 INFO llmem.worker[1]: before the page\n")
    page = browser_page
    page.goto(f"{live_viewer.url}/queue")
    expect(page.locator("#log")).to_contain_text("before the page")
    expect(page.locator("#workers")).to_contain_text("no heartbeat ever recorded")
    with log_file.open("a") as fh:
        fh.write("2026-11-30T10:00:01 ERROR llmem.worker[1]: after <img src=x onerror=window.pwned=1>\n")
    expect(page.locator("#log .log-ERROR")).to_contain_text("after <img src=x onerror=window.pwned=1>")
    assert page.evaluate("window.pwned") is None  # the line is text, never markup
    assert page.console_errors == []


def test_undo_a_dream_run_in_the_browser(browser_page, live_viewer):
    store, config = live_viewer.llmem.store, live_viewer.llmem.config
    outcome = propose_changes(store, config)
    page = browser_page
    page.goto(f"{live_viewer.url}/dreams")
    row = page.locator(f"#run-{outcome.run_id}")
    expect(row).to_contain_text("done")
    row.locator("text=Undo…").click()
    expect(page.locator("h1")).to_contain_text(f"Undo dream run {outcome.run_id}?")
    page.click("button:has-text('Undo this run')")
    expect(page.locator(".flash")).to_contain_text(f"Undid run {outcome.run_id}")
    expect(page.locator(f"#run-{outcome.run_id}")).to_contain_text("undone")
    assert store.models.DreamRun.get_by_id(outcome.run_id).status == "undone"
    assert page.console_errors == []


def test_accept_a_skill_patch_in_the_browser(browser_page, live_viewer):
    store, config = live_viewer.llmem.store, live_viewer.llmem.config
    propose_changes(store, config)
    page = browser_page
    page.goto(f"{live_viewer.url}/dreams")
    card = page.locator('[id="proposal-skill-patch:EDGE_CASE"]')
    expect(card).to_contain_text("[SKILL PATCH] EDGE_CASE")
    card.locator("input[name=note]").fill("checked by hand")
    card.locator("button:has-text('Accept')").click()
    expect(page.locator(".flash")).to_contain_text("Recorded: skill-patch:EDGE_CASE accepted")
    card = page.locator('[id="proposal-skill-patch:EDGE_CASE"]')
    expect(card.locator(".decision-accepted")).to_have_text("accepted")
    expect(card).to_contain_text("checked by hand")
    decided = {p.id: p.decision for p in list_proposals(store.db, config.paths.proposed_changes_path)}
    assert decided["skill-patch:EDGE_CASE"].decision == "accepted"
    assert decided["insight:EDGE_CASE"] is None
    # The report opens sandboxed: its own inline CSS is allowed there, nothing else.
    report = page.context.new_page()
    report.goto(f"{live_viewer.url}/dreams/report")
    expect(report.locator("h1")).to_have_text("llmem dream report")
    assert page.console_errors == []
