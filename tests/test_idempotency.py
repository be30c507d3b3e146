"""Every task run twice adds nothing the second time (issue 9.5).

The worker's own task functions (workers/tasks.py) on a real store, over a real Copilot
session file: process_event of each kind, embed_pending, and a dream with nothing new.
"""

from __future__ import annotations

import uuid

import pytest
from session_writers import copilot_events_file, copilot_line, copilot_turn_lines

from llmem.app import App
from llmem.pipeline.events import record_event, retry_events
from workers import tasks


@pytest.fixture
def state_dir(tmp_path):
    folder = tmp_path / "copilot" / "session-state"
    folder.mkdir(parents=True)
    return folder


def open_app(configure, state_dir, model_server=None) -> App:
    embedding = (f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n" if model_server
                 else "embedding:\n  provider: none\n")
    configure(embedding + "llm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
              "pipeline:\n  min_extraction_interval_seconds: 0\n")
    app = App()
    tasks.use_app(app)
    return app


@pytest.fixture
def app(configure, state_dir):
    application = open_app(configure, state_dir)
    yield application
    tasks.use_app(None)
    application.close()


def snapshot(app) -> dict[str, list[tuple]]:
    """Every row a task may write, but access tracking (a context read counts as a recall)."""
    db = app.store.db
    return {
        "memory": db.execute_sql(
            "SELECT id, type, content, summary, confidence, source, project, session_id, metadata, "
            "content_hash, invalidated_at, promoted_at FROM memory ORDER BY id").fetchall(),
        "relation": db.execute_sql("SELECT source_id, target_id, type FROM relation ORDER BY 1, 2, 3").fetchall(),
        "embedding": db.execute_sql("SELECT memory_id, content_hash FROM embedding ORDER BY 1").fetchall(),
        "session_cursor": db.execute_sql(
            "SELECT adapter, session_id, cursor, introspect_cursor, messages_read, status "
            "FROM session_cursor ORDER BY 1, 2").fetchall(),
    }


def admitted_mistake(prompt: str) -> list[str]:
    """A turn whose reply admits a mistake (what heuristic introspection reads)."""
    reply = "You're right, I forgot to check for None before indexing the result, so it crashed."
    return [copilot_line("user.message", {"content": prompt}),
            copilot_line("assistant.turn_start", {"turnId": "9"}),
            copilot_line("assistant.message", {"messageId": str(uuid.uuid4()), "content": reply, "toolRequests": []}),
            copilot_line("assistant.turn_end", {"turnId": "9"})]


def copilot_session(state_dir) -> str:
    """A session with stated facts, an agent mistake, a compaction and a shutdown."""
    session_id, _ = copilot_events_file(
        state_dir,
        *copilot_turn_lines("remember that the staging database listens on port 5433"),
        *copilot_turn_lines("We decided to keep the theme in localStorage"),
        copilot_line("session.compaction_start", {}),
        copilot_line("session.compaction_complete", {"success": True, "summaryContent": "Theme work."}),
        *copilot_turn_lines("No, that is wrong: the tests crashed because the value was None"),
        *admitted_mistake("Fix the crash in the order loader"),
        *copilot_turn_lines("Always run ruff before committing"),
        copilot_line("session.shutdown", {"shutdownType": "routine"}))
    return session_id


@pytest.mark.parametrize("kind", ["created", "idle", "ending", "compacting"])
def test_process_event_twice_adds_nothing(app, state_dir, kind):
    session_id = copilot_session(state_dir)
    first, _ = record_event(app.store, "copilot", session_id, kind)
    assert tasks.process_event(first.id)["status"] == "done"
    after_first = snapshot(app)
    if kind != "created":  # the others extract: the first run did find the stated facts
        contents = " ".join(row[2] for row in after_first["memory"])
        assert "5433" in contents and "localStorage" in contents
    if kind in ("idle", "ending"):  # … and introspected the admitted mistake
        assert "self_assessment" in {row[1] for row in after_first["memory"]}

    again, is_new = record_event(app.store, "copilot", session_id, kind)  # the same moment, detected twice
    assert is_new and tasks.process_event(again.id)["status"] == "done"
    assert snapshot(app) == after_first

    retry_events(app.store, [first.id])  # and the very same event run once more (a lost task)
    assert tasks.process_event(first.id)["status"] == "done"
    assert snapshot(app) == after_first


def test_embed_pending_twice_embeds_nothing_the_second_time(configure, state_dir, model_server):
    app = open_app(configure, state_dir, model_server)
    try:
        for text in ("The api listens on port 8080", "Deploys need the vpn", "Builds use Python 3.12"):
            app.store.add(text, "fact")
        assert tasks.embed_pending() == {"embedded": 3}
        after_first = snapshot(app)
        calls = len(model_server.requests)
        assert tasks.embed_pending() == {"embedded": 0}
        assert snapshot(app) == after_first and len(model_server.requests) == calls
    finally:
        tasks.use_app(None)
        app.close()


def test_dream_with_nothing_new_changes_nothing(app, state_dir):
    session_id = copilot_session(state_dir)
    event, _ = record_event(app.store, "copilot", session_id, "ending")
    tasks.process_event(event.id)

    def journal() -> list[tuple]:
        # Every journaled write, the diary's and DREAMS.md's included: a run with nothing new
        # adds no entry (it used to add a dated one every night).
        return app.store.db.execute_sql(
            "SELECT run_id, phase, kind, memory_id FROM dream_action ORDER BY id").fetchall()

    assert tasks.dream()["run_id"]
    after_first, journal_after_first = snapshot(app), journal()
    assert tasks.dream()["run_id"]
    assert snapshot(app) == after_first
    assert journal() == journal_after_first


def two_turn_session(state_dir) -> str:
    session_id, _ = copilot_events_file(state_dir, *copilot_turn_lines("remember that alpha is one"),
                                        *copilot_turn_lines("remember that beta is two"))
    return session_id


def test_memories_and_the_cursor_are_written_together_or_not_at_all(app, state_dir, monkeypatch):
    from llmem.capture.extract import extract_session

    session_id = two_turn_session(state_dir)
    real_add = type(app.store).add
    added = []

    def add_then_fail(store, *args, **kwargs):
        if added:
            raise RuntimeError("disk full")  # the second memory of the slice cannot be written
        added.append(args[0])
        return real_add(store, *args, **kwargs)

    monkeypatch.setattr(type(app.store), "add", add_then_fail)
    with pytest.raises(RuntimeError):
        extract_session(app, session_id)
    assert snapshot(app) == {"memory": [], "relation": [], "embedding": [], "session_cursor": []}
    monkeypatch.setattr(type(app.store), "add", real_add)
    report = extract_session(app, session_id)  # the whole slice again, once
    assert report.memories_added == 2 and report.cursor is not None
    rows = snapshot(app)["memory"]
    assert sorted(row[2] for row in rows if row[5] != "episode") == ["Alpha is one", "Beta is two"]
    # and each turn's episodes once: the failed run's were rolled back with its memories
    assert [row[2] for row in rows if row[5] == "episode"] == [
        "user: remember that alpha is one\n\nassistant: done\n\nuser: remember that beta is two\n\nassistant: done"]


def test_a_run_that_lost_the_race_for_the_cursor_reads_on_from_the_winner(app, state_dir, monkeypatch):
    import llmem.capture.extract as extract
    from llmem.adapters import CopilotAdapter
    from llmem.times import now

    session_id = two_turn_session(state_dir)
    first_turn = CopilotAdapter(state_dir).read_transcript(session_id).messages[1]
    assert first_turn.role == "assistant"
    real_chunks = extract._extract_chunks
    raced = []

    def racing(*args, **kwargs):
        if not raced:
            # While this run (an ending) works on both turns, an idle run of the first turn
            # commits first: its memory and its cursor.
            raced.append(True)
            app.store.add("Alpha is one", "fact", source="extraction", session_id=session_id)
            app.store.models.SessionCursor.create(adapter="copilot", session_id=session_id, cursor=first_turn.id,
                                                  messages_read=2, status="done", updated_at=now())
        return real_chunks(*args, **kwargs)

    monkeypatch.setattr(extract, "_extract_chunks", racing)
    report = extract.extract_session(app, session_id)
    assert not report.concurrent and report.memories_added == 1
    contents = sorted(row[2] for row in snapshot(app)["memory"] if row[5] != "episode")
    assert contents == ["Alpha is one", "Beta is two"]  # the second turn is not lost, nothing twice
