"""Review of proposed changes (llmem/dream/review.py and `llmem dream review`): stable ids,
decisions recorded in the store with who and when, nothing ever applied."""

from __future__ import annotations

import json

import pytest
from dream_support import open_store, run_cli, snapshot
from proposals_support import propose_changes

from llmem.dream.review import DECISIONS_KEY, list_proposals, parse_proposals, record_decision
from llmem.errors import NotFound, UsageError


@pytest.fixture
def env(llmem_home):
    store, config = open_store(llmem_home)
    yield store, config, llmem_home
    store.close()


def test_rem_entries_get_ids_from_their_markers(env):
    store, config, _ = env
    propose_changes(store, config)
    proposals = list_proposals(store.db, config.paths.proposed_changes_path)
    assert [(p.id, p.kind, p.key) for p in proposals] == [
        ("insight:EDGE_CASE", "insight", "EDGE_CASE"),
        ("skill-patch:EDGE_CASE", "skill_patch", "EDGE_CASE")]
    patch = proposals[1]
    assert patch.title == "[SKILL PATCH] EDGE_CASE" and "### Checklist" in patch.text
    assert "Behavioural insight" not in patch.text  # each entry is its own section
    assert all(p.decision is None for p in proposals)


def test_ids_survive_edits_and_hand_written_sections_get_one():
    text = ("# Proposed changes\n\npreamble\n\n## [SKILL PATCH] X\n<!-- llmem:skill-patch X -->\nold\n"
            "## My own idea\nsomething\n")
    edited = text.replace("old", "reworded by hand").replace("# Proposed changes", "# Mine")
    first, second = parse_proposals(text), parse_proposals(edited)
    assert [p.id for p in first] == [p.id for p in second]
    assert first[0].id == "skill-patch:X" and first[1].kind == "note"
    assert first[0].sha256 != second[0].sha256
    # The same marker pasted twice still gives two ids.
    doubled = parse_proposals(text + "## [SKILL PATCH] X again\n<!-- llmem:skill-patch X -->\n")
    assert [p.id for p in doubled] == ["skill-patch:X", "note:" + first[1].key, "skill-patch:X#2"]


def test_accepting_records_and_applies_nothing(env):
    store, config, home = env
    propose_changes(store, config)
    path = config.paths.proposed_changes_path
    def files():  # everything but the store itself
        return {name: data for name, data in snapshot(home).items() if not name.startswith("memory.db")}

    files_before = files()
    Memory = store.models.Memory
    memories_before = list(Memory.select().order_by(Memory.id).dicts())
    made = record_decision(store, path, "skill-patch:EDGE_CASE", "accepted", by="test on here",
                           note="fine", at=1000.0)
    assert files() == files_before  # proposed-changes.md, skills, MEMORY.md untouched
    assert list(Memory.select().order_by(Memory.id).dicts()) == memories_before
    listed = {p.id: p for p in list_proposals(store.db, path)}
    decided = listed["skill-patch:EDGE_CASE"].decision
    assert decided == made and decided.by == "test on here" and decided.at == 1000.0
    assert decided.decision == "accepted" and decided.note == "fine"
    assert listed["insight:EDGE_CASE"].decision is None
    # A later decision wins; both stay on record.
    record_decision(store, path, "skill-patch:EDGE_CASE", "rejected", by="test")
    listed = {p.id: p for p in list_proposals(store.db, path)}
    assert listed["skill-patch:EDGE_CASE"].decision.decision == "rejected"
    from llmem.db.settings import get_setting

    assert [row["decision"] for row in json.loads(get_setting(store.db, DECISIONS_KEY))] == [
        "accepted", "rejected"]


def test_an_edited_entry_says_it_changed_since_its_decision(env):
    store, config, _ = env
    propose_changes(store, config)
    path = config.paths.proposed_changes_path
    record_decision(store, path, "insight:EDGE_CASE", "accepted", by="test")
    path.write_text(path.read_text().replace("Class of mistake", "Kind of mistake"))
    listed = {p.id: p for p in list_proposals(store.db, path)}
    assert listed["insight:EDGE_CASE"].changed_since_decision
    assert not listed["skill-patch:EDGE_CASE"].changed_since_decision


def test_unknown_ids_and_decisions_are_refused(env):
    store, config, _ = env
    propose_changes(store, config)
    path = config.paths.proposed_changes_path
    with pytest.raises(NotFound):
        record_decision(store, path, "skill-patch:NOPE", "accepted", by="test")
    with pytest.raises(UsageError):
        record_decision(store, path, "skill-patch:EDGE_CASE", "applied", by="test")
    assert list_proposals(store.db, path.with_name("absent.md")) == []


def test_cli_lists_accepts_and_rejects(env):
    store, config, _ = env
    propose_changes(store, config)
    code, out, _ = run_cli("dream", "review")
    assert code == 0 and "skill-patch:EDGE_CASE" in out and "waiting" in out
    code, out, _ = run_cli("dream", "review", "accept", "skill-patch:EDGE_CASE", "--note", "ok")
    assert code == 0 and "accepted by cli " in out and "Nothing was applied" in out
    code, out, _ = run_cli("dream", "review", "reject", "insight:EDGE_CASE")
    assert code == 0 and "rejected" in out
    code, out, _ = run_cli("dream", "review", "--json")
    decided = {p["id"]: p["decision"]["decision"] for p in json.loads(out)}
    assert decided == {"insight:EDGE_CASE": "rejected", "skill-patch:EDGE_CASE": "accepted"}
    code, _, err = run_cli("dream", "review", "accept", "skill-patch:NOPE")
    assert code == 1 and "dream review" in err
