"""Timestamps: stored as epoch seconds (float, UTC), shown and exported as ISO 8601."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now() -> float:
    return time.time()


def to_iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def from_iso(value: str | float | int | None) -> float | None:
    """Parse an ISO 8601 time (a bare date, or with a zone; naive means UTC) or epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"not a time: {value!r}")
    text = value.strip().replace("Z", "+00:00")
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def days_between(later: float, earlier: float) -> float:
    return max(0.0, (later - earlier) / 86400.0)
