"""A dream's memory stays bounded at any size (issue 22: peak RSS of a dream at 1M memories):
deep's decays are planned as compact rows that read as the Actions they stand for and apply
without one; light gives back the vector file's pages it has read; merges without an LLM
share transactions, and with one the LLM is never asked inside a transaction."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest
from dream_support import add, open_store, recall
from fakes import FakeEmbedder, StubLLM

from llmem.dream import run_dream
from llmem.dream.deep import DecayRows, plan_deep
from llmem.dream.journal import Action, Actions, Journal, start_run
from llmem.dream.light import _page_release


@pytest.fixture
def env(home, store_url):
    store, config = open_store(home, "", store_url)
    yield store, config
    store.close()


def _plan(store, config):
    return plan_deep(store, config.dream, near_duplicates=[], exact_duplicates=[], auto_links=[],
                     stale_ids=set(), phase_hits={})


def test_decays_are_planned_compactly_and_read_as_their_actions(env):
    store, config = env
    idle = add(store, "the idle one", age_days=95)
    stale = add(store, "rotate the key by hand", "procedure", age_days=61)
    store.update(stale.id, metadata={"stale_procedure": True})
    store.db.execute_sql("UPDATE memory SET updated_at = created_at WHERE id = ?", (stale.id,))
    weak = add(store, "the weak one", confidence=0.33, age_days=31)
    floored = add(store, "already at the floor", confidence=0.3, age_days=1)
    popular = add(store, "the popular one")
    recall(store, popular, [f"q{i}" for i in range(5)], origin="context")
    fresh = add(store, "a fresh one")

    deep = _plan(store, config)
    assert isinstance(deep.actions, Actions)
    compact = [part for part in deep.actions._parts if isinstance(part, DecayRows)]
    assert len(compact) == 1 and len(compact[0]) == 6  # five memories, the weak one twice

    actions = {(a.kind, a.memory_id): a for a in deep.actions}
    assert all(isinstance(a, Action) and a.phase == "deep" for a in actions.values())
    assert fresh.id not in {m for _, m in actions}
    decay = actions[("decay", idle.id)]
    assert decay.text == "decay 0.70 → 0.55 (idle 3 intervals)"
    assert decay.changes["confidence"] == pytest.approx(0.55)
    assert set(decay.changes["metadata"]) == {"decayed_at"}
    assert actions[("decay", stale.id)].text == "decay 0.70 → 0.50 (idle 2 intervals, stale procedure ×2)"
    assert actions[("decay", weak.id)].text == "decay 0.33 → 0.30 (idle 1 interval)"
    assert actions[("invalidate", weak.id)].changes["metadata"]["invalidation_reason"] == \
        "dream: confidence 0.30 at or below confidence_floor 0.3"
    assert actions[("invalidate", floored.id)].text.startswith("dream: confidence 0.30 at or below")
    assert ("decay", floored.id) not in actions
    assert actions[("boost", popular.id)].text == "boost 0.70 → 0.75 (5 accesses)"
    assert actions[("boost", popular.id)].changes["metadata"] == {"boosted_at_count": 5}

    # The list it replaces: order (an invalidation right after its decay), len, slices, counts.
    listed = list(deep.actions)
    assert [(a.kind, a.memory_id) for a in listed].index(("invalidate", weak.id)) == \
        [(a.kind, a.memory_id) for a in listed].index(("decay", weak.id)) + 1
    assert len(deep.actions) == len(listed) == 6
    assert [a.text for a in deep.actions[1:4]] == [a.text for a in listed[1:4]]
    assert deep.actions[-1].text == listed[-1].text and deep.actions[0].text == listed[0].text
    assert deep.counts() == {"decay": 3, "invalidate": 2, "boost": 1}
    assert [(p, m, c) for p, _, m, c in deep.actions.updates()] == [(a.phase, a.memory_id, a.changes) for a in listed]
    assert deep.actions.of_kind("merge") == []


def test_an_applied_dream_makes_no_action_object_for_its_decays(env, monkeypatch):
    store, config = env
    ids = [add(store, f"idle memory number {i}", age_days=65).id for i in range(30)]
    weak = add(store, "the weak one", confidence=0.33, age_days=31)

    def refuse(self):
        raise AssertionError("the apply read the compact decays as Action objects")

    monkeypatch.setattr(DecayRows, "__iter__", refuse)
    outcome = run_dream(store, config, apply=True, use_llm=False, phases=["deep"])
    assert outcome.action_counts()["deep"] == {"decay": 31, "invalidate": 1}
    Memory = store.models.Memory
    assert [m.confidence for m in Memory.select().where(Memory.id.in_(ids))] == [pytest.approx(0.6)] * 30
    assert Memory.get(Memory.id == weak.id).invalidated_at is not None
    journaled = store.db.execute_sql("SELECT kind, COUNT(*) FROM dream_action WHERE run_id = ? GROUP BY kind",
                                     (outcome.run_id,)).fetchall()
    assert {kind: n for kind, n in journaled if kind in ("decay", "invalidate")} == {"decay": 31, "invalidate": 1}


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"),
                    reason="reads the resident file pages from /proc")
def test_light_gives_back_the_pages_of_the_rows_it_has_read(tmp_path):
    def resident_file_kb() -> int:
        with open("/proc/self/status") as status:
            return sum(int(line.split()[1]) for line in status if line.startswith(("RssFile:", "RssShmem:")))

    rows, dim = 16384, 1024  # 16 MiB of int8 rows after a header, as the vector file holds them
    data = np.random.default_rng(3).integers(-127, 128, size=(rows, dim), dtype=np.int8)
    path = tmp_path / "rows.bin"
    path.write_bytes(b"\0" * 100 + data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    os.close(fd)
    matrix = np.frombuffer(mapped, dtype=np.int8, count=rows * dim, offset=100).reshape(rows, dim)
    release = _page_release(matrix)

    before = resident_file_kb()
    total = int(matrix[: rows // 2].astype(np.int64).sum())  # the first half read
    touched = resident_file_kb()
    assert touched - before > 6 * 1024
    release(0, rows // 2)
    assert resident_file_kb() < touched - 6 * 1024  # its pages are the kernel's again
    # A row read again (this process's search, say) faults back in unchanged.
    assert int(matrix[: rows // 2].astype(np.int64).sum()) == total
    assert np.array_equal(matrix[rows // 2 - 1], data[rows // 2 - 1])
    release(rows // 2, rows + 5)  # past the end: clipped
    assert _page_release(data)(0, 10) is None  # not a mapping: nothing to give back


def _twins(store, embedder, count: int) -> None:
    for i in range(count):
        text = f"the release checklist {i} says bump the version tag the changelog and push the signed tag"
        add(store, text, embedder=embedder)
        add(store, text + " today", embedder=embedder)


def _merges_seen(monkeypatch, store) -> list[bool]:
    """Whether a transaction was open as each merge was applied."""
    from llmem.dream import sweep

    seen, apply_action = [], sweep.apply_action

    def applying(store_, journal, action, **kw):
        if action.kind == "merge":
            seen.append(store.db.in_transaction())
        return apply_action(store_, journal, action, **kw)

    monkeypatch.setattr(sweep, "apply_action", applying)
    return seen


def test_merges_without_an_llm_share_a_transaction(env, monkeypatch):
    store, config = env
    _twins(store, FakeEmbedder(dim=512), 3)
    seen = _merges_seen(monkeypatch, store)
    outcome = run_dream(store, config, apply=True, use_llm=False, phases=["light", "deep"])
    assert [r["method"] for r in outcome.merge_results] == ["concatenation"] * 3
    assert seen == [True, True, True]  # inside the batch's transaction, not one of their own


def test_with_an_llm_each_merge_is_asked_outside_any_transaction(env, monkeypatch):
    store, config = env
    _twins(store, FakeEmbedder(dim=512), 2)
    seen = _merges_seen(monkeypatch, store)
    asked = []

    class Merger(StubLLM):
        def chat_json(self, messages, schema, task):
            asked.append(store.db.in_transaction())
            first = messages[-1]["content"].split("Memory 1:\n", 1)[1].split("\n\nMemory 2:")[0]
            return {"content": first + " (today)"}

    outcome = run_dream(store, config, apply=True, llm=Merger(), phases=["light", "deep"])
    assert [r["method"] for r in outcome.merge_results] == ["llm", "llm"]
    assert asked == [False, False] and seen == [False, False]


def test_a_relation_already_there_is_not_journaled_again(env):
    store, config = env
    a, b = add(store, "one memory"), add(store, "another memory")
    run = start_run(store, "dream", ["deep"])
    journal = Journal(store, run)
    with store.db.atomic():
        assert journal.relate("deep", "link", a.id, b.id, "related_to") is True
        assert journal.relate("deep", "link", a.id, b.id, "related_to") is False
    rows = store.db.execute_sql("SELECT op FROM dream_action WHERE run_id = ?", (run.id,)).fetchall()
    assert rows == [("relate",)] and journal.count == 1


def test_an_applied_runs_histograms_hold_every_valid_confidence(env):
    store, config = env
    for i in range(6):
        add(store, f"idle memory number {i}", age_days=65)
    add(store, "the weak one", confidence=0.33, age_days=31)
    add(store, "a fresh one", confidence=0.9)

    def valid() -> list[float]:
        return sorted(c for (c,) in store.db.execute_sql(
            "SELECT confidence FROM memory WHERE invalidated_at IS NULL").fetchall())

    before = valid()
    outcome = run_dream(store, config, apply=True, use_llm=False, phases=["deep"])
    assert sorted(outcome.confidence_before) == before and len(before) == 8
    assert sorted(outcome.confidence_after) == valid() == [pytest.approx(0.6)] * 6 + [0.9]


def test_compact_decays_apply_as_update_many_would_their_updates(env, monkeypatch):
    """DecayRows.apply works out its writes and images itself: the same rows and the same
    journal, byte for byte, as Journal.update_many given the updates the rows stand for."""
    store, config = env
    add(store, "the idle one", age_days=95, metadata={"speaker": "Zoë", "file": "a/b.py"})
    stale = add(store, "rotate the key by hand", "procedure", age_days=61)
    store.update(stale.id, metadata={"stale_procedure": True})
    store.db.execute_sql("UPDATE memory SET updated_at = created_at WHERE id = ?", (stale.id,))
    add(store, "the weak one", confidence=0.33, age_days=31)
    add(store, "already at the floor", confidence=0.3, age_days=1)
    popular = add(store, "the popular one")
    recall(store, popular, [f"q{i}" for i in range(5)], origin="context")
    for i in range(5):
        add(store, f"idle memory number {i}", age_days=40 + i)
    deep = _plan(store, config)
    compact = next(part for part in deep.actions._parts if isinstance(part, DecayRows))
    import llmem.dream.deep as deep_module
    import llmem.dream.journal as journal_module

    monkeypatch.setattr(deep_module, "now", lambda: 1_800_000_000.25)
    monkeypatch.setattr(journal_module, "now", lambda: 1_800_000_000.25)
    run = start_run(store, "dream", ["deep"])

    def applied(apply) -> tuple[list, list]:
        with store.db.atomic() as txn:
            apply(Journal(store, run))
            rows = store.db.execute_sql("SELECT * FROM memory ORDER BY seq").fetchall()
            journal = store.db.execute_sql("SELECT run_id, phase, kind, op, memory_id, before, after, created_at "
                                           "FROM dream_action WHERE run_id = ? ORDER BY id", (run.id,)).fetchall()
            txn.rollback()
        return rows, journal

    # In two slices, so a batch boundary falls inside the rows.
    by_rows = applied(lambda journal: (compact.apply(journal, 0, 3), compact.apply(journal, 3, compact.rows)))
    by_updates = applied(lambda journal: journal.update_many(list(compact.updates())))
    assert len(by_rows[1]) == len(compact) == 11
    assert {kind for _, _, kind, *_ in by_rows[1]} == {"decay", "boost", "invalidate"}
    assert by_rows == by_updates


def test_a_decay_planned_for_a_memory_deleted_since_is_not_written_to_the_one_holding_its_seq(env):
    """DecayRows.apply reads its rows by seq: a memory deleted after the plan fails the batch
    as it did by id, even when a memory added since holds its seq (SQLite reuses the
    highest rowid), and that memory is left as it is."""
    from llmem.errors import NotFound

    store, config = env
    add(store, "an idle one", age_days=95)
    last = add(store, "the last idle one", age_days=95)
    deep = _plan(store, config)
    compact = next(part for part in deep.actions._parts if isinstance(part, DecayRows))
    assert last.id in compact.ids
    store.delete(last.id)
    newcomer = add(store, "added after the plan")
    before = store.db.execute_sql("SELECT * FROM memory WHERE id = ?", (newcomer.id,)).fetchone()
    run = start_run(store, "dream", ["deep"])
    with pytest.raises(NotFound, match=last.id), store.db.atomic():
        compact.apply(Journal(store, run), 0, compact.rows)
    assert store.db.execute_sql("SELECT * FROM memory WHERE id = ?", (newcomer.id,)).fetchone() == before


def test_decay_rows_count_their_kinds_in_the_order_each_first_comes():
    rows = DecayRows(at=1_800_000_000.0, confidence_floor=0.3)
    rows.add("b", 2, 2, 0.7, 0.75, 5, 0.0, False)  # a boost
    rows.add("c", 3, 1, 0.35, 0.3, 1, 1.0, True)  # a decay, then its invalidation
    rows.add("d", 4, 0, 0.3, 0.3, 0, 0.0, True)  # an invalidation alone
    rows.add("e", 5, 1, 0.7, 0.6, 2, 1.0, False)
    counted = {}
    for action in rows:
        counted[("deep", action.kind)] = counted.get(("deep", action.kind), 0) + 1
    assert list(rows.kind_counts().items()) == list(counted.items()) == \
        [(("deep", "boost"), 1), (("deep", "decay"), 2), (("deep", "invalidate"), 2)]
    assert DecayRows(at=0.0, confidence_floor=0.3).kind_counts() == {}
