"""Words in many memories (not most: those are universal): bm25 costs FTS5 a score for every
match, so the keyword ranking of a large store scores the matches of the rarest words, of those
holding a rare word and a common one, and of those holding every common one; never every match
of the query. The memories holding a rare word rank as the exact ranking ranks them."""

import uuid

import pytest

from llmem.db import fts
from llmem.search import Searcher, SearchOptions
from llmem.store import Store

MEMORIES = 400
WHERE = "m.invalidated_at IS NULL"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """Every 2nd memory holds `widget`, every 3rd `gadget`, every 40th `flux`: a bound of 60
    matches leaves `widget` and `gadget` common (200 and 134) and `flux` rare (10)."""
    monkeypatch.setattr(fts, "RANKED_MATCHES", 60)
    s = Store.open(tmp_path / "memory.db")
    words = [" ".join(w for w, every in (("widget", 2), ("gadget", 3), ("flux", 40)) if n % every == 0)
             for n in range(MEMORIES)]
    rows = [{"id": uuid.uuid4().hex, "type": "fact", "content": f"note {n} {text} {'routine ' * (n % 7)}",
             "source": "extraction", "created_at": 1_700_000_000.0 + n, "updated_at": 1_700_000_000.0 + n}
            for n, text in enumerate(words)]
    with s.db.atomic():
        s.insert_rows(rows)
    yield s
    s.close()


def test_the_ranking_never_scores_every_match_and_keeps_the_exact_order_of_the_rare_words(store, monkeypatch):
    ranked = []
    real = fts.ranked_matches

    def spy(db, expression, *args):
        ranked.append(expression)
        return real(db, expression, *args)

    monkeypatch.setattr("llmem.search.ranked_matches", spy)
    query = "widget gadget flux"
    found = Searcher(store, None).fts_candidates(query, 8, WHERE, [])
    full = " OR ".join(fts.match_alternatives(query))
    assert full not in ranked and ranked[0] == '"flux"'
    exact = fts.ranked_matches(store.db, full, (1.0, 0.6, 0.4), MEMORIES, WHERE, [])
    with_flux = {seq for seq, in store.db.execute_sql(
        "SELECT rowid FROM memory_fts WHERE memory_fts MATCH 'flux'")}
    best = [p for p in exact if p[0] in with_flux][:8]  # every flux holder outranks the rest
    assert [seq for seq, _ in found] == [seq for seq, _ in best]
    assert [score for _, score in found] == pytest.approx([score for _, score in best])
    assert fts.alternative_matches(store.db, fts.match_alternatives(query)) == [200, 134, 10]


def test_a_store_no_larger_than_the_bound_ranks_every_match(store, monkeypatch):
    monkeypatch.setattr(fts, "RANKED_MATCHES", MEMORIES)
    query = "widget gadget"
    full = " OR ".join(fts.match_alternatives(query))
    assert Searcher(store, None).fts_candidates(query, 8, WHERE, []) == \
        fts.ranked_matches(store.db, full, (1.0, 0.6, 0.4), 8, WHERE, [])


def test_a_search_reads_the_vocabulary_once_for_its_frequencies_and_the_ranking_bound(store, monkeypatch):
    reads = []
    real = fts.document_frequencies

    def spy(db, terms):
        reads.append(list(terms))
        return real(db, terms)

    monkeypatch.setattr(fts, "document_frequencies", spy)
    monkeypatch.setattr("llmem.search.document_frequencies", spy)
    query = "widget gadget flux"
    result = Searcher(store, None).search(query, SearchOptions(mode="fts", track=False, min_relevance=0.0))
    # The ranking's bound took the frequencies the search read: no later read asks for its
    # terms again (the lexical scorer's read of the hits' own words may hold them).
    assert result.hits and reads[0] == ["widget", "gadget", "flux"]
    assert [r for r in reads[1:] if set(r) <= {"widget", "gadget", "flux"}] == []
    alternatives = fts.match_alternatives(query)
    known = {"widget": 200, "nowhere": 0}
    assert fts.alternative_matches(store.db, alternatives) == [200, 134, 10]
    assert fts.alternative_matches(store.db, alternatives, known) == [200, 134, 10]
    assert reads[-1] == ["flux", "gadget"]  # with some known, only the others are read
