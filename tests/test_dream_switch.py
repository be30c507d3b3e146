"""Dreaming on and off, and the time zone of its schedule: through the CLI, the worker's
periodic task (the real huey registration) and the systemd timer's command line."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dream_support import add, open_store, run_cli

from llmem.app import App
from llmem.config import load_config, validate_mapping
from llmem.errors import ConfigError
from llmem.setup.systemd import render_unit
from llmem.store import Store
from workers import tasks
from workers.app import build_huey


@pytest.fixture
def home(llmem_home):
    store, _ = open_store(llmem_home, "dream:\n  timezone: America/Los_Angeles\n")
    add(store, "the deploy script lives in scripts/deploy.sh")
    store.close()
    return llmem_home


def dream_runs(home) -> int:
    store = Store.open(load_config().store_location)
    try:
        DreamRun = store.models.DreamRun
        return DreamRun.select().where(DreamRun.kind == "dream").count()
    finally:
        store.close()


def status(home) -> dict:
    code, out, err = run_cli("dream", "status", "--json")
    assert code == 0, err
    return json.loads(out)


def test_off_and_on_persist_and_show_in_status(home):
    assert status(home)["enabled"] is True
    assert status(home)["enabled_by"] == "config"
    code, out, _ = run_cli("dream", "off")
    assert code == 0 and "off" in out
    data = status(home)
    assert data["enabled"] is False and data["enabled_by"] == "llmem dream off"
    assert data["next_run"] is None
    code, out, _ = run_cli("dream", "status")
    assert "Dreaming:  off" in out and "none: dreaming is off" in out
    code, _, _ = run_cli("dream", "on")
    data = status(home)
    # On is the config's own value: the override is gone and the config speaks again.
    assert data["enabled"] is True and data["enabled_by"] == "config"
    assert data["timezone"] == "America/Los_Angeles"
    assert "T03:00-08:00" in data["next_run"]  # 03:00 in Los Angeles, in winter


def test_the_timer_run_does_nothing_while_off_but_a_manual_run_goes_ahead(home):
    assert "dream --apply --scheduled" in render_unit("llmem-dream.service")
    run_cli("dream", "off")
    code, out, err = run_cli("dream", "--apply", "--scheduled")
    assert code == 0 and "Dreaming is off" in out
    assert dream_runs(home) == 0
    code, out, err = run_cli("dream", "--apply", "--no-llm")
    assert code == 0, err
    assert "dreaming is off" in err and "goes ahead" in err
    assert dream_runs(home) == 1
    run_cli("dream", "on")
    code, out, err = run_cli("dream", "--apply", "--scheduled", "--no-llm")
    assert code == 0 and "applied" in out
    assert dream_runs(home) == 2


def test_config_enabled_false_is_the_default_the_switch_overrides(llmem_home):
    store, _ = open_store(llmem_home, "dream:\n  enabled: false\n")
    store.close()
    assert status(llmem_home)["enabled"] is False
    run_cli("dream", "on")
    data = status(llmem_home)
    assert data["enabled"] is True and data["enabled_by"] == "llmem dream on"


def test_dream_help_lists_the_switch():
    code, out, _ = run_cli("dream", "help")
    assert code == 0
    for word in ("on", "off", "status", "--scheduled"):
        assert word in out


def test_timezone_is_validated_with_zoneinfo():
    values, _ = validate_mapping({"dream": {"timezone": "Asia/Ho_Chi_Minh"}})
    assert values["dream"]["timezone"] == "Asia/Ho_Chi_Minh"
    assert validate_mapping({})[0]["dream"]["timezone"] is None
    with pytest.raises(ConfigError, match="dream.timezone.*IANA"):
        validate_mapping({"dream": {"timezone": "Mars/Olympus_Mons"}})


def _local(moment: datetime) -> datetime:
    """An aware moment as huey (utc=False) passes it: naive local wall time."""
    return moment.astimezone().replace(tzinfo=None)


def test_worker_periodic_dream_fires_in_the_configured_zone_and_respects_off(home):
    app = App()
    tasks.use_app(app)
    try:
        huey = build_huey(app.config)
        huey.immediate = True
        tasks.register(huey, app.config)
        three_am = datetime(2026, 12, 1, 3, 0, tzinfo=ZoneInfo("America/Los_Angeles"))

        def periodic(at: datetime):
            return [t for t in huey.read_periodic(_local(at)) if t.name == "dream_periodic"]

        assert periodic(three_am)
        assert not periodic(three_am + timedelta(hours=1))
        assert not periodic(three_am.replace(tzinfo=ZoneInfo("UTC")) + timedelta(hours=1))

        run_cli("dream", "off")
        (task,) = periodic(three_am)
        assert huey.execute(task, timestamp=_local(three_am)) == {"skipped": "dreaming is off"}
        assert app.store.models.DreamRun.select().count() == 0
        run_cli("dream", "on")
        result = huey.execute(task, timestamp=_local(three_am))
        assert result["run_id"]
        assert app.store.models.DreamRun.select().count() == 1
    finally:
        tasks.use_app(None)
        app.close()
