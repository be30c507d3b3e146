"""Planted secrets never reach the store, the embedder or the LLM, on every write path."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from session_writers import copilot_session, recorded_opencode_store
from test_extract import PROJECT
from test_redact import PLANTED

from llmem.app import App
from llmem.capture.extract import extract_session, extract_text
from llmem.capture.introspect import (
    introspect_manual,
    introspect_session,
    introspect_text,
    learn,
    track_review,
)

CUSTOM_SECRET = "ACME-INTERNAL-48151623"


def planted_texts() -> list[tuple[str, str]]:
    """(text to plant, secret) for every planted kind, plus one custom-pattern secret."""
    texts = [((template or "token in text: {s} (end)").format(s=secret), secret)
             for _, template, secret in PLANTED]
    return [*texts, (f"the ticket system id is {CUSTOM_SECRET}", CUSTOM_SECRET)]


def test_at_least_twenty_kinds_are_planted():
    assert len({kind for kind, _, _ in PLANTED}) >= 20


def test_no_planted_secret_reaches_the_store_or_any_request(configure, tmp_path, model_server):
    state_dir = tmp_path / "session-state"
    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"llm:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
              f"redaction:\n  patterns: ['ACME-INTERNAL-[0-9]{{8}}']\n")
    planted = planted_texts()
    secrets = [secret for _, secret in planted]

    # Session A goes through the LLM; B gets garbage twice, so the heuristics handle it.
    for session_id in ("ses-secrets-a", "ses-secrets-b"):
        session = copilot_session(state_dir, session_id, cwd=PROJECT)
        for number, (text, _) in enumerate(planted):
            session.user(f"Remember that {text}")  # a statement the heuristics keep
            session.assistant(f"Using it: {text}", [{
                "name": "bash", "arguments": {"command": f"deploy --note '{text}'"},
                "output": f"Traceback (most recent call last):\nValueError: bad value {text}",
                "success": number % 2 == 0}])
        session.assistant("Editing.", [{"name": "edit", "arguments": {"path": "x.py"}, "output": "ok"}])
        session.assistant("", [{"name": "bash", "arguments": {"command": "pytest"},
                                "output": f"1 failed: AssertionError {planted[0][0]}"}])

    # A model that echoes secrets back (it never saw them, but may invent secret-shaped text;
    # a bare value with nothing around it, such as a 40-character AWS secret, cannot be told
    # from any other string, so the echo carries its context like a real leak would).
    echo = " ; ".join(text for text, _ in planted[:5])
    llm_memories = json.dumps({"memories": [
        {"type": "fact", "content": f"Deployment uses these values: {text}", "summary": text}
        for text, _ in planted[:8]] + [{"type": "fact", "content": f"Echo {echo}"}]})
    model_server.chat_replies = [llm_memories] * 30

    app = App()
    try:
        report_a = extract_session(app, "ses-secrets-a")
        model_server.chat_replies = ["not json", "still not json"] * 30
        report_b = extract_session(app, "ses-secrets-b")
        introspect_session(app, "ses-secrets-a")
        model_server.chat_replies = [json.dumps({"assessments": [{
            "category": "AUTH_BYPASS", "what_happened": f"leaked {planted[1][0]}",
            "proposed_update": f"rotate {planted[2][0]}"}]})]
        introspect_text(app, f"I made a mistake and pasted {planted[3][0]}")
        extract_text(app, "Remember: " + " and ".join(text for text, _ in planted[:10]))
        introspect_manual(app, "AUTH_BYPASS", f"committed {planted[4][0]}", context=planted[5][0],
                          proposed_fix=f"never paste {planted[6][0]}")
        learn(app, f"used {planted[7][0]}", f"read it from the vault, not {planted[8][0]}",
              context=planted[9][0])
        track_review(app, single={"category": "AUTH_BYPASS", "context": planted[10][0],
                                  "what_happened": f"hardcoded {planted[11][0]}"})
        stored = app.store.list(limit=None, include_invalid=True)
    finally:
        app.close()

    assert report_a.used_llm and report_a.memories_added > 0 and report_a.redactions >= len(planted)
    assert not report_b.used_llm and report_b.memories_added > 0
    assert len(stored) > 20
    assert any("[REDACTED:" in m.content for m in stored)
    assert {p for p, _ in model_server.requests} >= {"/api/chat", "/api/embed"}

    home = Path(app.config.db_path).parent
    store_bytes = b"".join(p.read_bytes() for p in home.glob("memory.db*"))
    requests = json.dumps([body for _, body in model_server.requests], ensure_ascii=False)
    leaks_store = [s for s in secrets if s.encode() in store_bytes]
    leaks_requests = [s for s in secrets if s in requests]
    assert leaks_store == [] and leaks_requests == []


@pytest.mark.parametrize("enabled", [False])
def test_redaction_can_be_turned_off(configure, enabled):
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\nredaction:\n  enabled: {str(enabled).lower()}\n")
    app = App()
    try:
        report = extract_text(app, "Remember that the staging password: hunter2!x is shared.")
        (memory,) = app.store.list()
    finally:
        app.close()
    assert report.redactions == 0 and "hunter2!x" in memory.content


def test_batched_redaction_matches_text_by_text(fts_config):
    from llmem.adapters import ToolCall, TranscriptMessage
    from llmem.capture.extract import redact_messages
    from llmem.redact import redact

    app = App()
    texts = [text for text, _ in planted_texts()[:-1]]
    messages = [TranscriptMessage(id=f"m{i}", index=i, role="user", text=text,
                                  tool_calls=(ToolCall("bash", {"cmd": text, "n": 3}, text),))
                for i, text in enumerate(texts)]
    redacted, tally = redact_messages(app.config, messages)
    for original, message in zip(texts, redacted, strict=True):
        assert message.text == redact(original).text
        assert message.tool_calls[0].output == redact(original).text
        assert json.loads(message.tool_calls[0].input) == {"cmd": redact(original).text, "n": 3}
    assert sum(tally.values()) == 3 * len(texts)

    # An unclosed <private> block swallows the separator: the batch falls back, and the
    # next message is still there, redacted on its own.
    unclosed = [TranscriptMessage(id="a", index=0, role="user", text="keep <private>secret stuff"),
                TranscriptMessage(id="b", index=1, role="user", text="the next message")]
    first, second = redact_messages(app.config, unclosed)[0]
    assert first.text == "keep [REDACTED:private]" and second.text == "the next message"
    app.close()


# ---- every text that leaves llmem, and every other write path (issue 14.3) -----------------

def _leaks(secrets: list[str], haystack: str) -> list[str]:
    return [secret for secret in secrets if secret in haystack]


def _planted_turns() -> tuple[str, str, list[str]]:
    """A session title holding a token, one user turn holding every other planted secret."""
    planted = planted_texts()
    title_token = planted[6][1]  # a GitHub token
    title = f"Deploy with {title_token} tonight"
    turn = "Please help. " + " ; ".join(text for text, _ in planted)
    return title, turn, [secret for _, secret in planted]


def test_session_title_and_turns_never_reach_the_embedder(cli, configure, tmp_path, model_server):
    """`context`, the created hook and the compacting hook build a search query from the session
    (its title and recent user turns): the query is embedded, redacted."""
    import yaml
    from test_adapters_opencode import MAIN

    title, turn, secrets = _planted_turns()
    state_dir = tmp_path / "session-state"
    copilot = copilot_session(state_dir, "ses-title-token", cwd=PROJECT)
    (copilot.folder / "workspace.yaml").write_text(yaml.safe_dump(
        {"id": copilot.id, "cwd": "/home/dev/acme", "git_root": "/home/dev/acme", "name": title}))
    copilot.user(turn)
    opencode_dir = tmp_path / "opencode"
    connection = sqlite3.connect(recorded_opencode_store(opencode_dir, journal_mode="WAL"))
    connection.execute("UPDATE session SET title = ? WHERE id = ?", (title, MAIN))
    connection.commit()
    connection.close()
    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"llm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
              f"  opencode:\n    data_dir: {opencode_dir}\n"
              f"redaction:\n  patterns: ['ACME-INTERNAL-[0-9]{{8}}']\n"
              # Embedded in the hook's own process too (by default only a resident embeds).
              f"context:\n  embed_without_resident: true\n")
    # A stored vector: from now on the session's query is embedded, not only matched by words.
    assert cli("add", "--content", "Deploys go out on Tuesdays")[0] == 0

    runs = [("context", "--session-id", copilot.id),
            ("context", "--session-id", copilot.id, "--compacting"),
            ("hook", "--type", "created", "--session-id", copilot.id),
            ("hook", "--type", "compacting", "--session-id", copilot.id, "--sync"),
            ("context", "--session-id", MAIN, "--adapter", "opencode")]
    for args in runs:
        before = len(model_server.embed_requests())
        code, _, err = cli(*args)
        assert code == 0, err
        assert len(model_server.embed_requests()) > before, f"{args} embedded no query"
    sent = json.dumps(model_server.embed_requests(), ensure_ascii=False)
    assert "[REDACTED:github_token]" in sent
    assert _leaks(secrets, sent) == []


def test_the_clients_redact_whatever_they_send(configure, model_server):
    """The embedder and the LLM redact at the one place they send from, whoever calls them."""
    from llmem.config import load_config
    from llmem.providers import make_embedder
    from llmem.providers.llm import make_llm

    _, turn, secrets = _planted_turns()
    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"llm:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"redaction:\n  patterns: ['ACME-INTERNAL-[0-9]{{8}}']\n")
    config = load_config()
    embedder = make_embedder(config)
    llm = make_llm(config)
    try:
        embedder.embed_query(turn)
        embedder.embed_documents([turn, "nothing secret here"])
        model_server.chat_replies = ['{"ok": true}']
        llm.chat_json([{"role": "system", "content": "Answer in JSON."},
                       {"role": "user", "content": turn}],
                      {"type": "object"}, task="test")
    finally:
        embedder.close()
        llm.close()
    paths = {path for path, _ in model_server.requests}
    assert {"/api/embed", "/api/chat"} <= paths
    sent = json.dumps([body for _, body in model_server.requests], ensure_ascii=False)
    assert _leaks(secrets, sent) == []
    assert "nothing secret here" in sent


def test_add_update_and_import_store_no_secret(cli, configure, tmp_path, llmem_home):
    _, turn, secrets = _planted_turns()
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              "redaction:\n  patterns: ['ACME-INTERNAL-[0-9]{8}']\n")
    code, out, err = cli("add", "--content", turn, "--summary", turn,
                         "--metadata", json.dumps({"note": turn, "password": "hunter2-x9!"}), "--json")
    assert code == 0, err
    added = json.loads(out)
    code, out, err = cli("add", "--content", "a plain memory to update", "--json")
    plain = json.loads(out)
    assert cli("update", plain["id"], "--content", f"now {turn}", "--summary", turn,
               "--metadata", json.dumps({"token": "tok-" + secrets[0]}))[0] == 0
    assert cli("invalidate", plain["id"], "--reason", f"leaked {turn}")[0] == 0
    document = {"version": 1, "memories": [{
        "id": "00000000-0000-4000-8000-00000000abcd", "type": "fact", "content": f"imported {turn}",
        "summary": turn, "metadata": {"api_key": secrets[1], "nested": [turn]}}], "relations": []}
    export = tmp_path / "import.json"
    export.write_text(json.dumps(document))
    code, _, err = cli("import", str(export))
    assert code == 0, err

    store_bytes = b"".join(p.read_bytes() for p in llmem_home.glob("memory.db*")).decode(
        "utf-8", errors="replace")
    assert _leaks([*secrets, "hunter2-x9!"], store_bytes) == []
    assert "[REDACTED:" in added["content"] and added["metadata"]["password"] == "[REDACTED:password]"


def test_a_merged_text_written_by_dream_is_redacted(configure):
    """Dream writes LLM merges through Store.write_fields: the model may invent a token."""
    from llmem.dream.journal import row_snapshot

    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              "redaction:\n  patterns: ['ACME-INTERNAL-[0-9]{8}']\n")
    _, turn, secrets = _planted_turns()
    app = App()
    try:
        memory = app.store.add("deploys run on tuesdays").memory
        with app.store.db.atomic():
            app.store.write_fields(memory.id, {"content": f"merged: {turn}", "summary": turn},
                                   current=row_snapshot(memory.id, app.store.db))
        stored = app.store.get(memory.id)
    finally:
        app.close()
    assert _leaks(secrets, stored.content + stored.summary) == []
    assert stored.content.startswith("merged: Please help.")
