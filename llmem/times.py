"""Timestamps: stored as epoch seconds (float, UTC), shown and exported as ISO 8601."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

# The times an ISO 8601 string can show (years 1 to 9999, in UTC): a stored time outside them
# could never be exported or printed again.
EARLIEST = datetime(1, 1, 1, tzinfo=UTC).timestamp()
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


def now() -> float:
    return time.time()


def to_iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def utc_minute(ts: float) -> str:
    """A time as people read it in reports and pages: `2026-12-01 17:34 UTC`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def utc_second(ts: float) -> str:
    """`2026-12-01 17:34:15 UTC`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def utc_date(ts: float) -> str:
    """The UTC day of a time: `2026-12-01`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def file_stamp(ts: float | None = None) -> str:
    """A local time as part of a file name (a backup, a damaged file moved aside): `20261201T173415`."""
    return time.strftime("%Y%m%dT%H%M%S", time.localtime(ts))


def from_iso(value: str | float | int | None) -> float | None:
    """Parse an ISO 8601 time (a bare date, or with a zone; naive means UTC) or epoch seconds.

    ValueError when it is not a time, or one outside years 1 to 9999 in UTC.
    """
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            stamp = float(value)
        except OverflowError:  # an int too large for a float
            stamp = math.inf
    elif isinstance(value, str):
        text = value.strip().replace("Z", "+00:00")
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        stamp = parsed.timestamp()
    else:
        raise ValueError(f"not a time: {_shown(value)}")
    if not EARLIEST <= stamp <= LATEST:  # NaN fails this too
        raise ValueError(f"{_shown(value)} is outside the years 1 to 9999 (UTC)")
    return stamp


def _shown(value) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit number"
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def days_between(later: float, earlier: float) -> float:
    return max(0.0, (later - earlier) / 86400.0)
