"""Two stores open in one process never see each other's rows (issue 9 item 4)."""

from __future__ import annotations

import pytest

from llmem.db.models import Event, Memory, UnboundModelError
from llmem.db.settings import get_setting, set_setting
from llmem.pipeline.events import claim_event, record_event
from llmem.search import Searcher, SearchOptions
from llmem.store import Store


@pytest.fixture
def two_stores(tmp_path):
    first = Store.open(tmp_path / "a.db", vec_enabled=False)
    second = Store.open(tmp_path / "b.db", vec_enabled=False)
    yield first, second
    first.close()
    second.close()


def fill(store: Store, word: str) -> list[str]:
    """Two related memories, an event with its cursor, a setting: every kind of row."""
    one = store.add(f"the {word} service deploys from main", project=word).memory
    two = store.add(f"the {word} service runs on port 8080", project=word).memory
    store.relate(one.id, two.id, "related_to")
    record_event(store, "opencode", f"ses_{word}", "idle")
    store.models.SessionCursor.create(adapter="opencode", session_id=f"ses_{word}", cursor=word,
                                      updated_at=0.0)
    with store.db.atomic():
        set_setting(store.db, "owner", word)
    return [one.id, two.id]


def test_each_store_reads_and_writes_only_its_own_rows(two_stores):
    first, second = two_stores
    # Interleaved, with the second store opened last: a process-wide binding would send
    # everything to it.
    ids_a = fill(first, "alpha")
    ids_b = fill(second, "beta")

    for store, own, other, word in ((first, ids_a, ids_b, "alpha"), (second, ids_b, ids_a, "beta")):
        assert {m.id for m in store.list()} == set(own)
        assert store.get(own[0][:8]).project == word
        assert not store.models.Memory.select().where(store.models.Memory.id.in_(other)).exists()
        hits = Searcher(store, None).search("service", SearchOptions(mode="fts", track=True)).hits
        assert {h.memory.id for h in hits} == set(own)
        assert [(r.source_id, r.target_id) for r in store.relations_of(own)] == [(own[0], own[1])]
        relation = store.models.Relation.get()
        assert relation.source.id == own[0] and type(relation.source) is store.models.Memory
        assert [e.session_id for e in store.models.Event.select()] == [f"ses_{word}"]
        assert [c.cursor for c in store.models.SessionCursor.select()] == [word]
        assert get_setting(store.db, "owner") == word
        assert store.stats()["memories"] == 2 and store.stats()["relations"] == 1

    first.update(ids_a[0], summary="alpha deploys")
    assert second.models.Memory.get(second.models.Memory.id == ids_b[0]).summary is None
    assert first.get(ids_a[0]).summary == "alpha deploys"
    event = second.models.Event.get()
    assert claim_event(first, event.id) is not None  # alpha's own event 1, not beta's
    assert second.models.Event.get().status == "pending"


def test_the_same_content_is_new_in_each_store(two_stores):
    first, second = two_stores
    assert first.add("use uv, not pip").created
    assert second.add("use uv, not pip").created
    assert first.stats()["memories"] == second.stats()["memories"] == 1


def test_a_query_on_a_declared_model_fails_loudly(two_stores):
    with pytest.raises(UnboundModelError, match="store.models.Memory"):
        Memory.get_or_none(Memory.id == "x")
    with pytest.raises(UnboundModelError, match="store.models"):
        Event.select().count()
    with pytest.raises(UnboundModelError, match="store.models.Event"):
        Event.create(adapter="opencode", session_id="s", kind="idle", detected_at=0.0)
