"""Overview: the store at a glance, as charts over the last days — memories by type, embedding
coverage, recalls, LLM tokens against the daily budget — and the last and next dream."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import peewee as pw
from starlette.routing import Route

from ...dream.schedule import next_run
from ...errors import UsageError
from ...times import now
from ..charts import Series, bars_by_day, coverage_bar
from ..web import render, store, viewer

NAV = ("Overview", "/")

DAY = 86400
WINDOWS = (7, 30, 90)  # the day ranges offered
DEFAULT_WINDOW = 30


def _window(request) -> int:
    try:
        days = int(request.query_params.get("days", DEFAULT_WINDOW))
    except ValueError:
        days = DEFAULT_WINDOW
    return days if days in WINDOWS else DEFAULT_WINDOW


def _local_offset() -> float:
    # Days are the user's local days, like llm_usage.day. The offset is today's: across a DST
    # change a record within an hour of midnight may land on the neighbouring day.
    return datetime.now().astimezone().utcoffset().total_seconds()


def _days(count: int) -> list[str]:
    today = datetime.now().astimezone().date()
    return [(today - timedelta(days=count - 1 - i)).isoformat() for i in range(count)]


def _per_day(model, time_field, group_field, since: float, offset: float, value=None) -> dict:
    """{(local day 'YYYY-MM-DD', group): value} for rows since `since`, counted or summed in SQL."""
    day_number = ((time_field + offset) / DAY).cast("INTEGER")
    aggregate = pw.fn.COUNT(model._meta.primary_key) if value is None else pw.fn.SUM(value)
    rows = (model.select(day_number.alias("day"), group_field.alias("grp"), aggregate.alias("n"))
            .where(time_field >= since).group_by(day_number, group_field).tuples())
    epoch = date(1970, 1, 1)
    return {((epoch + timedelta(days=int(day))).isoformat(), group): n or 0 for day, group, n in rows}


def _series(cells: dict, days: list[str]) -> list[Series]:
    groups = sorted({group for _, group in cells}, key=lambda g: (g is None, str(g)))
    return [Series(str(group), [cells.get((day, group), 0) for day in days]) for group in groups]


def overview(request):
    current = viewer(request)
    current_store, config = store(request), current.llmem.config
    models = current_store.models
    window = _window(request)
    days = _days(window)
    offset = _local_offset()
    # The first local midnight of the window, in epoch seconds.
    since = datetime.fromisoformat(days[0]).replace(tzinfo=UTC).timestamp() - offset
    Memory, Recall, Usage = models.Memory, models.RecallEvent, models.LlmUsage
    stats = current_store.stats()

    created = _series(_per_day(Memory, Memory.created_at, Memory.type, since, offset), days)
    recalls = _series(_per_day(Recall, Recall.created_at, Recall.origin, since, offset), days)
    usage_rows = (Usage.select(Usage.day, pw.fn.SUM(Usage.prompt_tokens), pw.fn.SUM(Usage.completion_tokens))
                  .where(Usage.day >= days[0]).group_by(Usage.day).tuples())
    prompt, completion = {}, {}
    for day, prompt_tokens, completion_tokens in usage_rows:
        prompt[day], completion[day] = prompt_tokens or 0, completion_tokens or 0
    tokens = [Series("prompt", [prompt.get(d, 0) for d in days]),
              Series("completion", [completion.get(d, 0) for d in days])]
    budget = config.llm.daily_token_budget
    today = days[-1]

    charts = {
        "memories": bars_by_day(days, created, title=f"Memories created per day, by type ({window} days)"),
        "coverage": coverage_bar(stats["embedded"], stats["valid"],
                                 title="Valid memories with a current embedding"),
        "recalls": bars_by_day(days, recalls, title=f"Recalls per day, by origin ({window} days)"),
        "tokens": bars_by_day(days, tokens, title=f"LLM tokens per day ({window} days)",
                              limit=budget or None, limit_name="daily budget"),
    }
    DreamRun = models.DreamRun
    last_dream = (DreamRun.select().where(DreamRun.kind == "dream")
                  .order_by(DreamRun.started_at.desc()).first())
    schedule = config.dream.schedule
    try:
        upcoming = next_run(schedule)
        schedule_problem = None
    except UsageError as exc:  # a bad schedule in config.yaml: say it, keep the page
        upcoming, schedule_problem = None, exc.message
    return render(request, "overview.html", stats=stats, charts=charts, window=window, windows=WINDOWS,
                  totals={"created": sum(sum(s.values) for s in created),
                          "recalls": sum(sum(s.values) for s in recalls),
                          "tokens_today": prompt.get(today, 0) + completion.get(today, 0)},
                  budget=budget, last_dream=last_dream, schedule=schedule,
                  next_dream=upcoming.timestamp() if upcoming else None,
                  schedule_problem=schedule_problem, generated_at=now())


ROUTES = [Route("/", overview)]
