"""Every write asked through the memory service is journaled (llmem/memories.py): `llmem
history` shows the audit trail, a person's edit is undone as a dream run is, and a memory
deleted for good leaves no text behind in the journal."""

from __future__ import annotations

import json
from contextlib import closing

import pytest

from llmem.app import App


@pytest.fixture
def store_home(fts_config):
    return fts_config


def _ok(cli, *args):
    code, out, err = cli(*args)
    assert code == 0, err
    return out


def _history(cli, *args):
    return json.loads(_ok(cli, "history", *args, "--json"))


def test_each_edit_is_journaled_and_history_shows_it_newest_first(store_home, cli):
    api = json.loads(_ok(cli, "add", "-c", "the api listens on 8080", "--json"))["id"]
    _ok(cli, "add", "-c", "the api listens on 8080")  # an exact duplicate: nothing changed
    _ok(cli, "update", api, "--content", "the api listens on 8081")
    _ok(cli, "invalidate", api, "--reason", "the api moved")
    _ok(cli, "invalidate", api, "--reason", "twice")  # already invalid: left as it was
    vpn = json.loads(_ok(cli, "add", "-c", "deploys need the vpn", "--json"))["id"]
    newer = json.loads(_ok(cli, "correct", vpn, "-c", "deploys need the vpn and a token", "--json"))["id"]
    assert cli("correct", vpn, "-c", "deploys need a token")[0] != 0  # refused: nothing journaled

    edits = _history(cli)
    runs = list(dict.fromkeys((e["run_id"], e["what"]) for e in edits))
    assert [what for _, what in runs] == ["correct", "add", "invalidate", "update", "add"]
    assert {e["run_kind"] for e in edits} == {"edit"} and {e["phase"] for e in edits} == {"cli"}
    corrected = [e for e in edits if e["what"] == "correct"]
    assert sorted((e["op"], e["memory_id"]) for e in corrected) == sorted(
        [("create", newer), ("relate", newer), ("update", vpn)])

    on_api = _history(cli, api[:8])
    assert [e["what"] for e in on_api] == ["invalidate", "update", "add"]
    changed = {c["field"]: (c["before"], c["after"]) for c in on_api[1]["changes"]}
    assert changed["content"] == ("the api listens on 8080", "the api listens on 8081")
    invalidated = {c["field"]: c["after"] for c in on_api[0]["changes"]}
    assert invalidated["metadata"]["invalidation_reason"] == "the api moved"

    shown = _ok(cli, "history", api[:8])
    assert "via cli" in shown and "'the api listens on 8080' → 'the api listens on 8081'" in shown
    code, _, err = cli("history", "0000dead")
    assert code != 0 and "no memory with id" in err


def test_an_edit_is_undone_as_a_run_and_a_delete_is_refused(store_home, cli):
    memory = json.loads(_ok(cli, "add", "-c", "the api listens on 8080", "--json"))["id"]
    _ok(cli, "update", memory, "--content", "the api listens on 8081")
    update_run = _history(cli, memory)[0]["run_id"]
    _ok(cli, "dream", "undo", update_run)
    with closing(App()) as app:
        assert app.store.get(memory).content == "the api listens on 8080"

    _ok(cli, "delete", memory)
    delete_run = _history(cli, memory)[0]
    assert (delete_run["what"], delete_run["op"]) == ("delete", "delete")
    code, _, err = cli("dream", "undo", delete_run["run_id"])
    assert code == 2 and "cannot be undone" in err


def test_a_deleted_memory_leaves_no_text_in_the_journal(store_home, cli):
    memory = json.loads(_ok(cli, "add", "-c", "the vault key is kept in the blue folder", "--json"))["id"]
    _ok(cli, "update", memory, "--content", "the vault key is kept in the red folder")
    _ok(cli, "invalidate", memory, "--reason", "moved to the green folder")
    _ok(cli, "delete", memory)
    with closing(App()) as app:
        DreamAction = app.store.models.DreamAction
        rows = list(DreamAction.select().where(DreamAction.memory_id == memory))
        assert len(rows) == 4  # what was done, and when, stays
        assert not [r for r in rows if "folder" in json.dumps([r.before, r.after])]
    assert [e["what"] for e in _history(cli, memory)] == ["delete", "invalidate", "update", "add"]


def test_a_dream_run_is_still_undone_around_a_later_edit(store_home, cli):
    # A person's edit after a dream is no reason to refuse its undo: the edited memory is left
    # as the person made it and reported, as before edits were journaled.
    from llmem.dream.journal import Journal, finish_run, start_run, undo_run

    with closing(App()) as app:
        kept = app.memories.add("the api listens on 8080", confidence=0.8).memory
        edited = app.memories.add("deploys need the vpn", confidence=0.8).memory
        run = start_run(app.store, "dream", ["deep"])
        with app.store.db.atomic():
            journal = Journal(app.store, run)
            journal.update("deep", "decay", kept.id, {"confidence": 0.5})
            journal.update("deep", "decay", edited.id, {"confidence": 0.5})
        finish_run(app.store, run, {})
        app.memories.update(edited.id, content="deploys need the vpn and a token")
        result = undo_run(app.store, run.id)
        assert result.skipped_memories == [edited.id]
        assert app.store.get(kept.id).confidence == pytest.approx(0.8)
        assert app.store.get(edited.id).content == "deploys need the vpn and a token"


def test_dream_status_lists_no_edit_as_a_run(store_home, cli):
    _ok(cli, "add", "-c", "the api listens on 8080")
    _ok(cli, "dream", "--apply")
    runs = json.loads(_ok(cli, "dream", "status", "--json"))["recent_runs"]
    assert [run["kind"] for run in runs] == ["dream"]
