"""A query word in most memories: bm25 gives it no weight (FTS5 clamps its IDF), so search
does not rank every memory it matches (96 ms at 100k for a word in 86% of them) and the
result is the one the exact ranking gives."""

import uuid

import pytest

from llmem.db import fts
from llmem.search import Searcher, SearchOptions
from llmem.store import Store

MEMORIES = 300


@pytest.fixture
def store(store_url):
    """MEMORIES memories all holding `widget`; every 50th also `flux`, every 3rd a decision."""
    s = Store.open(store_url)
    rows = [{"id": uuid.uuid4().hex, "type": "decision" if n % 3 == 0 else "fact",
             "content": f"widget note {n} about {'flux capacitors' if n % 50 == 7 else 'routine things'}",
             "source": "extraction", "created_at": 1_700_000_000.0 + n, "updated_at": 1_700_000_000.0 + n}
            for n in range(MEMORIES)]
    with s.db.atomic():
        s.insert_rows(rows)
    yield s
    s.close()


@pytest.fixture
def small_window(monkeypatch):
    """The rule as at 100k memories, on a store of a few hundred: the same code, read in a
    window of 64 of them."""
    monkeypatch.setattr(fts, "UNIVERSAL_WINDOW", 64)
    monkeypatch.setattr(fts, "UNIVERSAL_MIN_MEMORIES", 128)


def contents(store, query, **options):
    result = Searcher(store, None).search(query, SearchOptions(mode="fts", track=False, min_relevance=0.0,
                                                               **options))
    return [h.memory.content for h in result.hits]


def test_a_word_in_most_memories_is_universal_and_a_rare_one_is_not(store, small_window):
    alternatives = fts.match_alternatives("widget flux")
    assert fts.universal_terms(store.db, alternatives) == {'"widget"'}


def test_below_the_minimum_size_every_term_is_ranked(store):
    assert fts.universal_terms(store.db, fts.match_alternatives("widget flux")) == set()


def test_the_rare_word_ranks_as_the_exact_ranking_ranks_it(store, small_window, monkeypatch):
    fast = contents(store, "widget flux", limit=6)
    monkeypatch.setattr(fts, "UNIVERSAL_MIN_MEMORIES", 10 * MEMORIES)  # exact: bm25 over every match
    exact = contents(store, "widget flux", limit=6)
    flux = [c for c in exact if "flux" in c]
    assert len(flux) == 6 and fast[:6] == exact[:6]


def test_the_universal_word_alone_fills_with_the_newest_matches_that_pass_the_filters(store, small_window):
    found = contents(store, "widget", limit=5, memory_type="decision")
    assert len(found) == 5
    numbers = [int(c.split()[2]) for c in found]
    assert all(n % 3 == 0 for n in numbers)  # every one a decision
    assert sorted(numbers, reverse=True) == [297, 294, 291, 288, 285]  # the newest, however ordered


def test_rare_matches_come_first_and_universal_ones_fill_the_rest(store, small_window):
    found = contents(store, "widget flux", limit=10)
    assert all("flux" in c for c in found[:6])
    assert len(found) == 10 and all("flux" not in c for c in found[6:])
