"""Episodes (capture/episodes.py): every turn of a user session kept as searchable memory.

Real Copilot session files, a real store, the real extraction, search, context, viewer and dream
code; a fake model server on loopback where an LLM or an embedder is needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from session_writers import copilot_session

from llmem.adapters import TranscriptMessage
from llmem.adapters.base import ToolCall
from llmem.app import App
from llmem.capture import episodes as ep
from llmem.capture.extract import extract_session
from llmem.errors import ConfigError
from llmem.search import Searcher, SearchOptions

PROJECT = "/work/acme"


@pytest.fixture
def state_dir(tmp_path) -> Path:
    path = tmp_path / "session-state"
    path.mkdir()
    return path


def config_text(state_dir, *, llm_url: str | None = None, embed_url: str | None = None, extra: str = "") -> str:
    embedding = f"embedding:\n  provider: ollama\n  base_url: {embed_url}\n" if embed_url else \
        "embedding:\n  provider: none\n"
    llm = f"llm:\n  provider: ollama\n  base_url: {llm_url}\n  timeout: 5\n" if llm_url else \
        "llm:\n  provider: none\n"
    return (embedding + llm + f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
            "pipeline:\n  min_extraction_interval_seconds: 0\n" + extra)


@pytest.fixture
def app(configure, state_dir):
    configure(config_text(state_dir))
    application = App()
    yield application
    application.close()


def episodes_of(app, session_id: str | None = None) -> list:
    Memory = app.store.models.Memory
    query = Memory.select().where(Memory.source == "episode")
    if session_id:
        query = query.where(Memory.session_id == session_id)
    return list(query.order_by(Memory.seq))


def design_session(state_dir, secret: str = "sk-live-0123456789abcdefABCDEF0123"):
    repeats = ep.CHUNK_CHARS // 160  # a reply longer than a chunk, each of its two halves shorter
    session = copilot_session(state_dir, cwd=PROJECT)
    session.user("Which web framework should we use for the orders API?")
    session.tool_step("ls src", "orders.py\n" * 5000)  # a tool's output: left out of the episode
    session.reply("Let's use FastAPI with Postgres for the orders API.\n\n"
                  f"I set the connection pool size to 20 and the API key to {secret}.\n\n"
                  + "The handlers stay thin: validation in pydantic models, queries in the repository. " * repeats
                  + "\n\n" + "Each query runs in its own transaction, with a five second timeout. " * repeats)
    session.turn("What expiry did we set on the tokens?", "Access tokens expire after 15 minutes.")
    return session


# ---- what a slice becomes ---------------------------------------------------------------------


def message(index, role, text="", **kw):
    return TranscriptMessage(id=f"m{index}", index=index, role=role, text=text, time_ms=1_700_000_000_000, **kw)


def test_a_turn_becomes_a_user_episode_and_an_assistant_episode_with_tool_calls_as_one_line():
    messages = [
        message(0, "system", "You are a helpful agent."),
        message(1, "user", "Fix the flaky test in api/handlers.py"),
        message(2, "assistant", "", tool_calls=(ToolCall("bash", input='{"command": "pytest -q api"}',
                                                         output="F" * 100_000),)),
        message(3, "tool", "F" * 1000),
        message(4, "assistant", "The test raced the cache warm-up; it now waits for the warm-up event."),
        message(5, "user", "Summary of the conversation so far", kind="compaction_summary"),
        message(6, "user", "Continue.", synthetic=True),
        message(7, "assistant", "", tool_calls=(ToolCall("read", input="a.py"),)),  # tool calls alone
    ]
    (built,) = ep.build_episodes(messages, ("user", "assistant"))  # a short question and its answer: one chunk
    assert (built.role, built.turn, built.message_ids) == ("mixed", 1, ["m1", "m2", "m4"])
    assert built.content.startswith("user: Fix the flaky test in api/handlers.py\n\n"
                                    "assistant: The test raced the cache warm-up")
    assert '[tool bash: {"command": "pytest -q api"}]' in built.content and "FFFF" not in built.content
    assert "Summary of the conversation" not in built.content and "Continue." not in built.content
    assert built.metadata("copilot") == {"agent": "copilot", "role": "mixed",
                                         "turn": 1, "message_ids": ["m1", "m4"], "time": "2023-11-14T22:13:20Z"}
    assert [e.metadata("x")["role"] for e in ep.build_episodes(messages, ("user",))] == ["user"]
    assert [e.role for e in ep.build_episodes(messages, ("assistant",))] == ["assistant"]
    assert ep.build_episodes(messages, ()) == []
    # A turn too long for the room left starts its own chunk, of its role alone.
    long_answer = message(4, "assistant", "The warm-up race. " * 100)
    split = ep.build_episodes([*messages[:4], long_answer], ("user", "assistant"))
    assert [e.role for e in split] == ["user", "assistant", "assistant"]
    assert [(e.part, e.parts) for e in split] == [(0, 0), (1, 2), (2, 2)]


def test_long_turns_are_chunked_at_paragraphs_code_is_capped_and_binary_is_left_out():
    paragraphs = [f"Paragraph {n}: " + "word " * 120 for n in range(12)]  # ~610 chars each
    code = "```python\n" + "x = 1\n" * 2000 + "```"
    built = ep.build_episodes([message(1, "user", "\n\n".join(paragraphs[:6]) + "\n\n" + code
                                       + "\n\n" + "\n\n".join(paragraphs[6:]))], ("user",))
    assert all(len(e.content) <= ep.CHUNK_CHARS for e in built)
    assert all(e.parts == len(built) for e in built) and [e.part for e in built] == list(range(1, len(built) + 1))
    assert all(e.content.startswith("user: ") for e in built)
    # No paragraph is cut in two when it fits a chunk.
    for paragraph in paragraphs:
        assert any(paragraph.strip() in e.content for e in built)
    joined = "\n".join(e.content for e in built)
    assert "more characters of code]" in joined and joined.count("x = 1") < 2000 / 3
    binary = ep.build_episodes([message(1, "user", "\x00\x01\x02\ufffd" * 200)], ("user",))
    assert [e.content for e in binary] == ["user: [800 characters of binary or undecodable text left out]"]
    assert ep.clean_text("a stray \x00 NUL and a \x07 bell\nin prose") == "a stray  NUL and a  bell\nin prose"


def test_a_50_mb_paste_keeps_its_head_within_the_turn_cap():
    log_line = "2026-11-30 12:00:01 INFO worker[12] processed job 48213 in 12 ms queue=default\n"
    paste = "Here is the log:\n" + "".join(f"{n:08d} {log_line}" for n in range(50_000_000 // 90))
    built = ep.build_episodes([message(1, "user", paste)], ("user",))
    assert 1 <= len(built) <= ep.TURN_CHARS // (ep.CHUNK_CHARS // 2) + 1
    assert sum(len(e.content) for e in built) <= ep.TURN_CHARS + 200
    assert built[0].content.startswith("user: Here is the log:")
    assert built[0].cut >= len(paste) - ep.TURN_CHARS - 100
    assert "more characters]" in built[-1].content


def test_episode_roles_are_validated_by_the_config(configure, state_dir):
    from llmem.config import load_config

    configure(config_text(state_dir, extra="capture:\n  episode_roles: [user, tool]\n"))
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert "capture.episode_roles" in caught.value.message and "user, assistant" in caught.value.message


# ---- extraction writes them -------------------------------------------------------------------


def test_without_an_llm_every_turn_is_searchable_with_provenance_and_redacted(app, state_dir):
    session = design_session(state_dir)
    report = extract_session(app, session.id)
    assert report.episodes_added == 4 and not report.used_llm
    episodes = episodes_of(app, session.id)
    # The question alone (its long answer does not fit beside it), the answer in two parts cut
    # at a paragraph, then the short second exchange in one chunk.
    assert [e.metadata["role"] for e in episodes] == ["user", "assistant", "assistant", "mixed"]
    assert [e.metadata.get("part") for e in episodes] == [None, 1, 2, None]
    assert [e.trust for e in episodes] == ["user", "agent", "agent", "agent"]  # whose words (trust.py)
    for episode in episodes:
        assert episode.type == "conversation" and episode.project == PROJECT
        assert episode.metadata["agent"] == "copilot" and episode.metadata["time"].endswith("Z")
        assert isinstance(episode.metadata["turn"], int) and episode.metadata["message_ids"]
    answer = episodes[1].content + episodes[2].content
    assert "FastAPI with Postgres" in answer and "pool size to 20" in answer
    assert "sk-live" not in answer and "[REDACTED" in answer  # redacted like every write
    assert "[tool bash: " in answer and "orders.py" not in answer  # the tool's output is left out
    hits = Searcher(app.store, None).search("orders API framework", SearchOptions(mode="fts", track=False)).hits
    assert hits and hits[0].memory.source == "episode"

    # The same slice again adds nothing; a new turn is read once.
    assert extract_session(app, session.id).episodes_added == 0
    session.turn("Which port does staging use?", "Staging listens on 8443.")
    more = extract_session(app, session.id)  # a short exchange goes on in the last episode
    assert more.episodes_added == 0 and more.episode_extended == episodes[-1].id
    contents = [e.content for e in episodes_of(app, session.id)]
    assert len(contents) == 4 and contents[-1].endswith("user: Which port does staging use?\n\n"
                                                         "assistant: Staging listens on 8443.")
    assert extract_session(app, session.id).episode_extended is None  # and only once


def test_the_llm_path_writes_the_episodes_too(configure, state_dir, model_server):
    model_server.chat_replies = [json.dumps({"memories": [
        {"type": "decision", "content": "The orders API uses FastAPI with Postgres."}]})]
    configure(config_text(state_dir, llm_url=model_server.url))
    application = App()
    try:
        session = design_session(state_dir)
        report = extract_session(application, session.id)
        assert report.used_llm and report.memories_added >= 1 and report.episodes_added == 4
    finally:
        application.close()


def test_episodes_off_or_one_role_only(configure, state_dir):
    session = design_session(state_dir)
    configure(config_text(state_dir, extra="capture:\n  episodes: false\n"))
    application = App()
    try:
        assert extract_session(application, session.id).episodes_added == 0
        assert episodes_of(application) == []
    finally:
        application.close()
    other = design_session(state_dir)
    configure(config_text(state_dir, extra="capture:\n  episode_roles: [user]\n"))
    application = App()
    try:
        extract_session(application, other.id)
        kept = episodes_of(application, other.id)
        assert {e.metadata["role"] for e in kept} == {"user"} and "FastAPI" not in " ".join(e.content for e in kept)
    finally:
        application.close()


def test_a_held_cursor_never_writes_a_turn_twice(app, state_dir):
    session = design_session(state_dir)
    first = extract_session(app, session.id, use_llm=False, hold_cursor=True)  # the LLM comes later
    assert first.deferred and first.episodes_added == 4
    session.turn("And the refresh tokens?", "Refresh tokens last 30 days.")
    again = extract_session(app, session.id)  # reads the held slice again, and the new turn
    assert again.episodes_added == 0 and again.episode_extended  # the new turn, in the last episode
    contents = [e.content for e in episodes_of(app, session.id)]
    assert len(contents) == 4 and "Refresh tokens last 30 days." in contents[-1]
    assert sum(c.count("What expiry did we set on the tokens?") for c in contents) == 1


def test_a_lost_episode_cursor_reads_the_whole_session_and_stores_nothing_twice(app, state_dir):
    session = design_session(state_dir)
    extract_session(app, session.id)
    Cursor = app.store.models.SessionCursor
    Cursor.update(cursor=None, episode_cursor=None).execute()  # e.g. a restored or rolled-back row
    assert extract_session(app, session.id).episodes_added == 0
    assert len(episodes_of(app, session.id)) == 4


KILLED_RUN = textwrap.dedent("""
    import sys, time
    import llmem.capture.extract as extract
    from llmem.app import App
    real = extract.write_episodes
    def write_then_hang(*args, **kwargs):
        written = real(*args, **kwargs)
        print("written, not committed", flush=True)  # the parent kills us here
        time.sleep(120)
        return written
    extract.write_episodes = write_then_hang
    extract.extract_session(App(), sys.argv[1])
""")


def test_a_run_killed_inside_its_transaction_loses_nothing_and_the_rerun_writes_each_turn_once(
        app, state_dir, llmem_home):
    session = design_session(state_dir)
    app.store.add("The staging database listens on port 5433", "fact", project=PROJECT)
    env = {**os.environ, "LLMEM_HOME": str(llmem_home)}
    child = subprocess.Popen([sys.executable, "-c", KILLED_RUN, session.id], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "written, not committed", child.stderr.read()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    # kill -9 mid-transaction: nothing of it was committed, what was stored before is intact.
    assert episodes_of(app) == [] and app.store.models.SessionCursor.select().count() == 0
    assert [m.content for m in app.store.list()] == ["The staging database listens on port 5433"]
    assert extract_session(app, session.id).episodes_added == 4
    assert extract_session(app, session.id).episodes_added == 0  # and the same slice again: nothing
    contents = [e.content for e in episodes_of(app, session.id)]
    assert len(contents) == len(set(contents)) == 4


def test_a_10000_turn_session_is_bounded(app, state_dir):
    from session_writers import append_lines, copilot_line

    session = copilot_session(state_dir, cwd=PROJECT)
    lines = []
    for n in range(10_000):
        lines += [copilot_line("user.message", {"content": f"What does migration {n} do?"}),
                  copilot_line("assistant.message", {"messageId": f"a{n}", "content": f"Migration {n} adds index {n}.",
                                                     "toolRequests": []})]
    append_lines(session.events_path, *lines)
    report = extract_session(app, session.id)
    # 20,000 short turns packed into chunks of ~CHUNK_CHARS: ~30-50 characters each with their label.
    assert 20_000 * 30 // ep.CHUNK_CHARS <= report.episodes_added <= 20_000 * 50 // ep.CHUNK_CHARS
    assert all(len(e.content) <= ep.CHUNK_CHARS for e in episodes_of(app, session.id))
    assert len(report.as_dict()["episode_ids"]) == 100  # the event row keeps a sample of the ids
    hits = Searcher(app.store, None).search("migration 9876", SearchOptions(mode="fts", track=False)).hits
    assert any("assistant: Migration 9876 adds index 9876." in h.memory.content for h in hits)


# ---- search, context, viewer --------------------------------------------------------------------


def test_a_typed_memory_outranks_the_episode_saying_the_same_and_filters_apply(app, state_dir, cli):
    session = copilot_session(state_dir, cwd=PROJECT)
    session.turn("We decided to use FastAPI for the orders API.", "Noted: FastAPI for the orders API.")
    extract_session(app, session.id)
    typed = [m for m in app.store.list() if m.source != "episode"]
    assert [m.type for m in typed] == ["decision"]
    hits = Searcher(app.store, None).search("FastAPI orders API", SearchOptions(mode="fts", track=False)).hits
    assert [h.memory.source for h in hits][:2] == ["extraction", "episode"]
    assert hits[1].components["episode_prior"] == pytest.approx(0.85)
    # The same words typed by hand are kept as a memory of their own, not taken for the episode.
    added = app.store.add("Noted: FastAPI for the orders API.", "fact", project=PROJECT)
    assert added.created and added.memory.source == "user"
    app.store.delete(added.memory.id)

    code, out, err = cli("search", "FastAPI", "--json", "--no-track")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["episode"] for r in rows] == [False, True]
    code, out, _ = cli("search", "FastAPI", "--no-track", "--type", "conversation")
    assert "episode:mixed" in out and "decision" not in out
    code, out, _ = cli("search", "FastAPI", "--json", "--no-track", "--project", "/elsewhere")
    assert json.loads(out) == []
    episode = next(r for r in rows if r["episode"])
    app.store.invalidate(episode["id"], "test")
    code, out, _ = cli("search", "FastAPI", "--json", "--no-track", "--valid-only")
    assert [r["episode"] for r in json.loads(out)] == [False]


def test_mcp_search_marks_episodes(app, state_dir):
    from llmem.mcp_server import MemoryTools

    session = copilot_session(state_dir, cwd=PROJECT)
    session.turn("Which queue do we use?", "We use the redis queue named orders-high.")
    extract_session(app, session.id)
    reply = MemoryTools(app, default_project=PROJECT).search("redis queue orders-high")
    assert "episode:mixed" in reply and "orders-high" in reply


def test_context_adds_relevant_episodes_beside_the_typed_memories_within_the_budget(app, state_dir):
    from llmem.context import EPISODES_TITLE, assemble_context

    old = copilot_session(state_dir, cwd=PROJECT)
    old.turn("Remember that the orders API uses FastAPI.",
             "Agreed. The orders API connection pool error was fixed by raising the pool size to 20.")
    extract_session(app, old.id)
    new = copilot_session(state_dir, cwd=PROJECT)
    new.user("The orders API shows a connection pool error again")
    extract_session(app, new.id)
    block = assemble_context(app, new.id, max_tokens=400)
    assert block.tokens <= 400
    assert EPISODES_TITLE in block.sections
    # Both are in; within the section the lines follow their relevance to the session (the
    # episode about the pool error is the closer one here), not a fixed kind-first order.
    assert "fact: The orders API uses FastAPI" in block.text and "said on " in block.text
    shown = app.store.models.Memory.select().where(app.store.models.Memory.id.in_(block.sections[EPISODES_TITLE]))
    assert {m.session_id for m in shown} == {old.id}  # never the session's own turns
    assert "said on " in block.text and "assistant: Agreed." in block.text and "pool size to 20" in block.text


# ---- the dream ------------------------------------------------------------------------------------


def test_light_prunes_by_age_and_size_through_the_journal_and_undo_restores(configure, state_dir):
    from llmem.dream.journal import undo_run
    from llmem.dream.sweep import run_dream
    from llmem.times import now

    configure(config_text(state_dir, extra="capture:\n  episode_max_age_days: 30\n  episode_max_total_mb: 0.0001\n"))
    application = App()
    try:
        session = design_session(state_dir)
        extract_session(application, session.id)
        episodes = episodes_of(application)
        Memory = application.store.models.Memory
        Memory.update(created_at=now() - 40 * 86400).where(Memory.id == episodes[0].id).execute()
        typed = application.store.add("The orders API uses FastAPI", "decision", project=PROJECT).memory
        outcome = run_dream(application.store, application.config, apply=True, phases=["light"], use_llm=False)
        pruned = {a.memory_id: a.changes["metadata"]["invalidation_reason"] for a in outcome.actions
                  if a.kind == "prune_episode"}
        assert "episode_max_age_days" in pruned[episodes[0].id]
        # 100 bytes of text allowed: the newest episode that fits stays, the older ones go.
        kept = [e.id for e in episodes_of(application) if e.invalidated_at is None]
        assert kept and all(e.id not in pruned for e in episodes if e.id in kept)
        assert len(pruned) >= 2 and typed.id not in pruned
        assert Memory.get(Memory.id == typed.id).invalidated_at is None
        undo_run(application.store, outcome.run_id)
        assert all(e.invalidated_at is None for e in episodes_of(application))
    finally:
        application.close()


def test_the_dream_never_merges_or_promotes_an_episode(configure, state_dir, model_server):
    from llmem.dream.promote import candidates
    from llmem.dream.sweep import run_dream
    from llmem.times import now

    configure(config_text(state_dir, embed_url=model_server.url))
    application = App()
    try:
        first, second = copilot_session(state_dir, cwd=PROJECT), copilot_session(state_dir, cwd=PROJECT)
        first.turn("The deploy runs every Friday at noon from the main branch", "ok then")
        second.turn("The deploy runs every Friday at noon from the main branch!", "sure")
        extract_session(application, first.id)
        extract_session(application, second.id)
        assert len([e for e in episodes_of(application) if "deploy" in e.content]) == 2
        outcome = run_dream(application.store, application.config, apply=True, use_llm=False)
        assert not [a for a in outcome.actions if a.kind in ("merge", "dedupe")]
        assert all(e.invalidated_at is None for e in episodes_of(application))
        # Recalled often from many queries on many days: still held by the `typed` gate.
        episode = episodes_of(application)[0]
        RecallEvent = application.store.models.RecallEvent
        for day in range(6):
            for query in range(4):
                RecallEvent.create(memory=episode.id, query_hash=f"q{query}", rank=1, score=0.95, origin="search",
                                   created_at=now() - day * 86400 - query * 3600)
        (candidate,) = candidates(application.store, application.config.dream, memory_ids=[episode.id])
        assert not candidate.gates["typed"]["passed"] and not candidate.passes
        assert candidate.verdict.startswith("hold")
    finally:
        application.close()


def test_with_an_llm_old_episodes_are_condensed_into_typed_memories_linked_back(configure, state_dir,
                                                                                 model_server):
    from llmem.dream.journal import undo_run
    from llmem.dream.sweep import run_dream
    from llmem.times import now

    configure(config_text(state_dir, llm_url=model_server.url, extra="capture:\n  episode_max_age_days: 30\n"))
    application = App()
    try:
        session = design_session(state_dir)
        extract_session(application, session.id, use_llm=False)
        episodes = episodes_of(application)
        Memory = application.store.models.Memory
        Memory.update(created_at=now() - 40 * 86400).where(Memory.source == "episode").execute()
        model_server.chat_replies = [json.dumps({"memories": [
            {"type": "decision", "content": "The orders API uses FastAPI with Postgres and a pool of 20."}]})]
        outcome = run_dream(application.store, application.config, apply=True, phases=["light"])
        made = [a for a in outcome.actions if a.kind == "condense"]
        assert len(made) == 1 and {a.memory_id for a in outcome.actions if a.kind == "prune_episode"} == {
            e.id for e in episodes}
        condensed = Memory.get(Memory.id == made[0].memory_id)
        assert condensed.source == "dream" and condensed.type == "decision" and condensed.session_id == session.id
        links = application.store.relations_of([condensed.id])
        assert {(r.type, r.target_id) for r in links} == {("derived_from", e.id) for e in episodes}
        assert all(e.invalidated_at is not None for e in episodes_of(application))
        undo_run(application.store, outcome.run_id)
        assert Memory.get_or_none(Memory.id == condensed.id) is None
        assert all(e.invalidated_at is None for e in episodes_of(application))
    finally:
        application.close()


def test_short_slices_go_on_in_the_last_episode_until_it_is_full(app, state_dir):
    session = copilot_session(state_dir, cwd=PROJECT)
    turns = ep.CHUNK_CHARS // 60  # exchanges of ~100 characters: more than one chunk holds
    for n in range(turns):  # one idle per exchange, as a live session is read
        session.turn(f"What does step {n} of the release do?", f"Step {n} tags the build and uploads it.")
        extract_session(app, session.id)
    episodes = episodes_of(app, session.id)
    assert 1 < len(episodes) < turns and all(len(e.content) <= ep.CHUNK_CHARS for e in episodes)
    text = "\n\n".join(e.content for e in episodes)
    assert all(text.count(f"What does step {n} of the release do?") == 1 for n in range(turns))
    first = episodes[0].metadata
    assert first["role"] == "mixed" and len(first["message_ids"]) == 2
    # A backfill writes new rows only: its rollback deletes what it created.
    other = copilot_session(state_dir, cwd=PROJECT)
    other.turn("Where do the release notes go?", "Into docs/releases.")
    extract_session(app, other.id)
    other.turn("And the changelog?", "CHANGELOG.md at the root.")
    report = extract_session(app, other.id, extend_episodes=False)
    assert report.episode_extended is None and report.episodes_added == 1


def test_an_episode_that_went_on_is_embedded_again(configure, state_dir, model_server):
    configure(config_text(state_dir, embed_url=model_server.url))
    application = App()
    try:
        session = copilot_session(state_dir, cwd=PROJECT)
        session.turn("Which cache do we use?", "Redis, with a one hour TTL.")
        extract_session(application, session.id)
        session.turn("And for sessions?", "Signed cookies.")
        assert extract_session(application, session.id).episode_extended
        (episode,) = episodes_of(application, session.id)
        Embedding = application.store.models.Embedding
        assert Embedding.get(Embedding.memory == episode.id).content_hash == episode.embed_hash  # not stale
        hits = Searcher(application.store, application.embedder).search(
            "signed cookies", SearchOptions(mode="semantic", track=False)).hits
        assert hits and hits[0].memory.id == episode.id
    finally:
        application.close()


def test_with_the_llm_down_old_episodes_are_pruned_all_the_same(configure, state_dir):
    from conftest import free_port_url

    from llmem.dream.sweep import run_dream
    from llmem.times import now

    configure(config_text(state_dir, llm_url=free_port_url(), extra="capture:\n  episode_max_age_days: 30\n"))
    application = App()
    try:
        for _ in range(2):
            extract_session(application, design_session(state_dir).id, use_llm=False)
        Memory = application.store.models.Memory
        Memory.update(created_at=now() - 40 * 86400).where(Memory.source == "episode").execute()
        outcome = run_dream(application.store, application.config, apply=True, phases=["light"])
        assert not [a for a in outcome.actions if a.kind == "condense"]
        assert all(e.invalidated_at is not None for e in episodes_of(application))
    finally:
        application.close()
