"""The memory service: the writes a person or their agent asks for (add, update, invalidate,
correct, delete), once, under every front-end — the CLI, the MCP tools and the viewer — and
capture where it writes a single memory.

The store (store.py) redacts and writes in one transaction; this layer journals each write in
that same transaction (below), adds what comes after the commit — the vector, made at once
while the embedder answers and left pending otherwise (`embed --pending` and the worker catch
up) — and says what happened as a typed result, so a front-end only words it. Policies that
belong to one surface stay there: MCP's project scope, the viewer's form versions are passed
in as `expected_version`.

The journal is the dream's (`dream_run`, `dream_action`: dream/journal.py): each write is a
run of kind `edit` whose phase names the surface (cli, mcp, viewer) and whose actions
hold the before- and after-images, so `llmem history`, the viewer's memory page and
`llmem dream undo` read your edits as they read the dream's. A delete keeps only that it
happened: the journal's images of a memory deleted for good are emptied with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .db import journal_rows
from .db.derived import text_to_embed
from .db.models import Memory
from .db.queries import memory_snapshot
from .errors import EmbedderUnavailable, UsageError
from .store import DERIVED_COLUMNS, Store, check_version, content_hash
from .times import now
from .trust import trust_of_source

EDIT_RUN = "edit"  # dream_run.kind of a write asked through the service (the audit trail)
SURFACES = ("cli", "mcp", "viewer")

log = logging.getLogger(__name__)

# What the user states or corrects directly is trusted more than what is extracted (seed: 0.9+ vs 0.7).
USER_CONFIDENCE = 0.9
PREVIOUS_CHARS = 500  # of a restated memory's text kept in its `previous_content`


@dataclass(frozen=True)
class Stored:
    """`add`: the memory, and whether it is new (False: an exact duplicate was already stored)."""

    memory: Memory
    created: bool
    pending: str | None = None  # why it is not embedded yet (None: embedded, or nothing to embed)


@dataclass(frozen=True)
class Restated:
    """`add` with `near_duplicates`: the text restates a valid memory of the same type and scope,
    which now says it; the text it had is kept as an invalidated row it supersedes."""

    memory: Memory
    similarity: float
    pending: str | None = None


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
    """The writes over one store and one embedder (`embedder` None: none is configured), as
    asked through `surface` (what the journal says made them)."""

    def __init__(self, store: Store, embedder: Any | None, surface: str = "cli"):
        if surface not in SURFACES:
            raise ValueError(f"unknown surface {surface!r}")
        self.store = store
        self.embedder = embedder
        self.surface = surface

    def via(self, surface: str) -> MemoryService:
        """The same service, its writes journaled as made through `surface`."""
        return self if surface == self.surface else MemoryService(self.store, self.embedder, surface)

    def _journal(self, what: str, actions: list[tuple[str, str, dict | None, dict | None]]) -> None:
        """Record one write (`what`: add, update, invalidate, correct, delete) as an edit run of
        (op, memory id, before, after) actions. Call inside the write's transaction."""
        import uuid

        stamp = now()
        run = self.store.models.DreamRun.create(
            id=uuid.uuid4().hex[:12], kind=EDIT_RUN, phases=self.surface, status="done",
            started_at=stamp, finished_at=stamp,
            summary={"edit": what, "memory_ids": list(dict.fromkeys(a[1] for a in actions))})
        DreamAction = self.store.models.DreamAction
        for op, memory_id, before, after in actions:
            DreamAction.create(run=run.id, phase=self.surface, kind=what, op=op, memory_id=memory_id,
                               before=before, after=after, created_at=stamp)

    def _snapshot(self, memory_id: str) -> dict[str, Any]:
        return memory_snapshot(self.store.db, memory_id) or {}

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
            source: str = "user", near_duplicates: float | None = None, **fields: Any) -> Stored | Restated:
        """Store a memory (Store.add: redacted, deduplicated), then embed it if it is new.

        `near_duplicates` (a cosine similarity, e.g. dream.similarity_threshold): while the
        embedder answers, a text that close to a valid memory of the same type and project
        restates it (Store.revise) instead of adding a second one."""
        confidence = USER_CONFIDENCE if confidence is None else confidence
        near = self._near_duplicate(content, memory_type, fields, near_duplicates) \
            if near_duplicates is not None else None
        store = self.store
        with store.db.atomic():
            if near is not None:
                seq, similarity = near
                old = store.models.Memory.get(store.models.Memory.seq == seq)
                image = self._snapshot(old.id)
                memory = store.revise(old.id, content, summary=fields.get("summary"),
                                      confidence=max(old.confidence, confidence),
                                      metadata={"previous_content": previous_text(old.content),
                                                "similarity": round(similarity, 4)},
                                      trust=fields.get("trust") or trust_of_source(
                                          source, fields.get("metadata"), fields.get("project")))
                kept = store.models.Relation.select().where(
                    (store.models.Relation.source == memory.id)
                    & (store.models.Relation.type == "supersedes")).order_by(
                    store.models.Relation.created_at.desc(), store.models.Relation.id.desc()).first()
                actions = []
                if kept is not None:
                    actions += [_created(store.get(kept.target_id)),
                                ("relate", memory.id, None, {"source_id": memory.id,
                                                             "target_id": kept.target_id, "type": "supersedes"})]
                self._journal("add", [*actions, _updated(memory.id, image, self._snapshot(memory.id))])
            else:
                result = store.add(content, memory_type, confidence=confidence, source=source, **fields)
                if result.created:
                    self._journal("add", [_created(result.memory)])
        if near is not None:
            return Restated(memory, near[1], self.embed([memory]))
        pending = self.embed([result.memory]) if result.created else None
        return Stored(result.memory, result.created, pending)

    def _near_duplicate(self, content: str, memory_type: str, fields: dict,
                        threshold: float) -> tuple[int, float] | None:
        """(seq, similarity) of the valid memory of the type and scope `content` restates, or
        None (an exact duplicate, none close enough, or no embedder answering)."""
        if self.embedder is None or not self.embedder.available:
            return None
        from .search import Searcher

        # Redacted before anything derives from it: the embedder never sees a secret.
        text = self.store.redactor.text((content or "").strip())
        project = fields.get("project")
        if not text or self.store.find_duplicate(content_hash(text), project) is not None:
            return None  # add says it: an exact duplicate is no restatement
        try:
            vector = self.embedder.embed_documents([text_to_embed(text, self.store.redactor.text(
                fields.get("summary")), None)])[0]
        except EmbedderUnavailable as exc:
            log.info("embedder unavailable, near-duplicates not checked: %s", exc.message)
            return None
        return near_duplicate(Searcher(self.store, self.embedder), vector, memory_type, project, threshold)

    def update(self, id_or_prefix: str, **fields: Any) -> Updated:
        """Store.update, then a new vector when the embedded text (content, summary, metadata) changed."""
        before = self.store.get(id_or_prefix)
        with self.store.db.atomic():
            image = self._snapshot(before.id)
            memory = self.store.update(before.id, **fields)
            self._journal("update", [_updated(memory.id, image, self._snapshot(memory.id))])
        changed = memory.embed_hash != before.embed_hash
        return Updated(memory, self.embed([memory]) if changed else None)

    def invalidate(self, id_or_prefix: str, reason: str, *,
                   expected_version: int | None = None) -> Invalidated | AlreadyInvalid:
        """Soft-delete a memory; one invalidated before is left as it was (first reason kept)."""
        memory = self.store.get(id_or_prefix)
        already = already_invalid(memory)
        if already is not None:
            return already
        with self.store.db.atomic():
            image = self._snapshot(memory.id)
            memory = self.store.invalidate(memory.id, reason, expected_version=expected_version)
            self._journal("invalidate", [_updated(memory.id, image, self._snapshot(memory.id))])
        return Invalidated(memory)

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
            related = store.relate(newer.id, old.id, "supersedes")
            image = self._snapshot(old.id)
            replaced = store.invalidate(old.id, (reason or "").strip() or f"superseded by {newer.id}")
            actions = [_created(newer)] if added.created else []
            if related:
                actions.append(("relate", newer.id, None,
                                {"source_id": newer.id, "target_id": old.id, "type": "supersedes"}))
            self._journal("correct", [*actions, _updated(old.id, image, self._snapshot(old.id))])
        return Correction(newer, replaced, self.embed([newer]) if added.created else None)

    def delete(self, id_or_prefix: str) -> str:
        """Delete a memory for good (with its relations, vector and recalls); returns its id.

        The journal keeps that it was deleted (its type and hash, not its text) and forgets the
        text its earlier entries held."""
        store = self.store
        with store.db.atomic():
            memory = store.get(id_or_prefix)
            deleted = store.delete(memory.id)
            journal_rows.forget_images(store.db, deleted)
            self._journal("delete", [("delete", deleted, {"type": memory.type,
                                                          "content_hash": memory.content_hash}, None)])
        return deleted


def near_duplicate(searcher, vector, memory_type: str, project: str | None,
                   threshold: float) -> tuple[int, float] | None:
    """(seq, similarity) of the valid memory of `memory_type` in `project` nearest to `vector`,
    when at least `threshold` similar; None otherwise."""
    where = "m.invalidated_at IS NULL AND m.type = ? AND " + (
        "m.project IS NULL" if project is None else "m.project = ?")
    params = [memory_type] if project is None else [memory_type, project]
    nearest = searcher.vector_candidates(vector, 1, where, params)
    if nearest and 1.0 - nearest[0][1] >= threshold:
        return nearest[0][0], 1.0 - nearest[0][1]
    return None


def previous_text(content: str) -> str:
    """What a restated memory keeps of the text it had, in `previous_content` (the whole text
    is kept as the invalidated row it supersedes)."""
    return content if len(content) <= PREVIOUS_CHARS else content[:PREVIOUS_CHARS] + "…"


def _created(memory: Memory) -> tuple[str, str, None, dict]:
    """A `create` action: undo deletes the memory while it is still as added."""
    return ("create", memory.id, None, {"content_hash": memory.content_hash, "updated_at": memory.updated_at})


def _updated(memory_id: str, before: dict, after: dict) -> tuple[str, str, dict, dict]:
    """An `update` action holding the columns the write changed (derived ones aside: an undo
    recomputes them), as they were and as they are."""
    names = [name for name in after if name not in DERIVED_COLUMNS and before.get(name) != after[name]]
    return ("update", memory_id, {name: before.get(name) for name in names},
            {name: after[name] for name in names})


# ---- the journal, read back ------------------------------------------------------------------

# Columns a journaled write re-derives from the text, and its clock: not what the writer chose.
_NOT_SHOWN = {"hints", "embed_hash", "content_hash", "updated_at"}


@dataclass(frozen=True)
class JournalEntry:
    """One journaled write to a memory: a person's edit (`run_kind` "edit", `phase` the surface
    it came through) or a dream, promotion or backfill run's action."""

    at: float
    run_id: str
    run_kind: str
    run_status: str
    phase: str
    what: str  # add, update, invalidate, correct, delete; a run's decay, merge, promote, …
    op: str  # create, update, relate, delete, …
    memory_id: str | None
    changes: list[tuple[str, Any, Any]]  # (column, before, after) of what the write chose

    def as_dict(self) -> dict[str, Any]:
        from .times import to_iso

        return {"at": to_iso(self.at), "run_id": self.run_id, "run_kind": self.run_kind,
                "run_status": self.run_status, "phase": self.phase, "what": self.what, "op": self.op,
                "memory_id": self.memory_id,
                "changes": [{"field": name, "before": old, "after": new} for name, old, new in self.changes]}


def memory_journal(store: Store, memory_id: str | None = None, *, limit: int = 50,
                   edits_only: bool = False) -> list[JournalEntry]:
    """The journal's writes to `memory_id` (None: to any memory), newest first; `edits_only`:
    only a person's edits through the service, not the runs' actions."""
    DreamAction, DreamRun = store.models.DreamAction, store.models.DreamRun
    query = DreamAction.select(DreamAction, DreamRun).join(DreamRun)
    # A backfill journals the memories it created in one action per session: the ones that
    # created this memory are found by id and read as its create.
    created_by: dict[int, str] = {}
    if memory_id is not None and not edits_only:
        created_by = dict(journal_rows.created_in_session_actions(store.db, memory_id))
    if memory_id is not None:
        query = query.where((DreamAction.memory_id == memory_id) | DreamAction.id.in_(list(created_by) or [0]))
    else:
        query = query.where(DreamAction.memory_id.is_null(False))
    if edits_only:
        query = query.where(DreamRun.kind == EDIT_RUN)
    actions = query.order_by(DreamAction.created_at.desc(), DreamAction.id.desc()).limit(limit)
    entries = []
    for action in actions:
        before, after = action.before or {}, action.after or {}
        if action.op == "relate" and isinstance(after, dict):
            changes = [("relation", None, f"{after.get('type')} {after.get('target_id')}")]
        elif isinstance(after, dict) and isinstance(before, dict):
            changes = [(name, before.get(name), value) for name, value in sorted(after.items())
                       if name not in _NOT_SHOWN and before.get(name) != value]
        else:
            changes = []
        if action.id in created_by:
            entries.append(JournalEntry(action.created_at, action.run.id, action.run.kind, action.run.status,
                                        action.phase, created_by[action.id], "create", memory_id, []))
            continue
        entries.append(JournalEntry(action.created_at, action.run.id, action.run.kind, action.run.status,
                                    action.phase, action.kind, action.op, action.memory_id, changes))
    return entries
