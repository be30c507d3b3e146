"""Issue 18's growth: a store keeps 16-character hashes, no index a wider one serves, a create
journaled by its id and stamp, and a first backfill leaves its FTS index merged and no free
pages. A store made before migration 0023 (pg0009) upgrades in place with nothing lost."""

from __future__ import annotations

import hashlib
import json
import re
import secrets

import pytest
from test_dream_backfill import app, backfill_llm  # noqa: F401 - the fixture and its stand-in LLM

from llmem.db import fts, migrations
from llmem.db.backend import is_postgres
from llmem.db.derived import HASH_CHARS, text_to_embed
from llmem.db.migrations import REDUNDANT_INDEXES
from llmem.db.postgres import migrations as pg_migrations
from llmem.dream.backfill import rollback_backfill, run_backfill
from llmem.dream.journal import Journal, finish_run, start_run, undo_run
from llmem.exchange import apply_import, export_data, plan_import
from llmem.providers.embedders import OllamaEmbedder
from llmem.store import Store, content_hash
from llmem.vectors import embed_pending, pending_query

backend = pytest.mark.backend
STEP = {"sqlite": "0023_compact_store", "postgres": "pg0009_compact_store"}


def old_hash(text: str) -> str:
    """A hash as llmem wrote it before 0023: the whole sha256 hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def old_content_hash(content: str) -> str:
    return old_hash(re.sub(r"\s+", " ", content.strip().lower()))


def applied_migrations(db) -> list[str]:
    return (pg_migrations if is_postgres(db) else migrations).applied_migrations(db)


def index_names(db) -> set[str]:
    if is_postgres(db):
        return {r[0] for r in db.execute_sql("SELECT indexname FROM pg_indexes WHERE tablename = 'memory'")}
    return {r[0] for r in db.execute_sql("SELECT name FROM sqlite_master WHERE type = 'index'")}


def make_old(db, backend_name: str) -> None:
    """Turn a store into one llmem made before the compacting step: every hash whole, the
    journal's creates holding the content hash, the three indexes there, the step not recorded."""
    rows = db.execute_sql("SELECT id, content, summary, metadata, updated_at FROM memory").fetchall()
    for memory_id, content, summary, metadata, updated_at in rows:
        embedded = old_hash(text_to_embed(content, summary, json.loads(metadata or "{}")))
        db.execute_sql("UPDATE memory SET content_hash = ?, embed_hash = ? WHERE id = ?",
                       (old_content_hash(content), embedded, memory_id))
        db.execute_sql("UPDATE embedding SET content_hash = ? WHERE memory_id = ?", (embedded, memory_id))
        db.execute_sql("UPDATE dream_action SET after = ? WHERE op = 'create' AND memory_id = ?",
                       (json.dumps({"content_hash": old_content_hash(content), "updated_at": updated_at}), memory_id))
    for name, column in (("memory_type", "type"), ("memory_project", "project"),
                         ("memory_invalidated_at", "invalidated_at")):
        db.execute_sql(f"CREATE INDEX {name} ON memory({column})")
    db.execute_sql("DELETE FROM schema_migration WHERE name = ?", (STEP[backend_name],))


def test_a_fresh_store_keeps_short_hashes_and_no_index_a_wider_one_serves(store_url):
    with Store.open(store_url) as store:
        memory = store.add("The gateway listens on port 8080", "fact", project="github.com/acme/api").memory
        assert len(memory.content_hash) == HASH_CHARS == len(memory.embed_hash)
        # A fresh id is 16 random hex characters: what a 36-character uuid was in the row, the
        # embedding row, the journal, the vector log and their indexes.
        assert re.fullmatch(r"[0-9a-f]{16}", memory.id)
        ids = {store.add(f"note {n} about the gateway", "fact").memory.id[:8] for n in range(20)}
        assert len(ids) == 20  # random, not time-ordered: the 8 the CLI shows tell them apart
        assert memory.content_hash == content_hash("the   gateway LISTENS on port 8080")
        assert not store.add("the gateway listens on port 8080", "fact", project="github.com/acme/api").created
        assert index_names(store.db).isdisjoint(REDUNDANT_INDEXES)
        assert {"memory_type_created", "memory_project_created", "memory_current_created"} <= index_names(store.db)


def test_a_store_made_before_the_step_upgrades_in_place_with_nothing_lost(store_url, model_server):
    """Dedupe still meets the old rows, no vector becomes pending, a run journaled before the
    step is still undone exactly, and an introspected text is still found by its key."""
    backend_name = "postgres" if store_url.startswith("postgresql") else "sqlite"
    embedder = OllamaEmbedder("nomic-embed-text", model_server.url, 5.0, 8)
    with Store.open(store_url) as store:
        kept = store.add("deploys run from the main branch", "decision", project="p").memory
        run = start_run(store, "backfill", ["backfill"])
        with store.db.atomic():
            added = store.add("the queue retries a job three times", "fact", project="p").memory
            Journal(store, run).create("backfill", "add", added)
        finish_run(store, run, {})
        store.add("null pointer in the handler", "self_assessment", source="introspection",
                  metadata={"text_key": old_hash("p\nnull pointer in the handler")})
        assert embed_pending(store, embedder) == 3
        with store.db.atomic():
            make_old(store.db, backend_name)
        assert len(store.get(kept.id).content_hash) == 64
    with Store.open(store_url) as store:
        assert STEP[backend_name] in applied_migrations(store.db)
        for memory in store.models.Memory.select():
            assert memory.content_hash == content_hash(memory.content)
            assert len(memory.embed_hash) == HASH_CHARS
        assert list(pending_query(store, embedder.identity)) == []  # every vector still current
        assert not store.add("Deploys run from the main branch", "decision", project="p").created
        assert index_names(store.db).isdisjoint(REDUNDANT_INDEXES)
        introspected = store.models.Memory.get(store.models.Memory.source == "introspection")
        assert introspected.metadata["text_key"] == old_hash("p\nnull pointer in the handler")[:HASH_CHARS]
        result = undo_run(store, run.id)
        assert (result.deleted, result.skipped_memories) == (1, [])
        assert {m.content for m in store.models.Memory.select()} == {
            "deploys run from the main branch", "null pointer in the handler"}


def test_an_export_of_an_older_store_keeps_its_vectors_current_on_import(tmp_path, model_server):
    embedder = OllamaEmbedder("nomic-embed-text", model_server.url, 5.0, 8)
    with Store.open(tmp_path / "a.db") as store:
        store.add("the cache holds entries for ten minutes", "fact", summary="cache lifetime")
        embed_pending(store, embedder)
        document = export_data(store, include_embeddings=True)
    for row in document["memories"]:  # as an llmem before 0023 wrote them: whole hashes
        row["content_hash"] = old_content_hash(row["content"])
        row["embedding"]["content_hash"] = old_hash(text_to_embed(row["content"], row["summary"], row["metadata"]))
    with Store.open(tmp_path / "b.db") as store:
        plan = plan_import(store, json.loads(json.dumps(document)))
        assert not plan.errors
        apply_import(store, plan)
        assert store.models.Embedding.select().count() == 1
        assert list(pending_query(store, embedder.identity)) == []


def test_a_backfill_journals_ids_and_stamps_and_leaves_a_compact_store(app):  # noqa: F811
    first = run_backfill(app, llm=backfill_llm())
    assert first.added + first.episodes >= 2
    db = app.store.db
    # One action per session, holding each memory it made as [id, stamp] by kind, and no other.
    actions = db.execute_sql("SELECT op, memory_id, after FROM dream_action WHERE run_id = ?", (first.run_id,)).fetchall()
    assert [(op, memory_id) for op, memory_id, _ in actions] == [("session", None)] * first.sessions
    made = {row[0]: row[1] for row in db.execute_sql("SELECT id, updated_at FROM memory")}
    pairs = [pair for _, _, after in actions for kind in json.loads(after).values() for pair in kind]
    assert len(pairs) == first.added + first.episodes == len(made)
    assert all(made[memory_id] == stamp for memory_id, stamp in pairs)
    assert db.execute_sql("PRAGMA freelist_count").fetchone()[0] == 0
    db.execute_sql("INSERT INTO memory_fts(memory_fts) VALUES ('integrity-check')")
    # An edit since the backfill is still seen: the rollback leaves that memory as it was made.
    Memory = app.store.models.Memory
    edited = Memory.select().where(Memory.source == "episode").first()
    app.store.update(edited.id, content=edited.content + " (checked by hand)")
    result = rollback_backfill(app.store, first.run_id)
    assert result.skipped_memories == [edited.id]
    assert [m.id for m in Memory.select()] == [edited.id]


def test_the_index_is_compacted_only_after_a_write_that_is_much_of_the_store(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        for n in range(40):  # one transaction each: one FTS segment each
            store.add(f"note {n}: the worker {secrets.token_hex(4)} restarts nightly", "fact")
        assert not fts.compact_after_bulk_add(store.db, 5)  # a few beside many: left to FTS5
        assert fts.compact_after_bulk_add(store.db, 40)
        assert store.db.execute_sql("PRAGMA freelist_count").fetchone()[0] == 0
        assert fts.match_count(store.db, fts.match_expression("restarts nightly"), 100) == 40


@pytest.mark.sqlite_only
@pytest.mark.creates_store
def test_the_index_writes_leaves_that_leave_room_for_its_small_records(tmp_path, monkeypatch):
    """At FTS5's default leaf size a leaf fills its page alone, and the index's two small
    records (averages, structure) took a page of their own: migration 0025 sets a leaf size
    that leaves them room beside the first leaf, on a new store and an older one alike."""
    def leaf_size(store):
        return store.db.execute_sql("SELECT v FROM memory_fts_config WHERE k = 'pgsz'").fetchone()

    before = [step for step in migrations.MIGRATIONS if step[0] != "0025_fts_leaf_size"]
    monkeypatch.setattr(migrations, "MIGRATIONS", before)
    with Store.open(tmp_path / "old.db") as store:
        assert leaf_size(store) is None
    monkeypatch.undo()
    for name in ("old.db", "new.db"):
        with Store.open(tmp_path / name) as store:
            assert leaf_size(store) == (fts.LEAF_BYTES,)
            for n in range(150):  # one transaction each: a segment each, merged into one below
                store.add(f"note {n}: the worker {secrets.token_hex(6)} restarts at {secrets.token_hex(3)} nightly", "fact")
            assert fts.compact_after_bulk_add(store.db, 150)
            store.db.execute_sql("VACUUM")  # the rows in order, as a first backfill's compaction leaves them
            pages = store.db.execute_sql("SELECT count(*) FROM dbstat WHERE name = 'memory_fts_data' "
                                         "AND pagetype = 'leaf'").fetchone()[0]
            leaves = store.db.execute_sql("SELECT count(*) FROM memory_fts_data WHERE id > 10").fetchone()[0]
            assert leaves > 2 and pages == leaves
            store.db.execute_sql("INSERT INTO memory_fts(memory_fts) VALUES ('integrity-check')")
            assert fts.match_count(store.db, fts.match_expression("restarts"), 1000) == 150


@backend
def test_on_a_team_store_the_owner_cuts_every_teammates_hashes(servers):
    """Row-level security shows the migrating owner only its own and the shared rows: the step
    must still reach a teammate's private memory, or her next identical note is stored twice."""
    from servers import PG_PASSWORD

    server = servers.postgres()
    url = servers.fresh_database()
    database = url.rsplit("/", 1)[1]
    owner, alice = (f"{name}_{secrets.token_hex(3)}" for name in ("owner", "alice"))
    for role in (owner, alice):
        server.psql(f"CREATE ROLE {role} LOGIN PASSWORD '{PG_PASSWORD}'")
        server.psql(f"GRANT CONNECT ON DATABASE {database} TO {role}")
    server.psql(f"ALTER DATABASE {database} OWNER TO {owner}")
    server.psql(f"GRANT ALL ON SCHEMA public TO {owner}", database=database)
    server.psql(f"GRANT USAGE ON SCHEMA public TO {alice}", database=database)
    Store.open(server.url(database, role=owner)).close()  # the owner (no superuser) makes the schema
    for grant in (f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {alice}",
                  f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {alice}"):
        server.psql(grant, database=database)
    with Store.open(server.url(database, role=alice)) as store:
        note = store.add("alice keeps her scratch notes in notes.md", "preference", project="p").memory
    assert note.visibility == "private"
    # As llmem wrote it before the step (the superuser sees every row).
    server.psql(f"UPDATE memory SET content_hash = '{old_content_hash(note.content)}' WHERE id = '{note.id}'",
                database=database)
    server.psql("DELETE FROM schema_migration WHERE name = 'pg0009_compact_store'", database=database)
    Store.open(server.url(database, role=owner)).close()  # the owner upgrades the store
    stored = server.psql(f"SELECT content_hash FROM memory WHERE id = '{note.id}'", database=database).strip()
    assert stored == content_hash(note.content)
    with Store.open(server.url(database, role=alice)) as store:
        assert not store.add("Alice keeps her scratch notes in notes.md", "preference", project="p").created
        assert store.db.execute_sql("SELECT relforcerowsecurity FROM pg_class WHERE relname = 'memory'").fetchone()[0]
