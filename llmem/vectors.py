"""Embedding memories: find what is pending, call the embedder, store and index the vectors."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import NamedTuple

import peewee as pw

from .db import bulk, vec
from .db.derived import text_hash, text_to_embed
from .db.fts import DESCRIPTIVE_METADATA
from .db.models import Memory
from .errors import EmbedderUnavailable
from .providers.embedders import Embedder
from .times import now

log = logging.getLogger(__name__)


def embedding_text(memory: Memory) -> str:
    """text_to_embed of a memory row."""
    return text_to_embed(memory.content, memory.summary, memory.metadata)


def pending_query(store, identity: str, everything: bool = False):
    """Valid memories with no current embedding under `identity` (or all valid ones)."""
    Memory, Embedding = store.models.Memory, store.models.Embedding
    # `+invalidated_at`: read by seq (the rowid), not through an index led by invalidated_at.
    # Without table statistics SQLite took that index for embed_pending's `seq > last` batches
    # and went through every valid memory on each one (quadratic: embed --pending at 100k was
    # 6.8x its floor).
    query = Memory.select().where(pw.NodeList((pw.SQL("+"), Memory.invalidated_at), glue="").is_null())
    if everything:
        return query.order_by(Memory.seq)
    current = Embedding.select(Embedding.memory).where(
        (Embedding.model == identity) & (Embedding.content_hash == Memory.embed_hash)
        & (Embedding.memory == Memory.id))
    return query.where(~pw.fn.EXISTS(current)).order_by(Memory.seq)


def store_vectors(store, embedder: Embedder, memories: list[Memory], vectors,
                  texts: list[str] | None = None) -> None:
    """Write vectors for memories (one transaction), rebuilding the index on a model change.

    `texts`: what each vector was made from (default: embedding_text of the memory as
    loaded). Its hash is stored, so a memory whose text changed meanwhile stays pending.
    """
    texts = texts if texts is not None else [embedding_text(m) for m in memories]
    identity, dim = embedder.identity, int(vectors.shape[1])
    stamp = now()
    with store.db.atomic():
        vec.ensure_index(store.db, identity, dim)
        # One prepared upsert for the batch (db/bulk.py): a peewee insert per row was most
        # of `embed --pending`'s time with a fast embedder.
        bulk.upsert_embeddings(store.db, [
            (memory.id, identity, dim, blob, text_hash(text), stamp)
            for memory, blob, text in zip(memories, vec.vector_blobs(store.db, vectors), texts, strict=True)])
        vec.put_vectors(store.db, [(memory.seq, vector) for memory, vector in zip(memories, vectors, strict=True)])


# A metadata key as json.dumps writes it; `\u` in the text: a key may be written escaped.
_DESCRIPTIVE_KEYS_JSON = tuple(f'"{key}"' for key in DESCRIPTIVE_METADATA)


def _described_metadata(text: str | None) -> dict | None:
    """A stored metadata text parsed when it may hold a descriptive key, the only part of it
    a vector's text reads (db/fts.py metadata_text), else None: parsing every row's metadata
    was a tenth of `embed --pending`'s own work."""
    if not text or (not any(key in text for key in _DESCRIPTIVE_KEYS_JSON) and "\\u" not in text):
        return None
    return json.loads(text)


class PendingMemory(NamedTuple):
    """The columns of a memory its vector needs (embedding_text and store_vectors read these;
    of the metadata, only a descriptive one: _described_metadata)."""

    seq: int
    id: str
    content: str
    summary: str | None
    metadata: dict | None


def embed_memories(store, embedder: Embedder, memories: list[Memory] | list[PendingMemory]) -> int:
    """Embed the given memories now (HTTP outside any transaction); return how many."""
    if not memories or not embedder.available:
        return 0
    texts = [embedding_text(m) for m in memories]
    vectors = embedder.embed_documents(texts)
    store_vectors(store, embedder, memories, vectors, texts)
    return len(memories)


def embed_pending(store, embedder: Embedder, *, everything: bool = False,
                  batch: int = 2000, progress: Callable[[int], None] | None = None) -> int:
    """Embed every memory whose vector is missing or stale; return how many were embedded.

    Reads plain rows, not model instances (built per row, they cost as much as the writes);
    the embedder splits a batch into its own request sizes (embedding.batch_size). A batch
    is one transaction: each commit of ~1 MB of vectors costs a WAL checkpoint's share."""
    done = 0
    last_seq = 0
    Memory = store.models.Memory
    while True:
        query = (pending_query(store, embedder.identity, everything)
                 .select(Memory.seq, Memory.id, Memory.content, Memory.summary, Memory.metadata)
                 .where(Memory.seq > last_seq).limit(batch))
        # The driver's rows as they are (db.execute skips peewee's per-row conversion).
        chunk = [PendingMemory(seq, memory_id, content, summary, _described_metadata(metadata))
                 for seq, memory_id, content, summary, metadata in store.db.execute(query)]
        if not chunk:
            if done:  # bring the vector file up to date now, not in the next search
                from .db import vector_file

                model, dim = vec.index_state(store.db)
                vector_file.index_for(store.db, model, dim)
            return done
        done += embed_memories(store, embedder, chunk)
        last_seq = chunk[-1].seq
        if progress:
            progress(done)


def catch_up(store, embedder: Embedder, *,
             progress: Callable[[int], None] | None = None) -> tuple[int, str | None]:
    """Embed what is pending while the embedder answers: (how many were embedded, why it
    stopped early or None). An embedder that is down is no error here: the memories stay
    pending for the next catch-up (the worker's periodic one, or `llmem embed --pending`)."""
    if not embedder.available:
        return 0, None
    done = [0]

    def count(n: int) -> None:
        done[0] = n
        if progress:
            progress(n)

    try:
        return embed_pending(store, embedder, progress=count), None
    except EmbedderUnavailable as exc:
        log.info("embedding paused after %d: %s", done[0], exc.message)
        return done[0], exc.message
