"""A backfill's journal (issue 18's growth): the run's sessions share one action, which a
rollback still reads as every memory they made and every cursor they moved."""

from __future__ import annotations

import json

import pytest
from session_writers import append_lines, copilot_events_file, copilot_turn_lines

from llmem.app import App
from llmem.db import journal_rows
from llmem.dream.backfill import rollback_backfill, run_backfill
from llmem.dream.journal import action_counts

WORDS = ("billing", "ingest", "search", "viewer", "worker", "scheduler")


@pytest.fixture
def copilot(tmp_path, configure):
    """(App, its Copilot state folder) for backfills with no LLM and no embedder."""
    state = tmp_path / "copilot-state"
    state.mkdir()
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: copilot\n"
              f"  copilot:\n    state_dir: {state}\n")
    application = App()
    yield application, state
    application.close()


def write_sessions(state, count: int, start: int = 0) -> list[tuple[str, object]]:
    return [copilot_events_file(state, *copilot_turn_lines(
        f"remember that the {WORDS[n % len(WORDS)]} service {n} listens on port 9{n:03d}",
        f"The {WORDS[n % len(WORDS)]} service {n} now listens on port 9{n:03d}."))
        for n in range(start, start + count)]


def session_actions(db, run_id: str) -> list[tuple]:
    return db.execute_sql("SELECT op, memory_id, before, after FROM dream_action WHERE run_id = ? ORDER BY id",
                          (run_id,)).fetchall()


def cursors(app) -> dict[str, tuple]:
    SessionCursor = app.store.models.SessionCursor
    return {c.session_id: (c.cursor, c.episode_cursor, c.messages_read) for c in SessionCursor.select()}


def test_one_action_holds_a_runs_sessions_and_the_rollback_undoes_each(copilot):
    app, state = copilot
    grown = write_sessions(state, 2)
    run_backfill(app, use_llm=False)
    kept_cursors = cursors(app)
    Memory = app.store.models.Memory
    kept = {m.id for m in Memory.select()}
    # A session read before grows, and four new ones come: the second run reads all six
    # (the cursor of the one unchanged is stamped anew, so journaled too).
    for _, events in grown[:1]:
        append_lines(events, *copilot_turn_lines("remember that the billing service 0 also needs redis",
                                                 "Noted: billing service 0 uses redis.", turn_id="1"))
    write_sessions(state, 4, start=2)
    second = run_backfill(app, use_llm=False)
    assert second.sessions == 6 and second.added + second.episodes >= 5
    actions = session_actions(app.store.db, second.run_id)
    assert [(op, memory_id) for op, memory_id, _, _ in actions] == [(journal_rows.SESSION_OP, None)]
    moved = journal_rows.moved_cursors(actions[0][2])  # (adapter, session_id, the row as it was or None)
    assert len(moved) == 6 and sum(row is not None for _, _, row in moved) == 2
    made = [pair for pairs in json.loads(actions[0][3]).values() for pair in pairs]
    assert len(made) == second.added + second.episodes
    assert action_counts(app.store, second.run_id) == {
        "backfill": {"add": second.added, "episode": second.episodes, "cursor": 6}}
    result = rollback_backfill(app.store, second.run_id)
    assert result.deleted == second.added + second.episodes
    assert {m.id for m in Memory.select()} == kept
    assert cursors(app) == kept_cursors  # the grown session's cursor back where run 1 left it, the new ones gone
    again = run_backfill(app, use_llm=False)  # and the sessions are read again
    assert (again.added, again.episodes) == (second.added, second.episodes)


def test_an_action_past_its_size_is_followed_by_a_new_one(copilot, monkeypatch):
    app, state = copilot
    monkeypatch.setattr(journal_rows, "SESSION_ACTION_BYTES", 600)
    write_sessions(state, 6)
    run = run_backfill(app, use_llm=False)
    actions = session_actions(app.store.db, run.run_id)
    assert 1 < len(actions) < run.sessions
    assert sum(len(journal_rows.moved_cursors(before)) for _, _, before, _ in actions) == run.sessions
    assert all(len(before) + len(after) <= 600 + 400 for _, _, before, after in actions)  # one session past it at most
    assert rollback_backfill(app.store, run.run_id).deleted == run.added + run.episodes
    assert app.store.models.Memory.select().count() == 0 and cursors(app) == {}


def test_an_older_stores_action_of_one_session_still_rolls_back(copilot):
    """Before, `before` held one cursor image (not a list): a store keeps such actions."""
    app, state = copilot
    write_sessions(state, 2)
    run = run_backfill(app, use_llm=False)
    db = app.store.db
    ((_, _, before, after),) = session_actions(db, run.run_id)
    images, created = journal_rows.cursor_images(before), json.loads(after)
    # The same run as the older journal wrote it: an action per session, its one image whole.
    db.execute_sql("DELETE FROM dream_action WHERE run_id = ?", (run.run_id,))
    Memory = app.store.models.Memory
    for image in images:
        assert image["table"] == "session_cursor" and image["row"] is None
        session = image["key"]["session_id"]
        own = {m.id for m in Memory.select(Memory.id).where(Memory.session_id == session)}
        mine = {kind: [pair for pair in pairs if pair[0] in own] for kind, pairs in created.items()}
        journal_rows.insert_action(db, run.run_id, "backfill", "session", journal_rows.SESSION_OP, None,
                                   json.dumps(image), json.dumps({k: v for k, v in mine.items() if v}), 0.0)
    assert action_counts(app.store, run.run_id)["backfill"]["cursor"] == 2
    assert rollback_backfill(app.store, run.run_id).deleted == run.added + run.episodes
    assert Memory.select().count() == 0 and cursors(app) == {}


def test_cursors_without_a_row_are_grouped_by_adapter_and_read_back_in_order():
    moved = [("claude", "s1", None), ("claude", "s2", None), ("codex", "s3", {"cursor": "offset:9"}),
             ("codex", "s4", None), ("claude", "s5", None)]
    before, _ = journal_rows.session_action_images({}, moved)
    assert json.loads(before) == [["claude", ["s1", "s2"]], ["codex", "s3", {"cursor": "offset:9"}],
                                  ["codex", ["s4"]], ["claude", ["s5"]]]
    assert journal_rows.moved_cursors(before) == moved
    # An older action's entries, one [adapter, session_id, null] each, read the same.
    older = json.dumps([list(entry) for entry in moved])
    assert journal_rows.moved_cursors(older) == moved
    assert journal_rows.cursor_images(older) == journal_rows.cursor_images(before)
