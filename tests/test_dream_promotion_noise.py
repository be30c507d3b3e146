"""Promotion that resists noise: bursts and same-day repeats count once, snippets are cut at a
sentence end, MEMORY.md holds readable one-liners, deep re-reads before writing, and dream
artefacts are never promoted."""

from __future__ import annotations

import datetime
import json

import pytest
from dream_support import DAY, add, open_store, recall, run_cli

from llmem.dream.deep import apply_action, plan_deep
from llmem.dream.journal import Journal, start_run
from llmem.dream.memory_md import cut_snippet
from llmem.dream.promote import apply_promotions, candidates, promotable
from llmem.times import now


def explain(memory_id: str) -> dict:
    code, out, err = run_cli("promote-explain", memory_id, "--json")
    assert code == 0, err
    return json.loads(out)[0]


def test_a_burst_of_six_searches_within_a_minute_passes_no_gate(home):
    store, _ = open_store(home)
    memory = add(store, "The staging database is reached through the bastion host bastion-2 on port 2222")
    store.close()
    queries = ["staging database", "bastion host", "staging bastion port", "database port 2222",
               "bastion-2", "how to reach staging database"]
    for query in queries:  # real searches, each recording its recall, all within seconds
        code, out, err = run_cli("search", query)
        assert code == 0 and memory.id[:8] in out, (query, out, err)

    data = explain(memory.id)
    assert data["recalls"]["searches"] == 6
    assert data["recalls"]["counted"] == 1 and data["recalls"]["unique_queries"] == 1
    assert data["recalls"]["days"] == 1
    assert {"min_recall_count", "min_unique_queries"} <= set(data["holding_gates"])
    assert data["verdict"].startswith("hold")
    code, out, _ = run_cli("promote", "--json")
    assert json.loads(out)["promote"] == []
    code, out, _ = run_cli("dream", "status", "--deep")
    assert "1 counted recalls of 6 recorded" in out and "held by: min_score, min_recall_count, min_unique_queries" in out


def test_a_memory_recalled_on_three_days_by_different_queries_is_promoted(home):
    store, _ = open_store(home)
    memory = add(store, "Releases are tagged vX.Y.Z on main and the changelog is written by towncrier", "decision")
    recall(store, memory, ["release tag", "changelog tool", "how do we version"], days_ago=[2, 1, 0])
    store.close()

    data = explain(memory.id)
    assert (data["recalls"]["counted"], data["recalls"]["unique_queries"], data["recalls"]["days"]) == (3, 3, 3)
    assert data["holding_gates"] == [] and data["verdict"] == "promote"
    code, out, err = run_cli("promote", "--apply", "--json")
    assert code == 0, err
    assert [c["memory_id"] for c in json.loads(out)["promote"]] == [memory.id]
    text = (home / "MEMORY.md").read_text()
    assert (f"- decision: Releases are tagged vX.Y.Z on main and the changelog is written by towncrier "
            f"(id {memory.id[:8]}, user)") in text


def test_the_same_query_repeated_in_one_day_counts_once_and_days_count_apart(home):
    store, config = open_store(home)
    memory = add(store, "ruff is both linter and formatter here")
    RecallEvent = store.models.RecallEvent
    # Yesterday's local noon: six hours back from it stays on its day whatever time the test
    # runs (days are counted in the local zone, dream.timezone unset).
    at = (datetime.datetime.now().replace(hour=12, minute=0, second=0, microsecond=0)
          - datetime.timedelta(days=1)).timestamp()
    # Same query three times a day, hours apart (not a burst): one recall per day.
    for day in (0, 1):
        for hours in (0, 3, 6):
            RecallEvent.create(memory=memory.id, query_hash="same", rank=1, score=0.8, origin="search",
                               created_at=at - day * DAY - hours * 3600)
    [c] = candidates(store, config.dream, memory_ids=[memory.id])
    assert (c.searches, c.recalls, c.unique_queries, c.recall_days) == (6, 2, 1, 2)
    store.close()


def test_context_and_dream_recalls_do_not_count(home):
    store, config = open_store(home)
    memory = add(store, "the VPN profile is named corp-west")
    recall(store, memory, ["a", "b", "c"], origin="context", days_ago=[0, 1, 2])
    recall(store, memory, ["d"], origin="dream")
    [c] = candidates(store, config.dream, memory_ids=[memory.id])
    assert (c.recalls, c.excluded_recalls) == (0, 4)
    store.close()


def test_snippet_is_cut_on_a_sentence_boundary():
    sentence = "The build runs in the ci container and caches wheels in /var/cache/pip. "
    text = sentence * 20
    cut = cut_snippet(text, 160)
    assert len(cut) <= 160 * 4 and cut.endswith("/var/cache/pip.")
    assert cut.count("The build") == 8  # 8 whole sentences of 71 characters fit in 640
    assert cut_snippet("Short fact. Another one.", 160) == "Short fact. Another one."
    # One sentence longer than the budget: cut at a word, marked.
    long_one = "word " * 300
    assert cut_snippet(long_one, 10).endswith("…") and len(cut_snippet(long_one, 10)) <= 40


def test_memory_md_lines_are_cut_to_the_configured_budget_and_show_a_lesson(home):
    store, _ = open_store(home, "dream:\n  max_promoted_snippet_tokens: 20\n")
    long_memory = add(store, "Deploys go through the release pipeline only. Never push images by hand from a "
                             "laptop because the registry credentials there are scoped to staging. "
                             "The pipeline signs every image.", "procedure", session_id="sess-1234-abcd")
    lesson = add(store, "Category: NULL_SAFETY\nContext: api handler\nWhat_happened: read user.name on a "
                        "missing user\nOutcomes: 500 in prod\nWhat_caught_it: sentry\nEstimates_vs_actual: 1h vs "
                        "4h\nRecurring: yes\nProposed_update: Check the user lookup for None before reading "
                        "its fields.\nIteration_count: 3", "self_assessment", metadata={"category": "NULL_SAFETY"})
    for memory in (long_memory, lesson):
        recall(store, memory, ["deploy images", "user lookup", "registry creds"], days_ago=[2, 1, 0])
    store.close()
    code, out, err = run_cli("promote", "--apply")
    assert code == 0, err
    lines = [line for line in (home / "MEMORY.md").read_text().splitlines() if line.startswith("- ")]
    assert f"- procedure: Deploys go through the release pipeline only. (id {long_memory.id[:8]}, user, session sess-123)" in lines
    assert (f"- lesson (NULL_SAFETY): Check the user lookup for None before reading its fields. "
            f"(id {lesson.id[:8]}, user)") in lines
    assert not any("What_happened" in line or "Estimates_vs_actual" in line for line in lines)


def test_deep_skips_candidates_changed_invalidated_or_deleted_since_ranking(home):
    store, config = open_store(home)
    cfg = config.dream
    kept = add(store, "the docs site is built with mkdocs material")
    edited = add(store, "the api listens on port 8080 behind nginx")
    invalid = add(store, "the queue is redis streams")
    deleted = add(store, "the frontend uses vite with react")
    for memory in (kept, edited, invalid, deleted):
        recall(store, memory, ["docs build", "api port", "queue tech"], days_ago=[2, 1, 0])
    chosen, _ = promotable(store, cfg)
    assert {c.memory_id for c in chosen} == {kept.id, edited.id, invalid.id, deleted.id}

    store.update(edited.id, content="the api listens on port 9090 behind caddy")
    store.invalidate(invalid.id, "replaced by kafka")
    store.delete(deleted.id)
    run = start_run(store, "promote", ["deep"])
    with store.db.atomic():
        promoted, skipped = apply_promotions(store, Journal(store, run), chosen, now())
    assert [c.memory_id for c in promoted] == [kept.id]
    assert "stale" in skipped[edited.id] and "invalidated" in skipped[invalid.id] and "deleted" in skipped[deleted.id]
    Memory = store.models.Memory
    assert Memory.get(Memory.id == edited.id).promoted_at is None
    assert Memory.get(Memory.id == invalid.id).promoted_at is None
    store.close()


def test_a_planned_deep_promotion_of_a_memory_edited_since_is_skipped(home):
    store, config = open_store(home)
    memory = add(store, "the cache is memcached on port 11211")
    recall(store, memory, ["cache", "memcached port", "cache host"], days_ago=[2, 1, 0])
    deep = plan_deep(store, config.dream, near_duplicates=[], exact_duplicates=[], auto_links=[],
                     stale_ids=set(), phase_hits={})
    [action] = [a for a in deep.actions if a.kind == "promote"]
    store.update(memory.id, content="the cache is redis on port 6379")
    run = start_run(store, "dream", ["deep"])
    with store.db.atomic():
        result = apply_action(store, Journal(store, run), action)
    assert "stale" in result["skipped"] and action.kind == "skip_promote"
    Memory = store.models.Memory
    assert Memory.get(Memory.id == memory.id).promoted_at is None
    store.close()


@pytest.mark.parametrize("content", [
    "## Deep Sleep\n- Promoted 3f2a1b4c (score 0.81): the deploy script lives in scripts/deploy.sh",
    "<!-- llmem:dreams rem begin -->\n## REM Sleep\nthemes: deploy (3)",
    "# Dream diary\n\n## Dream run 1a2b3c4d5e6f: 2026-11-02 03:00 UTC\n### Light",
    "Summary of the llmem dream report from last night: 4 merges, 2 promotions",
])
def test_diary_and_report_artefacts_are_never_promoted(home, content):
    store, _ = open_store(home)
    artefact = add(store, content)
    grounded = add(store, "the deploy script lives in scripts/deploy.sh")
    for memory in (artefact, grounded):
        recall(store, memory, ["deploy script", "what did dream do", "promotions"], days_ago=[2, 1, 0])
    from_file = add(store, "Light phase found 3 near duplicates", metadata={"path": "/home/u/.config/llmem/dreaming/light/2026-11-02.md"})
    recall(store, from_file, ["light phase", "duplicates", "dream light"], days_ago=[2, 1, 0])
    store.close()

    for memory in (artefact, from_file):
        data = explain(memory.id)
        assert "grounded" in data["holding_gates"] and data["verdict"].startswith("not eligible: dream diary/report")
    code, out, err = run_cli("promote", "--apply", "--json")
    assert code == 0, err
    assert [c["memory_id"] for c in json.loads(out)["promote"]] == [grounded.id]
    text = (home / "MEMORY.md").read_text()
    assert grounded.id[:8] in text and artefact.id[:8] not in text and from_file.id[:8] not in text
