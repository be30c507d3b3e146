"""Dreaming on or off, and the time zone its schedule is read in.

`dream.enabled` in the config is the default; `llmem dream on|off` records an override in
the store's setting table. The store, not the config file, because the switch must reach
processes already running: the worker reads its config once at start, but reads the store
on every periodic dream, and so does the systemd timer's `llmem dream --apply --scheduled`.
An override equal to the config's value is removed, so the config speaks again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, tzinfo

from ..db.settings import delete_setting, get_setting, set_setting
from ..times import now

SWITCH_KEY = "dream_switch"  # setting row: {"enabled": bool, "at": timestamp}


@dataclass(frozen=True)
class DreamSwitch:
    enabled: bool
    source: str  # "config" or "llmem dream on|off"
    changed_at: float | None = None

    def as_dict(self) -> dict:
        return {"enabled": self.enabled, "source": self.source, "changed_at": self.changed_at}


def _override(db) -> dict | None:
    raw = get_setting(db, SWITCH_KEY)
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("enabled"), bool) else None


def dream_switch(store, config) -> DreamSwitch:
    """Whether dreaming is on, and what decided it."""
    override = _override(store.db)
    if override is not None:
        return DreamSwitch(override["enabled"], f"llmem dream {'on' if override['enabled'] else 'off'}",
                           override.get("at"))
    return DreamSwitch(bool(config.dream.enabled), "config")


def set_dream_enabled(store, config, enabled: bool) -> DreamSwitch:
    """Turn dreaming on or off for every process using this store."""
    with store.db.atomic():
        if enabled == bool(config.dream.enabled):
            delete_setting(store.db, SWITCH_KEY)
        else:
            set_setting(store.db, SWITCH_KEY, json.dumps({"enabled": enabled, "at": now()}))
    return dream_switch(store, config)


def dream_zone(config) -> tzinfo:
    """dream.timezone, or the system's local zone when it is null."""
    name = config.dream.timezone
    if name:
        from zoneinfo import ZoneInfo

        return ZoneInfo(name)
    return datetime.now().astimezone().tzinfo


def zone_name(config) -> str:
    name = config.dream.timezone
    return name or f"local ({datetime.now().astimezone().tzname()})"
