"""Embedding memories: find what is pending, call the embedder, store and index the vectors."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import NamedTuple

import peewee as pw

from .db import bulk, vec, vector_file
from .db.derived import text_hash, text_to_embed
from .db.fts import DESCRIPTIVE_METADATA
from .db.models import Memory
from .errors import EmbedderUnavailable
from .providers.embedders import Embedder
from .times import now

log = logging.getLogger(__name__)


def embedding_text(memory: Memory | PendingMemory) -> str:
    """text_to_embed of a memory row (a model instance or a PendingMemory)."""
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
    _write_vectors(store, embedder.identity, [m.id for m in memories], [m.seq for m in memories],
                   [text_hash(text) for text in texts], vectors)


def _write_vectors(store, identity: str, ids: list[str], seqs: list[int], hashes: list[str], vectors,
                   blobs: list[bytes] | None = None, written: vector_file.WrittenVectors | None = None) -> None:
    """Store the vectors of the memories `ids` (their `seqs`), each made from the text of its
    hash in `hashes`, in one transaction (`blobs`: the vectors as stored, vec.vector_blobs);
    `written` keeps them for the vector file."""
    dim = int(vectors.shape[1])
    stamp = now()
    blobs = blobs if blobs is not None else vec.vector_blobs(store.db, vectors)
    with store.db.atomic():
        vec.ensure_index(store.db, identity, dim)
        with written.batch(store.db, seqs, blobs) if written is not None else nullcontext():
            # One prepared upsert for the batch (db/bulk.py): a peewee insert per row was most
            # of `embed --pending`'s time with a fast embedder.
            bulk.upsert_embeddings(store.db, [(memory_id, identity, dim, blob, text_hash, stamp) for
                                              memory_id, blob, text_hash in zip(ids, blobs, hashes, strict=True)])
            vec.put_vectors(store.db, list(zip(seqs, vectors, strict=True)))


# A metadata key as json.dumps writes it, or any escape (`\u`): a key may be written escaped.
_DESCRIPTIVE_KEY_JSON = re.compile("|".join([*(re.escape(f'"{key}"') for key in DESCRIPTIVE_METADATA), r"\\u"]))


def _described_metadata(text: str | None) -> dict | None:
    """A stored metadata text parsed when it may hold a descriptive key, the only part of it
    a vector's text reads (db/fts.py metadata_text), else None: parsing every row's metadata
    was a tenth of `embed --pending`'s own work."""
    if not text or not _DESCRIPTIVE_KEY_JSON.search(text):
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
    embed_hash: str | None = None  # the hash of the text its vector must be made from


def embed_memories(store, embedder: Embedder, memories: list[Memory] | list[PendingMemory]) -> int:
    """Embed the given memories now (HTTP outside any transaction); return how many."""
    if not memories or not embedder.available:
        return 0
    texts = [embedding_text(m) for m in memories]
    vectors = embedder.embed_documents(texts)
    store_vectors(store, embedder, memories, vectors, texts)
    return len(memories)


# What `embed --pending` has embedded is stored in one transaction once it holds WRITE_ROWS
# memories or the oldest has waited WRITE_SECONDS. A commit per read batch of 2,000 was a
# quarter of its own time at 100k with a fast embedder (51 commits); one of 100k spilled
# SQLite's page cache and cost more than 10k (100k, CPU: 2.9 s at 2k, 2.3 at 10k, 3.5 at 100k).
# With a slow embedder (a batch taking WRITE_SECONDS or more) each batch is stored as it
# comes, so a kill loses no more than a batch's work: each transaction holds whole rows, and
# the next run embeds what is still pending.
WRITE_ROWS = 20_000
WRITE_SECONDS = 2.0


class _HeldVectors:
    """Vectors embedded and not stored yet (`embed_pending`), and what the stored ones were."""

    def __init__(self, store, identity: str, clock: Callable[[], float]):
        self.store, self.identity, self.clock = store, identity, clock
        self.memories: list[PendingMemory] = []
        self.vectors: list = []
        self.blobs: list[bytes] = []
        self.since: float | None = None  # when the embedder began on the oldest held memory
        self.written: vector_file.WrittenVectors | None = None
        self.stored = 0

    def embed(self, embedder: Embedder, memories: list[PendingMemory]) -> None:
        if self.since is None:
            self.since = self.clock()
        vectors = embedder.embed_documents([embedding_text(m) for m in memories])
        self.memories += memories
        self.vectors.append(vectors)
        # Encoded a batch at a time: quantising 20k rows at once was 3x slower than 2k ten
        # times (its temporaries leave the CPU's cache).
        self.blobs += vec.vector_blobs(self.store.db, vectors)

    def due(self) -> bool:
        return bool(self.memories) and (len(self.memories) >= WRITE_ROWS
                                        or self.clock() - self.since >= WRITE_SECONDS)

    def write(self) -> None:
        """Store the held vectors in one transaction (the memories' own embed_hash is the hash
        of the text each was made from: read with it)."""
        if not self.memories:
            return
        import numpy as np

        vectors = self.vectors[0] if len(self.vectors) == 1 else np.concatenate(self.vectors)
        if self.written is None:
            self.written = vector_file.written_vectors(self.store.db, self.identity, int(vectors.shape[1]))
        memories = self.memories
        _write_vectors(self.store, self.identity, [m.id for m in memories], [m.seq for m in memories],
                       [m.embed_hash or text_hash(embedding_text(m)) for m in memories], vectors, self.blobs,
                       self.written)
        self.stored += len(memories)
        self.memories, self.vectors, self.blobs, self.since = [], [], [], None


def _pending_batches(store, identity: str, everything: bool, batch: int):
    """The pending memories as PendingMemory lists of up to `batch`, by seq."""
    last_seq = 0
    Memory = store.models.Memory
    while True:
        query = (pending_query(store, identity, everything)
                 .select(Memory.seq, Memory.id, Memory.content, Memory.summary, Memory.metadata, Memory.embed_hash)
                 .where(Memory.seq > last_seq).limit(batch))
        # The driver's rows as they are (db.execute skips peewee's per-row conversion).
        chunk = [PendingMemory(seq, memory_id, content, summary, _described_metadata(metadata), embed_hash)
                 for seq, memory_id, content, summary, metadata, embed_hash in store.db.execute(query)]
        if not chunk:
            return
        yield chunk
        last_seq = chunk[-1].seq


def embed_pending(store, embedder: Embedder, *, everything: bool = False, batch: int = 2000,
                  progress: Callable[[int], None] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> int:
    """Embed every memory whose vector is missing or stale; return how many were embedded.

    Reads plain rows, not model instances (built per row, they cost as much as the writes),
    `batch` at a time; the embedder splits a batch into its own request sizes
    (embedding.batch_size). The vectors are stored as WRITE_ROWS says, `progress(n)` told
    each time (n stored so far), and the vector file is then written from them."""
    held = _HeldVectors(store, embedder.identity, clock)
    told = 0
    try:
        for chunk in _pending_batches(store, embedder.identity, everything, batch):
            held.embed(embedder, chunk)
            if held.due():
                held.write()
                if progress:
                    progress(told := held.stored)
    except EmbedderUnavailable:
        held.write()  # what the embedder gave before it went away is kept
        if progress and held.stored != told:
            progress(held.stored)
        raise
    held.write()
    if progress and held.stored != told:
        progress(held.stored)
    if held.stored:  # bring the vector file up to date now, not in the next search
        model, dim = vec.index_state(store.db)
        vector_file.index_for(store.db, model, dim, held.written)
    return held.stored


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
