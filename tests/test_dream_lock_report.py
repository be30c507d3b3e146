"""The dream lock across processes, the cron reader, and an inert HTML report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from html.parser import HTMLParser

import pytest
from dream_support import add, open_store, run_cli
from fakes import FakeEmbedder, wait_until

from llmem.db.locks import server_lock_held
from llmem.dream import DreamLock, DreamLocked, run_dream
from llmem.dream.lock import LOCK_KEY, lock_is_live, read_lock, stale_lock
from llmem.dream.schedule import CronSchedule
from llmem.errors import UsageError
from llmem.store import Store

HOLD = """
import socket, sys
if len(sys.argv) > 2:  # a run on another machine sharing the store
    socket.gethostname = lambda: sys.argv[2]
from llmem.store import Store
from llmem.dream import DreamLock
store = Store.open(sys.argv[1])
with DreamLock(store.db, "holder0000"):
    print("held", flush=True)
    sys.stdin.read()
"""


def _hold_lock(location, *host: str) -> subprocess.Popen:
    """A process holding the dream lock of the store at `location` until it is killed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(location), *host],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_second_run_refused_while_another_process_holds_the_lock(home):
    store, config = open_store(home)
    holder = _hold_lock(config.store_location)
    try:
        with pytest.raises(DreamLocked, match="another dream run is in progress"):
            run_dream(store, config, apply=True)
        code, _, err = run_cli("dream", "--apply")
        assert code == 1 and "another dream run is in progress" in err and "holder0000" in err
        # A preview still works, and says a run is going on.
        assert any("in progress" in n for n in run_dream(store, config).notes)
    finally:
        holder.kill()
        holder.wait()
    # The holder died without releasing: its lock is stale and taken over.
    assert read_lock(store.db)["run_id"] == "holder0000"
    outcome = run_dream(store, config, apply=True)
    assert any("stale lock" in n for n in outcome.notes)
    assert read_lock(store.db) is None
    store.close()


def test_lock_row_from_dead_pid_is_taken_over(home, store_url):
    store, config = open_store(home, store_url=store_url)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    store.db.execute_sql("INSERT INTO setting(key, value) VALUES (?, ?)", (LOCK_KEY, json.dumps(
        {"pid": dead.pid, "host": socket.gethostname(), "run_id": "deadbeef", "started_at": time.time()})))
    with DreamLock(store.db, "mine00000000") as lock:
        assert lock.taken_over["run_id"] == "deadbeef"
        with pytest.raises(DreamLocked):  # the same process, another run: refused too
            DreamLock(store.db, "other0000000").acquire()
    assert read_lock(store.db) is None
    assert os.getpid() != dead.pid
    store.close()


def test_another_connection_waits_for_the_run_to_end(home, store_url):
    first, _ = open_store(home, store_url=store_url)
    second = Store.open(store_url)
    with DreamLock(first.db, "first0000001"), pytest.raises(DreamLocked, match="first0000001"):
        DreamLock(second.db, "second000001").acquire()
    with DreamLock(second.db, "second000001") as lock:
        assert lock.taken_over is None
    assert read_lock(first.db) is None
    first.close()
    second.close()


@pytest.mark.backend
def test_on_a_shared_server_a_dead_machines_lock_is_free_at_once(home, postgres_url):
    """Several machines share a Postgres store: a run on a laptop holds the lock for every
    host while its connection lives, and the moment it dies (kill -9, the laptop gone) the
    next run anywhere takes over, where a SQLite store trusts another host's row for hours."""
    store, config = open_store(home, store_url=postgres_url)
    laptop = _hold_lock(postgres_url, "laptop-b.invalid")
    try:
        with pytest.raises(DreamLocked, match="laptop-b.invalid"):
            run_dream(store, config, apply=True)
        assert lock_is_live(read_lock(store.db), store.db) and stale_lock(store.db) is None
    finally:
        laptop.kill()
        laptop.wait()
    # The server ends the dead client's session as soon as it sees the connection closed.
    wait_until(lambda: not server_lock_held(store.db, LOCK_KEY), timeout=10, interval=0.02)
    assert stale_lock(store.db)["host"] == "laptop-b.invalid"
    outcome = run_dream(store, config, apply=True)
    assert any("stale lock" in n for n in outcome.notes)
    assert read_lock(store.db) is None and not server_lock_held(store.db, LOCK_KEY)
    store.close()


@pytest.mark.parametrize("expr, now, expected", [
    ("0 3 * * *", "2026-11-30 10:15", "2026-12-01 03:00"),
    ("0 3 * * *", "2026-11-30 02:59", "2026-11-30 03:00"),
    ("*/15 * * * *", "2026-11-30 10:15", "2026-11-30 10:30"),
    ("30 4 1 * *", "2026-11-30 10:00", "2026-12-01 04:30"),
    ("0 9 * * mon-fri", "2026-12-04 10:00", "2026-12-07 09:00"),  # Friday → Monday
    ("0 0 29 2 *", "2026-03-01 00:00", "2028-02-29 00:00"),
    ("0 12 1 * 0", "2026-11-30 13:00", "2026-12-01 12:00"),  # dom OR dow
])
def test_cron_next_run(expr, now, expected):
    fmt = "%Y-%m-%d %H:%M"
    assert CronSchedule(expr).next_after(datetime.strptime(now, fmt)).strftime(fmt) == expected


@pytest.mark.parametrize("bad", ["", "0 3 * *", "61 * * * *", "a b c d e", "*/0 * * * *"])
def test_cron_rejects_bad_expressions(bad):
    with pytest.raises(UsageError):
        CronSchedule(bad)


class TagCollector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)


HOSTILE = ['<script>alert("x")</script> the deploy key lives in vault',
           '"><img src=x onerror=alert(1)> the deploy key lives in vault too',
           "</style><style>body{background:url(http://evil.test/x)}</style>"]


def test_report_is_self_contained_and_inert(home, tmp_path):
    store, config = open_store(home, "dream:\n  auto_link_threshold: 0.3\n")
    emb = FakeEmbedder(dim=512)
    for text in HOSTILE:
        add(store, text, embedder=emb, age_days=40)
    add(store, "Category: <b>NULL_SAFETY</b>\nWhat_happened: <script>x</script>", "self_assessment")
    report = tmp_path / "report.html"
    outcome = run_dream(store, config, apply=True, report_path=report)
    assert outcome.actions  # decays of the hostile memories are listed with their text
    page = report.read_text()
    collector = TagCollector()
    collector.feed(page)
    assert "script" not in collector.tags and "img" not in collector.tags
    assert not {a for a in collector.attrs if a.startswith("on")}
    assert "&lt;script&gt;" in page and "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    # The hostile </style> stays text: one style element, holding only our CSS.
    assert page.count("<style>") == 1 and page.count("</style>") == 1
    assert "http:" not in page.split("<body>")[0] and "https:" not in page.split("<body>")[0]
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    for chart in ("Valid memories by type", "Confidence histogram", "Actions per phase"):
        assert chart in page
    assert page.count("<svg") >= 3 and "<link" not in page
    store.close()


def test_report_shows_calibration_chart(home, tmp_path):
    store, config = open_store(home)
    now = time.time()
    add(store, "check nulls", "procedure", age_days=10,
        metadata={"insight_key": "NULL_SAFETY", "category": "NULL_SAFETY", "introduced_at": now - 10 * 86400})
    for age in (12, 13, 2):
        add(store, f"Category: NULL_SAFETY\nWhat_happened: oops {age}", "self_assessment", age_days=age)
    report = tmp_path / "r.html"
    run_dream(store, config, report_path=report)
    assert "Calibration: error rate before and after" in report.read_text()
    store.close()


def test_the_confidence_histogram_axis_labels_never_overlap():
    import re

    from llmem.dream.report import grouped_chart

    bins = [f"{i / 10:.1f}–{(i + 1) / 10:.1f}" for i in range(10)]
    svg = grouped_chart(bins, [("before", [1] * 10), ("after", [2] * 10)], "Confidence histogram")
    width = int(re.search(r'width="(\d+)"', svg).group(1))
    base = max(float(y) for y in re.findall(r'<line [^>]*y1="([\d.]+)"', svg))
    char = 7.5  # pixels per character of the report's 12px chart text, generously
    spans = []
    for tag, text in re.findall(r"(<text [^>]*>)([^<]*)</text>", svg):
        y = float(re.search(r'y="([\d.]+)"', tag).group(1))
        if y != base + 14:
            continue  # the title and the legend
        x = float(re.search(r'x="([\d.]+)"', tag).group(1))
        w = char * len(text)
        start = x - w / 2 if 'text-anchor="middle"' in tag else x
        spans.append((start, start + w))
    assert len(spans) >= 5  # labelled enough to read
    spans.sort()
    assert spans[0][0] >= 0 and spans[-1][1] <= width
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))


def test_a_report_path_naming_llmem_home_is_written_there(home, tmp_path, monkeypatch):
    """dream.report_path expands ~ and $VARIABLES as every other path key does: the report of an
    applied run lands in $LLMEM_HOME, not in a folder literally named `$LLMEM_HOME`."""
    monkeypatch.chdir(tmp_path)
    store, _ = open_store(home, "dream:\n  report_path: $LLMEM_HOME/reports/report.html\n")
    store.close()
    reports = home / "reports"
    reports.mkdir()
    code, out, err = run_cli("dream", "--apply")
    assert code == 0, err
    assert (reports / "report.html").is_file()
    assert not (tmp_path / "$LLMEM_HOME").exists()


def test_a_long_report_legend_wraps_inside_the_chart_instead_of_overlapping():
    import re

    from llmem.dream.report import grouped_chart

    names = ["error rate before the insight", "error rate after the insight", "sessions counted"]
    svg = grouped_chart(["NULL_SAFETY", "TESTS"], [(name, [1, 2]) for name in names], "Calibration")
    width = int(re.search(r'<svg[^>]* width="(\d+)"', svg).group(1))
    height = float(re.search(r'<svg[^>]* height="([\d.]+)"', svg).group(1))
    char = 7.5  # pixels per character of the report's 12px chart text, generously
    rows: dict[str, list[tuple[float, float]]] = {}
    for x, y, text in re.findall(r'<text x="([\d.]+)" y="([\d.]+)">([^<]+)</text>', svg):
        if text in names:
            assert float(x) + char * len(text) <= width and float(y) <= height, text
            rows.setdefault(y, []).append((float(x), float(x) + char * len(text)))
    assert sum(len(row) for row in rows.values()) == len(names)
    for row in rows.values():
        row.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(row, row[1:], strict=False))
