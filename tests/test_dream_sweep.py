"""The sweep as a whole: preview writes nothing, apply journals everything, undo restores it."""

from __future__ import annotations

import json

import pytest
from conftest import store_location
from dream_support import DAY, add, open_store, recall, run_cli, snapshot
from fakes import FakeEmbedder
from servers import store_rows

from llmem.dream import run_dream, undo_run
from llmem.exchange import export_data
from llmem.times import now

CONFIG = "dream:\n  auto_link_threshold: 0.5\n"


def build(home, store_url=None):
    """A store where every phase has something to do."""
    store, config = open_store(home, CONFIG, store_url)
    emb = FakeEmbedder(dim=512)
    add(store, "the deploy script lives in scripts/deploy.sh and needs AWS_PROFILE set before running it",
        embedder=emb, age_days=3)
    add(store, "the deploy script lives in scripts/deploy.sh and it needs AWS_PROFILE set before running it",
        embedder=emb, age_days=1)
    add(store, "postgres is the main database; migrations run with alembic upgrade head", "decision",
        embedder=emb)
    add(store, "postgres migrations run with alembic upgrade head in the api container", "procedure",
        embedder=emb)
    for i in range(3):
        add(store, f"Category: NULL_SAFETY\nWhat_happened: dereferenced a missing user {i}\n"
                   f"Proposed_update: check user is not None before .name\nIteration_count: 2",
            "self_assessment", age_days=i + 1)
    add(store, "an idle fact nobody reads about the old build server", age_days=70)
    add(store, "a weak guess about the cache layout", confidence=0.32, age_days=31)
    busy = add(store, "ruff is the linter and formatter for this repo")
    recall(store, busy, [f"lint {i}" for i in range(6)], days_ago=[0, 0, 1, 1, 2, 3])
    add(store, "procedure to rotate the signing key by hand", "procedure", age_days=90)
    store.close()
    return config


def written(home) -> tuple[dict, dict]:
    """Every file of the home and, for a store on a server, every row of its tables."""
    return snapshot(home), store_rows(store_location())


def test_preview_writes_nothing(home):
    build(home)
    before = written(home)
    assert "memory.db" in before[0] or before[1]["memory"]
    code, out, err = run_cli("dream")
    assert code == 0, err
    assert "preview" in out and "merge" in out and "decay" in out and "promote" in out
    code, out, _ = run_cli("dream", "--json")
    plan = json.loads(out)
    kinds = {a["kind"] for a in plan["actions"]}
    assert {"merge", "decay", "invalidate", "promote", "insight", "flag_stale", "link"} <= kinds
    for args in (("dream", "--phase", "deep"), ("promote",), ("dream", "status"), ("promote-explain", "ruff linter")):
        code, _, err = run_cli(*args)
        assert code == 0, (args, err)
    assert written(home) == before


def test_preview_report_is_the_only_file_written(home, tmp_path):
    build(home)
    before = written(home)
    report = tmp_path / "out" / "report.html"
    report.parent.mkdir()  # a report goes only into a folder that exists
    code, _, err = run_cli("dream", "--report", str(report))
    assert code == 0, err
    assert report.exists() and "<svg" in report.read_text()
    assert written(home) == before


def _export(store):
    data = export_data(store)
    data.pop("exported_at")
    return data


def test_apply_then_undo_restores_exactly(home, store_url):
    config = build(home, store_url)
    from llmem.store import Store

    store = Store.open(config.store_location)
    DreamRun = store.models.DreamRun
    before_export = _export(store)
    before_files = {k: v for k, v in snapshot(home).items() if not k.startswith("memory.db")}
    outcome = run_dream(store, config, apply=True)
    counts = outcome.action_counts()
    assert counts["deep"].get("merge") == 1 and counts["deep"].get("promote") == 1
    assert counts["rem"].get("insight") == 1
    after_export = _export(store)
    assert after_export != before_export
    assert config.diary_path.exists() and config.paths.memory_md_path.exists()
    assert config.paths.proposed_changes_path.exists()
    assert (home / "DREAMS.md").exists()  # created by the run: undo removes it

    result = undo_run(store, outcome.run_id)
    assert result.restored and result.deleted and result.files
    assert _export(store) == before_export
    after_files = {k: v for k, v in snapshot(home).items() if not k.startswith("memory.db")}
    assert after_files == before_files
    assert DreamRun.get_by_id(outcome.run_id).status == "undone"
    with pytest.raises(Exception, match="already undone"):
        undo_run(store, outcome.run_id)
    store.close()


def test_undo_cli_and_status(home):
    build(home)
    code, out, err = run_cli("dream", "--apply", "--json")
    assert code == 0, err
    run_id = json.loads(out)["run_id"]
    code, out, _ = run_cli("dream", "status", "--json")
    status = json.loads(out)
    assert status["last_run"]["id"] == run_id
    assert status["next_run"].endswith("03:00") or "T03:00" in status["next_run"]
    assert status["last_run"]["counts"]["deep"]["merge"] >= 1
    code, out, err = run_cli("dream", "undo", run_id)
    assert code == 0, err
    assert "Undid run" in out
    code, out, err = run_cli("dream", "undo", run_id)
    assert code != 0 and "already undone" in err


def test_merge_keeps_originals_linked(home):
    config = build(home)
    from llmem.store import Store

    store = Store.open(config.store_location)
    Memory, Relation = store.models.Memory, store.models.Relation
    outcome = run_dream(store, config, apply=True, phases=["light", "deep"])
    merged_id = outcome.merge_results[0]["merged_id"]
    merged = Memory.get(Memory.id == merged_id)
    assert merged.source == "dream" and merged.metadata["merge_method"] == "concatenation"
    originals = merged.metadata["merged_from"]
    for memory_id in originals:
        original = Memory.get(Memory.id == memory_id)
        assert original.invalidated_at is not None
        assert merged_id in original.metadata["invalidation_reason"]
    kinds = {(r.source_id, r.target_id, r.type) for r in Relation.select()}
    for memory_id in originals:
        assert (merged_id, memory_id, "derived_from") in kinds
        assert (merged_id, memory_id, "supersedes") in kinds
    store.close()


def test_second_run_is_incremental(home):
    config = build(home)
    from llmem.store import Store

    store = Store.open(config.store_location)
    first = run_dream(store, config, apply=True, phases=["light"])
    assert first.light.changed == 4
    emb = FakeEmbedder(dim=512)
    add(store, "postgres is the main database and migrations run with alembic upgrade head", "decision",
        embedder=emb)
    second = run_dream(store, config, apply=True, phases=["light"])
    assert second.light.changed == 1 and second.light.compared_with == 5
    assert len(second.light.near_duplicates) == 1
    store.close()


def test_deep_alone_uses_last_light_candidates(home):
    config = build(home)
    from llmem.store import Store

    store = Store.open(config.store_location)
    run_dream(store, config, apply=True, phases=["light"])
    deep = run_dream(store, config, apply=True, phases=["deep"])
    assert deep.action_counts()["deep"].get("merge") == 1
    assert any("light run" in n for n in deep.notes)
    store.close()


def test_failed_run_is_recorded_rolled_back_and_lock_released(home, monkeypatch):
    """A dream that fails midway (REM applied, deep fails) leaves nothing half-written."""
    config = build(home)
    from llmem.dream import sweep
    from llmem.dream.lock import read_lock
    from llmem.store import Store

    store = Store.open(config.store_location)
    DreamRun = store.models.DreamRun
    rows = "SELECT id, content, confidence, metadata, updated_at, invalidated_at FROM memory ORDER BY seq"
    before = store.db.execute_sql(rows).fetchall()

    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(sweep, "plan_deep", boom)
    with pytest.raises(RuntimeError):
        run_dream(store, config, apply=True)
    run = DreamRun.select().order_by(DreamRun.started_at.desc()).get()
    assert run.status == "undone" and "disk on fire" in run.error
    assert store.models.DreamAction.select().where(store.models.DreamAction.run == run.id).count()  # REM wrote
    assert store.db.execute_sql(rows).fetchall() == before
    assert read_lock(store.db) is None
    assert now() - run.started_at < DAY
    store.close()


def test_an_applied_dream_embeds_the_memories_it_made(cli, ollama_config):
    for text in ("the deploy script lives in scripts/deploy.sh and needs AWS_PROFILE set before running it",
                 "the deploy script lives in scripts/deploy.sh and it needs AWS_PROFILE set before running it"):
        code, _, err = cli("add", "--content", text)
        assert code == 0, err
    code, out, err = cli("dream", "--apply", "--no-llm", "--json")
    assert code == 0, err
    assert json.loads(out)["counts"]["deep"].get("merge") == 1
    code, out, _ = cli("stats", "--json")
    assert json.loads(out)["pending_embedding"] == 0


# ---- undo never loses an edit made after the run (issue 20 item 4) ---------------------------

def test_undo_leaves_a_memory_edited_since_the_run_and_force_restores_it(home):
    config = build(home)
    from llmem.store import Store

    store = Store.open(config.store_location)
    Memory = store.models.Memory
    before_ids = {m.id for m in Memory.select()}
    idle_before = next(m for m in Memory.select() if "idle fact" in m.content)
    outcome = run_dream(store, config, apply=True)
    created = [m for m in Memory.select() if m.id not in before_ids]
    merged = next(m for m in created if m.source == "dream" and "deploy" in m.content)
    decayed = next(m for m in Memory.select() if "idle fact" in m.content)
    store.update(merged.id, content="deploy with scripts/deploy.sh; AWS_PROFILE=prod, said the user")
    store.update(decayed.id, confidence=0.95)

    result = undo_run(store, outcome.run_id)
    assert sorted(result.skipped_memories) == sorted([merged.id, decayed.id])
    kept = store.get(merged.id)  # the dream created it, the user edited it: it stays
    assert kept.content == "deploy with scripts/deploy.sh; AWS_PROFILE=prod, said the user"
    assert store.get(decayed.id).confidence == pytest.approx(0.95)
    # Everything else of the run is undone: no other memory the run created is left.
    assert {m.id for m in Memory.select()} == before_ids | {merged.id}

    code, out, err = run_cli("dream", "undo", outcome.run_id)
    assert code != 0 and "already undone" in err
    store.close()
    code, out, err = run_cli("dream", "undo", outcome.run_id, "--force")
    assert code == 0, err
    store = Store.open(config.store_location)
    assert {m.id for m in store.models.Memory.select()} == before_ids
    assert decayed.confidence < idle_before.confidence  # the run decayed it
    assert store.get(decayed.id).confidence == pytest.approx(idle_before.confidence)
    store.close()


def test_undo_cli_reports_the_memories_it_left(home):
    config = build(home)
    code, out, err = run_cli("dream", "--apply", "--json")
    run_id = json.loads(out)["run_id"]
    from llmem.store import Store

    with Store.open(config.store_location) as store:
        idle = next(m for m in store.list(limit=None) if "idle fact" in m.content)
        store.update(idle.id, content="an idle fact about the old build server, corrected by hand")
    code, out, err = run_cli("dream", "undo", run_id)
    assert code == 0, err
    assert f"memory {idle.id} changed since the run; left as it is" in err and "--force" in err
    with Store.open(config.store_location) as store:
        assert store.get(idle.id).content.endswith("corrected by hand")


def test_a_promote_that_fails_to_write_leaves_a_failed_run_and_no_lock(home):
    # Issue 20 item 17: a run that cannot write what it must leaves no "running" row nor lock.
    from llmem.dream.lock import read_lock
    from llmem.dream.sweep import run_promote

    store, config = open_store(home)
    memory = add(store, "the deploy script needs the staging vpn and a fresh token from vault",
                 "procedure", age_days=10)
    recall(store, memory, [f"deploy question {i}" for i in range(8)], score=0.95,
           days_ago=[0, 0.5, 1, 2, 3, 4, 5, 6])
    config.paths.memory_md_path.mkdir(parents=True)  # MEMORY.md cannot be written: a folder holds its name
    with pytest.raises(OSError):
        run_promote(store, config, apply=True)
    (run,) = store.models.DreamRun.select()
    assert run.kind == "promote" and run.status == "failed" and "Error" in run.error
    assert read_lock(store.db) is None
    store.close()
