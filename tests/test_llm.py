"""The chat LLM client against a fake Ollama/OpenAI server on 127.0.0.1."""

from __future__ import annotations

import json
import time

import pytest
from conftest import free_port_url

from llmem.app import App
from llmem.errors import BudgetExhausted, LLMReplyInvalid, LLMUnavailable
from llmem.providers.llm import (
    OllamaLLM,
    make_llm,
    parse_reply,
    schema_errors,
    today,
    usage_summary,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {
            "type": "object",
            "properties": {"kind": {"type": "string", "enum": ["a", "b"]},
                           "count": {"type": "integer"}, "score": {"type": "number"},
                           "ok": {"type": "boolean"}},
            "required": ["kind"]}},
    },
    "required": ["items"],
}


@pytest.fixture
def app(ollama_config):
    application = App()
    yield application
    application.close()


def chats(server, path="/api/chat"):
    return [body for p, body in server.requests if p == path]


def test_schema_validator_subset():
    assert schema_errors({"items": [{"kind": "a", "count": 2, "score": 0.5, "ok": True}]}, SCHEMA) == []
    assert schema_errors({"items": [{"kind": "c"}]}, SCHEMA) == ['$.items[0].kind: "c" is not one of "a", "b"']
    assert schema_errors({}, SCHEMA) == ["$: missing required property 'items'"]
    assert schema_errors({"items": [{"kind": "a", "count": True}]}, SCHEMA) == [
        "$.items[0].count: expected integer, got boolean"]
    assert schema_errors({"items": [{"kind": "a", "count": 2.0, "score": 3}]}, SCHEMA) == []
    assert schema_errors({"items": "x"}, SCHEMA) == ["$.items: expected array, got string"]
    assert schema_errors({"n": 0}, {"properties": {"n": {"type": "integer", "minimum": 1}}}) == [
        "$.n: 0 is below the minimum 1"]


def test_parse_reply_accepts_fences_and_surrounding_prose():
    assert parse_reply('```json\n{"items": []}\n```', SCHEMA) == {"items": []}
    assert parse_reply('Here you go: {"items": []} hope it helps', SCHEMA) == {"items": []}
    with pytest.raises(LLMReplyInvalid, match="not JSON"):
        parse_reply("no braces here", SCHEMA)
    with pytest.raises(LLMReplyInvalid, match="empty"):
        parse_reply("  ", SCHEMA)


def test_ollama_chat_sends_the_schema_as_format_and_records_tokens(app, ollama_config):
    ollama_config.chat_replies = ['{"items": [{"kind": "a"}]}']
    llm = make_llm(app.config)
    try:
        assert llm.chat_json([{"role": "user", "content": "hi"}], SCHEMA, task="extract") == {
            "items": [{"kind": "a"}]}
    finally:
        llm.close()
    (body,) = chats(ollama_config)
    assert body["format"] == SCHEMA and body["stream"] is False and body["model"] == "llama3.1:8b"
    LlmUsage = app.store.models.LlmUsage
    (row,) = LlmUsage.select()
    assert (row.task, row.provider, row.model, row.prompt_tokens, row.completion_tokens, row.day) == (
        "extract", "ollama", "llama3.1:8b", 10, 5, today())


def test_openai_compatible_provider(configure, model_server, monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "not-a-real-key")
    configure(f"embedding:\n  provider: none\nllm:\n  provider: openai\n  model: gpt-x\n"
              f"  base_url: {model_server.url}/v1\n  api_key_env: TEST_LLM_KEY\n")
    application = App()
    model_server.chat_replies = ['{"items": []}']
    llm = make_llm(application.config)
    try:
        assert llm.chat_json([{"role": "user", "content": "hi"}], SCHEMA, task="merge") == {"items": []}
        (body,) = chats(model_server, "/v1/chat/completions")
        assert body["response_format"] == {"type": "json_object"}
        assert json.dumps(SCHEMA) in body["messages"][0]["content"]
        assert usage_summary(application.store)["by_task"]["merge"] == {"today": 15, "total": 15, "calls": 1}
    finally:
        llm.close()
        application.close()


def test_invalid_reply_is_retried_once_with_the_error_shown(app, ollama_config, caplog):
    ollama_config.chat_replies = ['{"items": [{"kind": "zzz"}]}', '{"items": [{"kind": "b"}]}']
    llm = make_llm(app.config)
    with caplog.at_level("WARNING", logger="llmem"):
        result = llm.chat_json([{"role": "user", "content": "hi"}], SCHEMA, task="extract")
    llm.close()
    assert result == {"items": [{"kind": "b"}]}
    first, second = chats(ollama_config)
    assert len(second["messages"]) == 3
    assert second["messages"][1] == {"role": "assistant", "content": '{"items": [{"kind": "zzz"}]}'}
    assert '"zzz" is not one of "a", "b"' in second["messages"][2]["content"]
    assert 'raw reply: {"items": [{"kind": "zzz"}]}' in caplog.text
    LlmUsage = app.store.models.LlmUsage
    assert LlmUsage.select().count() == 2


def test_garbage_twice_raises_llm_reply_invalid_and_logs_the_raw_reply(app, ollama_config, caplog):
    ollama_config.chat_replies = ["I think the answer is 42" + "!" * 5000, "still not json"]
    llm = make_llm(app.config)
    with caplog.at_level("WARNING", logger="llmem"), pytest.raises(LLMReplyInvalid, match="no usable reply"):
        llm.chat_json([{"role": "user", "content": "hi"}], SCHEMA, task="extract")
    llm.close()
    assert "I think the answer is 42" in caplog.text and "still not json" in caplog.text
    assert "more characters]" in caplog.text  # long raw replies are truncated in the log
    assert len(chats(ollama_config)) == 2


def test_a_body_that_is_not_json_is_unusable_too(app, ollama_config, caplog):
    ollama_config.mode = "garbage"
    llm = make_llm(app.config)
    with caplog.at_level("WARNING", logger="llmem"), pytest.raises(LLMReplyInvalid):
        llm.chat_json([{"role": "user", "content": "hi"}], SCHEMA, task="extract")
    llm.close()
    assert "<html>not json" in caplog.text


def test_http_error_and_unreachable_server_raise_llm_unavailable(app, ollama_config):
    ollama_config.mode = "error"
    llm = make_llm(app.config)
    with pytest.raises(LLMUnavailable, match="answered 500"):
        llm.chat_json([{"role": "user", "content": "hi"}], SCHEMA, task="extract")
    llm.close()
    down = make_llm(app.config, base_url=free_port_url(), model="other:1b")
    with pytest.raises(LLMUnavailable) as caught:
        down.chat_json([{"role": "user", "content": "hi"}], SCHEMA, task="extract")
    down.close()
    assert "ollama serve" in caught.value.hint and down.model == "other:1b"


def test_timeout_raises_llm_unavailable(app, ollama_config):
    ollama_config.mode, ollama_config.delay = "slow", 1.0
    llm = OllamaLLM("llama3.1:8b", ollama_config.url, timeout=0.2)
    started = time.perf_counter()
    with pytest.raises(LLMUnavailable, match="did not answer within 0.2 s") as caught:
        llm.chat_json([{"role": "user", "content": "hi"}], SCHEMA, task="extract")
    llm.close()
    assert time.perf_counter() - started < 0.9
    assert "llm.timeout" in caught.value.hint


def test_daily_budget_is_enforced_per_local_day(app, ollama_config):
    llm = OllamaLLM("llama3.1:8b", ollama_config.url, daily_token_budget=20, store=app.store)
    ollama_config.chat_replies = ['{"items": []}', '{"items": []}', '{"items": []}']
    llm.chat_json([], SCHEMA, task="extract")  # 15 tokens
    llm.chat_json([], SCHEMA, task="extract")  # 30: now over
    with pytest.raises(BudgetExhausted, match="30 of 20"):
        llm.chat_json([], SCHEMA, task="extract")
    assert len(chats(ollama_config)) == 2
    # Yesterday's tokens do not count today.
    LlmUsage = app.store.models.LlmUsage
    LlmUsage.update(day="2000-01-01").execute()
    llm.chat_json([], SCHEMA, task="extract")
    llm.close()


def test_provider_none_gives_no_llm(fts_config):
    application = App()
    assert make_llm(application.config) is None


def test_stats_shows_llm_tokens_by_task(app, ollama_config, cli):
    ollama_config.chat_replies = ['{"items": []}']
    llm = make_llm(app.config)
    llm.chat_json([], SCHEMA, task="introspect")
    llm.close()
    app.close()
    code, out, _ = cli("stats", "--json")
    assert code == 0
    data = json.loads(out)["llm"]
    assert data["tokens_today"] == 15 and data["by_task"]["introspect"]["total"] == 15
    code, out, _ = cli("stats")
    assert "llm:       15 tokens today, 15 in total (1 calls)" in out
