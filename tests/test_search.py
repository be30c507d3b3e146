import math

import pytest
from conftest import free_port_url
from fakes import FakeEmbedder

from llmem import search as search_module
from llmem.config import load_config
from llmem.db import vec
from llmem.errors import EmbedderUnavailable, UsageError
from llmem.providers import make_embedder
from llmem.providers.embedders import NoEmbedder, OllamaEmbedder
from llmem.search import Searcher, SearchOptions, memory_signal
from llmem.store import Store
from llmem.vectors import embed_memories, embed_pending

CORPUS = [
    ("decision", "we chose postgres as the primary database for the billing service"),
    ("preference", "the user prefers tabs over spaces in go code"),
    ("fact", "the staging cluster runs kubernetes 1.30 on three nodes"),
    ("procedure", "to release, tag the commit and run make publish"),
    ("event", "the outage on monday was caused by an expired tls certificate"),
    ("fact", "billing invoices are generated nightly by a cron job"),
    ("conversation", "agreed with the team to review pull requests within a day"),
]


@pytest.fixture
def store(store_url):
    """A store on each backend (conftest.py `store_url`: SQLite, and Postgres marked backend)."""
    s = Store.open(store_url)
    for mtype, text in CORPUS:
        s.add(text, mtype)
    yield s
    s.close()


def ranked(result):
    return [h.memory.content for h in result.hits]


def test_hybrid_search_finds_by_meaning_and_words(store):
    embedder = FakeEmbedder()
    assert embed_pending(store, embedder) == len(CORPUS)
    result = Searcher(store, embedder).search("billing database", SearchOptions(limit=3))
    assert result.mode == "hybrid"
    assert ranked(result)[0] == CORPUS[0][1]
    hit = result.hits[0]
    assert hit.fts_rank is not None and hit.vec_rank is not None
    assert embed_pending(store, embedder) == 0  # nothing left pending


def test_the_score_is_relevance_with_priors_as_a_narrow_tie_breaker(store):
    embedder = FakeEmbedder()
    embed_pending(store, embedder)
    opts = SearchOptions(limit=10, track=False)
    hits = Searcher(store, embedder).search("billing database postgres", opts).hits
    assert hits
    for hit in hits:
        strong, weak = max(hit.lexical, hit.semantic), min(hit.lexical, hit.semantic)
        assert hit.relevance == pytest.approx(strong + opts.both_weight * weak * (1 - strong))
        expected = (1 - search_module.PRIOR_WEIGHT) * hit.relevance + search_module.PRIOR_WEIGHT * hit.signal
        if hit.memory.source == "episode":
            expected *= search_module.EPISODE_PRIOR
        assert hit.score == pytest.approx(expected)
        assert 0 <= hit.relevance <= 1 and 0 <= hit.signal <= 1


def test_signal_follows_the_seed_formula(store):
    Memory = store.models.Memory
    memory = Memory.get(Memory.type == "decision")
    signal, parts = memory_signal(memory, memory.created_at + 86400)
    assert parts["recency"] == 0 and parts["frequency"] == 0  # never accessed
    assert signal == pytest.approx(0.4 * memory.confidence + 0.1 * 1.2)
    memory.access_count, memory.accessed_at = 4, memory.created_at
    at = memory.created_at + 2 * 86400
    signal, parts = memory_signal(memory, at)
    assert parts["recency"] == pytest.approx(math.exp(-0.02))
    assert parts["frequency"] == pytest.approx(math.log(1 + 4 / 2))


def test_model_or_dimension_change_rebuilds_the_index(store):
    embed_pending(store, FakeEmbedder(dim=64))
    assert vec.index_state(store.db) == ("fake:words", 64)
    bigger = FakeEmbedder(model="words-v2", dim=96)
    assert embed_pending(store, bigger) == len(CORPUS)  # every memory is pending again
    assert vec.index_state(store.db) == ("fake:words-v2", 96)
    hits = Searcher(store, bigger).search("kubernetes cluster", SearchOptions(mode="semantic", track=False)).hits
    assert hits[0].memory.content == CORPUS[2][1]


def test_no_embedder_means_fts_only_with_a_notice(store):
    result = Searcher(store, NoEmbedder()).search("kubernetes")
    assert result.mode == "fts" and "FTS only" in result.notice
    assert ranked(result)[0] == CORPUS[2][1]
    with pytest.raises(UsageError):
        Searcher(store, NoEmbedder()).search("kubernetes", SearchOptions(mode="semantic"))


def test_filters_and_invalid_memories(store):
    Memory = store.models.Memory
    embed_pending(store, FakeEmbedder())
    searcher = Searcher(store, FakeEmbedder())
    assert {h.memory.type for h in searcher.search("billing", SearchOptions(memory_type="fact")).hits} == {"fact"}
    target = Memory.get(Memory.content == CORPUS[2][1])
    store.invalidate(target.id, "cluster upgraded")
    assert CORPUS[2][1] not in ranked(searcher.search("kubernetes cluster"))
    assert CORPUS[2][1] in ranked(searcher.search("kubernetes cluster", SearchOptions(include_invalid=True)))


def test_valid_only_drops_expired_and_superseded(store):
    old = store.add("deploys go through jenkins", "decision").memory
    new = store.add("deploys go through github actions", "decision").memory
    store.relate(new.id, old.id, "supersedes")
    expired = store.add("the freeze lasts until friday deploys", "fact", valid_until=1.0).memory
    searcher = Searcher(store, None)
    everything = ranked(searcher.search("deploys", SearchOptions(mode="fts")))
    assert old.content in everything and expired.content in everything
    valid = ranked(searcher.search("deploys", SearchOptions(mode="fts", valid_only=True)))
    assert valid == [new.content]


def test_related_adds_one_hop(store):
    Memory = store.models.Memory
    a = Memory.get(Memory.content == CORPUS[0][1])
    b = Memory.get(Memory.content == CORPUS[5][1])
    store.relate(a.id, b.id, "related_to")
    result = Searcher(store, None).search("postgres", SearchOptions(mode="fts", related=True))
    assert [h.via for h in result.hits] == [None, f"related_to {a.id[:8]}"]


# ---- the embedders over real HTTP ---------------------------------------------------------

def test_ollama_embedder_batches_and_uses_nomic_prefixes(ollama_config):
    server = ollama_config
    embedder = make_embedder(load_config())
    embedder.batch_size = 2
    vectors = embedder.embed_documents(["a", "b", "c"])
    assert vectors.shape == (3, 64)
    bodies = server.embed_requests()
    assert [len(b["input"]) for b in bodies] == [2, 1]
    assert bodies[0]["input"][0] == "search_document: a"
    embedder.embed_query("where")
    assert server.embed_requests()[-1]["input"] == ["search_query: where"]


def test_openai_embedder(model_server, configure):
    configure(f"embedding:\n  provider: openai\n  model: text-embed\n  base_url: {model_server.url}\n")
    embedder = make_embedder(load_config())
    assert embedder.embed_documents(["x", "y"]).shape == (2, 64)
    assert model_server.requests[-1][0] == "/v1/embeddings"


def test_embedder_down_slow_or_failing_gives_clear_errors(model_server):
    down = OllamaEmbedder("nomic-embed-text", free_port_url(), 2.0, 8)
    with pytest.raises(EmbedderUnavailable, match="could not reach ollama") as info:
        down.embed_query("x")
    assert "ollama serve" in info.value.hint
    model_server.mode, model_server.delay = "slow", 1.0
    slow = OllamaEmbedder("nomic-embed-text", model_server.url, 0.2, 8)
    with pytest.raises(EmbedderUnavailable, match="did not answer"):
        slow.embed_query("x")
    model_server.mode = "error"
    with pytest.raises(EmbedderUnavailable, match="500"):
        slow.embed_query("x")
    model_server.mode = "garbage"
    with pytest.raises(EmbedderUnavailable, match="not JSON"):
        slow.embed_query("x")
    model_server.mode = "ok"
    missing = OllamaEmbedder("no-such-model", model_server.url, 2.0, 8)
    with pytest.raises(EmbedderUnavailable) as info:
        missing.embed_query("x")
    assert "ollama pull no-such-model" in info.value.hint


def test_memory_is_stored_when_the_embedder_is_down_and_embedded_later(tmp_path, model_server):
    store = Store.open(tmp_path / "m.db")
    Memory, Embedding = store.models.Memory, store.models.Embedding
    memory = store.add("remember the api rate limit is 100 per minute").memory
    model_server.mode = "error"
    embedder = OllamaEmbedder("nomic-embed-text", model_server.url, 2.0, 8)
    with pytest.raises(EmbedderUnavailable):
        embed_memories(store, embedder, [memory])
    assert Memory.select().count() == 1 and Embedding.select().count() == 0
    result = Searcher(store, embedder).search("rate limit")
    assert result.mode == "fts" and "unavailable" in result.notice and result.hits
    model_server.mode = "ok"
    assert embed_pending(store, embedder) == 1
    assert Searcher(store, embedder).search("rate limit").mode == "hybrid"
    store.close()


@pytest.mark.parametrize("reply", [
    [[0.1, 0.2, 0.3], [0.4, 0.5]],  # ragged
    [["a", "b", "c"], ["d", "e", "f"]],  # not numbers
    [[0.1, None, 0.3], [0.4, 0.5, 0.6]],
    [[0.1, "nan", 0.3], [0.4, 0.5, 0.6]],  # converts, but is no vector
    [{"x": 1}, {"y": 2}],
])
def test_a_malformed_embedder_reply_is_the_embedder_unavailable(model_server, reply):
    model_server.embeddings_reply = reply
    embedder = OllamaEmbedder("nomic-embed-text", model_server.url, 2.0, 8)
    with pytest.raises(EmbedderUnavailable, match="malformed"):
        embedder.embed_documents(["one", "two"])


def test_with_a_malformed_reply_add_keeps_the_memory_pending_and_search_falls_back(cli, ollama_config):
    ollama_config.embeddings_reply = [[0.1, 0.2], [0.3]]
    code, out, err = cli("add", "--content", "the rate limit is 100 requests per minute")
    assert code == 0 and "embed --pending" in err
    ollama_config.embeddings_reply = [["x"] * 8]
    code, out, err = cli("search", "rate limit")
    assert code == 0 and "rate limit" in out and "unavailable" in err


def test_the_kept_memory_count_follows_writes_of_any_connection(tmp_path):
    """fts.memory_count is kept between searches and counted again after a write by this
    connection, inside a transaction, or by another connection to the same store."""
    from llmem.db import fts

    first = Store.open(tmp_path / "memory.db")
    second = Store.open(tmp_path / "memory.db")
    assert fts.memory_count(first.db) == 0
    first.add("one memory")
    assert fts.memory_count(first.db) == 1
    second.add("a memory from another process")
    assert fts.memory_count(first.db) == 2
    with first.db.atomic():
        third = first.add("a third").memory
        assert fts.memory_count(first.db) == 3
    assert fts.memory_count(second.db) == 3
    second.delete(third.id)
    assert fts.memory_count(first.db) == fts.memory_count(second.db) == 2
