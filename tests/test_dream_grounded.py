"""The grounded lane: rem-harness writes nothing; rem-backfill writes journaled DREAMS.md
entries and stages evidence; both rollbacks remove exactly that, byte for byte."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from dream_support import add, open_store, recall, run_cli, snapshot

JOURNAL_TABLES = {"dream_run", "dream_action"}  # where the backfill and its rollback are recorded


def write_notes(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "2026-10-01.md").write_text(
        "# Router setup\n- We decided to use VLAN 20 for the lab routers.\n- The router vlan trunk goes to port 24.\n"
        "- I prefer configuring the router vlan by ansible, not by hand.\n")
    (folder / "2026-10-02.md").write_text(
        "## VLAN follow-up\nWe decided to use VLAN 20 for the lab routers.\n"
        "Remember: the vlan 20 gateway is 10.20.0.1\n```\ndecided: this is code, not a note\n```\n")
    (folder / "2026-10-03.md").write_text("## Deep Sleep\n- Promoted 1a2b3c4d (score 0.9): a diary line\n")
    (folder / "notes.md").write_text("We decided nothing dated here.\n")
    return folder


def tables(home: Path) -> dict[str, list]:
    """Every row of every table but the journal's and the FTS/vector indexes' internals."""
    db = sqlite3.connect(home / "memory.db")
    try:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                 if n not in JOURNAL_TABLES and not n.startswith(("memory_fts", "vec", "sqlite_"))]
        out = {n: sorted(map(repr, db.execute(f'SELECT * FROM "{n}"'))) for n in names}
        # Deleting a memory bumps the vector cache's generation (vec.drop_vectors), a counter
        # telling other processes to reload their vectors, not data; so does a recall added or
        # removed to promotion_generation (the viewer's kept promotion bounds, 0019).
        out["setting"] = [r for r in out["setting"]
                          if "'vec_generation'" not in r and "'promotion_generation'" not in r]
        return out
    finally:
        db.close()


def files(home: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(home).items() if not k.startswith("memory.db")}


def live_store(home: Path):
    """A store in use: memories, live recalls, a dream run's diary and MEMORY.md, user text in DREAMS.md."""
    store, _ = open_store(home)
    vlan = add(store, "We decided to use VLAN 20 for the lab routers.", "decision")
    recall(store, vlan, ["vlan id"], days_ago=[1])
    other = add(store, "ruff is the linter and formatter for this repo")
    recall(store, other, ["linter", "formatter", "lint config"], days_ago=[2, 1, 0])
    store.close()
    code, _, err = run_cli("dream", "--apply", "--no-llm")
    assert code == 0, err
    (home / "DREAMS.md").write_text("# Dreams\n\nMy own notes about dreaming, kept by hand.\n")
    return vlan, other


def backfill(*args: str) -> dict:
    code, out, err = run_cli("dream", "rem-backfill", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_rem_harness_writes_nothing(home, tmp_path):
    live_store(home)  # its dream run promoted the linter memory
    store, _ = open_store(home)
    docs = add(store, "the docs site is built with mkdocs material")
    recall(store, docs, ["docs build", "mkdocs theme", "site generator"], days_ago=[2, 1, 0])
    store.close()
    notes = write_notes(tmp_path / "notes")
    before_files, before_rows, db_bytes = files(home), tables(home), snapshot(home)
    code, out, err = run_cli("dream", "rem-harness")
    assert code == 0, err
    assert "Deep would promote 1 memories" in out and "- fact: the docs site is built with mkdocs material (id" in out
    code, out, err = run_cli("dream", "rem-harness", "--json")
    data = json.loads(out)
    assert [p["memory_md_line"].split(" (id")[0] for p in data["deep"]["promote"]] == [
        "- fact: the docs site is built with mkdocs material"]
    code, out, err = run_cli("dream", "rem-harness", "--path", str(notes), "--grounded")
    assert code == 0, err
    assert "## Grounded replay: 2026-10-01" in out and "decision (line 2): We decided to use VLAN 20" in out
    assert "2026-10-03.md: skipped" in out and "notes.md" in out
    assert "decided: this is code" not in out
    assert snapshot(home) == db_bytes  # not one byte of the store, the diary or DREAMS.md
    assert files(home) == before_files and tables(home) == before_rows


def test_rem_harness_usage_errors(home, tmp_path):
    open_store(home)[0].close()
    assert run_cli("dream", "rem-harness", "--grounded")[0] == 2
    assert run_cli("dream", "rem-harness", "--path", str(tmp_path))[0] == 2
    code, _, err = run_cli("dream", "rem-harness", "--path", str(tmp_path / "missing"), "--grounded")
    assert code == 2 and "not a folder" in err
    reports = tmp_path / "dreaming" / "deep"
    reports.mkdir(parents=True)
    code, _, err = run_cli("dream", "rem-harness", "--path", str(reports), "--grounded")
    assert code == 2 and "never replayed" in err


def test_backfill_then_rollback_leaves_everything_byte_for_byte(home, tmp_path):
    vlan, _ = live_store(home)
    notes = write_notes(tmp_path / "notes")
    before_files, before_rows = files(home), tables(home)

    data = backfill("--path", str(notes), "--stage-short-term")
    run_id = data["run_id"]
    assert data["written"] == ["2026-10-01", "2026-10-02"]
    assert data["staged"] == {"memories": 2, "recalls": 4}
    dreams = (home / "DREAMS.md").read_text()
    assert dreams.startswith("# Dreams\n\nMy own notes about dreaming, kept by hand.\n")
    assert f"<!-- llmem:grounded {run_id} 2026-10-01 begin -->" in dreams
    assert "Deep Sleep" not in dreams  # the artefact note was not replayed
    # The note's decision is the live memory's text: it gains evidence, no second memory.
    code, out, _ = run_cli("promote-explain", vlan.id, "--json")
    assert json.loads(out)[0]["recalls"]["grounded"] == 2
    code, out, _ = run_cli("dream", "status", "--deep", "--json")
    assert json.loads(out)["deep"]["grounded_staged"] == {"recalls": 4, "memories": 3}
    # Journaled like every dream action.
    db = sqlite3.connect(home / "memory.db")
    ops = dict(db.execute("SELECT op, COUNT(*) FROM dream_action WHERE run_id = ? GROUP BY op", (run_id,)).fetchall())
    db.close()
    assert ops == {"file": 1, "create": 2, "report": 4}
    assert tables(home) != before_rows

    code, _, err = run_cli("dream", "undo", run_id)
    assert code == 2 and "rem-backfill --rollback" in err
    data = backfill("--rollback", run_id)
    assert (data["recalls_removed"], data["memories_removed"], data["entries_removed"]) == (4, 2, 2)
    assert files(home) == before_files
    assert tables(home) == before_rows
    assert run_cli("dream", "rem-backfill", "--rollback", run_id)[0] == 2  # already rolled back


def test_rollback_short_term_keeps_the_entries_then_rollback_removes_them(home, tmp_path):
    live_store(home)
    notes = write_notes(tmp_path / "notes")
    before_files, before_rows = files(home), tables(home)
    run_id = backfill("--path", str(notes), "--stage-short-term")["run_id"]
    with_entries = files(home)

    data = backfill("--rollback-short-term")
    assert data["runs"] == [run_id] and data["recalls_removed"] == 4 and data["entries_removed"] == 0
    assert tables(home) == before_rows  # staged evidence gone, live recalls untouched
    assert files(home) == with_entries  # the grounded diary entries stay
    data = backfill("--rollback", run_id)
    assert data["recalls_removed"] == 0 and data["entries_removed"] == 2
    assert files(home) == before_files and tables(home) == before_rows


def test_rollback_removes_only_its_entries_and_leaves_live_use_alone(home, tmp_path):
    live_store(home)
    notes = write_notes(tmp_path / "notes")
    diary_before = (home / "dream-diary.md").read_bytes()
    run_id = backfill("--path", str(notes), "--stage-short-term")["run_id"]
    # After the backfill: the user writes in DREAMS.md, and a live search recalls a staged memory.
    dreams = home / "DREAMS.md"
    dreams.write_text(dreams.read_text() + "\nA line the user added afterwards.\n")
    code, out, _ = run_cli("search", "gateway")
    assert code == 0 and "10.20.0.1" in out
    before_rows = tables(home)

    data = backfill("--rollback", run_id)
    assert data["entries_removed"] == 2 and data["memories_removed"] == 1
    assert list(data["memories_kept"].values()) == ["recalled by live use since"]
    assert dreams.read_text() == ("# Dreams\n\nMy own notes about dreaming, kept by hand.\n"
                                  "\nA line the user added afterwards.\n")
    assert (home / "dream-diary.md").read_bytes() == diary_before
    after_rows = tables(home)
    live = [r for r in before_rows["recall_event"] if "'grounded'" not in r]
    assert after_rows["recall_event"] == live  # every live recall kept, every staged one gone


def test_a_second_backfill_skips_days_already_replayed(home, tmp_path):
    open_store(home)[0].close()
    notes = write_notes(tmp_path / "notes")
    first = backfill("--path", str(notes))
    second = backfill("--path", str(notes))
    assert second["written"] == [] and second["already_replayed"] == {
        "2026-10-01": first["run_id"], "2026-10-02": first["run_id"]}
    assert (home / "DREAMS.md").read_text().count("## Grounded replay: 2026-10-01") == 1


def test_rem_backfill_usage_errors(home, tmp_path):
    open_store(home)[0].close()
    assert run_cli("dream", "rem-backfill")[0] == 2
    assert run_cli("dream", "rem-backfill", "--stage-short-term")[0] == 2
    assert run_cli("dream", "rem-backfill", "--path", str(tmp_path), "--rollback", "abcd")[0] == 2
    code, _, err = run_cli("dream", "rem-backfill", "--rollback", "ffffffff")
    assert code == 1 and "no dream run" in err


def test_secrets_in_a_note_are_redacted_before_any_entry_or_staged_memory_quotes_them(home, tmp_path):
    open_store(home)[0].close()
    token = "ghp_" + "a1B2c3D4" * 5
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "2026-10-05.md").write_text(f"Remember: the deploy bot authenticates with {token}\n")
    code, out, _ = run_cli("dream", "rem-harness", "--path", str(notes), "--grounded")
    assert code == 0 and token not in out and "deploy bot" in out
    backfill("--path", str(notes), "--stage-short-term")
    assert token not in (home / "DREAMS.md").read_text()
    db = sqlite3.connect(home / "memory.db")
    contents = [c for (c,) in db.execute("SELECT content FROM memory")]
    db.close()
    assert len(contents) == 1 and "deploy bot" in contents[0] and token not in contents[0]


def test_staged_memories_outlive_the_next_dream_and_then_roll_back(home, tmp_path):
    open_store(home)[0].close()
    notes = write_notes(tmp_path / "notes")
    run_id = backfill("--path", str(notes), "--stage-short-term")["run_id"]
    code, _, err = run_cli("dream", "--apply", "--no-llm")
    assert code == 0, err
    db = sqlite3.connect(home / "memory.db")
    rows = db.execute("SELECT confidence, invalidated_at FROM memory").fetchall()
    db.close()
    assert rows and all(conf == 0.6 and invalid is None for conf, invalid in rows)  # notes of October: no decay
    assert backfill("--rollback", run_id)["memories_removed"] == 3


def test_entries_sit_beside_the_phase_blocks_and_a_rollback_after_a_dream_keeps_the_blocks(home, tmp_path):
    store, _ = open_store(home)
    docs = add(store, "the docs site is built with mkdocs material")
    recall(store, docs, ["docs build", "mkdocs theme", "site generator"], days_ago=[2, 1, 0])
    store.close()
    notes = write_notes(tmp_path / "notes")
    run_id = backfill("--path", str(notes))["run_id"]
    code, _, err = run_cli("dream", "--apply", "--no-llm")  # rewrites its phase blocks in DREAMS.md
    assert code == 0, err
    dreams = home / "DREAMS.md"
    text = dreams.read_text()
    assert "## Deep Sleep" in text and text.count("## Grounded replay:") == 2
    blocks = text[text.index("<!-- llmem:dreams light begin -->"):]

    backfill("--rollback", run_id)
    after = dreams.read_text()
    assert "Grounded replay" not in after and after.endswith(blocks)
    assert after == text.replace(text[text.index("\n<!-- llmem:grounded"):text.index("\n<!-- llmem:dreams light")], "")
