"""`llmem store copy --to URL` (issue 23): SQLite → PostgreSQL and back, every memory, relation,
vector, journal entry and cursor, checked by counts and hashes, resumable after a kill,
refusing a non-empty target without --merge."""

from __future__ import annotations

import json

import pytest
from dream_support import add, open_store, recall
from fakes import FakeEmbedder

from llmem import transfer
from llmem.db import copying
from llmem.dream import run_dream
from llmem.exchange import export_data
from llmem.pipeline.events import record_event
from llmem.search import Searcher, SearchOptions
from llmem.store import Store

backend = pytest.mark.backend
EMBEDDER = FakeEmbedder(dim=64)


def build(home, store_url=None):
    """A store with something in every table a copy carries."""
    store, config = open_store(home, "dream:\n  auto_link_threshold: 0.5\n", store_url)
    first = add(store, "the deploy script lives in scripts/deploy.sh and needs AWS_PROFILE", embedder=EMBEDDER,
                age_days=3)
    add(store, "the deploy script lives in scripts/deploy.sh and it needs AWS_PROFILE", embedder=EMBEDDER,
        age_days=1)
    add(store, "postgres migrations run with alembic upgrade head", "procedure", embedder=EMBEDDER,
        project="github.com/acme/api")
    for i in range(60):
        add(store, f"fact number {i} about the billing service and its nightly invoice job", embedder=EMBEDDER)
    recall(store, first, ["deploy script", "aws profile"])
    record_event(store, "claude", "ses-1", "idle")
    store.models.SessionCursor.create(adapter="claude", session_id="ses-1", cursor="u7", updated_at=1.0)
    store.share("github.com/acme/api")
    outcome = run_dream(store, config, apply=True)
    assert outcome.run_id
    return store, config


def portable_export(store) -> dict:
    data = export_data(store, include_embeddings=True)
    data.pop("exported_at")
    for memory in data["memories"]:
        memory.pop("author", None)
    return data


def copy_both_ways(home, tmp_path, target_url, cli):
    source, _ = build(home)
    before = portable_export(source)
    code, out, err = cli("store", "copy", "--to", target_url, "--json")
    assert code == 0, err
    result = json.loads(out)
    memories = source.models.Memory.select().count()
    assert result["ok"] and result["vectors_indexed"] == source.models.Embedding.select().count() >= 63
    assert {t["table"]: t["copied"] for t in result["tables"]}["memory"] == memories > 63
    with Store.open(target_url) as target:
        assert portable_export(target)["memories"] == before["memories"]
        hits = Searcher(target, EMBEDDER).search("where is the deploy script", SearchOptions(track=False)).hits
        assert hits and "deploy" in hits[0].memory.content
        assert target.models.DreamAction.select().count() == source.models.DreamAction.select().count() > 0
    # A second copy into it is refused: it holds memories now.
    code, _, err = cli("store", "copy", "--to", target_url)
    assert code == 2 and "already holds memories" in err and "--merge" in err
    code, out, err = cli("store", "copy", "--to", target_url, "--merge", "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["ok"] and {t["table"]: t["copied"] for t in again["tables"]} == {t.name: 0 for t in copying.TABLES}
    source.close()


def test_a_sqlite_store_copies_into_another_file(home, tmp_path, cli):
    copy_both_ways(home, tmp_path, f"sqlite:///{tmp_path / 'copy' / 'memory.db'}", cli)


@backend
def test_a_sqlite_store_copies_onto_postgres_and_back(home, tmp_path, cli, configure, postgres_url):
    copy_both_ways(home, tmp_path, postgres_url, cli)
    # And back: the Postgres store into a new SQLite file, the same memories again.
    configure(f"store:\n  url: {postgres_url}\nembedding:\n  provider: none\nllm:\n  provider: none\n")
    back = f"sqlite:///{tmp_path / 'back' / 'memory.db'}"
    code, out, err = cli("store", "copy", "--to", back, "--json")
    assert code == 0 and json.loads(out)["ok"], err
    with Store.open(postgres_url) as pg, Store.open(back) as sqlite:
        assert portable_export(sqlite)["memories"] == portable_export(pg)["memories"]


def test_a_copy_killed_midway_resumes_and_adds_nothing_twice(home, tmp_path, monkeypatch):
    source, _ = build(home)
    monkeypatch.setattr(copying, "BATCH", 25)
    target = Store.open(tmp_path / "target" / "memory.db")

    def killed(table, copied):
        if table == "memory" and copied >= 50:
            raise KeyboardInterrupt  # what SIGINT (or a kill -9 after the commit) leaves

    with pytest.raises(KeyboardInterrupt):
        transfer.copy_store(source, target, progress=killed)
    assert target.models.Memory.select().count() == 50
    outcome = transfer.copy_store(source, target)
    assert outcome.resumed and outcome.ok, outcome.as_dict()
    assert target.models.Memory.select().count() == source.models.Memory.select().count() > 63
    assert not [k for (k,) in target.db.execute_sql("SELECT key FROM setting WHERE key LIKE 'store_copy:%'")]
    target.close()
    source.close()


def test_usage_errors_name_the_fix(home, cli):
    store, config = build(home)
    store.close()
    code, _, err = cli("store", "copy", "--to", "mysql://x/y")
    assert code == 2 and "--to" in err and "postgresql" in err
    location = config.store_location  # the SQLite file, or the PostgreSQL run's database
    code, _, err = cli("store", "copy", "--to", location if isinstance(location, str) else f"sqlite:///{location}")
    assert code == 2 and "the store itself" in err
