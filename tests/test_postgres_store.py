"""The PostgreSQL + pgvector store, on a real server the tests start (tests/servers.py):
the CLI's core commands over it, its errors, and what keeps its password out of every output."""

from __future__ import annotations

import json

import pytest
from servers import PG_PASSWORD, free_port

from llmem.db.postgres.connection import qmark_to_format
from llmem.redact import masked_url

backend = pytest.mark.backend

MEMORIES = [
    ("decision", "we deploy with make release, never from a branch"),
    ("fact", "the staging cluster runs kubernetes 1.30 on three nodes"),
    ("procedure", "to rotate the tls certificate run certbot renew on the gateway"),
    ("preference", "the user prefers tabs over spaces in go code"),
    ("fact", "billing invoices are generated nightly by a cron job"),
]


def run_ok(cli, *args):
    code, out, err = cli(*args)
    assert code == 0, err
    return out


def no_password(*texts: str) -> None:
    for text in texts:
        assert PG_PASSWORD not in text


@backend
def test_the_core_commands_work_on_postgres_and_its_password_is_never_shown(
        cli, configure, model_server, servers, tmp_path, llmem_home, monkeypatch):
    url = servers.fresh_database()
    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\nllm:\n  provider: none\n")
    code, out, err = cli("init", "--store", url, "--adapter", "none")
    assert code == 0, err
    assert "pgvector" in out and ":***@" in out
    no_password(out, err)
    shown = run_ok(cli, "config", "show")
    assert ":***@127.0.0.1" in shown
    no_password(shown, run_ok(cli, "config", "show", "--json"))
    # The config file keeps it (a private file), so the next command reaches the server.
    assert PG_PASSWORD in (llmem_home / "config.yaml").read_text()

    ids = [json.loads(run_ok(cli, "add", "--content", text, "--type", kind, "--json"))["id"]
           for kind, text in MEMORIES]
    assert not (llmem_home / "memory.db").exists()  # nothing went to a SQLite file
    stats = json.loads(run_ok(cli, "stats", "--json"))
    assert stats["memories"] == 5 and stats["embedded"] == 5 and stats["pending_embedding"] == 0
    no_password(json.dumps(stats))

    code, out, err = cli("search", "how do we deploy a release", "--json", "--explain")
    assert code == 0 and "FTS only" not in err, err
    found = json.loads(out)
    top = found[0]
    assert top["id"] == ids[0]
    assert top["explain"]["fts_rank"] == 1 and top["explain"]["vec_rank"] is not None
    assert json.loads(run_ok(cli, "search", "kubernetes", "--fts-only", "--json"))[0]["id"] == ids[1]

    got = json.loads(run_ok(cli, "get", ids[2][:8], "--json"))
    assert got["content"] == MEMORIES[2][1]
    listed = json.loads(run_ok(cli, "list", "--json"))
    assert {m["id"] for m in listed} == set(ids)

    # Export from Postgres, import into a SQLite store: the same memories, the same answer.
    export = tmp_path / "export.json"
    run_ok(cli, "export", "-o", str(export))
    document = json.loads(export.read_text())
    assert len(document["memories"]) == 5
    other = tmp_path / "sqlite-home"
    other.mkdir()
    (other / "config.yaml").write_text(
        f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\nllm:\n  provider: none\n")
    monkeypatch.setenv("LLMEM_HOME", str(other))
    assert json.loads(run_ok(cli, "import", str(export), "--json"))["new"] == 5
    run_ok(cli, "embed", "--pending")
    on_sqlite = json.loads(run_ok(cli, "search", "how do we deploy a release", "--json"))
    assert [r["id"] for r in on_sqlite] == [r["id"] for r in found]

    # And back into a second Postgres database.
    second = servers.fresh_database()
    (other / "config.yaml").write_text(f"store:\n  url: {second}\nembedding:\n  provider: none\nllm:\n  provider: none\n")
    assert json.loads(run_ok(cli, "import", str(export), "--json"))["new"] == 5
    assert json.loads(run_ok(cli, "import", str(export), "--json"))["already_present"] == 5


@backend
def test_a_server_that_is_down_is_named_with_the_fix(cli, configure):
    configure(f"store:\n  url: postgresql://llmem:{PG_PASSWORD}@127.0.0.1:{free_port()}/memory\n"
              "embedding:\n  provider: none\n")
    code, out, err = cli("list")
    assert code == 1
    assert "no PostgreSQL server answers at postgresql://llmem:***@127.0.0.1" in err
    assert "start the server" in err and "Traceback" not in err
    no_password(out, err)


@backend
def test_a_wrong_password_and_a_missing_database_are_named(cli, configure, servers):
    server = servers.postgres()
    configure(f"store:\n  url: {server.url(password='not-the-password')}\nembedding:\n  provider: none\n")
    code, _, err = cli("list")
    assert code == 1 and "refused the password" in err and "not-the-password" not in err
    configure(f"store:\n  url: {server.url('no_such_db')}\nembedding:\n  provider: none\n")
    code, _, err = cli("list")
    assert code == 1 and "does not exist" in err and "createdb" in err
    no_password(err)


@backend
def test_a_database_without_pgvector_names_the_command_that_enables_it(cli, configure, servers):
    server = servers.postgres()
    server.psql("CREATE ROLE plain LOGIN PASSWORD 'plain-pw-1'")
    server.psql("CREATE DATABASE plain_db OWNER plain TEMPLATE template0")
    configure(f"store:\n  url: {server.url('plain_db', role='plain', password='plain-pw-1')}\n"
              "embedding:\n  provider: none\n")
    code, _, err = cli("list")
    assert code == 1
    assert "pgvector extension is not enabled" in err and "CREATE EXTENSION vector" in err
    assert "plain-pw-1" not in err
    # Once a superuser enables it, the same user's store opens and migrates.
    server.psql("CREATE EXTENSION vector", database="plain_db")
    code, out, err = cli("list")
    assert code == 0, err


def test_a_store_url_is_checked_and_its_password_masked_in_the_error(cli, configure):
    configure("store:\n  url: mysql://root:hunter2-pw@db/x\n")
    code, _, err = cli("list")
    assert code == 2 and "scheme must be sqlite or postgresql" in err
    assert "hunter2-pw" not in err and "root:***@db" in err
    configure("store:\n  url: postgresql://u:pw-secret-9@host:5432\n")
    code, _, err = cli("config", "check")
    assert code == 2 and "name the database" in err and "pw-secret-9" not in err


def test_a_sqlite_url_names_the_file(cli, configure, tmp_path):
    configure(f"store:\n  url: sqlite:///{tmp_path}/elsewhere.db\nembedding:\n  provider: none\n")
    run_ok(cli, "add", "--content", "stored in the file the URL names")
    assert (tmp_path / "elsewhere.db").is_file()


@pytest.mark.parametrize("url, shown", [
    ("postgresql://llmem:s3cret@db.example:5432/mem", "postgresql://llmem:***@db.example:5432/mem"),
    ("postgresql://llmem@db.example/mem", "postgresql://llmem@db.example/mem"),
    ("postgresql://:only-pw@host/db", "postgresql://:***@host/db"),
    ("postgresql://u:p%40ss@host:99999999/db", "postgresql://u:***@host:99999999/db"),
    ("sqlite:///home/a/memory.db", "sqlite:///home/a/memory.db"),
    (None, None),
])
def test_masked_url(url, shown):
    assert masked_url(url) == shown


@pytest.mark.parametrize("sql, expected", [
    ("SELECT 1 FROM t WHERE a = ? AND b IN (?, ?)", "SELECT 1 FROM t WHERE a = %s AND b IN (%s, %s)"),
    ("SELECT '?' , \"we?ird\" FROM t WHERE x = ?", "SELECT '?' , \"we?ird\" FROM t WHERE x = %s"),
    ("SELECT x % 2, '50%' FROM t WHERE y = ?", "SELECT x %% 2, '50%%' FROM t WHERE y = %s"),
    ("SELECT a FROM t WHERE b = %s", "SELECT a FROM t WHERE b = %s"),  # peewee's own: untouched
])
def test_qmark_placeholders_become_psycopg_ones(sql, expected):
    assert qmark_to_format(sql) == expected


PARITY_CORPUS = [
    ("the deploy script runs make release on the build server", None),
    ("deploying from a branch broke the release twice last month", "release incident"),
    ("the billing service stores invoices in postgres", None),
    ("release notes are written by the on-call engineer", None),
    ("the build server has 32 cores and deploys nightly", "build server"),
    ("nothing about the topic here at all", None),
]


@backend
@pytest.mark.parametrize("query", ["deploy release", "build server deploys", "billing postgres invoices",
                                   "release", "the on-call engineer writes notes"])
def test_bm25_on_postgres_scores_as_fts5_does(servers, tmp_path, query):
    from llmem.db.fts import match_expression, ranked_matches
    from llmem.search import BM25_WEIGHTS
    from llmem.store import Store

    scores = []
    for location in (tmp_path / "memory.db", servers.fresh_database()):
        with Store.open(location) as store:
            for text, summary in PARITY_CORPUS:
                store.add(text, summary=summary)
            seq_text = {m.seq: m.content for m in store.models.Memory.select()}
            rows = ranked_matches(store.db, match_expression(query), BM25_WEIGHTS, 50, "1", [])
            scores.append([(seq_text[seq], round(score, 6)) for seq, score in rows])
    sqlite_scores, postgres_scores = scores
    assert postgres_scores == sqlite_scores and sqlite_scores


@backend
def test_the_common_words_are_the_same_on_both_backends_in_two_round_trips(servers, tmp_path, monkeypatch):
    """common_words (what the semantic query leaves out) on PostgreSQL asks twice, for the
    totals and then every word's count together, and finds what SQLite finds."""
    from llmem.db.fts import common_words
    from llmem.db.postgres.connection import QmarkCursor
    from llmem.store import Store

    texts = [f"{word} deploying the build server {i}" for i in range(30) for word in ("alice", "bob")]
    texts += ["pottery class with alice", "chess club"]
    query = "Did alice deploy the build server to the chess club, or pottery? Bob"

    def filled(location) -> Store:
        store = Store.open(location)
        for text in texts:
            store.add(text, "conversation")
        return store

    with filled(tmp_path / "memory.db") as store:
        on_sqlite = common_words(store.db, query, share=0.10, min_docs=20)
    statements = []
    execute = QmarkCursor.execute
    with filled(servers.fresh_database()) as store:
        common_words(store.db, "the words stemmed once: " + query, share=0.10, min_docs=20)
        monkeypatch.setattr(QmarkCursor, "execute", lambda self, sql, params=None: (
            statements.append(sql), execute(self, sql, params))[1])
        on_postgres = common_words(store.db, query, share=0.10, min_docs=20)
        assert len(statements) == 2, statements
        assert common_words(store.db, "alice", share=0.99, min_docs=20) == set()  # above every count
    assert on_sqlite == on_postgres == {"alice", "deploy", "build", "server", "bob"}, (on_sqlite, on_postgres)


@backend
def test_the_postgres_schema_has_every_column_of_every_model(servers):
    """A model that gains a column needs a step in db/postgres/migrations.py too."""
    from llmem.db.models import ALL_MODELS
    from llmem.store import Store

    with Store.open(servers.fresh_database()) as store:
        rows = store.db.execute_sql("SELECT table_name, column_name FROM information_schema.columns "
                                    "WHERE table_schema = 'public'").fetchall()
    have = {(table, column) for table, column in rows}
    wanted = {(model._meta.table_name, field.column_name)
              for model in ALL_MODELS for field in model._meta.sorted_fields}
    assert wanted - have == set()


@backend
def test_a_postgres_store_upgrades_from_every_earlier_step(servers):
    from llmem.db.postgres import migrations
    from llmem.db.postgres.connection import PostgresStoreDatabase, ensure_pgvector
    from llmem.store import Store

    names = [name for name, _ in migrations.MIGRATIONS]
    for stop in range(1, len(names)):
        url = servers.fresh_database()
        db = PostgresStoreDatabase(url)
        db.connect()
        ensure_pgvector(db)
        migrations.applied_migrations(db)  # makes schema_migration
        for order, (name, step) in enumerate(migrations.MIGRATIONS[:stop]):  # a store made by an older llmem
            with db.atomic():
                step(db)
                # each step at its own time, as they were applied: the list is read in that order
                db.execute_sql("INSERT INTO schema_migration(name, applied_at) VALUES (?, ?)", (name, float(order)))
        db.close()
        with Store.open(url) as store:
            assert migrations.applied_migrations(store.db) == names
            store.add("a memory written after the upgrade")
            assert store.models.SessionCursor.select().count() == 0


@backend
def test_a_server_older_than_llmem_supports_is_named(cli, configure, servers, monkeypatch):
    # The test server is PostgreSQL 18: raise the floor above it instead of finding an old one.
    from llmem.db.postgres import connection

    monkeypatch.setattr(connection, "MIN_SERVER_VERSION", 190000)
    configure(f"store:\n  url: {servers.fresh_database()}\nembedding:\n  provider: none\n")
    code, _, err = cli("list")
    assert code == 1 and "runs PostgreSQL 18." in err and "upgrade the server" in err
    no_password(err)


@backend
def test_a_connection_the_server_dropped_is_opened_again_for_the_next_statement(servers):
    """A long-lived process (llmem run) outlives a server restart: the statement after the
    drop runs on a new connection instead of failing with "the connection is closed" for ever."""
    from llmem.store import Store

    url = servers.fresh_database()
    with Store.open(url) as store:
        store.add("before the server went away")
        database = url.rsplit("/", 1)[1]
        servers.postgres().psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                f"WHERE datname = '{database}' AND pid <> pg_backend_pid()")
        store.add("after it came back")
        assert store.models.Memory.select().count() == 2


class NamedEmbedder:
    """What store_vectors asks of an embedder: the identity its vectors are stored under."""

    identity = "test-model:8"


@backend
def test_a_bulk_load_goes_in_bare_and_gets_its_hnsw_index_once_at_its_end(servers):
    """460 vectors/s through a live HNSW index: a large batch into a table smaller than it is
    copied into the bare table, and the index is built once, when the load ends (or at the
    next search); what is stored after goes through the index, a re-embedding replaces."""
    import numpy as np

    from llmem.db import vec, vector_file
    from llmem.db.postgres.vec import BULK_ROWS, knn_vec0
    from llmem.exchange import apply_import, plan_import
    from llmem.store import Store
    from llmem.vectors import store_vectors

    count = BULK_ROWS + 200
    document = {"version": 1, "relations": [], "memories": [
        {"id": f"00000000-0000-4000-8000-{i:012d}", "type": "fact", "content": f"memory number {i}"}
        for i in range(count)]}
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(count, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with Store.open(servers.fresh_database()) as store:
        apply_import(store, plan_import(store, document))
        memories = list(store.models.Memory.select().order_by(store.models.Memory.seq))

        def has_index() -> bool:
            return store.db.execute_sql("SELECT to_regclass('memory_vec_hnsw') IS NOT NULL").fetchone()[0]

        store_vectors(store, NamedEmbedder(), memories, vectors)
        assert not has_index()  # loaded bare
        vector_file.index_for(store.db, *vec.index_state(store.db))  # as `embed` ends
        assert has_index()
        assert store.db.execute_sql("SELECT count(*) FROM memory_vec").fetchone()[0] == count
        for i in (0, 700, count - 1):  # every vector went in whole: each is its own nearest
            assert knn_vec0(store.db, vectors[i], 1)[0][0] == memories[i].seq
        moved = -vectors[5]
        store_vectors(store, NamedEmbedder(), [memories[5]], moved[None, :])  # re-embedded: replaced
        assert store.db.execute_sql("SELECT count(*) FROM memory_vec").fetchone()[0] == count
        assert knn_vec0(store.db, moved, 1)[0] == (memories[5].seq, pytest.approx(0.0, abs=1e-6))
        assert has_index()
        # A table rebuilt from the stored vectors (`store copy`, an import): bare, then indexed.
        assert vec.rebuild_index(store.db, *vec.index_state(store.db)) == count and has_index()
        assert knn_vec0(store.db, vectors[700], 1)[0][0] == memories[700].seq


@backend
def test_bm25_on_postgres_is_exact_when_more_match_than_it_scores_first(servers, tmp_path, monkeypatch):
    """Only the matches whose bound could reach the top are scored: with 600 matches and the
    first 20 bounds considered, the top 5 is still FTS5's, ties and all, in a second pass."""
    import random

    from llmem.db.postgres import fts

    monkeypatch.setattr(fts, "FIRST_CONSIDERED", 0)  # 4 × fetch: 20
    passes = []
    real = fts.ranked_matches.__globals__["_tsquery"]
    monkeypatch.setattr(fts, "_tsquery", lambda lexemes: passes.append(1) or real(lexemes))

    from llmem.db.fts import match_expression, ranked_matches
    from llmem.exchange import apply_import, plan_import
    from llmem.search import BM25_WEIGHTS
    from llmem.store import Store

    rng = random.Random(5)
    filler = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda"]
    texts = []
    for i in range(600):
        words = ["deploy"] * rng.randint(1, 3) + [rng.choice(filler) for _ in range(rng.randint(2, 30))]
        if i % 7 == 0:
            words += ["release"] * rng.randint(1, 2)
        rng.shuffle(words)
        texts.append(" ".join(words) + f" note{i}")
    scores = []
    for location in (tmp_path / "memory.db", servers.fresh_database()):
        with Store.open(location) as store:
            apply_import(store, plan_import(store, {"version": 1, "relations": [], "memories": [
                {"id": f"00000000-0000-4000-8000-{i:012d}", "type": "fact", "content": text}
                for i, text in enumerate(texts)]}))
            seq_text = {m.seq: m.content for m in store.models.Memory.select()}
            rows = ranked_matches(store.db, match_expression("deploy release"), BM25_WEIGHTS, 5, "1", [])
            scores.append([(seq_text[seq], round(score, 6)) for seq, score in rows])
    assert scores[1] == scores[0] and len(scores[0]) == 5
    assert len(passes) == 2  # the first 20 could not prove the top: all that could reach it next


@backend
def test_an_hnsw_build_never_gets_less_memory_than_the_server_is_configured_with(servers):
    """A graph built past maintenance_work_mem spills to disk, many times slower: a build asks
    for room for its vectors (up to a cap), but a server configured with more (a million
    vectors need ~2.6 GB) keeps its own setting instead of being cut to the cap."""
    from llmem.db.postgres.vec import BUILD_ROOM_CAP_MB, build_room_mb
    from llmem.store import Store

    url = servers.fresh_database()
    with Store.open(url) as store:
        assert build_room_mb(store.db, 1000, 384) == 64  # the server's default (64 MB) is enough
        assert build_room_mb(store.db, 1_000_000, 384) == BUILD_ROOM_CAP_MB
    name = url.rsplit("/", 1)[1]
    servers.postgres().psql(f"ALTER DATABASE {name} SET maintenance_work_mem = '6GB'")
    with Store.open(url) as store:
        assert build_room_mb(store.db, 1000, 384) == 6144
        assert build_room_mb(store.db, 1_000_000, 384) == 6144


@backend
def test_an_import_copies_its_memories_in_a_statement_per_batch(servers, monkeypatch):
    """An executemany is an INSERT per row, each firing memory's statement-level trigger (a
    memory_totals change row per memory: 1M of them for a 1M import); a COPY per batch
    (store.INSERT_BATCH rows, 2000 here) is one statement, one change row, and the rows as an
    INSERT would have stored them."""
    from llmem import store as store_module
    from llmem.exchange import apply_import, plan_import
    from llmem.store import Store

    monkeypatch.setattr(store_module, "INSERT_BATCH", 2000)

    count = 2500  # two batches
    document = {"version": 1, "relations": [], "memories": [
        {"id": f"00000000-0000-4000-8000-{i:012d}", "type": "fact", "content": f"memory number {i} it's \\ \t ok",
         "confidence": 0.25, "access_count": 3, "metadata": {"tags": ["a", "b"]}, "project": None if i % 2 else "/p"}
        for i in range(count)]}
    with Store.open(servers.fresh_database()) as store:
        apply_import(store, plan_import(store, document))
        assert store.db.execute_sql("SELECT count(*), sum(rows) FROM memory_totals").fetchone() == (2, count)
        row = store.db.execute_sql("SELECT content, confidence, access_count, metadata, project, search_words "
                                   "FROM memory WHERE id = '00000000-0000-4000-8000-000000000007'").fetchone()
        assert row[:3] == ("memory number 7 it's \\ \t ok", 0.25, 3)
        assert json.loads(row[3]) == {"tags": ["a", "b"]} and row[4] is None and row[5] > 0
        assert store.db.execute_sql("SELECT count(*) FROM memory WHERE search_text @@ 'number'::tsquery"
                                    ).fetchone()[0] == count
