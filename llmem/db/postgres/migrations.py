"""The Postgres store's schema: frozen DDL, applied in order and recorded.

The SQLite store's early steps build tables from the peewee models of their day; these are
written out once, as they stand, so a later change of a model can never change what an
applied step meant. Append new steps; never edit an applied one. The vector table itself
(`memory_vec`, `vector(dim)` with its HNSW index) is made by db/postgres/vec.py when the
embedder's dimension is known, as vec0's table is on SQLite.
"""

from __future__ import annotations

import time

# Lexical search: one tsvector per memory, generated from its text columns and weighted as
# SQLite's bm25 weights them (content A, summary B, identifier hints C), under a GIN index,
# and the memory's length in words, for db/postgres/fts.py's BM25 (FTS5's formula).
# Words are runs of letters and digits, as FTS5's unicode61 splits them (Postgres's own parser
# keeps `handler.py` or `a-b` whole, so every other character becomes a space first), stemmed
# by the snowball English stemmer with no stopword list: FTS5's porter tokenizer drops no
# word either, and its length counts them all.
TEXT_CONFIG = "llmem_words"
_TEXT_SEARCH = (
    "CREATE TEXT SEARCH DICTIONARY llmem_stem (TEMPLATE = snowball, LANGUAGE = english)",
    f"CREATE TEXT SEARCH CONFIGURATION {TEXT_CONFIG} (COPY = english)",
    f"ALTER TEXT SEARCH CONFIGURATION {TEXT_CONFIG} ALTER MAPPING FOR asciiword, asciihword, "
    "hword_asciipart, word, hword, hword_part, numword, numhword, hword_numpart WITH llmem_stem",
)
_COLUMNS = (("content", "A"), ("coalesce(summary, '')", "B"), ("hints", "C"))
_TSVECTOR = " || ".join(
    f"setweight(to_tsvector('{TEXT_CONFIG}'::regconfig, regexp_replace({column}, '[^[:alnum:]]+', ' ', 'g')), '{weight}')"
    for column, weight in _COLUMNS)
_WORD_COUNT = " + ".join(f"regexp_count({column}, '[[:alnum:]]+')" for column, _ in _COLUMNS)

SCHEMA_0001 = _TEXT_SEARCH + (
    f"""CREATE TABLE memory (
        seq SERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        type TEXT NOT NULL,
        content TEXT NOT NULL,
        summary TEXT,
        hints TEXT NOT NULL DEFAULT '',
        confidence DOUBLE PRECISION NOT NULL DEFAULT 0.7,
        source TEXT NOT NULL DEFAULT 'user',
        project TEXT,
        session_id TEXT,
        metadata TEXT NOT NULL DEFAULT '{{}}',
        content_hash TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        accessed_at DOUBLE PRECISION,
        access_count INTEGER NOT NULL DEFAULT 0,
        valid_from DOUBLE PRECISION,
        valid_until DOUBLE PRECISION,
        invalidated_at DOUBLE PRECISION,
        promoted_at DOUBLE PRECISION,
        embed_hash TEXT,
        version INTEGER NOT NULL DEFAULT 1,
        trust TEXT NOT NULL DEFAULT 'agent',
        search_text tsvector GENERATED ALWAYS AS ({_TSVECTOR}) STORED,
        search_words INTEGER GENERATED ALWAYS AS ({_WORD_COUNT}) STORED)""",
    "CREATE INDEX memory_type ON memory(type)",
    "CREATE INDEX memory_project ON memory(project)",
    "CREATE INDEX memory_session_id ON memory(session_id)",
    "CREATE INDEX memory_content_hash ON memory(content_hash)",
    "CREATE INDEX memory_invalidated_at ON memory(invalidated_at)",
    "CREATE INDEX memory_search_text ON memory USING GIN (search_text)",
    """CREATE TABLE relation (
        id SERIAL PRIMARY KEY,
        source_id TEXT NOT NULL REFERENCES memory(id) ON DELETE CASCADE,
        target_id TEXT NOT NULL REFERENCES memory(id) ON DELETE CASCADE,
        type TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE UNIQUE INDEX relation_source_id_target_id_type ON relation(source_id, target_id, type)",
    "CREATE INDEX relation_target_id ON relation(target_id)",
    """CREATE TABLE embedding (
        memory_id TEXT PRIMARY KEY REFERENCES memory(id) ON DELETE CASCADE,
        model TEXT NOT NULL,
        dim INTEGER NOT NULL,
        vector BYTEA NOT NULL,
        content_hash TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE recall_event (
        id SERIAL PRIMARY KEY,
        memory_id TEXT NOT NULL REFERENCES memory(id) ON DELETE CASCADE,
        query_hash TEXT NOT NULL,
        rank INTEGER NOT NULL,
        score DOUBLE PRECISION NOT NULL,
        origin TEXT NOT NULL DEFAULT 'search',
        created_at DOUBLE PRECISION NOT NULL,
        staged_by TEXT)""",
    "CREATE INDEX recall_event_memory_id ON recall_event(memory_id)",
    "CREATE INDEX recall_event_created_at ON recall_event(created_at)",
    "CREATE INDEX recall_event_query ON recall_event(memory_id, query_hash)",
    "CREATE INDEX recall_event_staged ON recall_event(staged_by) WHERE staged_by IS NOT NULL",
    """CREATE TABLE recall_query (
        query_hash TEXT PRIMARY KEY,
        text TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE TABLE setting (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE dream_run (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL DEFAULT 'dream',
        phases TEXT NOT NULL DEFAULT '',
        status TEXT NOT NULL DEFAULT 'running',
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        undone_at DOUBLE PRECISION,
        summary TEXT NOT NULL DEFAULT '{}',
        error TEXT)""",
    "CREATE INDEX dream_run_started_at ON dream_run(started_at)",
    """CREATE TABLE dream_action (
        id SERIAL PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES dream_run(id) ON DELETE CASCADE,
        phase TEXT NOT NULL,
        kind TEXT NOT NULL,
        op TEXT NOT NULL,
        memory_id TEXT,
        before TEXT,
        after TEXT,
        created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX dream_action_run_id ON dream_action(run_id)",
    "CREATE INDEX dream_action_memory_id ON dream_action(memory_id)",
    """CREATE TABLE event (
        id SERIAL PRIMARY KEY,
        adapter TEXT NOT NULL,
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        detected_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION,
        not_before DOUBLE PRECISION,
        result TEXT,
        owner_pid INTEGER,
        owner_started_at DOUBLE PRECISION,
        owner_host TEXT)""",
    "CREATE INDEX event_session_id ON event(session_id)",
    "CREATE INDEX event_status ON event(status)",
    """CREATE TABLE session_cursor (
        id SERIAL PRIMARY KEY,
        adapter TEXT NOT NULL,
        session_id TEXT NOT NULL,
        project TEXT,
        cursor TEXT,
        introspect_cursor TEXT,
        messages_read INTEGER NOT NULL DEFAULT 0,
        status TEXT NOT NULL DEFAULT 'idle',
        updated_at DOUBLE PRECISION NOT NULL)""",
    "CREATE UNIQUE INDEX session_cursor_adapter_session_id ON session_cursor(adapter, session_id)",
    """CREATE TABLE llm_usage (
        id SERIAL PRIMARY KEY,
        time DOUBLE PRECISION NOT NULL,
        day TEXT NOT NULL,
        task TEXT NOT NULL,
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX llm_usage_day ON llm_usage(day)",
    """CREATE TABLE watch_session (
        adapter TEXT NOT NULL,
        session_id TEXT NOT NULL,
        idle_reply TEXT,
        compacting INTEGER NOT NULL DEFAULT 0,
        ended INTEGER NOT NULL DEFAULT 0,
        ended_turn TEXT,
        seen_compaction_id TEXT,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (adapter, session_id))""",
)


def _key_by_machine(db) -> None:
    # The SQLite store's 0020_machines: events and the watcher's per-session state belong to
    # the machine whose agents wrote the session (llmem/machine.py). Rows already here are
    # given to the machine that migrates; an event of an llmem older than this step stays
    # null, which any machine takes.
    from ...machine import machine_id

    here = machine_id()
    for sql in ("ALTER TABLE event ADD COLUMN machine TEXT",
                "CREATE INDEX event_machine_status ON event(machine, status)",
                "ALTER TABLE watch_session ADD COLUMN machine TEXT"):
        db.execute_sql(sql)
    db.execute_sql("UPDATE event SET machine = ?", (here,))
    db.execute_sql("UPDATE watch_session SET machine = ?", (here,))
    db.execute_sql("ALTER TABLE watch_session ALTER COLUMN machine SET NOT NULL, "
                   "DROP CONSTRAINT watch_session_pkey, ADD PRIMARY KEY (machine, adapter, session_id)")


# A memory's author is the database role that wrote it (the default, current_user, and the
# insert policy's check); it reads its own memories and the shared ones, changes those, and
# deletes only its own. The dream's journal holds memories' text (its before-images): an
# entry is readable where its memory is, and by the role whose run wrote it. The vectors
# (embedding, memory_vec) stay readable by every role: they hold no text, a search's nearest
# seqs are read back through `memory`, which hides the others' private rows, and an index
# rebuilt by one role must hold every memory's vector, not only those it may read.
# FORCE: the tables' owner is a user too. A superuser bypasses all of it, as Postgres does.
VISIBILITY = (
    "ALTER TABLE memory ADD COLUMN author TEXT NOT NULL DEFAULT current_user",
    "ALTER TABLE memory ADD COLUMN visibility TEXT NOT NULL DEFAULT 'private'",
    "CREATE INDEX memory_author_visibility ON memory(author, visibility)",
    "ALTER TABLE dream_action ADD COLUMN author TEXT NOT NULL DEFAULT current_user",
    """CREATE TABLE shared_project (
        project TEXT NOT NULL,
        author TEXT NOT NULL DEFAULT current_user,
        shared_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (project, author))""",
    *(f"ALTER TABLE {table} {change} ROW LEVEL SECURITY"
      for table in ("memory", "dream_action", "shared_project") for change in ("ENABLE", "FORCE")),
    "CREATE POLICY memory_read ON memory FOR SELECT USING (author = current_user OR visibility = 'shared')",
    "CREATE POLICY memory_add ON memory FOR INSERT WITH CHECK (author = current_user)",
    "CREATE POLICY memory_change ON memory FOR UPDATE USING (author = current_user OR visibility = 'shared') "
    "WITH CHECK (author = current_user OR visibility = 'shared')",
    "CREATE POLICY memory_remove ON memory FOR DELETE USING (author = current_user)",
    "CREATE POLICY journal_of_visible ON dream_action USING (author = current_user OR "
    "EXISTS (SELECT 1 FROM memory m WHERE m.id = dream_action.memory_id)) WITH CHECK (author = current_user)",
    "CREATE POLICY shared_projects_read ON shared_project FOR SELECT USING (true)",
    "CREATE POLICY shared_projects_own ON shared_project USING (author = current_user) "
    "WITH CHECK (author = current_user)",
)


def _key_projects_by_remote(db) -> None:
    from ..project_keys import rekey_projects

    rekey_projects(db)


TOTALS = (
    """CREATE TABLE memory_totals (
        id BIGSERIAL PRIMARY KEY,
        author TEXT NOT NULL,
        visibility TEXT NOT NULL,
        rows BIGINT NOT NULL,
        words BIGINT NOT NULL)""",
    "ALTER TABLE memory_totals ENABLE ROW LEVEL SECURITY",
    "ALTER TABLE memory_totals FORCE ROW LEVEL SECURITY",
    "CREATE POLICY memory_totals_read ON memory_totals FOR SELECT USING (author = current_user OR visibility = 'shared')",
    # A teammate's update of a shared memory writes the change of its author's group.
    "CREATE POLICY memory_totals_add ON memory_totals FOR INSERT WITH CHECK (true)",
    "CREATE POLICY memory_totals_fold ON memory_totals FOR DELETE USING (author = current_user OR visibility = 'shared')",
    # Every role that may connect writes memories, hence their totals: no grant to forget.
    "GRANT SELECT, INSERT, DELETE ON memory_totals TO PUBLIC",
    "GRANT USAGE ON SEQUENCE memory_totals_id_seq TO PUBLIC",
    """CREATE FUNCTION llmem_count_memories() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
           IF TG_OP = 'INSERT' THEN
               INSERT INTO memory_totals(author, visibility, rows, words)
               SELECT author, visibility, count(*), coalesce(sum(search_words), 0) FROM came GROUP BY 1, 2;
           ELSIF TG_OP = 'DELETE' THEN
               INSERT INTO memory_totals(author, visibility, rows, words)
               SELECT author, visibility, -count(*), -coalesce(sum(search_words), 0) FROM gone GROUP BY 1, 2;
           ELSE  -- most updates change neither the group nor the length: they add nothing
               INSERT INTO memory_totals(author, visibility, rows, words)
               SELECT author, visibility, sum(r), sum(w) FROM (
                   SELECT author, visibility, -1 AS r, -search_words AS w FROM gone
                   UNION ALL SELECT author, visibility, 1, search_words FROM came) change
               GROUP BY 1, 2 HAVING sum(r) <> 0 OR sum(w) <> 0;
           END IF;
           RETURN NULL;
       END $$""",
    "CREATE TRIGGER memory_totals_insert AFTER INSERT ON memory REFERENCING NEW TABLE AS came "
    "FOR EACH STATEMENT EXECUTE FUNCTION llmem_count_memories()",
    "CREATE TRIGGER memory_totals_update AFTER UPDATE ON memory REFERENCING OLD TABLE AS gone NEW TABLE AS came "
    "FOR EACH STATEMENT EXECUTE FUNCTION llmem_count_memories()",
    "CREATE TRIGGER memory_totals_delete AFTER DELETE ON memory REFERENCING OLD TABLE AS gone "
    "FOR EACH STATEMENT EXECUTE FUNCTION llmem_count_memories()",
)


def _team_speed(db) -> None:
    _run(TOTALS)(db)
    # The memories already there, every author's: the owner sees them all only with the
    # policies set aside (FORCE applies them to it too), inside this step's transaction.
    db.execute_sql("ALTER TABLE memory NO FORCE ROW LEVEL SECURITY")
    db.execute_sql("INSERT INTO memory_totals(author, visibility, rows, words) "
                   "SELECT author, visibility, count(*), coalesce(sum(search_words), 0) FROM memory GROUP BY 1, 2")
    db.execute_sql("ALTER TABLE memory FORCE ROW LEVEL SECURITY")


def _compact_store(db) -> None:
    # The SQLite store's 0023_compact_store: the hashes cut to derived.HASH_CHARS wherever they
    # are stored, and the indexes a wider one serves dropped. Row-level security would let the
    # migrating role (the tables' owner) rewrite only its own and the shared rows: lifted for
    # this transaction's own statements and put back before it commits.
    from ..derived import HASH_CHARS
    from ..migrations import REDUNDANT_INDEXES

    n = HASH_CHARS
    db.execute_sql("ALTER TABLE memory NO FORCE ROW LEVEL SECURITY")
    db.execute_sql("ALTER TABLE dream_action NO FORCE ROW LEVEL SECURITY")
    db.execute_sql(f"UPDATE memory SET content_hash = left(content_hash, {n}) WHERE length(content_hash) > {n}")
    db.execute_sql(f"UPDATE memory SET embed_hash = left(embed_hash, {n}) WHERE length(embed_hash) > {n}")
    db.execute_sql(f"UPDATE embedding SET content_hash = left(content_hash, {n}) WHERE length(content_hash) > {n}")
    for key in ("content_hash", "embed_hash"):
        db.execute_sql(
            f"UPDATE dream_action SET after = jsonb_set(after::jsonb, '{{{key}}}', "
            f"to_jsonb(left(after::jsonb ->> '{key}', {n})))::text "
            f"WHERE jsonb_typeof(after::jsonb) = 'object' "
            f"AND jsonb_typeof(after::jsonb -> '{key}') = 'string' AND length(after::jsonb ->> '{key}') > {n}")
    db.execute_sql(
        f"UPDATE memory SET metadata = jsonb_set(metadata::jsonb, '{{text_key}}', "
        f"to_jsonb(left(metadata::jsonb ->> 'text_key', {n})))::text "
        f"WHERE source = 'introspection' AND jsonb_typeof(metadata::jsonb -> 'text_key') = 'string' "
        f"AND length(metadata::jsonb ->> 'text_key') > {n}")
    db.execute_sql("ALTER TABLE memory FORCE ROW LEVEL SECURITY")
    db.execute_sql("ALTER TABLE dream_action FORCE ROW LEVEL SECURITY")
    for name in REDUNDANT_INDEXES:
        db.execute_sql(f"DROP INDEX IF EXISTS {name}")


def _context_indexes(db) -> None:
    # The SQLite store's 0026_context_indexes: a session start's ordered reads per (type, scope).
    from ..migrations import CONTEXT_INDEXES

    _run(CONTEXT_INDEXES)(db)


def _run(statements):
    def step(db) -> None:
        for sql in statements:
            db.execute_sql(sql)
    return step


# (name, step), in order; recorded in schema_migration. The SQLite store's 0001–0014 are
# one step here: a Postgres store starts at the schema they arrive at.
MIGRATIONS = [
    ("pg0001_schema", _run(SCHEMA_0001)),
    # The SQLite store's 0012_episodes: how far each session was written as episodes.
    ("pg0002_episodes", _run((
        "ALTER TABLE session_cursor ADD COLUMN episode_cursor TEXT",
        "CREATE INDEX memory_source_created ON memory(source, created_at)",
    ))),
    # The SQLite store's 0015_bulk_indexes and 0019_viewer_indexes: the viewer's lists in
    # order under each filter, its counts from indexes, promotion's recall aggregates, and
    # the promotion_generation counter (a statement trigger bumps it once per writing statement).
    ("pg0005_viewer_indexes", _run((
        "CREATE INDEX memory_created ON memory(created_at, seq)",
        "CREATE INDEX memory_current_created ON memory(invalidated_at, created_at, seq)",
        "CREATE INDEX memory_type_created ON memory(type, invalidated_at, created_at, seq)",
        "CREATE INDEX memory_project_created ON memory(project, invalidated_at, created_at, seq)",
        "CREATE INDEX memory_current_type ON memory(invalidated_at, type)",
        "CREATE INDEX memory_promoted ON memory(promoted_at) WHERE promoted_at IS NOT NULL",
        "CREATE INDEX memory_expiring ON memory(invalidated_at, valid_until) WHERE valid_until IS NOT NULL",
        "CREATE INDEX relation_type_target ON relation(type, target_id, source_id)",
        "CREATE INDEX recall_event_signals ON recall_event(memory_id, origin, query_hash, created_at, score)",
        "CREATE INDEX recall_event_day ON recall_event(created_at, origin)",
        "INSERT INTO setting(key, value) VALUES ('promotion_generation', '0') ON CONFLICT (key) DO NOTHING",
        """CREATE FUNCTION llmem_bump_promotion_generation() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               UPDATE setting SET value = (value::bigint + 1)::text WHERE key = 'promotion_generation';
               RETURN NULL;
           END $$""",
        "CREATE TRIGGER recall_event_generation AFTER INSERT OR UPDATE OR DELETE ON recall_event "
        "FOR EACH STATEMENT EXECUTE FUNCTION llmem_bump_promotion_generation()",
        "CREATE TRIGGER memory_generation_delete AFTER DELETE ON memory "
        "FOR EACH STATEMENT EXECUTE FUNCTION llmem_bump_promotion_generation()",
        # A row trigger with its condition: a save writes every column, changed or not.
        "CREATE TRIGGER memory_generation_update AFTER UPDATE OF invalidated_at, promoted_at ON memory "
        "FOR EACH ROW WHEN (OLD.invalidated_at IS DISTINCT FROM NEW.invalidated_at "
        "OR OLD.promoted_at IS DISTINCT FROM NEW.promoted_at) "
        "EXECUTE FUNCTION llmem_bump_promotion_generation()",
    ))),
    ("pg0006_machines", _key_by_machine),
    # The SQLite store's 0021_project_identity: projects keyed by their repository's remote.
    ("pg0007_project_identity", _key_projects_by_remote),
    # The SQLite store's 0022_authors_visibility, enforced here by the server: row-level
    # security shows each database role its own memories and the shared ones, even in psql.
    ("pg0008_authors_visibility", _run(VISIBILITY)),
    # BM25's totals (how many memories, their mean length) without a scan of every memory on
    # each search (db/postgres/fts.py memory_totals). Appended only: each statement that
    # writes memories adds its change per (author, visibility), so writers never wait on one
    # counter row, and a role reads the groups its memory_read policy shows it: the totals of
    # exactly the rows it can see, as count(*) under RLS gave.
    ("pg0011_team_speed", _team_speed),
    ("pg0009_compact_store", _compact_store),
    # A SQLite integer is 64-bit, and an import or a `store copy` may carry any count up to
    # 2**63 - 1 (exchange.MAX_INTEGER): a 32-bit column refused it as an unexpected failure.
    ("pg0013_wide_access_count", _run(("ALTER TABLE memory ALTER COLUMN access_count TYPE BIGINT",))),
    ("pg0014_context_indexes", _context_indexes),
]

# Held for the whole migration, so two machines opening a new store at once do not both
# create it (any 64-bit key unique to llmem's migrations).
_MIGRATION_LOCK = 0x6C6C6D656D0001


def applied_migrations(db) -> list[str]:
    # Asked first: CREATE ... IF NOT EXISTS needs the right to create in the schema even when
    # the table is there, and a teammate's role has no such right on a team's store.
    if not db.execute_sql("SELECT to_regclass('schema_migration') IS NOT NULL").fetchone()[0]:
        db.execute_sql("CREATE TABLE IF NOT EXISTS schema_migration ("
                       "name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
    return [row[0] for row in db.execute_sql("SELECT name FROM schema_migration ORDER BY applied_at, name")]


def migrate(db) -> list[str]:
    """Apply every step not yet recorded, each in its own transaction, under an advisory
    lock that serialises migrating processes across machines; return the names applied."""
    ran: list[str] = []
    if {name for name, _ in MIGRATIONS} <= set(applied_migrations(db)):
        return ran
    for name, step in MIGRATIONS:
        with db.atomic():
            db.execute_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
            if db.execute_sql("SELECT 1 FROM schema_migration WHERE name = ?", (name,)).fetchone():
                continue  # another process applied it while this one waited for the lock
            step(db)
            db.execute_sql("INSERT INTO schema_migration(name, applied_at) VALUES (?, ?)", (name, time.time()))
        ran.append(name)
    return ran
