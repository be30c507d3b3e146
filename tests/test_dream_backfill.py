"""Backfill over the recorded OpenCode fixture: resumable, and a rollback removes what it added."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port_url
from dream_support import run_cli
from fakes import StubLLM
from session_writers import copilot_events_file, copilot_turn_lines, recorded_opencode_store

from llmem.app import App
from llmem.dream.backfill import rollback_backfill, run_backfill
from llmem.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"
SESSION = "ses_f0d5df91fffeoLpXSBPHrYDK6h"


def backfill_llm() -> StubLLM:
    return StubLLM(lambda n: {"memories": [{"type": "project_state", "content": f"Backfilled fact number {n}."}]})


@pytest.fixture
def app(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LLMEM_HOME", str(home))
    data_dir = tmp_path / "opencode"
    recorded_opencode_store(data_dir)
    home.mkdir()
    (home / "config.yaml").write_text(
        "embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: opencode\n"
        f"  opencode:\n    data_dir: {data_dir}\n")
    application = App()
    yield application
    application.close()


def test_backfill_resumes_and_rolls_back(app):
    llm = backfill_llm()
    first = run_backfill(app, llm=llm)
    assert first.sessions >= 1 and first.added >= 1 and not first.errors
    Memory, DreamRun, SessionCursor = app.store.models.Memory, app.store.models.DreamRun, app.store.models.SessionCursor
    added = [m.id for m in Memory.select().where(Memory.source.not_in(("dream", "episode")))]
    assert len(added) == first.added
    episodes = Memory.select().where(Memory.source == "episode").count()
    assert episodes == first.episodes >= 1
    assert SessionCursor.select().where(SessionCursor.session_id == SESSION).exists()
    # Resumable: a second run reads nothing new and adds nothing.
    again = run_backfill(app, llm=llm)
    assert again.added == 0
    result = rollback_backfill(app.store, first.run_id)
    assert result.deleted == first.added + first.episodes
    assert Memory.select().count() == 0  # the episodes go too, and their cursor is put back:
    assert not SessionCursor.select().where(SessionCursor.session_id == SESSION).exists()
    assert DreamRun.get_by_id(first.run_id).status == "undone"
    # With the cursors back, the sessions are read again.
    again = run_backfill(app, llm=backfill_llm())
    assert (again.added, again.episodes) == (first.added, first.episodes)


def test_rollback_refuses_other_runs(app):
    from llmem.dream import run_dream

    outcome = run_dream(app.store, app.config, apply=True)
    with pytest.raises(UsageError, match="not a backfill"):
        rollback_backfill(app.store, outcome.run_id)


def test_backfill_cli_with_limit_and_since(app):
    code, out, err = run_cli("backfill", "--since", "2999-01-01")
    assert code == 0 and "No sessions" in out
    code, out, err = run_cli("backfill", "--since", "yesterday-ish")
    assert code == 2 and "not a date" in err
    code, out, err = run_cli("backfill", "--no-llm", "--limit", "1")
    assert code == 0, err
    assert "Roll back with: llmem backfill --rollback" in out
    run_id = out.rsplit(" ", 1)[-1].strip()
    code, out, err = run_cli("backfill", "--rollback", run_id)
    assert code == 0 and "Rolled back" in out


def test_an_unreachable_llm_is_said_once_not_per_session(tmp_path, configure):

    state = tmp_path / "copilot-state"
    state.mkdir()
    for n in range(3):
        copilot_events_file(state, *copilot_turn_lines(f"remember that service {n} listens on port 90{n}0"))
    configure(f"embedding:\n  provider: none\nllm:\n  provider: ollama\n  base_url: {free_port_url()}\n"
              f"  timeout: 2\nsession:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n")
    # A process of its own: its stderr is what a user sees (logging's handler included).
    done = subprocess.run([sys.executable, "-m", "llmem", "backfill"], capture_output=True, text=True,
                          timeout=120)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err
    assert "3 sessions" in out and "3 memories added" in out
    said = [line for line in err.splitlines() if "could not reach" in line or "LLM" in line]
    assert len(said) == 1, (out, err)


def test_a_backfill_journals_a_session_once_and_its_memories_keep_their_history(app):
    """One journal action per session still counts, dates and guards each memory it made."""
    from llmem.dream.journal import Journal, action_counts, finish_run, start_run
    from llmem.memories import memory_journal

    first = run_backfill(app, llm=backfill_llm())
    store, Memory = app.store, app.store.models.Memory
    assert action_counts(store, first.run_id) == {
        "backfill": {"add": first.added, "episode": first.episodes, "cursor": first.sessions}}
    typed = Memory.get(Memory.source != "episode")
    episode = Memory.get(Memory.source == "episode")
    history = memory_journal(store, typed.id)
    assert [(e.run_id, e.what, e.op, e.memory_id) for e in history] == [(first.run_id, "add", "create", typed.id)]
    assert [e.what for e in memory_journal(store, episode.id)] == ["episode"]
    # A later run that changed one of them: the rollback alone would lose that run's write.
    later = start_run(store, "dream", ["light"])
    with store.db.atomic():
        Journal(store, later).update("light", "decay", episode.id, {"confidence": 0.4})
    finish_run(store, later, {})
    with pytest.raises(UsageError, match=later.id):
        rollback_backfill(store, first.run_id)
