"""Ordered, recorded schema migrations. Append new steps; never edit an applied one."""

from __future__ import annotations

import time
from collections.abc import Callable

from .models import bound_models
from .space import reclaim_space

# Steps create tables through the models bound to the database being migrated (the
# module-level models are unbound declarations).


def _create_core_tables(db) -> None:
    models = bound_models(db)
    db.create_tables([models.Memory, models.Relation, models.Embedding, models.RecallEvent,
                      models.Setting], safe=True)


def _create_fts(db) -> None:
    # External-content FTS5 over memory(seq): the text lives once, in `memory`.
    # Triggers keep it in sync for every writer, whatever the driver.
    for sql in (
        """CREATE VIRTUAL TABLE memory_fts USING fts5(
               content, summary, hints,
               content='memory', content_rowid='seq',
               tokenize='porter unicode61 remove_diacritics 2')""",
        """CREATE TRIGGER memory_fts_ai AFTER INSERT ON memory BEGIN
               INSERT INTO memory_fts(rowid, content, summary, hints)
               VALUES (new.seq, new.content, new.summary, new.hints);
           END""",
        """CREATE TRIGGER memory_fts_ad AFTER DELETE ON memory BEGIN
               INSERT INTO memory_fts(memory_fts, rowid, content, summary, hints)
               VALUES ('delete', old.seq, old.content, old.summary, old.hints);
           END""",
        """CREATE TRIGGER memory_fts_au AFTER UPDATE OF content, summary, hints ON memory BEGIN
               INSERT INTO memory_fts(memory_fts, rowid, content, summary, hints)
               VALUES ('delete', old.seq, old.content, old.summary, old.hints);
               INSERT INTO memory_fts(rowid, content, summary, hints)
               VALUES (new.seq, new.content, new.summary, new.hints);
           END""",
        "INSERT INTO memory_fts(memory_fts) VALUES ('rebuild')",
    ):
        db.execute_sql(sql)


def _index_recall_queries(db) -> None:
    db.execute_sql("CREATE INDEX IF NOT EXISTS recall_event_query ON recall_event(memory_id, query_hash)")


def _create_dream_tables(db) -> None:
    models = bound_models(db)
    db.create_tables([models.DreamRun, models.DreamAction], safe=True)


def _create_event_table(db) -> None:
    db.create_tables([bound_models(db).Event], safe=True)


def _create_session_tables(db) -> None:
    models = bound_models(db)
    db.create_tables([models.SessionCursor, models.LlmUsage], safe=True)


def _index_descriptive_metadata(db) -> None:
    # Recompute every memory's hints now that they carry its descriptive metadata too;
    # the update trigger re-indexes each changed row.
    import json

    from .fts import index_hints

    rows = db.execute_sql("SELECT seq, content, summary, metadata, hints FROM memory").fetchall()
    for seq, content, summary, metadata, hints in rows:
        fresh = index_hints(content, summary, json.loads(metadata) if metadata else None)
        if fresh != hints:
            db.execute_sql("UPDATE memory SET hints = ? WHERE seq = ?", (fresh, seq))


def _hash_embedded_text(db) -> None:
    # An embedding recorded the hash of the memory's content, but the embedded text also
    # holds its summary and descriptive metadata, so changing those left a stale vector that
    # `embed --pending` never found. Now memory.embed_hash is the hash of the text its vector
    # must be made from and an embedding records the hash of the text it was made from. An
    # old embedding is trusted only when it was made from the same content at or after the
    # memory's last change; every other one is marked stale ("" matches no memory) and is
    # re-embedded by `embed --pending`. Its vector serves search until then: the vec0 index
    # is derived from the embedding rows, which keep their vectors.
    import json

    from .derived import text_hash, text_to_embed

    columns = {row[1] for row in db.execute_sql("PRAGMA table_info(memory)")}
    if "embed_hash" not in columns:
        db.execute_sql("ALTER TABLE memory ADD COLUMN embed_hash TEXT")
    rows = db.execute_sql("SELECT seq, content, summary, metadata FROM memory").fetchall()
    db.cursor().executemany("UPDATE memory SET embed_hash = ? WHERE seq = ?", [
        (text_hash(text_to_embed(content, summary, json.loads(metadata) if metadata else None)), seq)
        for seq, content, summary, metadata in rows])
    db.execute_sql(
        "UPDATE embedding SET content_hash = COALESCE((SELECT m.embed_hash FROM memory m "
        "WHERE m.id = embedding.memory_id AND m.content_hash = embedding.content_hash "
        "AND embedding.created_at >= m.updated_at), '')")


def _create_watch_session_table(db) -> None:
    # The watcher's per-session state (llmem/pipeline/watcher.py SavedStates): what it emitted, so a
    # restart announces no session twice and catches up on what was written meanwhile.
    db.execute_sql("""CREATE TABLE IF NOT EXISTS watch_session (
                          adapter TEXT NOT NULL,
                          session_id TEXT NOT NULL,
                          idle_reply TEXT,
                          compacting INTEGER NOT NULL DEFAULT 0,
                          ended INTEGER NOT NULL DEFAULT 0,
                          ended_turn TEXT,
                          seen_compaction_id TEXT,
                          updated_at REAL NOT NULL,
                          PRIMARY KEY (adapter, session_id))""")


def _record_event_owner(db) -> None:
    # Who runs an event (pid, that process's start time, host), set when it is claimed: a
    # running event whose worker died on this host (kill -9, power loss) is requeued at once
    # instead of after pipeline.running_timeout_minutes. A fresh store's event table already
    # has the columns (0005 creates it from the model).
    columns = {row[1] for row in db.execute_sql("PRAGMA table_info(event)")}
    for name, kind in (("owner_pid", "INTEGER"), ("owner_started_at", "REAL"), ("owner_host", "TEXT")):
        if name not in columns:
            db.execute_sql(f"ALTER TABLE event ADD COLUMN {name} {kind}")


def _stage_grounded_evidence(db) -> None:
    # recall_event.staged_by marks the rows a grounded backfill staged (its rollback deletes
    # exactly those); recall_query keeps each user query's redacted text for the shadow trial.
    columns = {row[1] for row in db.execute_sql("PRAGMA table_info(recall_event)")}
    if "staged_by" not in columns:
        db.execute_sql("ALTER TABLE recall_event ADD COLUMN staged_by TEXT")
    db.execute_sql("CREATE INDEX IF NOT EXISTS recall_event_staged ON recall_event(staged_by) "
                   "WHERE staged_by IS NOT NULL")
    db.create_tables([bound_models(db).RecallQuery], safe=True)


def _add_memory_version(db) -> None:
    # memory.version counts the writes of a memory (store.py and write_memory_columns bump
    # it): the viewer's edit forms carry it, and a form loaded before a concurrent change is
    # refused instead of writing its stale values back. A fresh store has it from the model.
    columns = {row[1] for row in db.execute_sql("PRAGMA table_info(memory)")}
    if "version" not in columns:
        db.execute_sql("ALTER TABLE memory ADD COLUMN version INTEGER NOT NULL DEFAULT 1")


def _record_origin_trust(db) -> None:
    # memory.trust: whose words a memory holds (llmem/trust.py). Rows written before it are
    # given the trust their source and metadata say (trust_of_source), as an export without
    # the field is on import. A fresh store's memory table already has the column (0001).
    import json

    from ..trust import trust_of_source

    columns = {row[1] for row in db.execute_sql("PRAGMA table_info(memory)")}
    if "trust" not in columns:
        db.execute_sql("ALTER TABLE memory ADD COLUMN trust TEXT NOT NULL DEFAULT 'agent'")
    rows = db.execute_sql("SELECT seq, source, metadata, project FROM memory").fetchall()
    db.cursor().executemany("UPDATE memory SET trust = ? WHERE seq = ?", [
        (trust_of_source(source, json.loads(metadata) if metadata else None, project), seq)
        for seq, source, metadata, project in rows])


def _add_episodes(db) -> None:
    # session_cursor.episode_cursor: how far each session was written as episodes
    # (capture/episodes.py); a fresh store's table already has it (0006 creates it from the
    # model). The index serves the retention and the session page's episode reads.
    columns = {row[1] for row in db.execute_sql("PRAGMA table_info(session_cursor)")}
    if "episode_cursor" not in columns:
        db.execute_sql("ALTER TABLE session_cursor ADD COLUMN episode_cursor TEXT")
    db.execute_sql("CREATE INDEX IF NOT EXISTS memory_source_created ON memory(source, created_at)")


def _log_vector_changes(db) -> None:
    # vector_change: which memories' vectors changed, in commit order, whoever wrote them
    # (triggers, so a bulk executemany is logged too). The memory-mapped vector file
    # (db/vector_file.py) records the last id it holds and catches up from the ids above it.
    for sql in (
        "CREATE TABLE IF NOT EXISTS vector_change ("
        "id INTEGER PRIMARY KEY AUTOINCREMENT, memory_id TEXT NOT NULL)",
        """CREATE TRIGGER IF NOT EXISTS embedding_change_ai AFTER INSERT ON embedding BEGIN
               INSERT INTO vector_change(memory_id) VALUES (new.memory_id);
           END""",
        """CREATE TRIGGER IF NOT EXISTS embedding_change_au AFTER UPDATE OF vector, model, dim
           ON embedding BEGIN
               INSERT INTO vector_change(memory_id) VALUES (new.memory_id);
           END""",
        """CREATE TRIGGER IF NOT EXISTS embedding_change_ad AFTER DELETE ON embedding BEGIN
               INSERT INTO vector_change(memory_id) VALUES (old.memory_id);
           END""",
        # Which store a vector file belongs to: a store recreated in its place gets another.
        "INSERT OR IGNORE INTO setting(key, value) VALUES ('vector_store_token', lower(hex(randomblob(16))))",
    ):
        db.execute_sql(sql)


def _bulk_indexes(db) -> None:
    # The FTS update trigger fired whenever an UPDATE named content, summary or hints, so a
    # dream's decay (which wrote hints unchanged) deleted and re-added each row in the FTS
    # index; now it re-indexes only a row whose text really changed. The viewer's lists sort
    # by created_at (newest first) and promotion groups every recall by memory: both were scans.
    db.execute_sql("DROP TRIGGER IF EXISTS memory_fts_au")
    db.execute_sql("""CREATE TRIGGER memory_fts_au AFTER UPDATE OF content, summary, hints ON memory
                      WHEN old.content IS NOT new.content OR old.summary IS NOT new.summary
                           OR old.hints IS NOT new.hints BEGIN
                          INSERT INTO memory_fts(memory_fts, rowid, content, summary, hints)
                          VALUES ('delete', old.seq, old.content, old.summary, old.hints);
                          INSERT INTO memory_fts(rowid, content, summary, hints)
                          VALUES (new.seq, new.content, new.summary, new.hints);
                      END""")
    # The list's order (newest first) under each of its filters: all, not invalidated, a
    # type, a project (IS NULL is an equality for the index, so a page is read in order).
    for name, columns in (("memory_created", "created_at, seq"),
                          ("memory_current_created", "invalidated_at, created_at, seq"),
                          ("memory_type_created", "type, invalidated_at, created_at, seq"),
                          ("memory_project_created", "project, invalidated_at, created_at, seq")):
        db.execute_sql(f"CREATE INDEX IF NOT EXISTS {name} ON memory({columns})")
    # Promotion's bounds (queries.recall_bounds) group every recall by memory: read in the
    # group's order from this index alone, not through a temp b-tree and a table lookup each.
    db.execute_sql("CREATE INDEX IF NOT EXISTS recall_event_signals "
                   "ON recall_event(memory_id, origin, query_hash, created_at, score)")
    # The overview counts the valid memories by type (from this index alone) and the
    # promoted ones (a few among many).
    db.execute_sql("CREATE INDEX IF NOT EXISTS memory_current_type ON memory(invalidated_at, type)")
    db.execute_sql("CREATE INDEX IF NOT EXISTS memory_promoted ON memory(promoted_at) WHERE promoted_at IS NOT NULL")


def _viewer_indexes(db) -> None:
    # The viewer at 100k memories (bench/ui.py). Its "valid" count subtracts the expiring and
    # the superseded memories from the current ones (ui/pages/memories.py): few rows carry
    # valid_until, and the supersedes links are read by type, not by scanning every relation.
    db.execute_sql("CREATE INDEX IF NOT EXISTS memory_expiring ON memory(invalidated_at, valid_until) WHERE valid_until IS NOT NULL")
    db.execute_sql("CREATE INDEX IF NOT EXISTS relation_type_target ON relation(type, target_id, source_id)")
    # The overview's recalls per day by origin, from the index alone.
    db.execute_sql("CREATE INDEX IF NOT EXISTS recall_event_day ON recall_event(created_at, origin)")
    # promotion_generation: a counter every write that can move a promotion bound bumps (a
    # recall added, changed or removed; a memory invalidated, promoted or deleted: the bounds
    # read nothing else), so the viewer keeps the bounds of 63k recalled memories (aggregating
    # every recall: ~0.1 s of CPU at 100k) until they may have changed
    # (queries.promotion_generation). A decay, which rewrites confidence and metadata of
    # most memories, bumps nothing.
    db.execute_sql("INSERT OR IGNORE INTO setting(key, value) VALUES ('promotion_generation', '0')")
    bump = "UPDATE setting SET value = CAST(value AS INTEGER) + 1 WHERE key = 'promotion_generation';"
    for name, event in (("recall_event_generation_ai", "AFTER INSERT ON recall_event"),
                        ("recall_event_generation_au", "AFTER UPDATE ON recall_event"),
                        ("recall_event_generation_ad", "AFTER DELETE ON recall_event"),
                        ("memory_generation_ad", "AFTER DELETE ON memory"),
                        ("memory_generation_au", "AFTER UPDATE OF invalidated_at, promoted_at ON memory"
                                                 " WHEN old.invalidated_at IS NOT new.invalidated_at"
                                                 " OR old.promoted_at IS NOT new.promoted_at")):
        db.execute_sql(f"CREATE TRIGGER IF NOT EXISTS {name} {event} BEGIN {bump} END")


def _key_by_machine(db) -> None:
    # Several machines may share a store: an event, and the watcher's state of a session,
    # belong to the machine whose agents wrote the session (llmem/machine.py). What is here
    # was written by the machine opening the store now (a SQLite file has one).
    from ..machine import machine_id

    here = machine_id()
    if "machine" not in {row[1] for row in db.execute_sql("PRAGMA table_info(event)")}:
        db.execute_sql("ALTER TABLE event ADD COLUMN machine TEXT")
    db.execute_sql("UPDATE event SET machine = ? WHERE machine IS NULL", (here,))
    db.execute_sql("CREATE INDEX IF NOT EXISTS event_machine_status ON event(machine, status)")
    # The key grows a column: SQLite cannot change a primary key in place.
    db.execute_sql("""CREATE TABLE watch_session_by_machine (
                          machine TEXT NOT NULL,
                          adapter TEXT NOT NULL,
                          session_id TEXT NOT NULL,
                          idle_reply TEXT,
                          compacting INTEGER NOT NULL DEFAULT 0,
                          ended INTEGER NOT NULL DEFAULT 0,
                          ended_turn TEXT,
                          seen_compaction_id TEXT,
                          updated_at REAL NOT NULL,
                          PRIMARY KEY (machine, adapter, session_id))""")
    db.execute_sql("INSERT INTO watch_session_by_machine SELECT ?, adapter, session_id, idle_reply, compacting, "
                   "ended, ended_turn, seen_compaction_id, updated_at FROM watch_session", (here,))
    db.execute_sql("DROP TABLE watch_session")
    db.execute_sql("ALTER TABLE watch_session_by_machine RENAME TO watch_session")


def _key_projects_by_remote(db) -> None:
    # A project is keyed by its repository's remote (paths.project_key), one project on every
    # machine. The memories and cursors of a repository on this machine's disk take its key.
    from .project_keys import rekey_projects

    rekey_projects(db)


def _record_authors_and_visibility(db) -> None:
    # Who wrote each memory and who may read it (a team's store, issue 23). A SQLite file is
    # one user's: its author column stays null; every memory is private until shared.
    # shared_project: the projects whose facts, decisions and procedures a user shares.
    columns = {row[1] for row in db.execute_sql("PRAGMA table_info(memory)")}
    if "author" not in columns:
        db.execute_sql("ALTER TABLE memory ADD COLUMN author TEXT")
    if "visibility" not in columns:
        db.execute_sql("ALTER TABLE memory ADD COLUMN visibility TEXT NOT NULL DEFAULT 'private'")
    db.execute_sql("CREATE TABLE IF NOT EXISTS shared_project (project TEXT NOT NULL, "
                   "author TEXT NOT NULL DEFAULT '', shared_at REAL NOT NULL, PRIMARY KEY (project, author))")


def _compact_vectors(db) -> None:
    # Each vector was stored three times: float32 in `embedding`, again in the sqlite-vec
    # mirror `memory_vec` (which searches stopped reading when the vector file came; its
    # chunks preallocate 1024 vectors each) and in the vector file. Now the table holds int8
    # components and a scale (db/vec.py), the file the same, and the mirror is dropped. The
    # re-encoding logs every vector as changed: no file on disk can hold the new encoding
    # (another VERSION), so the log is dropped too. The space comes back by VACUUM (migrate).
    from .vec import compact_stored_vectors, drop_legacy_index
    from .vector_file import forget_changes

    compact_stored_vectors(db)
    drop_legacy_index(db)
    forget_changes(db)


def _compact_store(db) -> None:
    # A memory's hashes were whole sha256 hex (64 characters) in the row, its index, its
    # embedding row and the journal: ~0.3x the text a store holds. They are compared for
    # equality only, so 16 (derived.HASH_CHARS, 64 bits) are kept everywhere they are stored:
    # the memory's content and embed hashes, the hash each vector records (both cut alike,
    # so no vector becomes pending), the journal's after-images and findings that undo and
    # the dream compare with a memory's hash, and the key an introspected text is found by.
    # Three indexes are the first column of a wider one that serves the same lookups
    # (memory_type_created, memory_project_created, memory_current_created): dropped.
    from .derived import HASH_CHARS

    n = HASH_CHARS
    db.execute_sql(f"UPDATE memory SET content_hash = substr(content_hash, 1, {n}) WHERE length(content_hash) > {n}")
    db.execute_sql(f"UPDATE memory SET embed_hash = substr(embed_hash, 1, {n}) WHERE length(embed_hash) > {n}")
    db.execute_sql(f"UPDATE embedding SET content_hash = substr(content_hash, 1, {n}) WHERE length(content_hash) > {n}")
    for key in ("content_hash", "embed_hash"):
        db.execute_sql(
            f"UPDATE dream_action SET after = json_set(after, '$.{key}', substr(json_extract(after, '$.{key}'), 1, {n})) "
            f"WHERE json_valid(after) AND json_type(after, '$.{key}') = 'text' "
            f"AND length(json_extract(after, '$.{key}')) > {n}")
    db.execute_sql(
        f"UPDATE memory SET metadata = json_set(metadata, '$.text_key', substr(json_extract(metadata, '$.text_key'), 1, {n})) "
        f"WHERE source = 'introspection' AND json_valid(metadata) AND json_type(metadata, '$.text_key') = 'text' "
        f"AND length(json_extract(metadata, '$.text_key')) > {n}")
    for name in REDUNDANT_INDEXES:
        db.execute_sql(f"DROP INDEX IF EXISTS {name}")


def _pack_episode_text(db) -> None:
    # Episodes are most of a store's text, and deflate halves it (db/packed_text.py). The FTS
    # triggers index llmem_text(content), the text of a packed value or a plain one; the
    # episodes stored so far are packed with the triggers away (their text, so their tokens,
    # do not change: the index stays as it is); the column is declared PACKED_TEXT, the type
    # llmem's connections convert back to text on every raw read (no change on disk: its
    # affinity stays TEXT, so the schema text is edited in place, as SQLite documents for
    # changes that leave the stored records alone); the FTS index reads the text through a
    # view for a 'rebuild' or a snippet, so those see the text too.
    from .packed_text import DECLARED_TYPE, SQL_FUNCTION, pack

    for name in ("memory_fts_ai", "memory_fts_ad", "memory_fts_au"):
        db.execute_sql(f"DROP TRIGGER IF EXISTS {name}")
    declared = _declare_packed_content(db, DECLARED_TYPE)
    if declared:
        last = 0
        while True:
            rows = db.execute_sql("SELECT seq, content FROM memory WHERE seq > ? AND source = 'episode' "
                                  "AND typeof(content) = 'text' ORDER BY seq LIMIT 2000", (last,)).fetchall()
            if not rows:
                break
            last = rows[-1][0]
            packed = [(value, seq) for seq, text in rows if not isinstance(value := pack(text), str)]
            db.cursor().executemany("UPDATE memory SET content = ? WHERE seq = ?", packed)
    text = f"{SQL_FUNCTION}(new.content)"
    old = f"{SQL_FUNCTION}(old.content)"
    db.execute_sql(f"""CREATE TRIGGER memory_fts_ai AFTER INSERT ON memory BEGIN
                           INSERT INTO memory_fts(rowid, content, summary, hints)
                           VALUES (new.seq, {text}, new.summary, new.hints);
                       END""")
    db.execute_sql(f"""CREATE TRIGGER memory_fts_ad AFTER DELETE ON memory BEGIN
                           INSERT INTO memory_fts(memory_fts, rowid, content, summary, hints)
                           VALUES ('delete', old.seq, {old}, old.summary, old.hints);
                       END""")
    # Packing a plain row (or unpacking one) changes the stored value, not the text: no re-index.
    db.execute_sql(f"""CREATE TRIGGER memory_fts_au AFTER UPDATE OF content, summary, hints ON memory
                       WHEN (old.content IS NOT new.content AND {old} IS NOT {text})
                            OR old.summary IS NOT new.summary
                            OR old.hints IS NOT new.hints BEGIN
                           INSERT INTO memory_fts(memory_fts, rowid, content, summary, hints)
                           VALUES ('delete', old.seq, {old}, old.summary, old.hints);
                           INSERT INTO memory_fts(rowid, content, summary, hints)
                           VALUES (new.seq, {text}, new.summary, new.hints);
                       END""")


def _declare_packed_content(db, declared: str) -> bool:
    """memory.content declared `declared`, and the FTS index reading its text through the
    view memory_fts_text (llmem_text(content)) for a 'rebuild' or a snippet: True when they
    are, or now are. A SQLite whose schema cannot be edited (a defensive build) keeps TEXT,
    and its store nothing packed."""
    import logging
    import re

    from .packed_text import SQL_FUNCTION

    def schema(name: str) -> str:
        return db.execute_sql("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]

    table, index = schema("memory"), schema("memory_fts")
    edited = {"memory": re.sub(r'("content"\s+)TEXT\b', rf"\g<1>{declared}", table, count=1),
              "memory_fts": index.replace("content='memory'", "content='memory_fts_text'")}
    edits = {name: sql for name, sql in edited.items() if sql != schema(name)}
    if not edits:
        return declared in table
    db.execute_sql("CREATE VIEW IF NOT EXISTS memory_fts_text AS SELECT seq, "
                   f"{SQL_FUNCTION}(content) AS content, summary, hints FROM memory")
    version = db.execute_sql("PRAGMA schema_version").fetchone()[0]
    try:
        db.execute_sql("PRAGMA writable_schema = ON")
        for name, sql in edits.items():
            db.execute_sql("UPDATE sqlite_master SET sql = ? WHERE name = ?", (sql, name))
        db.execute_sql(f"PRAGMA schema_version = {int(version) + 1}")
    except Exception as exc:  # the driver's error family
        logging.getLogger(__name__).warning("episode text stays unpacked: the schema cannot be edited (%s)", exc)
        return False
    finally:
        db.execute_sql("PRAGMA writable_schema = OFF")
    return True


def content_is_packed(db) -> bool:
    """Whether memory.content reads packed values back (migration 0024 declared it so)."""
    from .packed_text import DECLARED_TYPE

    row = db.execute_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'memory'").fetchone()
    return bool(row) and f'"content" {DECLARED_TYPE}' in row[0]


def _fit_fts_leaves(db) -> None:
    # FTS5 writes its index as leaves of `pgsz` bytes, each a row of memory_fts_data. At its
    # default (4050) a leaf fills a page to the byte, so the index's two small records (the
    # averages and the segment structure, rows 1 and 10) had a page of their own: 4 KB a
    # store, 0.1x the text of a small one. At fts.LEAF_BYTES they sit beside the first leaf.
    # Leaves written from now on take the size; a first backfill rewrites the whole index.
    from .fts import LEAF_BYTES

    db.execute_sql("INSERT INTO memory_fts(memory_fts, rank) VALUES ('pgsz', ?)", (LEAF_BYTES,))


def _context_indexes(db) -> None:
    # A session start reads each kind's best current memories, the project's before the
    # global ones (context.py core_memories, state_memories): one ordered walk per (type,
    # scope) that stops at its limit. Sorting every match instead cost 1.1 s a kind at 1M.
    for sql in CONTEXT_INDEXES:
        db.execute_sql(sql)


# Shared with the PostgreSQL store's pg0014 (the same partial indexes there).
CONTEXT_INDEXES = (
    "CREATE INDEX IF NOT EXISTS memory_core_rank ON memory(type, project, confidence, updated_at) "
    "WHERE invalidated_at IS NULL",
    "CREATE INDEX IF NOT EXISTS memory_state_recent ON memory(type, project, updated_at) "
    "WHERE invalidated_at IS NULL",
)


# Indexes whose column leads a wider index on the same table (migration 0023 / pg0009).
REDUNDANT_INDEXES = ("memory_type", "memory_project", "memory_invalidated_at")


# (name, step). Names are recorded in schema_migration; order is the list's order.
MIGRATIONS: list[tuple[str, Callable]] = [
    ("0001_core_tables", _create_core_tables),
    ("0002_memory_fts", _create_fts),
    ("0003_recall_event_query_index", _index_recall_queries),
    ("0004_dream_tables", _create_dream_tables),
    ("0005_event_table", _create_event_table),
    ("0006_session_cursor_llm_usage", _create_session_tables),
    ("0007_index_descriptive_metadata", _index_descriptive_metadata),
    ("0008_hash_embedded_text", _hash_embedded_text),
    ("0009_watch_session", _create_watch_session_table),
    ("0010_event_owner", _record_event_owner),
    ("0011_grounded_evidence", _stage_grounded_evidence),
    ("0014_memory_version", _add_memory_version),
    ("0013_origin_trust", _record_origin_trust),
    ("0012_episodes", _add_episodes),
    ("0016_vector_file", _log_vector_changes),
    ("0015_bulk_indexes", _bulk_indexes),
    ("0019_viewer_indexes", _viewer_indexes),
    ("0020_machines", _key_by_machine),
    ("0021_project_identity", _key_projects_by_remote),
    ("0022_authors_visibility", _record_authors_and_visibility),
    ("0017_compact_vectors", _compact_vectors),
    ("0023_compact_store", _compact_store),
    ("0024_packed_episode_text", _pack_episode_text),
    ("0025_fts_leaf_size", _fit_fts_leaves),
    ("0026_context_indexes", _context_indexes),
]
# Steps that free much of the file: a VACUUM after them gives the space back to the disk.
RECLAIMING = {"0017_compact_vectors", "0023_compact_store"}
# Steps whose rows shrank in place: their pages are part-empty, not free, until a VACUUM.
REPACKING = {"0024_packed_episode_text"}


def applied_migrations(db) -> list[str]:
    db.execute_sql("""CREATE TABLE IF NOT EXISTS schema_migration (
                          name TEXT PRIMARY KEY, applied_at REAL NOT NULL)""")
    return [row[0] for row in db.execute_sql("SELECT name FROM schema_migration ORDER BY rowid")]


def migrate(db) -> list[str]:
    """Apply every migration not yet recorded, each in its own transaction; return their names."""
    done = set(applied_migrations(db))
    ran = []
    for name, step in MIGRATIONS:
        if name in done:
            continue
        with db.atomic():
            # Another process may have migrated while we waited for the write lock.
            if db.execute_sql("SELECT 1 FROM schema_migration WHERE name = ?", (name,)).fetchone():
                continue
            step(db)
            db.execute_sql("INSERT INTO schema_migration(name, applied_at) VALUES (?, ?)",
                           (name, time.time()))
        ran.append(name)
    if REPACKING & set(ran) and db.execute_sql("SELECT 1 FROM memory LIMIT 1").fetchone():
        reclaim_space(db, share=None)  # (a new store has no row to pack: no VACUUM)
    elif RECLAIMING & set(ran):
        reclaim_space(db)
    return ran
