"""A small cron reader: the next time a five-field schedule fires (for `dream status`) and
whether it fires this minute (the worker's periodic dream), read in dream.timezone.

llmem/ must not import huey; this covers the standard
syntax: `*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, lists, month and day names,
and cron's rule that a restricted day-of-month and day-of-week match when either does.
"""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo

from ..errors import UsageError

_NAMES = {
    "month": {m: i for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)},
    "dow": {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
}
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("dom", 1, 31), ("month", 1, 12), ("dow", 0, 7))


def _value(text: str, name: str) -> int:
    low = text.lower()
    if low in _NAMES.get(name, {}):
        return _NAMES[name][low]
    return int(text)


def _parse_field(text: str, name: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/", 1)
            step = int(step_text)
            if step < 1:
                raise ValueError
        if part == "*":
            start, end = low, high
        elif "-" in part:
            a, b = part.split("-", 1)
            start, end = _value(a, name), _value(b, name)
        else:
            start = _value(part, name)
            end = high if step > 1 else start
        if not (low <= start <= high and low <= end <= high and start <= end):
            raise ValueError
        values.update(range(start, end + 1, step))
    return values


class CronSchedule:
    """A parsed five-field cron expression."""

    def __init__(self, expression: str):
        parts = (expression or "").split()
        if len(parts) != 5:
            raise UsageError(f"dream.schedule {expression!r} is not a cron expression",
                             hint='use five fields, e.g. "0 3 * * *" (03:00 every day)')
        try:
            fields = [_parse_field(p, n, lo, hi) for p, (n, lo, hi) in zip(parts, _FIELDS, strict=True)]
        except ValueError:
            raise UsageError(f"dream.schedule {expression!r} is not a valid cron expression",
                             hint='e.g. "0 3 * * *" or "30 */6 * * mon-fri"') from None
        self.expression = expression
        self.minutes, self.hours, self.days, self.months, dow = fields
        self.weekdays = {d % 7 for d in dow}  # 7 is Sunday too
        self.dom_any = parts[2] == "*"
        self.dow_any = parts[4] == "*"

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        dom_ok = day.day in self.days
        dow_ok = (day.isoweekday() % 7) in self.weekdays
        if self.dom_any and self.dow_any:
            return True
        if self.dom_any:
            return dow_ok
        if self.dow_any:
            return dom_ok
        return dom_ok or dow_ok

    def matches(self, moment: datetime) -> bool:
        """Whether the schedule fires in the minute of `moment` (read in its own zone)."""
        return self._day_matches(moment) and moment.hour in self.hours and moment.minute in self.minutes

    def next_after(self, moment: datetime) -> datetime | None:
        """The first firing strictly after `moment` (naive local or aware), within 5 years."""
        start = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
        day = start.replace(hour=0, minute=0)
        for _ in range(366 * 5):
            if self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        candidate = day.replace(hour=hour, minute=minute)
                        if candidate >= start:
                            return candidate
            day += timedelta(days=1)
        return None


def next_run(expression: str, after: datetime | None = None, zone: tzinfo | None = None) -> datetime | None:
    """When the schedule fires next, read in `zone` (default: local time)."""
    return CronSchedule(expression).next_after(after or datetime.now(zone).astimezone(zone))


class ZonedTrigger:
    """huey's periodic-task test for a cron schedule read in a time zone.

    huey (built with utc=False) asks once a minute with the local wall time, naive; the
    schedule is read in `zone`, so `0 3 * * *` with America/Los_Angeles fires at 03:00 there
    whatever the machine's own zone. It is also the reader `dream status` uses for the next
    run, so the two never disagree (huey's own crontab ANDs day-of-month and day-of-week).
    """

    def __init__(self, expression: str, zone: tzinfo):
        self.schedule = CronSchedule(expression)
        self.zone = zone

    def __call__(self, moment: datetime) -> bool:
        aware = moment.astimezone() if moment.tzinfo is None else moment  # naive = local time
        return self.schedule.matches(aware.astimezone(self.zone))
