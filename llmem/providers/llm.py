"""Chat LLM clients (httpx): Ollama `/api/chat` and OpenAI-compatible `/v1/chat/completions`.

Every reply must be JSON matching a schema. An invalid reply gets one retry that shows the
model its error; a second failure raises LLMReplyInvalid so the caller can fall back to its
heuristics. The unusable reply is written to the log (truncated), never dropped silently.
Every message is redacted before it is sent, whoever built it.
Every call's tokens go to the LlmUsage table, which the daily token budget is checked against.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from contextlib import contextmanager
from datetime import date
from typing import Any

from ..errors import BudgetExhausted, LLMReplyInvalid, LLMUnavailable, UsageError
from ..redact import Redactor
from .http import HttpProvider, bearer, openai_path

log = logging.getLogger(__name__)

# How much of an unusable reply goes to the log.
RAW_LOG_CHARS = 2000


# ---- a small JSON-schema validator (the subset llmem's own schemas use) -------------------

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "number": (int, float),
    "integer": (int,), "boolean": (bool,), "null": (type(None),),
}


def schema_errors(value: Any, schema: dict, path: str = "$") -> list[str]:
    """What is wrong with `value` under `schema` (type, enum, required, properties, items)."""
    errors: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        kinds = expected if isinstance(expected, list) else [expected]
        ok = False
        for kind in kinds:
            python_types = _TYPES.get(kind, (object,))
            # bool is an int in Python, but not a number or an integer in JSON.
            if isinstance(value, bool) and kind in ("number", "integer"):
                continue
            if kind == "integer" and isinstance(value, float) and value.is_integer():
                ok = True
                break
            if isinstance(value, python_types):
                ok = True
                break
        if not ok:
            return [f"{path}: expected {' or '.join(kinds)}, got {_json_kind(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append(f"{path}: {json.dumps(value)[:60]} is not one of {allowed}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(f"{path}: missing required property {key!r}")
        for key, subschema in schema.get("properties", {}).items():
            if key in value:
                errors.extend(schema_errors(value[key], subschema, f"{path}.{key}"))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], f"{path}[{index}]"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    return errors


def _json_kind(value: Any) -> str:
    for name, python_types in _TYPES.items():
        if not isinstance(value, bool) and isinstance(value, python_types):
            return name
    return "boolean" if isinstance(value, bool) else type(value).__name__


_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def parse_reply(text: str, schema: dict) -> dict:
    """The reply's JSON object, validated; LLMReplyInvalid says what is wrong (shown to the model)."""
    if not isinstance(text, str) or not text.strip():
        raise LLMReplyInvalid("the reply was empty")
    fenced = _FENCE.match(text)
    candidate = fenced.group(1) if fenced else text.strip()
    try:
        value = json.loads(candidate)
    except ValueError:
        # Models sometimes wrap the object in prose; take the outermost {...}.
        start, end = candidate.find("{"), candidate.rfind("}")
        if start < 0 or end <= start:
            raise LLMReplyInvalid("the reply is not JSON") from None
        try:
            value = json.loads(candidate[start:end + 1])
        except ValueError as exc:
            raise LLMReplyInvalid(f"the reply is not valid JSON ({exc})") from None
    errors = schema_errors(value, schema)
    if errors:
        shown = "; ".join(errors[:5]) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise LLMReplyInvalid(f"the reply does not match the schema: {shown}")
    return value


def _truncate(text: str, limit: int = RAW_LOG_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}…[{len(text) - limit} more characters]"


# ---- token accounting ----------------------------------------------------------------------


def today() -> str:
    """The local calendar day the budget counts (YYYY-MM-DD)."""
    return date.today().isoformat()


def tokens_spent(store, day: str | None = None) -> int:
    """Tokens recorded in `store` on `day` (default today) over all tasks."""
    import peewee as pw

    LlmUsage = store.models.LlmUsage
    total = (LlmUsage.select(pw.fn.COALESCE(pw.fn.SUM(LlmUsage.prompt_tokens + LlmUsage.completion_tokens), 0))
             .where(LlmUsage.day == (day or today())).scalar())
    return int(total or 0)


def usage_summary(store, day: str | None = None) -> dict:
    """Tokens today and in total, by task: the `llm` block of `llmem stats`."""
    import peewee as pw

    LlmUsage = store.models.LlmUsage
    day = day or today()
    tokens = LlmUsage.prompt_tokens + LlmUsage.completion_tokens
    by_task: dict[str, dict[str, int]] = {}
    rows = (LlmUsage.select(LlmUsage.task, pw.fn.SUM(tokens), pw.fn.COUNT(LlmUsage.id))
            .group_by(LlmUsage.task).tuples())
    for task, total, calls in rows:
        by_task[task] = {"today": 0, "total": int(total or 0), "calls": int(calls)}
    today_rows = (LlmUsage.select(LlmUsage.task, pw.fn.SUM(tokens)).where(LlmUsage.day == day)
                  .group_by(LlmUsage.task).tuples())
    for task, total in today_rows:
        by_task.setdefault(task, {"today": 0, "total": 0, "calls": 0})["today"] = int(total or 0)
    return {
        "tokens_today": sum(v["today"] for v in by_task.values()),
        "tokens_total": sum(v["total"] for v in by_task.values()),
        "calls": sum(v["calls"] for v in by_task.values()),
        "by_task": dict(sorted(by_task.items())),
    }


# ---- the clients -----------------------------------------------------------------------------


class LLM(HttpProvider):
    """A chat model that answers in schema-checked JSON and records its token use."""

    provider = "none"
    error = LLMUnavailable
    timeout_hint = "is the model loading or too large? raise llm.timeout in config.yaml"

    def __init__(self, model: str, base_url: str, *, timeout: float = 120.0,
                 daily_token_budget: int = 0, db_path=None, store=None,
                 redactor: Redactor | None = None):
        self.model = model
        self.redactor = redactor or Redactor()
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.daily_token_budget = daily_token_budget
        # Usage rows go to `store` (the caller's); an LLM made without one opens the store
        # at `db_path` itself, and without either records nothing.
        self._store = store
        self._db_path = db_path
        self._own_store = None

    # -- transport

    def _post_json(self, path: str, payload: dict, headers: dict | None = None) -> tuple[dict | None, str]:
        """POST and return (parsed JSON body or None, raw body text)."""
        response = self._post(path, payload, headers)
        try:
            return response.json(), response.text
        except ValueError:
            return None, response.text

    def _reach_hint(self) -> str:
        return "is the server running? (llm.base_url in config.yaml, or --base-url)"

    def _request(self, messages: list[dict], schema: dict) -> tuple[str | None, int, int, str]:
        """One call: (reply content or None, prompt tokens, completion tokens, raw body)."""
        raise NotImplementedError

    # -- accounting

    def _usage_store(self):
        # A store's database reconnects by itself (peewee autoconnect), in any thread.
        if self._store is not None:
            return self._store
        if self._own_store is None:
            if self._db_path is None:
                return None
            from ..store import Store

            self._own_store = Store.open(self._db_path)
        return self._own_store

    def check_budget(self) -> None:
        """Raise BudgetExhausted when today's token budget is spent."""
        store = self._usage_store() if self.daily_token_budget > 0 else None
        if store is None:
            return
        spent = tokens_spent(store)
        if spent >= self.daily_token_budget:
            raise BudgetExhausted(
                f"today's LLM token budget is spent ({spent} of {self.daily_token_budget} tokens)",
                hint="the work is deferred until tomorrow; raise llm.daily_token_budget to go on")

    def _record(self, task: str, prompt_tokens: int, completion_tokens: int) -> None:
        store = self._usage_store()
        if store is None:
            log.debug("no store open: %s tokens of task %s not recorded",
                      prompt_tokens + completion_tokens, task)
            return
        stamp = time.time()
        with store.db.atomic():
            store.models.LlmUsage.create(time=stamp, day=today(), task=task, provider=self.provider,
                            model=self.model, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens)

    # -- the one public call

    def chat_json(self, messages: list[dict], schema: dict, task: str) -> dict:
        """Ask for JSON matching `schema`; one retry on invalid output, then LLMReplyInvalid."""
        self.check_budget()
        conversation = list(messages)
        last_error = ""
        for attempt in (1, 2):
            content, prompt_tokens, completion_tokens, raw = self._request(
                self._redacted(conversation), schema)
            self._record(task, prompt_tokens, completion_tokens)
            try:
                if content is None:
                    raise LLMReplyInvalid("the server's answer was not a chat reply")
                return parse_reply(content, schema)
            except LLMReplyInvalid as exc:
                # It may quote the reply; it is logged, raised, and kept in the event row.
                last_error = self.redactor.text(str(exc)) or ""
                # Redacted before it is cut (a cut secret no longer matches) and logged: the
                # model may echo or invent one, and `llmem logs` and the viewer show the log.
                shown = self.redactor.text(content if content is not None else raw) or ""
                log.warning("%s %s gave an unusable reply for %s (attempt %d): %s; raw reply: %s",
                            self.provider, self.model, task, attempt, last_error, _truncate(shown))
            if attempt == 1:
                conversation = [*messages,
                                {"role": "assistant",
                                 "content": _truncate(self.redactor.text(content or raw) or "", 4000)},
                                {"role": "user", "content":
                                 f"That reply cannot be used: {last_error}. Answer again with only "
                                 f"a JSON object matching this schema:\n{json.dumps(schema)}"}]
                self.check_budget()
        raise LLMReplyInvalid(f"{self.provider} {self.model} gave no usable reply for {task}: {last_error}")

    def _redacted(self, messages: list[dict]) -> list[dict]:
        return [{**message, "content": self.redactor.text(message.get("content"))}
                if isinstance(message.get("content"), str) else message for message in messages]

    def close(self) -> None:
        super().close()
        if self._own_store is not None:
            self._own_store.close()
            self._own_store = None


class OllamaLLM(LLM):
    """Ollama's /api/chat with the JSON schema as `format` (structured outputs)."""

    provider = "ollama"

    def _reach_hint(self):
        return "is `ollama serve` running? (llm.base_url in config.yaml, or --base-url)"

    def _status_hint(self, status):
        if status == 404:
            return f"pull the model: `ollama pull {self.model}` (or pick another with --model)"
        return None

    def _request(self, messages, schema):
        payload = {"model": self.model, "messages": messages, "stream": False, "format": schema,
                   "options": {"temperature": 0}}
        body, raw = self._post_json("/api/chat", payload)
        if not isinstance(body, dict):
            return None, 0, 0, raw
        message = body.get("message") if isinstance(body.get("message"), dict) else {}
        content = message.get("content")
        return (content if isinstance(content, str) else None,
                _count(body.get("prompt_eval_count")), _count(body.get("eval_count")), raw)


class OpenAILLM(LLM):
    """Any OpenAI-compatible /v1/chat/completions endpoint, in JSON mode."""

    provider = "openai"

    def __init__(self, *args, api_key_env: str = "OPENAI_API_KEY", **kw):
        super().__init__(*args, **kw)
        self.api_key = os.environ.get(api_key_env, "")
        self.api_key_env = api_key_env

    def _status_hint(self, status):
        if status in (401, 403):
            return f"check the API key in ${self.api_key_env} (llm.api_key_env)"
        if status == 404:
            return "check llm.model and llm.base_url (…/v1)"
        return None

    def _request(self, messages, schema):
        # JSON mode does not carry the schema: the system message does.
        guide = {"role": "system", "content": "Answer with a single JSON object matching this "
                 f"JSON schema, and nothing else:\n{json.dumps(schema)}"}
        payload = {"model": self.model, "messages": [guide, *messages], "temperature": 0,
                   "response_format": {"type": "json_object"}}
        body, raw = self._post_json(openai_path(self.base_url, "chat/completions"), payload, bearer(self.api_key))
        if not isinstance(body, dict):
            return None, 0, 0, raw
        content = None
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message") or {}
            content = message.get("content") if isinstance(message, dict) else None
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        return (content if isinstance(content, str) else None,
                _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")), raw)


class AgentLLM(LLM):
    """llm.provider: agent — an agent CLI's non-interactive mode answers (providers/agent_cli.py
    says how each is called and read); its calls are redacted, retried and metered like any."""

    provider = "agent"

    def __init__(self, call, **kw):
        super().__init__(call.label, "", **kw)
        self.call = call

    def _request(self, messages, schema):
        return self.call.ask(messages, schema, timeout=self.timeout, redactor=self.redactor)


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def make_llm(config, *, model: str | None = None, base_url: str | None = None,
             store=None) -> LLM | None:
    """The chat LLM of the `llm:` config section (None when llm.provider is none); its token
    use is recorded in `store`, or in the store at config.store_location opened on first use."""
    section = config.llm
    provider = section.provider
    if provider == "none":
        return None
    common = dict(timeout=section.timeout, daily_token_budget=section.daily_token_budget,
                  db_path=config.store_location, store=store,
                  redactor=Redactor.from_section(config.redaction))
    if provider == "ollama":
        return OllamaLLM(model or section.model, base_url or section.base_url, **common)
    if provider == "openai":
        return OpenAILLM(model or section.model, base_url or section.base_url,
                         api_key_env=section.api_key_env, **common)
    if provider == "agent":
        from .agent_cli import agent_call

        return AgentLLM(agent_call(section, model), **common)
    raise UsageError(f"unknown llm provider {provider!r}", hint="use ollama, openai, agent or none")


@contextmanager
def step_llm(app, llm, use_llm: bool):
    """The LLM a step uses: the caller's (left open), one made from config (closed after),
    or None when the step must not use one."""
    if not use_llm:
        yield None
    elif llm is not None:
        yield llm
    else:
        made = make_llm(app.config, store=app.store)
        try:
            yield made
        finally:
            if made is not None:
                made.close()
