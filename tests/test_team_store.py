"""A team on one store (issue 23): every memory has an author and a visibility; a project's
facts, decisions and procedures are shared only when their author shares the project; on
PostgreSQL the server enforces it with row-level security, one database role per teammate,
so another role cannot read a private memory even with plain SQL."""

from __future__ import annotations

import json
import secrets

import psycopg
import pytest
from servers import PG_PASSWORD

from llmem.db.visibility import store_author
from llmem.dream.light import find_candidates
from llmem.store import Store

backend = pytest.mark.backend

PROJECT = "github.com/acme/api"


@pytest.fixture
def team(servers):
    """A store made by its owner, and two teammates' roles with the rights a team gives."""
    owner_url = servers.fresh_database()
    Store.open(owner_url).close()  # the owner applies the migrations
    server = servers.postgres()
    database = owner_url.rsplit("/", 1)[1]
    roles = {name: f"{name}_{secrets.token_hex(3)}" for name in ("alice", "bob")}
    for role in roles.values():
        server.psql(f"CREATE ROLE {role} LOGIN PASSWORD '{PG_PASSWORD}'")
        for grant in (f"GRANT CONNECT ON DATABASE {database} TO {role}",
                      f"GRANT USAGE ON SCHEMA public TO {role}",
                      f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
                      f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}"):
            server.psql(grant, database=database)
    urls = {name: server.url(database, role=role) for name, role in roles.items()}
    stores = {name: Store.open(url) for name, url in urls.items()}
    yield stores, urls, roles
    for store in stores.values():
        store.close()


def contents(store) -> set[str]:
    return {m.content for m in store.models.Memory.select()}


@backend
def test_a_teammate_reads_only_what_is_shared_even_with_sql(team):
    stores, urls, roles = team
    alice, bob = stores["alice"], stores["bob"]
    assert store_author(alice.db) == roles["alice"]
    early = alice.add("the api deploys with make release, never from a branch", "decision", project=PROJECT).memory
    alice.add("alice prefers tabs in go code", "preference", project=PROJECT)
    alice.add("a fact of a project alice keeps to herself", "fact", project="github.com/acme/secret")
    assert early.visibility == "private" and contents(bob) == set()

    assert alice.share(PROJECT) == 1  # the decision; never the preference
    later = alice.add("the staging cluster runs kubernetes 1.30", "fact", project=PROJECT).memory
    assert later.visibility == "shared"
    assert contents(bob) == {"the api deploys with make release, never from a branch",
                             "the staging cluster runs kubernetes 1.30"}
    bob.add("bob's own note on the api", "fact", project=PROJECT)  # bob has not shared: his alone
    assert "bob's own note on the api" not in contents(alice)

    # Plain SQL as bob: the server hides alice's private rows, refuses a row in her name, and
    # deletes none of hers.
    with psycopg.connect(urls["bob"], autocommit=True) as conn:
        seen = {row[0] for row in conn.execute("SELECT content FROM memory WHERE author = %s", (roles["alice"],))}
        assert seen == {"the api deploys with make release, never from a branch",
                        "the staging cluster runs kubernetes 1.30"}
        assert conn.execute("DELETE FROM memory WHERE author = %s", (roles["alice"],)).rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO memory (id, type, content, content_hash, created_at, updated_at, author) "
                         "VALUES ('x', 'fact', 'forged', 'h', 0, 0, %s)", (roles["alice"],))

    assert alice.share(PROJECT, shared=False) == 2
    assert contents(bob) == {"bob's own note on the api"}


@backend
def test_the_cli_shares_a_project_and_lists_who_shares_it(team, cli, configure):
    stores, urls, roles = team
    configure(f"store:\n  url: {urls['alice']}\nembedding:\n  provider: none\nllm:\n  provider: none\n")
    stores["alice"].add("migrations run with alembic upgrade head", "procedure", project=PROJECT)
    code, out, err = cli("share", PROJECT, "--json")
    assert code == 0, err
    assert json.loads(out) == {"project": PROJECT, "shared": True, "memories_changed": 1, "author": roles["alice"]}
    code, out, _ = cli("share", "--list", "--json")
    assert [(row["project"], row["shared_by"]) for row in json.loads(out)] == [(PROJECT, roles["alice"])]
    code, _, err = cli("share")
    assert code == 2 and "name the project" in err


def test_sharing_flips_a_projects_shareable_memories_and_a_dream_never_merges_across_audiences(store_url):
    store = Store.open(store_url)
    Memory = store.models.Memory
    fact = store.add("the deploy key lives in vault under ops/deploy", "fact", project=PROJECT).memory
    taste = store.add("prefers short commit subjects", "preference", project=PROJECT).memory
    assert store.share(PROJECT) == 1
    assert (Memory.get_by_id(fact.seq).visibility, Memory.get_by_id(taste.seq).visibility) == ("shared", "private")
    # The same text kept privately too (written before the project was shared, say): the
    # dream's exact-duplicate merge would fold one audience's memory into the other's.
    twin = Memory.create(id="twin-of-the-fact", type="fact", content=fact.content, project=PROJECT,
                         content_hash=fact.content_hash, created_at=1.0, updated_at=1.0)
    result = find_candidates(store, similarity_threshold=0.92, auto_link_threshold=None, since=None)
    assert not any({fact.id, twin.id} <= set(group) for group in result.exact_duplicates)
    assert store.share(PROJECT, shared=False) == 1
    assert Memory.get_by_id(fact.seq).visibility == "private"
    result = find_candidates(store, similarity_threshold=0.92, auto_link_threshold=None, since=None)
    assert [sorted(group) for group in result.exact_duplicates] == [sorted([fact.id, twin.id])]
    store.close()


@backend
def test_each_roles_bm25_totals_are_those_of_the_memories_it_can_see(team, servers, monkeypatch):
    """BM25's N and mean length come from memory_totals (migration pg0011), kept by the
    statements that write memories: under each role they equal count(*) and avg over the
    rows its policies show it, through adds, a share and its undo, an edit, a delete, and the
    folding of the change rows."""
    from llmem.db.postgres import fts

    stores, urls, roles = team
    alice, bob = stores["alice"], stores["bob"]

    def assert_exact():
        for store in (alice, bob):
            seen, words = store.db.execute_sql("SELECT count(*), coalesce(avg(search_words), 1) FROM memory").fetchone()
            rows, avgdl, _ = store.db.execute_sql(fts.TOTALS_SQL).fetchone()
            assert (fts.memory_count(store.db), rows) == (seen, seen)
            assert avgdl == pytest.approx(max(float(words), 1.0))

    for i in range(3):
        alice.add(f"decision {i}: the api deploys with make release and signed tags", "decision", project=PROJECT)
    alice.add("alice prefers tabs", "preference", project=PROJECT)
    note = bob.add("bob's own short note", "fact", project=PROJECT).memory
    assert_exact()
    alice.share(PROJECT)
    assert_exact()
    bob.update(note.id, content="bob's own note, now a good deal longer than it was before")
    assert_exact()
    bob.delete(note.id)
    assert_exact()
    monkeypatch.setattr(fts, "FOLD_AT", 2)
    fts.memory_count(alice.db)  # folds what alice sees into one row per group
    fts.memory_count(bob.db)
    assert_exact()
    alice.share(PROJECT, shared=False)
    assert_exact()
