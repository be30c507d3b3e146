"""`embed --pending` parses a memory's metadata only when it may hold a descriptive key (the
only part of it a vector's text reads): every vector must still be made from the text its
memory's embed_hash names, whatever the metadata holds, or the memory would stay pending."""

from __future__ import annotations

from fakes import FakeEmbedder

from llmem.db.derived import text_hash, text_to_embed
from llmem.store import Store
from llmem.vectors import embed_pending, pending_query

METADATA = [None, {}, {"speaker": "ana"}, {"adapter": "codex", "turn": 3}, {"title": "Release", "score": 0.5},
            {"files": ["src/api.py", "README.md"], "tags": ["deploy"]}, {"note": "the speaker said so"},
            {"speaker": "Zoë"}]


class RecordingEmbedder(FakeEmbedder):
    def __init__(self):
        super().__init__(dim=16)
        self.texts: list[str] = []

    def _embed(self, texts):
        self.texts.extend(texts)
        return super()._embed(texts)


def test_every_vector_is_made_from_the_text_its_embed_hash_names(store_url):
    store = Store.open(store_url)
    expected = {}
    for i, metadata in enumerate(METADATA):
        content = f"memory {i} about the release train"
        store.add(content, metadata=metadata)
        expected[content] = text_to_embed(content, None, metadata)
    # A key written escaped (not by json.dumps, by another writer of the column) is read too.
    store.add("memory escaped about the deploy", metadata={"placeholder": 1})  # its row, rewritten below
    escaped = "memory escaped about the deploy"
    expected[escaped] = f"bo: {escaped}"
    store.db.execute_sql("UPDATE memory SET metadata = ?, embed_hash = ? WHERE content = ?",
                         ('{"\\u0073peaker": "bo"}', text_hash(expected[escaped]), escaped))
    embedder = RecordingEmbedder()
    assert embed_pending(store, embedder) == len(METADATA) + 1
    assert sorted(embedder.texts) == sorted(expected.values())
    assert pending_query(store, embedder.identity).count() == 0  # each vector's hash is its memory's
    store.close()
