"""Ranking the way a developer remembers (issue 19): identifiers as atoms, evidence kept through
fusion, priors as tie-breakers, the current decision first, a calibrated relevance and a clear
"nothing relevant". Real stores, the deterministic FakeEmbedder; bench/ranking.py measures the
same rules with the built-in MiniLM on tests/fixtures/ranking/set.json."""

import json
from collections import Counter
from pathlib import Path

import pytest
from fakes import FakeEmbedder

from llmem.db.fts import match_expression, parse_query
from llmem.search import Searcher, SearchOptions
from llmem.store import Store
from llmem.vectors import embed_pending

SET = Path(__file__).parent / "fixtures" / "ranking" / "set.json"
DAY = 86400.0


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "memory.db") as opened:
        yield opened


def _search(store, query, embedder=None, **options):
    if embedder is not None:
        embed_pending(store, embedder)
    options.setdefault("track", False)
    return Searcher(store, embedder).search(query, SearchOptions(**options)).hits


@pytest.mark.parametrize("query, atom", [
    ("E0502", ("e0502",)), ("ge0463z", ("ge0463z",)), ("TF_WORKSPACE_42", ("tf", "workspace", "42")),
    ("v2.14.3", ("v2", "14", "3")), ("src/api/handlers/user.go", ("src", "api", "handlers", "user", "go")),
    ("--no-verify", ("no", "verify")), (":8443", ("8443",)), ("why does `E0502` happen?", ("e0502",)),
])
def test_identifiers_are_atoms(query, atom):
    parsed = parse_query(query)
    assert atom in parsed.atoms
    assert '"' + " ".join(atom) + '"' in match_expression(query)


@pytest.mark.parametrize("query", ["e", "e.g.", "a 5 s", "2 42", "the of and", "?!()", "🚀🔥", ""])
def test_single_letters_bare_digits_and_stopwords_never_match_alone(query):
    assert match_expression(query) is None


def test_an_error_code_is_not_found_through_its_letter(store):
    store.add("Error E0502 means the idempotency key was reused with a different payload.")
    store.add("Cache warm-up, e.g. the product list, runs at boot.")
    hits = _search(store, "E0502", mode="fts")
    assert [h.memory.content[:11] for h in hits] == ["Error E0502"]


def test_let_s_does_not_match_a_question_through_its_s(store):
    store.add("Let's use tabs in the Makefile.")
    store.add("Let's rename the staging bucket later.")
    hits = _search(store, "what's the schedule?", mode="fts", min_relevance=0.35)
    assert hits == []


def test_an_exact_identifier_beats_stronger_priors(store):
    target = store.add("The regression started at commit ge0463z.", "event", confidence=0.3).memory
    for i in range(5):
        decoy = store.add(f"We decided the regression tests run nightly, commit hooks stay {i}.", "decision",
                          confidence=1.0).memory
        store.touch_accessed([decoy.id], 1_700_000_000.0 + i)
    hits = _search(store, "which commit started the regression ge0463z", FakeEmbedder(dim=256))
    assert hits[0].memory.id == target.id


def test_automatic_injections_do_not_count_as_use(store):
    best = store.add("Orders pagination uses an opaque cursor, never page numbers.").memory
    weaker = store.add("Orders are exported nightly; the cursor of the export job is logged.").memory
    searcher = Searcher(store, None)
    before = [h.memory.id for h in searcher.search("orders pagination cursor", SearchOptions(mode="fts", track=False)).hits]
    for _ in range(40):  # injected into every session start
        searcher.record_recall([h for h in searcher.search("orders cursor", SearchOptions(mode="fts", track=False)).hits
                                if h.memory.id == weaker.id], "orders cursor", "context", 1_700_000_000.0)
    after = [h.memory.id for h in searcher.search("orders pagination cursor", SearchOptions(mode="fts", track=False)).hits]
    assert before[0] == after[0] == best.id


def test_a_superseded_memory_ranks_below_its_successor_and_says_so(store):
    old = store.add("orders-api uses PostgreSQL 12 as its primary database, PostgreSQL everywhere.", "decision",
                    created_at=1_700_000_000.0).memory
    new = store.add("orders-api upgraded its database to PostgreSQL 16.", "decision",
                    created_at=1_700_000_000.0 + 30 * DAY).memory
    store.relate(new.id, old.id, "supersedes")  # as the dream's dedupe leaves it: not invalidated
    hits = _search(store, "which PostgreSQL database does orders-api use", FakeEmbedder(dim=256))
    ranked = [h.memory.id for h in hits]
    assert ranked.index(new.id) < ranked.index(old.id)
    assert hits[ranked.index(old.id)].superseded_by == new.id
    assert hits[ranked.index(new.id)].superseded_by is None


def test_of_two_memories_saying_nearly_the_same_the_newer_wins_even_untracked(store):
    older = store.add("The billing service runtime is Python 3.9 in CI and production.", "decision",
                      project="billing", created_at=1_700_000_000.0).memory
    newer = store.add("The billing service runtime is Python 3.12 in CI and production.", "decision",
                      project="billing", created_at=1_700_000_000.0 + 60 * DAY).memory
    hits = _search(store, "billing service runtime python 3.9 production", FakeEmbedder(dim=256), track=False)
    ranked = [h.memory.id for h in hits]
    assert ranked.index(newer.id) < ranked.index(older.id)


def test_relevance_is_calibrated_and_the_floor_returns_nothing_rather_than_noise(store):
    for text in ("Deploy by tagging main; CI promotes the build.", "Run the integration tests with make test-int.",
                 "The admin server listens on :8443."):
        store.add(text)
    embedder = FakeEmbedder(dim=256)
    every = _search(store, "how do I deploy by tagging main", embedder)
    assert every and all(0.0 <= h.relevance <= 1.0 and 0.0 <= h.score <= 1.0 for h in every)
    assert every[0].relevance >= 0.5
    assert _search(store, "gitleaks", embedder, min_relevance=0.35) == []
    assert _search(store, "which GPU trains the recommender", embedder, min_relevance=0.35) == []


def test_a_huge_query_is_read_in_bounded_time_and_never_returns_the_store(store):
    for i in range(30):
        store.add(f"note {i} about the warehouse schema")
    store.add("The deploy script runs the database migrations first.")
    query = ("deploy migrations " + "lorem ipsum dolor sit amet " * 4000)[:100_000]
    hits = _search(store, query, FakeEmbedder(dim=256), min_relevance=0.35)
    assert len(hits) <= 10
    assert all("warehouse" not in h.memory.content for h in hits)


def test_cli_search_says_nothing_relevant(fts_config, cli):
    assert cli("add", "-c", "The deploy script runs the database migrations first.")[0] == 0
    code, out, err = cli("search", "gitleaks")
    assert (code, out) == (0, "")
    assert "Nothing relevant" in err
    code, out, _ = cli("search", "deploy migrations", "--json", "--no-track")
    row = json.loads(out)[0]
    assert 0 < row["relevance"] <= 1 and row["superseded_by"] is None
    code, _, err = cli("search", "deploy", "--min-relevance", "2")
    assert code == 2 and "--min-relevance" in err


def test_the_retrieval_set_is_big_enough_and_holds_out_a_third():
    data = json.loads(SET.read_text())
    ids = {m["id"] for m in data["memories"]}
    assert len(ids) == len(data["memories"]) >= 300
    assert len({m["project"] for m in data["memories"]}) >= 6
    queries = data["queries"]
    assert len(queries) >= 150
    categories = Counter(q["category"] for q in queries)
    assert set(categories) == {"exact-identifier", "paraphrase", "project-scoped", "superseded",
                               "type-filter", "multi-fact", "unanswerable"}
    held = sum(q["split"] == "heldout" for q in queries)
    assert abs(held - len(queries) / 3) <= len(categories)
    for q in queries:
        assert set(q["relevant"]) <= ids and set(q.get("superseded", [])) <= ids
        assert bool(q["relevant"]) == (q["category"] != "unanswerable")


def test_an_identifier_as_written_beats_its_bare_word(store):
    store.add("Before a release, run the whole release checklist.", "procedure", confidence=1.0)
    flag = store.add("Never build search-svc with --release on CI.", "preference", confidence=0.3).memory
    assert _search(store, "--release", mode="fts")[0].memory.id == flag.id


def test_a_word_form_is_found_as_the_index_stems_it(store_url):
    # FTS5's porter tokenizer matched `linting` to `golangci-lint`, but the lexical relevance
    # compared unstemmed words (and looked `linting` up in the stemmed vocabulary): the only
    # memory about linting scored under the floor and the query said "nothing relevant".
    # Postgres stems with snowball English: the same result there.
    with Store.open(store_url) as store:
        _word_form_found(store)


def _word_form_found(store):
    lint = store.add("orders-api code must pass golangci-lint with zero warnings before review.", "preference").memory
    store.add("orders-api is written in Go and built in a container in CI.")
    store.add("Deploy orders-api by tagging main.", "procedure")
    hits = _search(store, "linting?", mode="fts", min_relevance=0.35)
    assert [h.memory.id for h in hits] == [lint.id]
    assert hits[0].lexical > 0.5


def test_stemming_follows_the_index(store):
    from llmem.db.fts import stem_words

    assert stem_words(store.db, ["linting", "deploying", "services", "café", "as", "e0502"]) == [
        "lint", "deploi", "servic", "cafe", "as", "e0502"]


def _restated_pair(store, mtype):
    store.add("orders-api is written in Go.", "fact", project="orders-api", created_at=1_700_000_000.0)
    old = store.add("orders-api on-call alerts page through PagerDuty.", mtype, project="orders-api",
                    created_at=1_700_000_000.0).memory
    new = store.add("orders-api switched on-call paging from PagerDuty to Opsgenie.", mtype, project="orders-api",
                    created_at=1_700_000_000.0 + 40 * DAY).memory
    hits = _search(store, "which tool pages the orders-api on-call engineer", FakeEmbedder(dim=256))
    return old, new, [h.memory.id for h in hits]


def test_a_newer_memory_restating_an_older_one_takes_its_place(store):
    # Unlinked and far apart as vectors (cosine < CONFLICT_COSINE), but the newer holds the
    # older's words: the older ranked first and the change of tool came second.
    old, new, ranked = _restated_pair(store, "decision")
    assert ranked[:2] == [new.id, old.id]


def test_an_event_is_not_replaced_by_a_newer_one(store):
    old, new, ranked = _restated_pair(store, "event")
    assert ranked.index(old.id) < ranked.index(new.id)


def test_the_reply_to_a_turn_that_asks_ranks_above_the_question(store):
    # The turn that asks what the query asks matched best and came first; the answer, the next
    # turn of that conversation, shares no word with the query and was not listed at all.
    def turn(text, session, i):
        return store.add(text, "conversation", session_id=session, created_at=1_700_000_000.0 + i).memory

    turn("Did you see the game last night?", "s1", 0)
    asked = turn("What kind of books do you keep in your library?", "s1", 1)
    reply = turn("Mostly kids' classics and stories from different cultures.", "s1", 2)
    turn("What kind of books do you keep in your library?", "s2", 3)  # unanswered in its session
    hits = _search(store, "what kind of books are in the library", mode="fts")
    ranked = [h.memory.id for h in hits]
    assert ranked.index(reply.id) < ranked.index(asked.id)
    assert hits[ranked.index(reply.id)].components["reply_to"] == asked.seq


@pytest.mark.parametrize("query", [
    "the of and what is", "?!()...;", "e", "x" * 100_000, 'NEAR(deploy main) AND "tag" OR -build* content:ci ^x',
    "deploy на сервер 部署 déploiement", "🚀🔥 deploy 🎉", "Ünïcödé café", "\x00\x1f\u200b",
])
def test_bad_input_gives_a_clear_result_never_an_error_nor_the_store(store, query):
    for i in range(15):
        store.add(f"Note {i}: the warehouse schema has {i} tables.")
    store.add("Deploy by tagging main; CI promotes the build.", "procedure")
    hits = _search(store, query, FakeEmbedder(dim=256), min_relevance=0.35)
    assert len(hits) <= 2
    assert all(0.0 <= h.relevance <= 1.0 for h in hits)
