"""The memory service (llmem/memories.py): what each write returns, and the vector made after
the commit — at once while the embedder (the fake Ollama on 127.0.0.1) answers, pending when it
does not. tests/ui/test_memory_service.py runs the same writes through the three front-ends."""

from __future__ import annotations

import pytest
from conftest import free_port_url

from llmem.app import App
from llmem.errors import UsageError
from llmem.memories import AlreadyInvalid, Correction, Invalidated, Stored, Updated
from llmem.store import StaleEdit


@pytest.fixture
def app():
    opened = App()
    yield opened
    opened.close()


def embedded(app) -> int:
    return app.store.stats()["embedded"]


def test_writes_are_embedded_after_the_commit_while_the_embedder_answers(ollama_config, app):
    added = app.memories.add("the staging db listens on 5432", project="/p")
    assert isinstance(added, Stored) and added.created and added.pending is None
    assert added.memory.confidence == 0.9 and embedded(app) == 1  # the user's own words
    again = app.memories.add("The staging DB listens on 5432", project="/p")
    assert (again.created, again.memory.id) == (False, added.memory.id)
    updated = app.memories.update(added.memory.id, confidence=0.5)
    assert isinstance(updated, Updated) and updated.pending is None
    renamed = app.memories.update(added.memory.id, content="the staging db listens on 6543")
    # The new text's vector replaced the old one: nothing waits.
    assert renamed.pending is None and embedded(app) == 1 and app.store.stats()["pending_embedding"] == 0


def test_an_embedder_that_is_down_leaves_the_write_committed_and_pending(configure, app):
    configure(f"embedding:\n  provider: ollama\n  base_url: {free_port_url()}\n  timeout: 2\n"
              "llm:\n  provider: none\n")
    added = app.memories.add("my password is hunter2hunter2 and the api listens on 8080")
    assert added.created and added.pending  # why it waits, for the front-end to say
    assert "hunter2hunter2" not in added.memory.content  # redacted before it is stored or sent
    assert app.store.stats()["pending_embedding"] == 1
    correction = app.memories.correct(added.memory.id, "the api listens on 9090")
    assert isinstance(correction, Correction) and correction.pending
    assert app.store.stats()["pending_embedding"] == 1  # the correction; the old one is invalid


def test_correct_supersedes_keeps_the_scope_and_invalidates_the_old_one(fts_config, app):
    old = app.store.add("the staging db listens on 5432", "fact", project="/p", session_id="ses_1").memory
    result = app.memories.correct(old.id[:8], "the staging db listens on 6543")
    newer = result.memory
    assert (newer.type, newer.project, newer.session_id, newer.source) == ("fact", "/p", "ses_1", "user")
    assert newer.metadata["corrects"] == old.id and result.replaced.id == old.id
    assert [(r.source_id, r.target_id, r.type) for r in app.store.relations_of([old.id])] == [
        (newer.id, old.id, "supersedes")]
    old = app.store.get(old.id)
    assert old.invalidated_at is not None
    assert old.metadata["invalidation_reason"] == f"superseded by {newer.id}"


def test_correct_refuses_the_same_text_a_stale_form_and_an_invalidated_memory(fts_config, app):
    old = app.store.add("deploys need the vpn").memory
    with pytest.raises(UsageError, match="same"):
        app.memories.correct(old.id, "  Deploys need the VPN ")
    with pytest.raises(StaleEdit):
        app.memories.correct(old.id, "deploys need no vpn", expected_version=old.version + 1)
    assert app.store.get(old.id).invalidated_at is None
    assert app.store.relations_of([old.id]) == []
    assert isinstance(app.memories.invalidate(old.id, "gone"), Invalidated)
    with pytest.raises(UsageError, match="already invalidated"):
        app.memories.correct(old.id, "deploys need no vpn")
    assert len(app.store.list(include_invalid=True)) == 1


def test_invalidating_twice_leaves_the_first_reason_and_time(fts_config, app):
    memory = app.store.add("the office wifi is acme-guest").memory
    first = app.memories.invalidate(memory.id, "the office closed")
    again = app.memories.invalidate(memory.id, "another reason")
    assert isinstance(again, AlreadyInvalid) and again.reason == "the office closed"
    assert app.store.get(memory.id).invalidated_at == first.memory.invalidated_at
    assert app.memories.delete(memory.id[:8]) == memory.id
    assert app.store.list(include_invalid=True) == []
