"""The Overview page: charts per day (memories by type, recalls, LLM tokens against the
budget), embedding coverage, last and next dream; hostile labels escaped."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from llmem.dream.schedule import next_run
from llmem.times import now
from llmem.ui.charts import Series, bars_by_day, coverage_bar

BUDGET = 50_000


@pytest.fixture
def fts_config(configure):
    """This module's store: FTS-only, with a daily token budget and a known dream schedule."""
    return configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
                     f"  daily_token_budget: {BUDGET}\ndream:\n  schedule: '30 4 * * *'\n")


def no_inline_code(html: str) -> bool:
    return (not re.findall(r"<script(?![^>]*\bsrc=)", html) and " style=" not in html
            and "<style" not in html and not re.search(r"\son[a-z]+=", html))


def section(page: str, element_id: str) -> str:
    return page.split(f'id="{element_id}"')[1].split("</section>")[0]


def bar_titles(svg: str) -> list[str]:
    return re.findall(r"<rect [^>]*><title>([^<]*)</title>", svg)


def test_memories_recalls_and_tokens_are_drawn_per_day(viewer):
    store = viewer.store
    today = datetime.now().astimezone().date().isoformat()
    for text in ("the api listens on 8080", "deploys need the vpn"):
        store.add(text, "fact")
    store.add("always run the linter before committing", "procedure")
    memory = store.add("old thing", "fact", created_at=now() - 3 * 86400).memory
    Recall, Usage = store.models.RecallEvent, store.models.LlmUsage
    for origin in ("search", "search", "mcp"):
        Recall.create(memory=memory.id, query_hash="q", rank=1, score=0.5, origin=origin, created_at=now())
    Usage.create(time=now(), day=today, task="extract", provider="ollama", model="m",
                 prompt_tokens=1200, completion_tokens=300)
    page = viewer.get("/").text
    assert no_inline_code(page)
    memories = section(page, "chart-memories")
    assert f"{today} fact: 2</title>" in memories and f"{today} procedure: 1</title>" in memories
    assert len(bar_titles(memories)) == 3  # today's two types and the fact of three days ago
    recalls = section(page, "chart-recalls")
    assert f"{today} search: 2</title>" in recalls and f"{today} mcp: 1</title>" in recalls
    tokens = section(page, "chart-tokens")
    assert f"{today} prompt: 1.2k</title>" in tokens and f"{today} completion: 300</title>" in tokens
    assert "daily budget: 50k</title>" in tokens  # the budget line
    assert ">1500</strong>" in page and f"of a {BUDGET} daily budget" in page


def test_the_window_changes_the_days_drawn(viewer):
    viewer.store.add("old thing", "fact", created_at=now() - 20 * 86400)
    week = section(viewer.get("/", params={"days": "7"}).text, "chart-memories")
    month = section(viewer.get("/", params={"days": "30"}).text, "chart-memories")
    assert bar_titles(week) == [] and len(bar_titles(month)) == 1
    # An unknown window is the default one, not an error.
    assert viewer.get("/", params={"days": "100000"}).status_code == 200


def test_coverage_and_the_dream_clock(viewer):
    viewer.store.add("not embedded: this store has no embedder", "fact")
    page = viewer.get("/").text
    assert "0 of 1 (0%)" in section(page, "chart-coverage")
    clock = section(page, "dream-clock")
    assert "never" in clock and "<code>30 4 * * *</code>" in clock
    upcoming = datetime.fromtimestamp(next_run("30 4 * * *").timestamp(), UTC)
    assert upcoming.strftime("%Y-%m-%d %H:%M UTC") in clock
    run = viewer.store.models.DreamRun.create(id="abcdef123456", kind="dream", phases="light,rem",
                                              status="done", started_at=now(), summary={})
    clock = section(viewer.get("/").text, "dream-clock")
    assert f'href="/dreams#run-{run.id}"' in clock and "light,rem" in clock


def test_hostile_labels_are_escaped():
    svg = bars_by_day(["2026-11-30"], [Series("<script>alert(1)</script>", [3])],
                      title='"><img src=x onerror=alert(1)>', limit=10, limit_name="<b>")
    assert "<script>" not in svg and "<img" not in svg and "<b>" not in svg
    assert "&lt;script&gt;" in svg and "&#34;&gt;&lt;img" in svg
    bar = coverage_bar(1, 3, title="<i>cover</i>")
    assert "<i>" not in bar and "1 of 3 (33%)" in bar


def test_a_hostile_recall_origin_is_escaped_on_the_page(viewer):
    memory = viewer.store.add("something recalled").memory
    viewer.store.models.RecallEvent.create(memory=memory.id, query_hash="q", rank=1, score=0.5,
                                           origin="<script>alert(1)</script>", created_at=now())
    page = viewer.get("/").text
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_long_legend_wraps_inside_the_chart_instead_of_being_clipped():
    char = 7  # pixels per character of an 11px label, generously
    names = ["fact", "decision", "preference", "event", "project_state", "procedure", "conversation",
             "self_assessment"]
    svg = str(bars_by_day(["2026-11-29", "2026-11-30"], [Series(name, [1, 2]) for name in names],
                          title="Memories created per day, by type", limit=10, limit_name="daily budget"))
    width = int(re.search(r'<svg[^>]* width="(\d+)"', svg).group(1))
    height = int(re.search(r'<svg[^>]* height="(\d+)"', svg).group(1))
    legend = re.findall(r'<text x="([\d.]+)" y="([\d.]+)" font-size="11" fill="#1d2530">([^<]+)</text>', svg)
    assert {text for _, _, text in legend} >= set(names)
    spans: dict[str, list[tuple[float, float]]] = {}
    for x, y, text in legend:
        start, end = float(x), float(x) + char * len(text)
        assert end <= width and float(y) <= height, (text, end, width)
        spans.setdefault(y, []).append((start, end))
    assert len(spans) >= 2  # wrapped onto a second row
    for row in spans.values():
        row.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(row, row[1:], strict=False))
