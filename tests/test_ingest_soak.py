"""The ingestion soak, small: 20 replayed sessions through a real `llmem run`, restarted once and
killed with SIGKILL once; every planted statement searchable exactly once, no event lost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from ingest import KINDS, report, soak  # noqa: E402


@pytest.mark.slow
def test_twenty_sessions_every_statement_recovered_once_nothing_lost(tmp_path):
    figures = soak(tmp_path / "soak", sessions=20, seed=7, span=20.0, long_idle=5.0, down=3.0,
                   idle_debounce=1.0, settle=100.0, log=lambda *_: None)
    summary = report(figures)
    assert set(figures["by_scenario"]) == set(KINDS), summary
    assert [d.split()[0] for d in figures["disruptions"]] == ["restart", "kill"], summary
    assert figures["planted"] >= 20, summary
    assert figures["recovered"] == figures["planted"], summary
    assert figures["duplicates"] == 0, summary
    assert figures["events_not_done"] == 0, summary
    assert figures["sessions_without_event"] == 0, summary
    # The turns themselves: every planted statement in exactly one episode.
    assert figures["episodes"]["lost"] == 0 and figures["episodes"]["twice"] == 0, summary
