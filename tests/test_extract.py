"""Extraction on real SQLite stores, Copilot/OpenCode transcripts and a fake Ollama on loopback."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from fakes import StubLLM
from session_writers import copilot_session, recorded_opencode_store

from llmem.app import App
from llmem.capture.extract import (
    SliceLine,
    chunk_lines,
    extract_session,
    extract_text,
)
from llmem.capture.markers import estimate_tokens, strip_context_blocks
from llmem.providers.llm import today

FIXTURES = Path(__file__).parent / "fixtures"
DONE = "7d3c2b1a-5e4f-4a8b-9c0d-1e2f3a4b5c6d"
PROJECT = "/home/dev/shop"
TYPED_ONLY = "capture:\n  episodes: false\n"


# ---- building transcripts ---------------------------------------------------------------------


def session_config(configure, state_dir: Path, *, server=None, llm: bool = True,
                   extra: str = "") -> None:
    embedding = (f"embedding:\n  provider: ollama\n  base_url: {server.url}\n" if server
                 else "embedding:\n  provider: none\n")
    if server and llm:
        chat = f"llm:\n  provider: ollama\n  base_url: {server.url}\n  timeout: 5\n"
    else:
        chat = "llm:\n  provider: none\n"
    # These tests are about the typed memories; tests/test_episodes.py covers the episodes.
    configure(embedding + chat + f"session:\n  adapter: copilot\n  copilot:\n"
              f"    state_dir: {state_dir}\n    share_dir: {state_dir}\n" + TYPED_ONLY + extra)


@pytest.fixture
def state_dir(tmp_path) -> Path:
    path = tmp_path / "session-state"
    path.mkdir()
    return path


@pytest.fixture
def app():
    application = App()
    yield application
    application.close()


def chat_requests(server) -> list[dict]:
    return [body for path, body in server.requests if path == "/api/chat"]


def reply(*memories: dict) -> str:
    return json.dumps({"memories": list(memories)})


# ---- pure helpers ---------------------------------------------------------------------------------


def test_context_blocks_are_stripped_even_unclosed():
    text = "keep <llmem-context>\n- [abcd] old memory\n</llmem-context> this <LLMEM-CONTEXT>tail"
    assert strip_context_blocks(text) == "keep  this "


def test_chunks_respect_the_token_budget_and_cut_huge_lines():
    lines = [SliceLine(f"m{i}", "user", "x" * 400, "x" * 400) for i in range(30)]
    lines.append(SliceLine("huge", "user", "y" * 5000, "y" * 5000))
    chunks = chunk_lines(lines, budget_tokens=500)
    assert len(chunks) > 5
    for chunk in chunks:
        assert sum(estimate_tokens(line.rendered) + 1 for line in chunk) <= 500
    assert sum(len(line.rendered) for chunk in chunks for line in chunk) == 30 * 400 + 5000


# ---- heuristics (llm.provider: none) ------------------------------------------------------------


def test_heuristics_capture_explicit_statements_without_an_llm(configure, state_dir, app):
    session = copilot_session(state_dir, "ses-heur", cwd=PROJECT)
    session.user("Remember that the staging database listens on port 5433.")
    session.assistant("Noted.")
    session.user("I prefer small commits with imperative subjects. Can you fix the flaky test?")
    session.user("We decided to use PostgreSQL 16 for the orders service.")
    session.user("Always run ruff before committing.\nNever push directly to main.")
    session.user("No, use pnpm instead of npm.")
    session.user("That's wrong, the API returns a list of orders.")
    session.user("That's wrong, try again.")  # states nothing to keep
    session.user("```\nremember this is code, not a statement\n```")
    session_config(configure, state_dir)

    report = extract_session(app, "ses-heur")

    assert not report.used_llm and not report.deferred
    stored = {m.content: m for m in app.store.list(limit=None)}
    expected = {
        "The staging database listens on port 5433.": ("fact", 0.95),
        "The user prefers small commits with imperative subjects.": ("preference", 0.9),
        "We decided to use PostgreSQL 16 for the orders service.": ("decision", 0.9),
        "Always run ruff before committing.": ("procedure", 0.9),
        "Never push directly to main.": ("procedure", 0.9),
        "Do: Use pnpm\nInstead of: npm": ("procedure", 0.9),  # a wrong → right pair, as `learn` has it
        "Correction from the user: The API returns a list of orders.": ("fact", 0.9),
    }
    assert set(stored) == set(expected)
    for content, (memory_type, confidence) in expected.items():
        memory = stored[content]
        assert (memory.type, memory.confidence) == (memory_type, confidence)
        assert memory.source == "extraction"
        assert memory.project == PROJECT
        assert memory.session_id == "ses-heur"
    assert stored["Do: Use pnpm\nInstead of: npm"].metadata["wrong"] == "npm"
    assert stored["Do: Use pnpm\nInstead of: npm"].metadata["right"] == "Use pnpm"
    assert report.memories_added == 7
    assert report.pending_embedding == 7  # no embedder: stored, waiting for `embed --pending`


def test_same_slice_twice_adds_nothing_and_new_messages_are_read_once(configure, state_dir, app):
    session = copilot_session(state_dir, "ses-idem", cwd=PROJECT)
    session.user("Remember that builds run on Python 3.12.")
    session_config(configure, state_dir)

    first = extract_session(app, "ses-idem")
    second = extract_session(app, "ses-idem")
    assert first.memories_added == 1 and first.messages_read == 1
    assert second.messages_read == 0 and second.memories_added == 0
    assert second.cursor == first.cursor

    session.user("Never commit generated files.")
    third = extract_session(app, "ses-idem")
    assert third.messages_read == 1 and third.memories_added == 1

    # A lost cursor re-reads everything; exact duplicates are dropped, nothing is added.
    Memory, SessionCursor = app.store.models.Memory, app.store.models.SessionCursor
    SessionCursor.delete().execute()
    again = extract_session(app, "ses-idem")
    assert again.messages_read == 2 and again.memories_added == 0 and again.duplicates == 2
    assert Memory.select().count() == 2


def test_injected_context_is_never_relearned(configure, state_dir, app, model_server):
    session = copilot_session(state_dir, "ses-ctx", cwd=PROJECT)
    session.user("<llmem-context>\n- [1234abcd] Remember that the cache is Redis.\n</llmem-context>\n"
                 "Remember that the queue is RabbitMQ.")
    session_config(configure, state_dir, server=model_server)
    model_server.chat_replies = [reply()]

    extract_session(app, "ses-ctx")

    sent = json.dumps(chat_requests(model_server))
    assert "RabbitMQ" in sent and "Redis" not in sent
    assert all("Redis" not in m.content for m in app.store.list(limit=None))


# ---- with the (fake) LLM --------------------------------------------------------------------------


def test_llm_extraction_types_confidence_embeddings_and_usage(configure, state_dir, app, model_server):
    session = copilot_session(state_dir, "ses-llm", cwd=PROJECT)
    session.user("Let's paginate with keyset cursors; offsets drift under concurrent inserts.")
    session.assistant("Switching list_orders to keyset pagination.",
                      [{"name": "edit", "arguments": {"path": "app/repo/orders.py"}, "output": "ok"}])
    session_config(configure, state_dir, server=model_server)
    model_server.chat_replies = [reply(
        {"type": "decision", "content": "list_orders uses keyset pagination because offsets drift.",
         "summary": "keyset pagination", "stated_by_user": True},
        {"type": "fact", "content": "Order listing lives in app/repo/orders.py."},
    )]

    report = extract_session(app, "ses-llm")

    assert report.used_llm and report.memories_added == 2 and report.embedded == 2
    request = chat_requests(model_server)[0]
    assert request["stream"] is False and request["format"]["required"] == ["memories"]
    assert "keyset cursors" in request["messages"][1]["content"]
    stored = {m.type: m for m in app.store.list(limit=None)}
    assert stored["decision"].confidence == 0.9 and stored["fact"].confidence == 0.7
    assert stored["decision"].summary == "keyset pagination"
    assert app.store.stats()["pending_embedding"] == 0
    LlmUsage = app.store.models.LlmUsage
    usage = list(LlmUsage.select())
    assert [(u.task, u.prompt_tokens, u.completion_tokens, u.day) for u in usage] == [
        ("extract", 10, 5, today())]


def test_explicit_statements_the_llm_leaves_out_are_kept_once(configure, state_dir, app, model_server):
    session = copilot_session(state_dir, "ses-floor", cwd=PROJECT)
    session.user("remember that the staging port is 8443. We decided to keep the theme in localStorage.")
    session.assistant("Noted.")
    session_config(configure, state_dir, server=model_server, llm=True)
    # The model restates one statement in its own words and leaves the other out.
    model_server.chat_replies = [reply({"type": "decision", "content": "Theme preference is stored in localStorage."})]

    report = extract_session(app, "ses-floor")

    assert report.used_llm
    contents = sorted(m.content for m in app.store.list(limit=None))
    assert contents == ["The staging port is 8443.", "Theme preference is stored in localStorage."]


def test_changed_decision_supersedes_the_old_one(configure, state_dir, app, model_server):
    session_config(configure, state_dir, server=model_server)
    old = app.store.add("The orders service stores data in MySQL 8.", "decision", project=PROJECT).memory
    session = copilot_session(state_dir, "ses-sup", cwd=PROJECT)
    session.user("We are moving the orders service from MySQL to PostgreSQL 16.")
    model_server.chat_replies = [reply(
        {"type": "decision", "content": "The orders service moves from MySQL to PostgreSQL 16.",
         "stated_by_user": True, "supersedes": [old.id[:8]]},
        {"type": "fact", "content": "An id the model made up must not be linked.",
         "supersedes": ["deadbeef"]},
    )]

    report = extract_session(app, "ses-sup")

    assert old.id[:8] in chat_requests(model_server)[0]["messages"][1]["content"]
    assert report.relations == 1
    Memory, Relation = app.store.models.Memory, app.store.models.Relation
    (relation,) = Relation.select()
    new = Memory.get(Memory.id == relation.source_id)
    assert relation.type == "supersedes" and relation.target_id == old.id
    assert "PostgreSQL 16" in new.content


def test_near_duplicate_updates_the_existing_memory(configure, state_dir, app, model_server):
    session_config(configure, state_dir, server=model_server,
                   extra="dream:\n  similarity_threshold: 0.9\n")
    session = copilot_session(state_dir, "ses-near", cwd=PROJECT)
    session.user("Remember the deploy steps.")
    first = copilot_session(state_dir, "ses-near-0", cwd=PROJECT)
    first.user("hello")
    model_server.chat_replies = [reply({"type": "procedure", "content": "Deploy with make deploy then run smoke tests"})]
    extract_session(app, "ses-near-0")
    (original,) = app.store.list(limit=None)
    # Same words, different punctuation and case: not an exact duplicate, but cosine 1.0.
    model_server.chat_replies = [reply({"type": "procedure", "content": "Deploy with `make deploy`, then run smoke tests!"})]

    report = extract_session(app, "ses-near")

    assert report.memories_added == 0 and report.memories_updated == 1
    (memory,) = app.store.list(limit=None)
    assert memory.id == original.id
    assert memory.content == "Deploy with `make deploy`, then run smoke tests!"
    assert memory.metadata["previous_content"] == "Deploy with make deploy then run smoke tests"
    assert app.store.stats()["pending_embedding"] == 0


def test_garbage_reply_falls_back_to_heuristics_and_is_logged(configure, state_dir, app, model_server, caplog):
    session = copilot_session(state_dir, "ses-garbage", cwd=PROJECT)
    session.user("Remember that the API gateway times out after 30 seconds.")
    session_config(configure, state_dir, server=model_server)
    model_server.chat_replies = ["Sure! Here are your memories: none", '{"memories": "nope"}']

    with caplog.at_level("WARNING", logger="llmem"):
        report = extract_session(app, "ses-garbage")

    assert len(chat_requests(model_server)) == 2  # one retry, then the fallback
    assert not report.used_llm and "no usable reply" in report.llm_error
    assert [m.content for m in app.store.list(limit=None)] == [
        "The API gateway times out after 30 seconds."]
    assert "Sure! Here are your memories: none" in caplog.text
    assert report.cursor is not None  # the slice is done: heuristics handled it


def test_unreachable_llm_means_heuristics(configure, state_dir, app):
    from conftest import free_port_url

    session = copilot_session(state_dir, "ses-down", cwd=PROJECT)
    session.user("I prefer pytest over unittest.")
    configure(f"embedding:\n  provider: none\nllm:\n  provider: ollama\n  base_url: {free_port_url()}\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n" + TYPED_ONLY)

    report = extract_session(app, "ses-down")

    assert not report.used_llm and not report.deferred and "could not reach" in report.llm_error
    assert [m.content for m in app.store.list(limit=None)] == ["The user prefers pytest over unittest."]


def test_spent_budget_defers_but_heuristics_still_run(configure, state_dir, app, model_server):
    session = copilot_session(state_dir, "ses-budget", cwd=PROJECT)
    session.user("Never log request bodies.")
    session_config(configure, state_dir, server=model_server, extra="")
    configure(f"embedding:\n  provider: none\nllm:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"  daily_token_budget: 100\nsession:\n  adapter: copilot\n  copilot:\n"
              f"    state_dir: {state_dir}\n" + TYPED_ONLY)
    with app.store.db.atomic():
        SessionCursor, LlmUsage = app.store.models.SessionCursor, app.store.models.LlmUsage
        LlmUsage.create(time=time.time(), day=today(), task="extract", provider="ollama",
                        model="m", prompt_tokens=90, completion_tokens=10)

    report = extract_session(app, "ses-budget")

    assert report.deferred and "budget" in report.llm_error
    assert chat_requests(model_server) == []
    assert [m.content for m in app.store.list(limit=None)] == ["Never log request bodies."]
    cursor = SessionCursor.get(SessionCursor.session_id == "ses-budget")
    assert cursor.status == "deferred" and cursor.cursor is None  # read again once budget allows
    # Tomorrow (budget free again) the slice is extracted with the LLM; the heuristic memory
    # is not duplicated.
    LlmUsage.delete().execute()
    model_server.chat_replies = [reply({"type": "procedure", "content": "Never log request bodies."})]
    later = extract_session(app, "ses-budget")
    assert later.used_llm and not later.deferred and later.memories_added == 0 and later.duplicates == 1


def test_long_slice_is_chunked_into_several_calls(configure, state_dir, app, model_server):
    session = copilot_session(state_dir, "ses-long", cwd=PROJECT)
    for i in range(40):
        session.user(f"Message {i}: " + "lorem ipsum dolor sit amet " * 60)
    session_config(configure, state_dir, server=model_server)
    model_server.chat_replies = [reply()] * 20

    report = extract_session(app, "ses-long")

    calls = chat_requests(model_server)
    assert report.chunks == len(calls) > 1
    for call in calls:
        assert estimate_tokens(call["messages"][1]["content"]) < 3000 + 500


def test_extract_text_with_project(app, fts_config):
    report = extract_text(app, "Remember: the prod cluster is eu-west-1. We decided to keep Redis 7.",
                          project="/srv/app", session_id="manual")
    assert report.memories_added == 2
    assert {(m.type, m.project) for m in app.store.list(limit=None)} == {
        ("fact", "/srv/app"), ("decision", "/srv/app")}


# ---- the recorded fixtures --------------------------------------------------------------------------


def test_copilot_fixture_transcript(configure, tmp_path, app, model_server):
    shutil.copytree(FIXTURES / "copilot", tmp_path / "copilot")
    session_config(configure, tmp_path / "copilot" / "session-state", server=model_server)
    model_server.chat_replies = [reply({"type": "fact", "content":
                                        "list_orders() orders by (created_at, id) so pages are stable."})]

    report = extract_session(app, DONE)

    prompt = chat_requests(model_server)[0]["messages"][1]["content"]
    assert "test_list_orders_paginates" in prompt and "full system prompt" not in prompt
    assert report.memories_added == 1 and report.project == "/home/dev/acme-api"
    assert extract_session(app, DONE).messages_read == 0


def test_opencode_fixture_transcript(configure, tmp_path, app):
    data_dir = tmp_path / "opencode"
    recorded_opencode_store(data_dir)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: opencode\n"
              f"  opencode:\n    data_dir: {data_dir}\n")
    llm = StubLLM({"memories": [{"type": "project_state", "content": "The OpenCode fixture session was read."}]})

    report = extract_session(app, "ses_f0d5df91fffeoLpXSBPHrYDK6h", llm=llm)

    assert report.adapter == "opencode" and report.messages_read > 0 and report.used_llm
    assert report.project and llm.messages[0][1]["content"]
    assert extract_session(app, "ses_f0d5df91fffeoLpXSBPHrYDK6h", llm=llm).messages_read == 0


# ---- speed ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_thousand_messages_outside_the_llm(configure, state_dir, app, capsys):
    """Extraction overhead on a 2,000-message transcript with a stub LLM (no HTTP)."""
    session = copilot_session(state_dir, "ses-big", cwd=PROJECT)
    for i in range(1000):
        session.user(f"Step {i}: please look at module_{i}.py and keep the API stable.")
        session.assistant(f"Looked at module_{i}.py.",
                          [{"name": "bash", "arguments": {"command": f"pytest tests/test_{i}.py"},
                            "output": f"{i} passed"}])
    session_config(configure, state_dir)
    app.store  # noqa: B018 - open (and migrate) outside the timing

    llm = StubLLM(lambda n: {"memories": [{"type": "fact", "content": f"Chunk {n} mentions modules."}]})

    started = time.perf_counter()
    report = extract_session(app, "ses-big", llm=llm)
    elapsed = time.perf_counter() - started

    assert report.messages_read == 2000 and report.memories_added == len(llm.tasks) == report.chunks
    with capsys.disabled():
        print(f"\n[extract] 2000 messages, {report.chunks} chunks, stub LLM: {elapsed * 1000:.0f} ms")
    assert elapsed < 10


def test_statements_in_plain_words_the_llm_leaves_out_are_kept_once(configure, state_dir, app, model_server):
    session = copilot_session(state_dir, "ses-plain", cwd=PROJECT)
    session.user("I want to use FastAPI with PostgreSQL for the backend. Tabs, not spaces.")
    session.assistant("Sounds good.")
    session.user("Fix the login test, and btw we're using Poetry for dependency management. Can you?")
    session.user("Maybe we should use Celery later?")  # a thought, not a statement
    session_config(configure, state_dir, server=model_server, llm=True)
    # The model restates the stack choice in its own words and leaves the rest out.
    model_server.chat_replies = [reply({"type": "decision", "content": "The backend uses FastAPI on PostgreSQL."})]

    report = extract_session(app, "ses-plain")

    assert report.used_llm
    stored = {m.content: m.type for m in app.store.list(limit=None)}
    assert stored == {
        "The backend uses FastAPI on PostgreSQL.": "decision",
        "The user prefers tabs, not spaces.": "preference",
        "We're using Poetry for dependency management.": "fact",
    }
