"""The memory service: the writes a person or their agent asks for (add, update, invalidate,
correct, delete), once, under every front-end — the CLI, the MCP tools and the viewer — and
capture where it writes a single memory.

The store (store.py) redacts and writes in one transaction; this layer adds what comes after
the commit — the vector, made at once while the embedder answers and left pending otherwise
(`embed --pending` and the worker catch up) — and says what happened as a typed result, so a
front-end only words it. Policies that belong to one surface stay there: MCP's project scope,
the viewer's form versions are passed in as `expected_version`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .db.models import Memory
from .errors import EmbedderUnavailable, UsageError
from .store import Store, check_version, content_hash

log = logging.getLogger(__name__)

# What the user states or corrects directly is trusted more than what is extracted (seed: 0.9+ vs 0.7).
USER_CONFIDENCE = 0.9


@dataclass(frozen=True)
class Stored:
    """`add`: the memory, and whether it is new (False: an exact duplicate was already stored)."""

    memory: Memory
    created: bool
    pending: str | None = None  # why it is not embedded yet (None: embedded, or nothing to embed)


@dataclass(frozen=True)
class Updated:
    memory: Memory
    pending: str | None = None


@dataclass(frozen=True)
class Invalidated:
    memory: Memory


@dataclass(frozen=True)
class AlreadyInvalid:
    """The memory was invalidated before: left as it was, its first reason and time kept."""

    memory: Memory

    @property
    def reason(self) -> str:
        return (self.memory.metadata or {}).get("invalidation_reason") or "no reason recorded"


@dataclass(frozen=True)
class Correction:
    """`correct` with a new text: `memory` supersedes `replaced`, now invalidated."""

    memory: Memory
    replaced: Memory
    pending: str | None = None


def already_invalid(memory: Memory) -> AlreadyInvalid | None:
    """The AlreadyInvalid of `memory`, or None while it holds (a viewer asks before its form)."""
    return AlreadyInvalid(memory) if memory.invalidated_at is not None else None


class MemoryService:
    """The writes over one store and one embedder (`embedder` None: none is configured)."""

    def __init__(self, store: Store, embedder: Any | None):
        self.store = store
        self.embedder = embedder

    def embed(self, memories: list[Memory]) -> str | None:
        """Embed memories just committed; never inside a transaction (an HTTP call must not hold
        the write lock). Returns why they stay pending when the embedder is down, else None."""
        from .vectors import embed_memories

        if not memories or self.embedder is None or not self.embedder.available:
            return None
        try:
            embed_memories(self.store, self.embedder, memories)
        except EmbedderUnavailable as exc:
            log.info("%d memories stored without embedding (%s)", len(memories), exc.message)
            return exc.message
        return None

    def add(self, content: str, memory_type: str = "fact", *, confidence: float | None = None,
            source: str = "user", **fields: Any) -> Stored:
        """Store a memory (Store.add: redacted, deduplicated), then embed it if it is new."""
        result = self.store.add(content, memory_type,
                                confidence=USER_CONFIDENCE if confidence is None else confidence,
                                source=source, **fields)
        pending = self.embed([result.memory]) if result.created else None
        return Stored(result.memory, result.created, pending)

    def update(self, id_or_prefix: str, **fields: Any) -> Updated:
        """Store.update, then a new vector when the embedded text (content, summary, metadata) changed."""
        before = self.store.get(id_or_prefix)
        memory = self.store.update(before.id, **fields)
        changed = memory.embed_hash != before.embed_hash
        return Updated(memory, self.embed([memory]) if changed else None)

    def invalidate(self, id_or_prefix: str, reason: str, *,
                   expected_version: int | None = None) -> Invalidated | AlreadyInvalid:
        """Soft-delete a memory; one invalidated before is left as it was (first reason kept)."""
        memory = self.store.get(id_or_prefix)
        already = already_invalid(memory)
        if already is not None:
            return already
        return Invalidated(self.store.invalidate(memory.id, reason, expected_version=expected_version))

    def correct(self, id_or_prefix: str, content: str, *, reason: str | None = None,
                expected_version: int | None = None, metadata: dict | None = None) -> Correction:
        """Never an overwrite: a new memory stating `content` (same type, project and session,
        the user's confidence) supersedes the old one, which is invalidated with its text kept,
        in one transaction; then the new one is embedded.

        Refused: the same text (exact duplicates only — a near-duplicate check would find the
        old memory itself), and a memory already invalidated (correct the one that replaced it)."""
        store = self.store
        with store.db.atomic():
            old = store.get(id_or_prefix)
            check_version(old, expected_version)
            if old.invalidated_at is not None:
                raise UsageError(f"memory {old.id} is already invalidated",
                                 hint="correct the memory that replaced it instead")
            if content_hash(store.redactor.text((content or "").strip())) == old.content_hash:
                raise UsageError("the correction says the same as what the memory already says",
                                 hint="change the text, or edit the memory instead")
            added = store.add(content, old.type, confidence=USER_CONFIDENCE, source="user",
                              project=old.project, session_id=old.session_id,
                              metadata={**(metadata or {}), "corrects": old.id})
            newer = added.memory
            store.relate(newer.id, old.id, "supersedes")
            replaced = store.invalidate(old.id, (reason or "").strip() or f"superseded by {newer.id}")
        return Correction(newer, replaced, self.embed([newer]) if added.created else None)

    def delete(self, id_or_prefix: str) -> str:
        """Delete a memory for good (with its relations, vector and recalls); returns its id."""
        return self.store.delete(id_or_prefix)
