import json
import sqlite3

import pytest

from llmem.db.connection import open_database
from llmem.db.derived import text_hash
from llmem.db.migrations import MIGRATIONS, applied_migrations
from llmem.db.packed_text import register_function
from llmem.errors import AmbiguousId, NotFound, UsageError
from llmem.providers.embedders import OllamaEmbedder
from llmem.search import Searcher, SearchOptions
from llmem.store import Store, content_hash
from llmem.vectors import embed_pending, embedding_text, pending_query, store_vectors


@pytest.fixture
def store(store_url):
    """A store on each backend (conftest.py `store_url`: SQLite, and Postgres marked backend)."""
    s = Store.open(store_url)
    yield s
    s.close()


def fts(store, text):
    return [h.memory.content for h in Searcher(store, None).search(text, SearchOptions(mode="fts", track=False)).hits]


def test_add_dedupes_exact_content_in_the_same_scope(store):
    Memory = store.models.Memory
    first = store.add("Use  Postgres for the API", "decision")
    again = store.add("use postgres for the api", "decision")
    other_project = store.add("Use Postgres for the API", "decision", project="/repo/b")
    assert first.created and not again.created and other_project.created
    assert again.memory.id == first.memory.id
    assert Memory.select().count() == 2


def test_unknown_type_and_bad_confidence_are_rejected(store):
    Memory = store.models.Memory
    with pytest.raises(UsageError, match="unknown memory type"):
        store.add("x", "opinion")
    with pytest.raises(UsageError, match="out of range"):
        store.add("x", "fact", confidence=1.5)
    with pytest.raises(UsageError, match="empty"):
        store.add("   ", "fact")
    assert Memory.select().count() == 0


def test_id_prefixes(store):
    ids = [store.add(f"memory {i}", memory_id=f"abcd{i}000-0000-4000-8000-00000000000{i}").memory.id
           for i in range(2)]
    assert store.resolve_id(ids[0][:6]) == ids[0]
    with pytest.raises(AmbiguousId) as info:
        store.resolve_id("abcd")
    assert ids[0] in str(info.value) and ids[1] in str(info.value)
    with pytest.raises(UsageError, match="too short"):
        store.resolve_id("abc")
    with pytest.raises(NotFound):
        store.resolve_id("ffff")
    with pytest.raises(NotFound):
        store.resolve_id("ab'; DROP TABLE memory; --")


def test_delete_removes_relations_on_both_sides(store):
    Memory, Relation = store.models.Memory, store.models.Relation
    a = store.add("alpha").memory
    b = store.add("beta").memory
    c = store.add("gamma").memory
    store.relate(a.id, b.id, "supersedes")
    store.relate(c.id, a.id, "related_to")
    assert store.relate(a.id, b.id, "supersedes") is False
    store.delete(a.id)
    assert Relation.select().count() == 0
    assert Memory.select().count() == 2
    assert fts(store, "alpha") == []


def test_update_and_invalidate(store):
    m = store.add("the cache uses redis", "fact").memory
    store.update(m.id[:8], content="the cache uses memcached", metadata={"k": 1})
    assert fts(store, "redis") == []
    assert fts(store, "memcached") == ["the cache uses memcached"]
    store.invalidate(m.id, "moved to a CDN")
    fresh = store.get(m.id)
    assert fresh.invalidated_at is not None
    assert fresh.metadata == {"k": 1, "invalidation_reason": "moved to a CDN"}
    assert fts(store, "memcached") == []
    with pytest.raises(UsageError):
        store.invalidate(m.id, " ")


@pytest.mark.parametrize("query, content", [
    ("request", "the router calls handle_request for every call"),
    ("function", "replace the helper with correctFunction in the handler"),
    ("handler", "the bug was in handler.py line 42"),
    ("handle_request", "the router calls handle_request for every call"),
    ("correctFunction", "replace the helper with correctFunction in the handler"),
])
def test_code_identifiers_are_found_by_their_parts(store, query, content):
    for text in ("the router calls handle_request for every call",
                 "replace the helper with correctFunction in the handler",
                 "the bug was in handler.py line 42", "unrelated memory about cats"):
        store.add(text)
    assert content in fts(store, query)


@pytest.mark.parametrize("query", ['"unbalanced', "a -b", "*", "x:y", "((", "NEAR(a b)",
                                   "'; DROP TABLE memory; --", "AND OR NOT", "", "🙂", "col:value*"])
def test_any_query_text_just_searches(store, query):
    Memory = store.models.Memory
    store.add("a memory about tables and values")
    fts(store, query)  # must not raise
    assert Memory.select().count() == 1


def test_migrations_are_recorded_and_an_old_schema_upgrades(tmp_path):
    path = tmp_path / "old.db"
    db = open_database(path)
    assert applied_migrations(db) == [name for name, _ in MIGRATIONS]
    db.close()
    # Simulate a database made before the later migrations existed.
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX recall_event_query")
    conn.execute("DELETE FROM schema_migration WHERE name = '0003_recall_event_query_index'")
    conn.commit()
    conn.close()
    db = open_database(path)
    assert "0003_recall_event_query_index" in applied_migrations(db)
    names = {r[0] for r in db.execute_sql("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "recall_event_query" in names
    db.close()


def test_recall_events_are_recorded_and_get_is_read_only(store):
    RecallEvent = store.models.RecallEvent
    m = store.add("the deploy script lives in ops/deploy.sh").memory
    store.get(m.id)
    assert store.get(m.id).access_count == 0
    Searcher(store, None).search("deploy", SearchOptions(mode="fts"))
    fresh = store.get(m.id)
    assert fresh.access_count == 1 and fresh.accessed_at is not None
    event = RecallEvent.get()
    assert event.memory_id == m.id and event.rank == 1 and event.origin == "search"
    Searcher(store, None).search("deploy", SearchOptions(mode="fts", track=False))
    assert store.get(m.id).access_count == 1


def test_descriptive_metadata_is_searchable_structural_is_not(store):
    said = store.add("I finally adopted a dog", "conversation",
                     metadata={"speaker": "Caroline", "session_id_hint": "zzqx", "file": "notes/petCare.md"}).memory
    assert fts(store, "Caroline") == [said.content]
    assert fts(store, "care") == [said.content]  # the camelCase parts of a file name too
    assert fts(store, "zzqx") == []
    store.update(said.id, metadata={"speaker": "Melanie"})
    assert fts(store, "Melanie") == [said.content] and fts(store, "Caroline") == []


# ---- vectors never stale (issue 9 item 6) -------------------------------------------------------

def pending_ids(store, embedder):
    return [m.id for m in pending_query(store, embedder.identity)]


@pytest.fixture
def embedded_pair(store, model_server):
    """Two memories, both embedded by the fake Ollama server."""
    embedder = OllamaEmbedder("nomic-embed-text", model_server.url, 5.0, 8)
    gateway = store.add("the gateway listens on port 8080").memory
    deploys = store.add("deploys run from the main branch").memory
    assert embed_pending(store, embedder) == 2
    assert pending_ids(store, embedder) == [] and store.stats()["pending_embedding"] == 0
    return embedder, gateway, deploys


@pytest.mark.parametrize("change", [
    {"summary": "Gateway port"},
    {"metadata": {"speaker": "Caroline"}},
    {"content": "the gateway listens on port 9090"},
])
def test_any_change_to_the_embedded_text_makes_exactly_that_memory_pending(store, model_server,
                                                                           embedded_pair, change):
    embedder, gateway, deploys = embedded_pair
    updated = store.update(gateway.id, **change)
    assert pending_ids(store, embedder) == [gateway.id]
    assert store.stats()["pending_embedding"] == 1
    sent = len(model_server.embed_requests())
    assert embed_pending(store, embedder) == 1
    (request,) = model_server.embed_requests()[sent:]
    assert request["input"] == [embedding_text(updated)]
    assert pending_ids(store, embedder) == [] and store.stats()["pending_embedding"] == 0
    stored = store.models.Embedding.get(store.models.Embedding.memory == gateway.id)
    assert stored.content_hash == text_hash(embedding_text(updated))


def test_a_change_outside_the_embedded_text_leaves_the_vector_current(store, embedded_pair):
    embedder, gateway, _ = embedded_pair
    store.update(gateway.id, confidence=0.9, metadata={"adapter": "opencode"})  # structural metadata
    assert pending_ids(store, embedder) == []


def test_a_vector_made_from_text_that_changed_meanwhile_stays_pending(store, embedded_pair):
    embedder, gateway, _ = embedded_pair
    before = store.get(gateway.id)
    store.update(gateway.id, summary="Gateway port")
    # Embedded from the memory as it was loaded (the HTTP call runs outside any transaction).
    store_vectors(store, embedder, [before], embedder.embed_documents([embedding_text(before)]))
    assert pending_ids(store, embedder) == [gateway.id]


@pytest.mark.parametrize("flag, value", [("--summary", "Gateway port"),
                                         ("--metadata", '{"speaker": "Caroline"}'),
                                         ("--content", "the gateway listens on port 9090")])
def test_update_with_the_embedder_down_leaves_the_memory_for_embed_pending(cli, ollama_config, flag, value):
    code, out, err = cli("add", "--content", "the gateway listens on port 8080", "--json")
    assert code == 0, err
    memory_id = json.loads(out)["id"]
    cli("add", "--content", "deploys run from the main branch")
    assert json.loads(cli("stats", "--json")[1])["pending_embedding"] == 0
    ollama_config.mode = "error"
    code, _, err = cli("update", memory_id, flag, value)
    assert code == 0, err
    assert json.loads(cli("stats", "--json")[1])["pending_embedding"] == 1
    ollama_config.mode = "ok"
    sent = len(ollama_config.embed_requests())
    code, out, err = cli("embed", "--pending", "--json")
    assert code == 0 and json.loads(out)["embedded"] == 1, err
    (request,) = ollama_config.embed_requests()[sent:]
    assert (json.loads(value)["speaker"] if flag == "--metadata" else value) in request["input"][0]
    assert json.loads(cli("stats", "--json")[1])["pending_embedding"] == 0


def test_migration_0008_marks_embeddings_of_changed_text_pending(tmp_path, model_server):
    path = tmp_path / "old.db"
    embedder = OllamaEmbedder("nomic-embed-text", model_server.url, 5.0, 8)
    with Store.open(path) as store:
        kept = store.add("the gateway listens on port 8080").memory
        renamed = store.add("deploys run from the main branch").memory
        embed_pending(store, embedder)
    # The schema before 0008: embeddings recorded the content hash; memory had no embed_hash.
    # Afterwards `renamed` got a summary, which the old scheme never noticed.
    conn = sqlite3.connect(path)
    register_function(conn)  # the FTS triggers index llmem_text(content) (migration 0024)
    conn.execute("UPDATE embedding SET content_hash = "
                 "(SELECT content_hash FROM memory WHERE memory.id = embedding.memory_id)")
    conn.execute("UPDATE memory SET summary = 'Deploys', updated_at = updated_at + 60 WHERE id = ?",
                 (renamed.id,))
    conn.execute("ALTER TABLE memory DROP COLUMN embed_hash")
    conn.execute("DELETE FROM schema_migration WHERE name = '0008_hash_embedded_text'")
    conn.commit()
    conn.close()
    with Store.open(path) as store:
        assert "0008_hash_embedded_text" in applied_migrations(store.db)
        assert pending_ids(store, embedder) == [renamed.id]
        assert store.stats()["pending_embedding"] == 1
        assert store.get(kept.id).embed_hash == text_hash(embedding_text(store.get(kept.id)))
        assert embed_pending(store, embedder) == 1 and pending_ids(store, embedder) == []


def test_migration_0010_adds_the_event_owner_to_an_old_store(tmp_path):
    path = tmp_path / "old.db"
    with Store.open(path) as store:
        store.models.Event.create(adapter="copilot", session_id="s1", kind="idle", status="running",
                                  detected_at=1.0, started_at=2.0)
    conn = sqlite3.connect(path)
    for column in ("owner_pid", "owner_started_at", "owner_host"):
        conn.execute(f"ALTER TABLE event DROP COLUMN {column}")
    conn.execute("DELETE FROM schema_migration WHERE name = '0010_event_owner'")
    conn.commit()
    conn.close()
    with Store.open(path) as store:
        assert "0010_event_owner" in applied_migrations(store.db)
        event = store.models.Event.get()
        assert (event.status, event.owner_pid, event.owner_host) == ("running", None, None)


def test_update_of_descriptive_metadata_re_embeds_at_once_like_content(cli, ollama_config):
    code, out, err = cli("add", "--content", "I finally adopted a dog", "--json")
    memory_id = json.loads(out)["id"]
    sent = len(ollama_config.embed_requests())
    code, _, err = cli("update", memory_id, "--metadata", '{"speaker": "Caroline"}')
    assert code == 0, err
    (request,) = ollama_config.embed_requests()[sent:]
    assert request["input"] == ["search_document: Caroline: I finally adopted a dog"]
    assert json.loads(cli("stats", "--json")[1])["pending_embedding"] == 0


# ---- writes outside add/update keep the derived columns in sync (issue 9 item 4) -----------------

def test_dream_journal_writes_and_undo_rederive_hints_and_hashes(store, embedded_pair):
    from llmem.dream.journal import Journal, finish_run, start_run, undo_run

    embedder, gateway, _ = embedded_pair
    run = start_run(store, "dream", ["deep"])
    with store.db.atomic():
        Journal(store, run).update("deep", "merge", gateway.id,
                                   {"content": "the apiGateway listens on port 9090"})
    finish_run(store, run, {})
    merged = store.get(gateway.id)
    assert merged.content_hash == content_hash("the apiGateway listens on port 9090")
    assert fts(store, "gateway") == [merged.content]  # the camelCase part, from the new hints
    assert pending_ids(store, embedder) == [gateway.id]

    undo_run(store, run.id)
    restored = store.get(gateway.id)
    assert restored.content == gateway.content and restored.hints == gateway.hints
    assert restored.embed_hash == gateway.embed_hash and pending_ids(store, embedder) == []


def test_import_derives_hints_and_the_embedded_text_hash(store, tmp_path):
    from llmem.exchange import apply_import, plan_import

    memory = {"id": "0b6a4f4e-8f0e-4c1e-9a43-2f7c1f0f6a11", "type": "fact",
              "content": "call correctFunction() instead", "summary": "the fix",
              "metadata": {"file": "handler.py"}, "created_at": "2026-01-02T03:04:05Z"}
    apply_import(store, plan_import(store, {"version": 1, "memories": [memory], "relations": []}))
    stored = store.get(memory["id"])
    assert fts(store, "correct function") == [stored.content]
    assert stored.embed_hash == text_hash(embedding_text(stored))
    assert stored.content_hash == content_hash(stored.content)


def test_access_tracking_is_not_a_change_of_the_memory(store):
    memory = store.add("the deploy script lives in ops/deploy.sh").memory
    Searcher(store, None).search("deploy", SearchOptions(mode="fts"))
    seen = store.get(memory.id)
    assert seen.access_count == 1 and seen.updated_at == memory.updated_at
