"""An episode's text kept deflated in the SQLite file (db/packed_text.py, migration 0024).

Real stores: what is packed, that every reader (peewee, raw SQL on llmem's connection, the FTS
index, a 'rebuild', snippets) sees the text, that an old store is carried over, and that the
text is written plain on PostgreSQL.
"""

from __future__ import annotations

import sqlite3

import pytest

from llmem.capture.episodes import EPISODE_CONFIDENCE, EPISODE_TYPE
from llmem.db import migrations
from llmem.db.models import EPISODE_SOURCE
from llmem.db.packed_text import MAGIC, PackedText, pack, unpack
from llmem.search import Searcher, SearchOptions
from llmem.store import Store

TURN = ("user: which pool do we run in front of postgres for the billing service?\n\n"
        "assistant: pgbouncer in transaction mode, with a pool of 40 server connections and "
        "server_idle_timeout at 600 seconds, because the workers open a connection per job and "
        "postgres itself should never see more than a hundred backends at once.")
EPISODE = "\n\n".join(TURN.replace("40", str(n)) for n in (40, 41, 42))


def add_episode(store, text=EPISODE, session="s1") -> str:
    with store.db.atomic():
        return store.add_many([(text, {"role": "mixed", "turn": 0}, "agent")], EPISODE_TYPE,
                              confidence=EPISODE_CONFIDENCE, source=EPISODE_SOURCE, project="/p",
                              session_id=session)[0]


def found(store, text) -> list[str]:
    return [h.memory.id for h in Searcher(store, None).search(text, SearchOptions(mode="fts", track=False)).hits]


def stored(store, memory_id) -> tuple[str, int]:
    return store.db.execute_sql("SELECT typeof(content), length(CAST(content AS BLOB)) FROM memory WHERE id = ?",
                                (memory_id,)).fetchone()


def test_pack_round_trips_and_leaves_short_text_plain():
    assert pack("short") == "short"
    packed = pack(EPISODE)
    assert isinstance(packed, bytes) and packed.startswith(MAGIC) and len(packed) < 0.7 * len(EPISODE.encode())
    assert unpack(packed) == EPISODE and isinstance(unpack(packed), PackedText)
    assert unpack(EPISODE.encode()) == EPISODE and unpack("plain") == "plain" and unpack(None) is None
    text = "ünïcode ✓ " * 40
    assert unpack(pack(text)) == text


@pytest.mark.sqlite_only
def test_an_episode_is_stored_deflated_and_every_reader_sees_its_text(llmem_home):
    with Store.open(llmem_home / "memory.db") as store:
        episode = add_episode(store)
        fact = store.add("the billing service runs pgbouncer in front of postgres").memory.id
        kind, size = stored(store, episode)
        assert kind == "blob" and size < 0.7 * len(EPISODE.encode())
        assert stored(store, fact)[0] == "text"  # typed memories stay plain
        assert store.get(episode).content == EPISODE  # peewee
        assert store.db.execute_sql("SELECT content FROM memory WHERE id = ?", (episode,)).fetchone()[0] == EPISODE
        assert store.db.execute_sql("SELECT m.content FROM memory m JOIN memory_fts f ON f.rowid = m.seq "
                                    "WHERE memory_fts MATCH 'server_idle_timeout'").fetchall() == [(EPISODE,)]
        assert episode in found(store, "server_idle_timeout") and episode in found(store, "backends")
        # A 'rebuild' and a snippet read the text through the view memory_fts_text.
        store.db.execute_sql("INSERT INTO memory_fts(memory_fts) VALUES ('rebuild')")
        assert episode in found(store, "server_idle_timeout")
        snippet = store.db.execute_sql("SELECT snippet(memory_fts, 0, '[', ']', '', 4) FROM memory_fts "
                                       "WHERE memory_fts MATCH 'pgbouncer' AND rowid = "
                                       "(SELECT seq FROM memory WHERE id = ?)", (episode,)).fetchone()[0]
        assert "[pgbouncer]" in snippet
        # Writes of other fields keep it packed; a new text is packed and indexed in place of the old.
        store.update(episode, confidence=0.4)
        assert stored(store, episode)[0] == "blob"
        store.update(episode, content=EPISODE.replace("pgbouncer", "pgcat"))
        assert stored(store, episode)[0] == "blob"
        assert episode in found(store, "pgcat") and episode not in found(store, "pgbouncer")
        store.delete(episode)
        assert found(store, "pgcat") == []
        store.db.execute_sql("INSERT INTO memory_fts(memory_fts) VALUES ('integrity-check')")


@pytest.mark.sqlite_only
def test_a_connection_without_llmem_text_cannot_write_memory_rows(llmem_home):
    """The FTS triggers index llmem_text(content): a writer without the function is refused,
    rather than leaving the index and the rows apart."""
    path = llmem_home / "memory.db"
    with Store.open(path) as store:
        episode = add_episode(store)
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.OperationalError, match="no such function: llmem_text"):
        conn.execute("DELETE FROM memory WHERE id = ?", (episode,))
    conn.close()
    with Store.open(path) as store:
        assert episode in found(store, "pgbouncer")


@pytest.mark.sqlite_only
@pytest.mark.creates_store
def test_a_store_of_the_previous_schema_is_packed_by_migration_0024(llmem_home, monkeypatch):
    path = llmem_home / "memory.db"
    before = [step for step in migrations.MIGRATIONS if step[0] != "0024_packed_episode_text"]
    monkeypatch.setattr(migrations, "MIGRATIONS", before)
    with Store.open(path) as store:
        assert not store.db.packs_text
        episodes = [add_episode(store, EPISODE.replace("billing", f"billing{n}"), session=f"s{n}") for n in range(200)]
        fact = store.add("the billing service runs pgbouncer").memory.id
        assert {stored(store, e)[0] for e in episodes} == {"text"}
        store.db.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    size = path.stat().st_size
    monkeypatch.setattr(migrations, "MIGRATIONS", [*before, ("0024_packed_episode_text", migrations._pack_episode_text)])
    with Store.open(path) as store:
        assert "0024_packed_episode_text" in migrations.applied_migrations(store.db) and store.db.packs_text
        assert {stored(store, e)[0] for e in episodes} == {"blob"} and stored(store, fact)[0] == "text"
        assert store.get(episodes[7]).content == EPISODE.replace("billing", "billing7")
        # The index made from the plain rows still matches: found, deleted and re-added by the new triggers.
        # (A word with a digit is matched whole first, then by its parts: `billing` is in every episode.)
        assert found(store, "billing7")[0] == episodes[7]
        store.delete(episodes[7])
        assert episodes[7] not in found(store, "billing7")
        store.update(episodes[8], content=EPISODE.replace("billing", "invoicing"))
        assert found(store, "invoicing") == [episodes[8]] and episodes[8] not in found(store, "billing8")
        store.db.execute_sql("INSERT INTO memory_fts(memory_fts) VALUES ('integrity-check')")
        store.db.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    assert path.stat().st_size < 0.8 * size  # the migration vacuums the space the packing freed


def test_episodes_read_back_as_their_text_on_every_backend(store_url):
    """PostgreSQL keeps the text plain (TOAST compresses it there); the readers are the same."""
    with Store.open(store_url) as store:
        episode = add_episode(store)
        assert store.get(episode).content == EPISODE
        assert episode in found(store, "pgbouncer")
        store.update(episode, content=EPISODE + "\n\nuser: and redis for the cache")
        assert store.get(episode).content.endswith("redis for the cache")
        assert episode in found(store, "redis")


@pytest.mark.sqlite_only
def test_an_exported_episode_is_imported_packed_with_its_text(llmem_home, tmp_path):
    from llmem.exchange import apply_import, export_data, plan_import

    with Store.open(llmem_home / "memory.db") as store:
        episode = add_episode(store)
        document = export_data(store)
    assert [m["content"] for m in document["memories"] if m["id"] == episode] == [EPISODE]
    with Store.open(tmp_path / "other" / "memory.db") as other:
        apply_import(other, plan_import(other, document))
        assert stored(other, episode)[0] == "blob" and other.get(episode).content == EPISODE
        assert episode in found(other, "server_idle_timeout")


@pytest.mark.backend
def test_a_store_copy_carries_packed_episodes_to_postgres_and_back(llmem_home, tmp_path, cli, configure,
                                                                  postgres_url):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    with Store.open(llmem_home / "memory.db") as store:
        episode = add_episode(store)
        assert stored(store, episode)[0] == "blob"
    code, _, err = cli("store", "copy", "--to", postgres_url, "--json")
    assert code == 0, err
    with Store.open(postgres_url) as pg:
        assert pg.get(episode).content == EPISODE and episode in found(pg, "server_idle_timeout")
    configure(f"store:\n  url: {postgres_url}\nembedding:\n  provider: none\nllm:\n  provider: none\n")
    back = tmp_path / "back" / "memory.db"
    code, _, err = cli("store", "copy", "--to", f"sqlite:///{back}", "--json")
    assert code == 0, err
    with Store.open(back) as sqlite_store:
        assert sqlite_store.get(episode).content == EPISODE and episode in found(sqlite_store, "server_idle_timeout")


@pytest.mark.sqlite_only
def test_a_read_only_store_reads_packed_episodes_as_text(llmem_home):
    from llmem.db.connection import open_read_only

    with Store.open(llmem_home / "memory.db") as store:
        episode = add_episode(store)
        store.db.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    db = open_read_only(llmem_home / "memory.db")
    try:
        assert db.execute_sql("SELECT typeof(content), content FROM memory WHERE id = ?",
                              (episode,)).fetchone() == ("blob", EPISODE)
    finally:
        db.close()
