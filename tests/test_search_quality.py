"""The retrieval principles the default search rests on, on small synthetic stores.

bench/locomo.py measures them on real conversations; these tests keep them from regressing
without any data file: common words do not steer the semantic query, unrelated memories are
not semantic candidates, the type prior of a fresh store does not bury the relevant memory,
and the lexical top hit's vector feeds the semantic query in hybrid mode.
"""

import numpy as np
import pytest
from fakes import FakeEmbedder

from llmem import search as search_module
from llmem.db import vec
from llmem.db.fts import semantic_text
from llmem.search import Searcher, SearchOptions
from llmem.store import Store
from llmem.vectors import embed_pending

TOPICS = ["garden tomatoes", "guitar lessons", "marathon training", "pottery class", "camping trip",
          "chess club", "baking bread", "bird watching", "painting sunsets", "learning spanish"]


@pytest.fixture
def chat_store(tmp_path):
    """A chat log: 'alice' is in most memories (short greetings), each topic in one."""
    store = Store.open(tmp_path / "memory.db")
    for i, topic in enumerate(TOPICS):
        store.add(f"I finally started {topic} last week with a few new friends from work", "conversation")
        store.add(f"Thanks alice {i}", "conversation")
        store.add(f"Wow alice {i}", "conversation")
        store.add(f"Hello alice {i}", "conversation")
    embed_pending(store, FakeEmbedder(dim=256))
    yield store
    store.close()


def test_the_semantic_query_drops_words_most_memories_share(chat_store):
    db = chat_store.db
    assert semantic_text(db, "When did alice start pottery class?") == "When did start pottery class"
    # stopwords stay; a query with nothing but common words is kept whole
    assert semantic_text(db, "alice?") == "alice?"
    # a rare word is never dropped
    assert semantic_text(db, "chess club") == "chess club"


def test_a_small_store_keeps_the_whole_query(tmp_path):
    with Store.open(tmp_path / "m.db") as store:
        for i in range(8):
            store.add(f"alice note {i}")
        # 'alice' is in every memory, but eight memories say nothing about a word's share
        assert semantic_text(store.db, "alice pottery") == "alice pottery"


def test_a_common_name_does_not_pull_the_semantic_search_off_topic(chat_store):
    searcher = Searcher(chat_store, FakeEmbedder(dim=256))
    hits = searcher.search("alice pottery", SearchOptions(limit=3, mode="semantic", track=False)).hits
    assert "pottery class" in hits[0].memory.content


def test_unrelated_memories_are_not_semantic_candidates(chat_store):
    searcher = Searcher(chat_store, FakeEmbedder(dim=256))
    vector = FakeEmbedder(dim=256).embed_query("pottery class")
    where, params = searcher._filters(SearchOptions(), 0)
    candidates = searcher.vector_candidates(vector, 50, where, params)
    best = 1 - candidates[0][1]
    assert 0 < len(candidates) <= 12  # without a floor, half the store is "near" by chance
    assert all(1 - d >= search_module.SEMANTIC_FLOOR * best for _, d in candidates)


def test_on_a_fresh_store_the_type_prior_does_not_bury_the_relevant_memory(tmp_path):
    with Store.open(tmp_path / "m.db") as store:
        store.add("we talked about the staging cluster migration plan and its rollback", "conversation")
        for text in ("use the staging environment for load tests", "staging deploys need approval",
                     "the cluster dashboards live in grafana", "migration scripts go in db/migrate"):
            store.add(text, "decision")  # higher type priority, one shared word each
        embedder = FakeEmbedder(dim=256)
        embed_pending(store, embedder)
        hits = Searcher(store, embedder).search("staging cluster migration rollback plan",
                                                SearchOptions(limit=5, track=False)).hits
    assert hits[0].memory.type == "conversation"
    assert hits[0].fts_rank == 1 and hits[0].vec_rank == 1
    # The lead must be out of the type prior's reach: a one-word overlap with a better type
    # would otherwise overtake it as soon as its ranks come one step closer.
    priorities = search_module.TYPE_PRIORITY.values()
    prior_swing = SearchOptions().blend * 0.1 * (max(priorities) - min(priorities))
    assert hits[0].score - hits[1].score > prior_swing


def test_hybrid_feeds_the_lexical_top_hit_into_the_semantic_query(chat_store):
    searcher = Searcher(chat_store, FakeEmbedder(dim=256))
    query_vector = FakeEmbedder(dim=256).embed_query("zzz unrelated words")
    fts_top = searcher.fts_candidates("pottery", 5, "1", [])[0][0]
    moved = searcher._with_feedback(query_vector, fts_top, search_module.FEEDBACK_WEIGHT)
    assert np.linalg.norm(moved) == pytest.approx(1.0, abs=1e-5)
    target = vec.stored_vector(chat_store.db, fts_top, FakeEmbedder(dim=256).identity, 256)
    assert float(moved @ target) > float(query_vector @ target)
    result = searcher.search("pottery", SearchOptions(limit=3, track=False))
    assert result.mode == "hybrid" and "pottery" in result.hits[0].memory.content
