"""The two-machine replay, small (bench/machines.py): two homes, each with its own agents and a
real `llmem run` restarted once and killed once, over one shared store (a SQLite file, or a
real PostgreSQL: conftest's `store_url`); every planted statement recovered once, no event
lost, none run by a machine that did not write its session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from machines import replay_on_machines, summary  # noqa: E402


@pytest.mark.slow
def test_two_machines_share_one_store_and_never_take_each_others_work(tmp_path, store_url):
    shared = store_url if store_url.startswith("postgresql://") else None  # None: a file under tmp_path
    result = replay_on_machines(tmp_path, sessions=10, seed=3, span=12.0, long_idle=5.0, down=3.0,
                                idle_debounce=1.0, settle=100.0, store=shared, log=lambda *_: None)
    text = summary(result)
    total = result["total"]
    assert total["planted"] >= 20, text
    assert total["recovered"] == total["planted"], text
    assert total["duplicates"] == 0, text
    assert result["events_not_done"] == 0 and total["sessions_without_event"] == 0, text
    assert result["wrong_machine"] == 0, text
    assert all(count > 0 for count in result["by_machine"].values()), text
