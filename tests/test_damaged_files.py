"""A damaged queue.db or memory.db (issue 20 item 10): the file that is damaged is named, the
queue is rebuilt from the store's event rows, and an export of a damaged store saves every
row it can read. Files are damaged deterministically: pages of real SQLite files overwritten."""

from __future__ import annotations

import json
import sqlite3

import pytest

from llmem.db.packed_text import register_function
from llmem.store import Store

CONFIG = "embedding:\n  provider: none\nllm:\n  provider: none\n"


@pytest.fixture
def home(llmem_home):
    llmem_home.mkdir()
    (llmem_home / "config.yaml").write_text(CONFIG)
    return llmem_home


def overwrite_page(path, page: int, fill: bytes = b"\xde\xad\xbe\xef") -> None:
    """Overwrite page `page` (1-based) of a SQLite file with garbage, as a bad sector does."""
    size = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    data[(page - 1) * size:page * size] = (fill * size)[:size]
    path.write_bytes(bytes(data))


def damaged_queue(cli, home):
    """A store with two pending events and a real queue.db whose first page is garbage."""
    from llmem.pipeline.events import record_event

    with Store.open(home / "memory.db") as store:
        store.add("the api gateway listens on port 8080")
        events = [record_event(store, "copilot", f"ses-{n}", "idle")[0].id for n in range(2)]
    code, _, err = cli("queue")  # makes queue.db, as the first enqueue does
    assert code == 0, err
    overwrite_page(home / "queue.db", 1)
    from llmem.cli import queueing

    queueing._queues.clear()  # each command is a new process: none holds the old file open
    return events


def test_a_damaged_queue_is_named_as_the_queue_not_the_store(cli, home):
    damaged_queue(cli, home)
    for args in (("queue",), ("enqueue", "reconcile"), ("worker",)):
        code, _, err = cli(*args)
        assert code == 1, args
        assert f"the queue {home / 'queue.db'} is damaged" in err, (args, err)
        assert "memory store" not in err.split("hint:")[0]
        assert "llmem queue --reset" in err
    code, out, _ = cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["queue"]["status"] == "fail" and "damaged" in checks["queue"]["detail"]
    assert checks["store"]["status"] == "ok"


def test_queue_reset_rebuilds_the_queue_from_the_event_rows(cli, home):
    events = damaged_queue(cli, home)
    code, out, err = cli("queue", "--reset", "--json")
    assert code == 0, err
    assert "rebuilt" in err and f"with {len(events)} event(s)" in err
    assert json.loads(out)["queue"]["pending"] == len(events)  # one task per pending event
    kept = [p.name for p in home.iterdir() if p.name.startswith("queue.db.damaged-")]
    assert kept, "the damaged file is kept beside the new one"
    code, out, _ = cli("doctor", "--json")
    assert {c["name"]: c for c in json.loads(out)["checks"]}["queue"]["status"] == "ok"


def test_export_of_a_damaged_store_saves_every_readable_row_and_counts_the_rest(cli, home, tmp_path,
                                                                                monkeypatch):
    path = home / "memory.db"
    with Store.open(path) as store, store.db.atomic():  # in bulk: `add` each is ~1 ms of queries
        ids = store.add_many([(f"MARK{n:04d} " + "the deploy notes say many things " * 12, {}, "user")
                              for n in range(300)], "fact", confidence=0.7, source="user",
                             project=None, session_id=None)
        store.relate(ids[0], ids[1], "related_to")
    conn = sqlite3.connect(path)
    register_function(conn)  # the FTS trigger reads the text through llmem_text (db/packed_text.py)
    # One column that is not UTF-8: the plain export stopped at it and wrote nothing.
    conn.execute("UPDATE memory SET summary = CAST(x'fffe4142' AS TEXT) WHERE id = ?", (ids[5],))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = path.read_bytes()
    page_size = 4096
    lost_page = data.index(b"MARK0150") // page_size + 1  # the table page holding memory 150
    overwrite_page(path, lost_page)
    readable = {n for n in range(300) if f"MARK{n:04d}".encode() in path.read_bytes()}
    assert 150 not in readable and len(readable) > 250

    out_file = tmp_path / "rescue.json"
    code, out, err = cli("export", "-o", str(out_file))
    assert code == 0, err
    saved = json.loads(out_file.read_text())
    marks = {int(m["content"][4:8]) for m in saved["memories"]}
    assert marks >= readable - {150}  # every row on a sound page is saved
    assert 150 not in marks
    rescue = saved["rescue"]
    assert rescue["unreadable_memories"] >= 1 and rescue["memories_with_damaged_text"] == 1
    assert "the store is damaged" in err and f"{rescue['unreadable_memories']} memory rows" in err
    damaged = next(m for m in saved["memories"] if m["id"] == ids[5])
    assert damaged["summary"] == "\ufffd\ufffdAB"
    # The rescue file imports into a new store: the documented recovery works end to end.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.yaml").write_text(CONFIG)
    monkeypatch.setenv("LLMEM_HOME", str(fresh))
    code, out, err = cli("import", str(out_file))
    assert code == 0, err
    with Store.open(fresh / "memory.db") as store:
        assert store.models.Memory.select().count() == len(saved["memories"])
