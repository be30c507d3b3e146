"""Session events: the one entry point agent hooks and the pipeline worker call.

created → the context block; idle → extract + introspect the new part of the transcript;
ending → extract whatever is past the cursor (a session often ends right after its last turn,
before any idle was seen), then introspect; compacting → extract what is about to be
compacted, then the compaction context block. Hooks call with fail_open=True; the worker
lets errors raise so the queue can retry.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from ..adapters.base import NoTranscript, validate_session_id
from ..errors import LlmemError, UsageError, store_failure
from ..text import error_line
from .kinds import EventKind

log = logging.getLogger(__name__)

# What each event does, in order.
STEPS = {
    EventKind.CREATED: ("context",),
    EventKind.IDLE: ("extract", "introspect"),
    EventKind.ENDING: ("extract", "introspect"),
    EventKind.COMPACTING: ("extract", "context"),
}


@dataclass
class EventResult:
    """What a session event did: each step's outcome and time, the failures a hook collected,
    the context block (created, compacting), and when to come back if the daily token budget
    deferred its LLM work."""

    kind: str
    session_id: str
    steps: dict[str, dict] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    deferred_until: float | None = None
    deferred_reason: str | None = None
    context: str | None = None

    def as_json(self, *, with_context: bool = True) -> dict[str, Any]:
        """The JSON that `hook --json` prints and, without the context block, the event row
        keeps: only the keys that hold something, in the order they always had."""
        data: dict[str, Any] = {"kind": self.kind, "session_id": self.session_id,
                                "steps": self.steps, "errors": self.errors}
        if self.deferred_until is not None:
            data["deferred_until"] = self.deferred_until
            data["deferred_reason"] = self.deferred_reason
        if with_context and self.context is not None:
            data["context"] = self.context
        return data


def step_function(step: str):
    """extract_session or introspect_session, imported when an event needs it (not at hook start)."""
    if step == "extract":
        from ..capture.extract import extract_session

        return extract_session
    from ..capture.introspect import introspect_session

    return introspect_session


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if hasattr(value, "_meta") and hasattr(value, "id"):  # a peewee row, e.g. a stored Memory
        return {"id": value.id, "type": getattr(value, "type", None)}
    if is_dataclass(value) and not isinstance(value, type):
        return _jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    for attr in ("as_dict", "to_dict"):
        method = getattr(value, attr, None)
        if callable(method):
            return _jsonable(method())
    return str(value)


def next_local_midnight(at: float | None = None) -> float:
    """When the daily token budget (counted per local calendar day) starts afresh."""
    from datetime import datetime, timedelta

    moment = datetime.fromtimestamp(time.time() if at is None else at)
    midnight = (moment + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight.timestamp()


class _EventLLM:
    """The event's LLM, with the hook's --model/--base-url (None: heuristics only), made on
    first use (created never needs one) and closed at the end."""

    def __init__(self, app, model: str | None, base_url: str | None):
        self.app, self.model, self.base_url = app, model, base_url
        self.made, self.value = False, None

    def get(self):
        if not self.made:
            from ..providers.llm import make_llm

            self.made = True
            self.value = make_llm(self.app.config, model=self.model, base_url=self.base_url,
                                  store=self.app.store)
        return self.value

    def close(self) -> None:
        close = getattr(self.value, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # closing an HTTP client must not turn a done event into a failure
                log.debug("closing the LLM client failed", exc_info=True)


def handle_session_event(app, kind: str, session_id: str, *, adapter_name: str | None = None,
                         model: str | None = None, base_url: str | None = None,
                         project: str | None = None, fail_open: bool = False,
                         with_context: bool = True) -> EventResult:
    """Do what a session event asks; return what happened (the context block for created and
    compacting).

    An unknown kind or an invalid session id always raises. A failing extraction or
    introspection raises too (the worker retries the event; every step is idempotent),
    unless `fail_open` (hooks): then the failure is logged and listed under "errors", and
    the remaining steps still run, so a compaction keeps its context block. The context
    step never fails the event; without `with_context` it is skipped (the worker: nobody reads
    its block, and building one would record recalls for nobody). When extraction was deferred by the daily token budget,
    `deferred_until` says when to try again.
    """
    if kind not in tuple(EventKind):
        raise UsageError(f"unknown session event {kind!r}", hint="use one of: " + ", ".join(EventKind))
    validate_session_id(session_id)
    result = EventResult(kind, session_id)
    llm = _EventLLM(app, model, base_url)
    try:
        for step in STEPS[kind]:
            if step == "context" and not with_context:
                continue
            started = time.perf_counter()
            try:
                if step == "context":
                    from ..context import build_context

                    result.context = build_context(app, session_id, project=project,
                                                   compacting=kind == "compacting",
                                                   adapter_name=adapter_name)
                    outcome: Any = "done"
                else:
                    function = step_function(step)
                    outcome = _jsonable(function(app, session_id, adapter_name=adapter_name,
                                                 llm=llm.get()))
            except NoTranscript:
                # session.adapter is none: nothing to read is the expected answer, not a failure.
                outcome = "no_transcript"
            except Exception as exc:
                if step != "context" and not fail_open:
                    raise
                # SQLite's words for a full disk or a damaged store, said in the user's terms.
                exc = store_failure(exc, app.config.db_path) or exc
                log.warning("%s %s: %s failed: %s", kind, session_id, step, error_line(exc),
                            exc_info=not isinstance(exc, LlmemError))
                result.errors.append(f"{step}: {error_line(exc)}")
                outcome = "failed"
            result.steps[step] = {"result": outcome, "seconds": round(time.perf_counter() - started, 4)}
            if isinstance(outcome, dict) and outcome.get("deferred"):
                result.deferred_until = next_local_midnight()
                result.deferred_reason = outcome.get("llm_error") or "llm.daily_token_budget is spent"
    finally:
        llm.close()
    return result

