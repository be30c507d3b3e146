"""bench/recall.py on three of its coding sessions (two Claude Code, one Codex): transcripts
written, `llmem backfill` run for real, every question searched, the figures checked against
what the sessions plant, so the bench cannot rot into printing numbers nobody could trust."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from fakes import FakeModelServer  # noqa: E402
from recall import (  # noqa: E402
    BM25,
    Corpus,
    Home,
    Question,
    Ranked,
    Scores,
    Session,
    Turn,
    TurnMap,
    Written,
    baseline_scores,
    fake_extraction,
    ingest_backfill,
    kept,
    load_coding,
    search_llmem,
)

SESSIONS = {"billing-02", "dash-02", "cli-02"}


@pytest.fixture(scope="module")
def corpus():
    return load_coding(only=SESSIONS)


def test_the_data_set_is_labelled_as_the_bench_promises():
    whole = load_coding()
    answerable = [q for q in whole.questions if q.answerable]
    assert len(whole.sessions) >= 25 and len(answerable) >= 200
    assert len(whole.questions) - len(answerable) >= 20
    assert {s.agent for s in whole.sessions} == {"claude", "codex", "copilot"}
    held = sum("held_out" in q.tags for q in answerable) / len(answerable)
    assert 0.3 <= held <= 0.37, held
    assert sum("paraphrase" in q.tags for q in answerable) >= len(answerable) / 2


def test_bm25_baseline_puts_the_planted_answer_first(corpus):
    scores = baseline_scores(corpus, None)
    by_text = {q.text: r for q, r in scores["BM25 over turns"].rows}
    # The error message the user pasted is in billing-02's first turn, and nowhere else.
    assert by_text["QueuePool limit of size 5 overflow 10 reached"].turns[0] == {("billing-02", "1")}
    assert by_text["stream did not contain valid UTF-8"].turns[0] == {("cli-02", "1")}
    figures = scores["BM25 over turns"].figures()
    assert figures["n"] == len([q for q in corpus.questions if q.answerable])
    assert figures["hit5"] >= 0.9 and figures["r5"] >= 0.7, figures
    # Unanswerable questions score lower on top than answerable ones, more often than not.
    assert figures["auroc"] > 0.6, figures


def test_scores_count_hits_and_turns_as_documented():
    answerable = Question("q", {"s1"}, {("s1", "2")})
    unanswerable = Question("u", set(), set(), tags={"unanswerable"})
    scores = Scores()
    scores.add(answerable, Ranked(["s0", "s1", "s1"], [{("s0", "1")}, set(), {("s1", "2")}], 0.9))
    scores.add(unanswerable, Ranked(["s0"], [{("s0", "1")}], 0.4))
    figures = scores.figures()
    # Session first found at rank 2; its turn only at rank 3 (rank 2 carried the session alone).
    assert figures["hit5"] == 1.0 and figures["mrr"] == 0.5
    assert figures["r5"] == 1.0 and figures["tmrr"] == pytest.approx(1 / 3)
    assert figures["auroc"] == 1.0


def test_a_hit_is_located_by_its_message_ids_and_its_text():
    session = Session("s", "claude", "/p", [Turn(str(n), [("user", f"question {n} about {word}"),
                                                            ("assistant", f"answer {n} on {word}")])
                                            for n, word in ((1, "redis"), (2, "ports"), (3, "tokens"))])
    written = Written(line_turn={"u1": ("s", "1"), "u2": ("s", "2"), "u3": ("s", "3")}, by_id={"id-s": session})
    where = TurnMap(Corpus("c", [session], []), written)
    # An episode naming its first and last message stands for the turns between.
    assert where.locate("id-s", {"message_ids": ["u1", "u3"]}, "x") == ("s", {"1", "2", "3"})
    # A heuristic memory: its message id; a restated sentence: the turn that holds it.
    assert where.locate("id-s", {"message_id": "u2"}, "unrelated") == ("s", {"2"})
    assert where.locate("id-s", {}, "answer 3 on tokens") == ("s", {"3"})
    # A short turn is credited only when its whole text is there.
    short = Session("t", "claude", "/p", [Turn("1", [("user", "Fix it.")]), Turn("2", [("user", "Thanks a lot!")])])
    written.by_id["id-t"] = short
    where = TurnMap(Corpus("c", [session, short], []), written)
    assert where.locate("id-t", {}, "user: Fix it. assistant: I will fix it now, thanks") == ("t", {"1"})
    # Only the session: counted for sessions, a miss for turns; no session: a miss.
    assert where.locate("id-s", {}, "something else entirely") == ("s", set())
    assert where.locate(None, {"message_id": "u2"}, "answer 2 on ports") == (None, set())


def test_bm25_scores_a_rare_term_above_a_common_one():
    index = BM25(["redis queue memory", "redis cache", "redis redis"])
    assert index.scores("queue")[0] > 0 and index.scores("queue")[1] == 0


def test_fake_llm_restates_the_transcripts_sentences_only():
    prompt = ("Project: /x\n\nExisting memories:\n(none)\n\nConversation:\n"
              "user: I don't like snapshot tests for templates at all.\n"
              "assistant: We'll run integration tests against a real Redis started by testcontainers.\n"
              "  [tool bash] pytest → 3 passed\n")
    body = {"format": {"required": ["memories"]}, "messages": [{"role": "user", "content": prompt}]}
    memories = json.loads(fake_extraction("/api/chat", body))["memories"]
    assert [(m["type"], m["content"]) for m in memories] == [
        ("preference", "I don't like snapshot tests for templates at all."),
        ("decision", "We'll run integration tests against a real Redis started by testcontainers.")]


def test_backfill_then_search_without_and_with_the_fake_llm(corpus, tmp_path):
    plain = Home(tmp_path / "plain", {"provider": "none"}, None)
    ingestion = ingest_backfill(plain, corpus)
    assert ingestion.note.startswith("3 sessions read"), ingestion.note
    plain_scores, _, _ = search_llmem(plain, corpus, cli_check=0)

    server = FakeModelServer().start()
    server.chat_answer = fake_extraction
    try:
        with_llm = Home(tmp_path / "llm", {"provider": "none"}, server.url)
        ingest_backfill(with_llm, corpus)
    finally:
        server.stop()
    assert any(path == "/api/chat" for path, _ in server.requests)
    what = kept(with_llm)
    assert what.total >= 10 and what.by_rule["llm"] >= 10, what
    # The growth is told per structure (dbstat): the memory table and the FTS index grew.
    growth = what.growth(with_llm.writer.written.text_bytes)
    assert "memory " in growth and "FTS index" in growth, growth
    scores, turn_map, extra = search_llmem(with_llm, corpus, cli_check=2)
    figures = scores.figures()
    # The fake LLM keeps the agent's answers, where these questions' answers are: llmem finds
    # their sessions, and (through the memories' message ids and text) many of their turns.
    assert figures["hit20"] >= 0.9 and figures["r5"] >= 0.3, figures
    assert turn_map.how["session and turn"] > 0
    assert figures["mrr"] >= 0.8, figures
    # Without an LLM the store holds what the heuristics (and episodes, once they are on) keep:
    # every answerable question is scored, whatever it found.
    assert plain_scores.figures()["n"] == figures["n"]
    assert extra["cli"].endswith("2/2 sampled questions"), extra
    # Every search found what this store holds, under this home: nothing from elsewhere.
    assert all(s in SESSIONS | {None} for _, r in scores.rows for s in r.sessions)
