"""The one write path of the memory store: add, update, invalidate, relate, delete, dedupe.

Every write runs in an IMMEDIATE transaction (see db/connection.py); nothing here makes a
network call, so no transaction is ever held open across HTTP.
"""

from __future__ import annotations

import logging
import operator
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peewee as pw

from .db import vec
from .db.connection import open_store_database
from .db.derived import described_text_to_embed, short_hash, text_hash
from .db.fts import DESCRIPTIVE_METADATA, described_hints, metadata_text
from .db.models import (
    EPISODE_SOURCE,
    MEMORY_TYPES,
    RELATION_TYPES,
    SHAREABLE_TYPES,
    SOURCES,
    JSONText,
    Memory,
    Models,
    Relation,
    bound_models,
)
from .db.packed_text import PackedText, pack
from .db.queries import insert_memory_rows, insert_memory_values, write_memory_columns
from .db.visibility import set_project_shared, shares_project
from .errors import AmbiguousId, NotFound, UsageError
from .redact import Redactor
from .times import now, to_iso
from .trust import check_trust, least_trusted, trust_of_source

log = logging.getLogger(__name__)

MIN_PREFIX = 4
# Random hex characters of a new memory's id (64 bits). The id is stored in the row, its
# index, the embedding row and its index, the journal and its index and the vector log: a
# 36-character uuid there was ~0.1x the text a store holds (issue 18). Random, not
# time-ordered: the CLI and viewer show the first 8 characters and take a unique prefix.
ID_BYTES = 8


def new_memory_id() -> str:
    """A fresh memory id: ID_BYTES random bytes as hex."""
    return secrets.token_hex(ID_BYTES)


def content_hash(content: str) -> str:
    """Hash of the normalised content: case and runs of whitespace do not make a new memory."""
    # str.split's whitespace is re's \s and strip's (every code point checked), and lower()
    # neither makes nor unmakes any: the text `\s+` → " " of the stripped, lowered content,
    # at a fifth of the regex's cost (an import hashes every text).
    return short_hash(" ".join(content.split()).lower())


def derived_fields(content: str, summary: str | None, metadata: dict | None) -> dict[str, Any]:
    """The columns derived from a memory's text, rewritten with it on every write: the FTS
    hints and the hash of the text its vector must be made from."""
    described = metadata_text(metadata)  # once for both
    return {"hints": described_hints(content, summary, described),
            "embed_hash": text_hash(described_text_to_embed(content, summary, described))}


# The columns of a memory row, in declaration order (the bulk insert writes each of them).
# Every column but the author, which the database fills in (db/visibility.py).
MEMORY_INSERT_FIELDS = tuple(f.name for f in Memory._meta.sorted_fields if f.name != "author")


def _default(field: pw.Field) -> Any:
    """A field's declared default (None when it has none)."""
    return field.default() if callable(field.default) else field.default


# Rows per INSERT of insert_rows: FTS5 writes and merges a segment per statement (100k rows,
# CPU: 6.0 s in statements of 2,000, 5.2 in 10,000, as one of 100,000).
INSERT_BATCH = 10_000

# Columns computed from others (never restored from a journal image; see derived_fields).
DERIVED_COLUMNS = frozenset({"hints", "embed_hash", "content_hash", "version"})


def text_changed(current: dict[str, Any], text: dict[str, Any]) -> bool:
    """Whether `text` (content, summary, metadata) differs from the row `current` in what
    derived_fields reads: metadata only through its descriptive values."""
    if text["content"] != current["content"] or text["summary"] != current["summary"]:
        return True
    new, old = text["metadata"], current["metadata"]
    if new is old or (isinstance(new, dict) and isinstance(old, dict)
                      and tuple(map(new.get, DESCRIPTIVE_METADATA)) == tuple(map(old.get, DESCRIPTIVE_METADATA))):
        return False  # the same descriptive values make the same text (a decay's stamp is not one)
    return metadata_text(new) != metadata_text(old)


def check_type(memory_type: str) -> str:
    if memory_type not in MEMORY_TYPES:
        raise UsageError(f"unknown memory type {memory_type!r}",
                         hint="use one of: " + ", ".join(MEMORY_TYPES))
    return memory_type


def check_confidence(confidence: float) -> float:
    if not 0.0 <= float(confidence) <= 1.0:
        raise UsageError(f"confidence {confidence} is out of range", hint="use a number from 0.0 to 1.0")
    return float(confidence)


def memory_to_dict(memory: Memory) -> dict[str, Any]:
    """A memory as plain JSON-ready data (the export and --json shape)."""
    return {
        "id": memory.id,
        "type": memory.type,
        "content": memory.content,
        "summary": memory.summary,
        "confidence": round(memory.confidence, 4),
        "source": memory.source,
        "project": memory.project,
        "session_id": memory.session_id,
        "metadata": memory.metadata or {},
        "content_hash": memory.content_hash,
        "created_at": to_iso(memory.created_at),
        "updated_at": to_iso(memory.updated_at),
        "accessed_at": to_iso(memory.accessed_at),
        "access_count": memory.access_count,
        "valid_from": to_iso(memory.valid_from),
        "valid_until": to_iso(memory.valid_until),
        "invalidated_at": to_iso(memory.invalidated_at),
        "promoted_at": to_iso(memory.promoted_at),
        "trust": memory.trust,
    }


class StaleEdit(UsageError):
    """A write carried the version of a memory read before someone else changed it."""

    def __init__(self, memory: Memory, expected: int):
        super().__init__(f"memory {memory.id} changed since it was read (version {expected}, now {memory.version})",
                         hint="read it again and redo the change on the current text")
        self.memory = memory
        self.expected = expected


def check_version(memory: Memory, expected: int | None) -> None:
    """Refuse a write based on a stale read (`expected`: the version that read saw; None: no check)."""
    if expected is not None and int(expected) != memory.version:
        raise StaleEdit(memory, int(expected))


@dataclass
class AddResult:
    memory: Memory
    created: bool  # False: an exact duplicate already existed and was returned


class Store:
    """The memory store: a peewee database plus the operations that write it."""

    def __init__(self, db, redactor: Redactor | None = None):
        self.db = db
        # This store's own models: two stores in one process never share a binding.
        self.models: Models = bound_models(db)
        # Every write path redacts (add, update, import; extraction already has): what a user
        # types or imports is stored as carefully as what llmem extracts.
        self.redactor = redactor or Redactor()

    @classmethod
    def open(cls, path: Path | str, *, vec_enabled: bool = True, redactor: Redactor | None = None,
             read_only: bool = False, connect_timeout: float | None = None) -> Store:
        """`path`: the SQLite file, or the store's URL (`sqlite:///…`, `postgresql://…`).
        `read_only`: nothing is created, migrated or written (db/connection.py open_read_only).
        `connect_timeout`: seconds a server store's server has to answer (None: its default)."""
        return cls(open_store_database(path, vec=vec_enabled, read_only=read_only,
                                       connect_timeout=connect_timeout), redactor)

    def close(self) -> None:
        if not self.db.is_closed():
            self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- reading ---------------------------------------------------------------------

    def resolve_id(self, prefix: str) -> str:
        """The full id of the memory whose id starts with `prefix` (≥ 4 characters)."""
        prefix = (prefix or "").strip().lower()
        if len(prefix) < MIN_PREFIX:
            raise UsageError(f"id prefix {prefix!r} is too short",
                             hint=f"give at least {MIN_PREFIX} characters of the id")
        if not re.fullmatch(r"[0-9a-f-]+", prefix):
            raise NotFound(f"no memory with id {prefix!r}", hint="ids are hexadecimal UUIDs; `llmem list` shows them")
        # Range scan on the unique index instead of LIKE (whose escaping and case rules vary).
        Memory = self.models.Memory
        rows = list(Memory.select(Memory.id).where(
            (Memory.id >= prefix) & (Memory.id < prefix + "\U0010ffff")).limit(11).tuples())
        if not rows:
            raise NotFound(f"no memory with id {prefix!r}", hint="`llmem list --all` shows every id")
        if len(rows) > 1:
            shown = ", ".join(r[0] for r in rows[:10])
            raise AmbiguousId(f"id prefix {prefix!r} matches {len(rows)}{'+' if len(rows) > 10 else ''} memories: {shown}",
                              hint="give more characters of the id")
        return rows[0][0]

    def get(self, id_or_prefix: str) -> Memory:
        """A memory by id or unique prefix. Read-only: access is not tracked."""
        Memory = self.models.Memory
        return Memory.get(Memory.id == self.resolve_id(id_or_prefix))

    def list(self, *, memory_type: str | None = None, project: str | None = None,
             limit: int | None = 50, include_invalid: bool = False,
             unexpired_at: float | None = None) -> list[Memory]:
        """Newest first; `unexpired_at` keeps only memories still valid then (in the query, so
        `limit` counts only what is returned)."""
        Memory = self.models.Memory
        query = Memory.select()
        if memory_type:
            query = query.where(Memory.type == check_type(memory_type))
        if project:
            query = query.where(Memory.project == project)
        if not include_invalid:
            query = query.where(Memory.invalidated_at.is_null())
        if unexpired_at is not None:
            query = query.where(Memory.valid_until.is_null() | (Memory.valid_until > unexpired_at))
        query = query.order_by(Memory.created_at.desc(), Memory.seq.desc())
        if limit:
            query = query.limit(limit)
        return list(query)

    def find_duplicate(self, text_hash: str, project: str | None) -> Memory | None:
        """A valid memory with the same normalised content in the same scope. An episode is no
        duplicate of a memory: a statement typed or extracted is kept even when a turn said it
        word for word (`add_many` skips an episode that repeats a memory instead)."""
        Memory = self.models.Memory
        scope = Memory.project.is_null() if project is None else (Memory.project == project)
        return (Memory.select().where((Memory.content_hash == text_hash) & scope
                                      & Memory.invalidated_at.is_null()
                                      & (Memory.source != EPISODE_SOURCE)).first())

    # ---- writing ---------------------------------------------------------------------

    def add(self, content: str, memory_type: str = "fact", *, summary: str | None = None,
            confidence: float | None = None, source: str = "user", project: str | None = None,
            session_id: str | None = None, metadata: dict | None = None,
            valid_from: float | None = None, valid_until: float | None = None,
            memory_id: str | None = None, created_at: float | None = None,
            trust: str | None = None) -> AddResult:
        """Store a memory; an exact duplicate in the same scope returns the existing one.

        `trust`: whose words these are (llmem/trust.py); by default what `source` says."""
        content = self.redactor.text((content or "").strip())
        if not content:
            raise UsageError("the memory content is empty", hint="pass --content TEXT")
        summary = self.redactor.text(summary)
        check_type(memory_type)
        if source not in SOURCES:
            raise UsageError(f"unknown source {source!r}", hint="use one of: " + ", ".join(SOURCES))
        confidence = check_confidence(0.7 if confidence is None else confidence)
        if metadata is not None and not isinstance(metadata, dict):
            raise UsageError("metadata must be a JSON object")
        metadata = self.redactor.tree(metadata)
        trust = check_trust(trust) if trust else trust_of_source(source, metadata, project)
        text_hash = content_hash(content)
        stamp = now()
        with self.db.atomic():
            existing = self.find_duplicate(text_hash, project)
            if existing is not None:
                return AddResult(existing, False)
            memory = self.models.Memory.create(visibility=self._visibility(memory_type, project),
                id=memory_id or new_memory_id(), type=memory_type, content=content,
                summary=summary, **derived_fields(content, summary, metadata),
                confidence=confidence, source=source, project=project, session_id=session_id,
                metadata=metadata or {}, content_hash=text_hash,
                created_at=created_at or stamp, updated_at=stamp,
                valid_from=valid_from, valid_until=valid_until, trust=trust)
        return AddResult(memory, True)

    def add_many(self, items: list[tuple[str, dict, str]], memory_type: str, *, confidence: float,
                 source: str, project: str | None, session_id: str | None) -> list[str]:
        """Add many memories of one kind and scope at once (a slice's episodes): each
        (content, metadata, trust) redacted and deduplicated as `add` does it — an exact duplicate of a
        valid memory of the scope, or of an earlier item, is skipped — in bulk inserts (`add`
        one by one costs ~1 ms of query building per row). Returns the ids of the memories
        created, in order. Call inside a transaction."""
        check_type(memory_type)
        if source not in SOURCES:
            raise UsageError(f"unknown source {source!r}", hint="use one of: " + ", ".join(SOURCES))
        confidence = check_confidence(confidence)
        # One redaction pass over all the texts, and one over all the metadata.
        contents = self.redactor.tree([(content or "").strip() for content, _, _ in items])
        metadatas = self.redactor.tree([metadata or {} for _, metadata, _ in items])
        trusts = [check_trust(trust) for _, _, trust in items]
        Memory = self.models.Memory
        scope = Memory.project.is_null() if project is None else (Memory.project == project)
        hashes = [content_hash(content) for content in contents]
        seen: set[str] = set()
        unique = list(dict.fromkeys(hashes))
        for start in range(0, len(unique), 500):
            seen.update(h for (h,) in Memory.select(Memory.content_hash).where(
                Memory.content_hash.in_(unique[start:start + 500]) & scope
                & Memory.invalidated_at.is_null()).tuples())
        stamp = now()
        visibility = self._visibility(memory_type, project)
        # Episodes are written deflated where the store reads them back (db/packed_text.py).
        stored = pack if source == EPISODE_SOURCE and getattr(self.db, "packs_text", False) else str
        rows = []
        for content, metadata, key, trust in zip(contents, metadatas, hashes, trusts, strict=True):
            if not content or key in seen:
                continue
            seen.add(key)
            rows.append({"id": new_memory_id(), "type": memory_type, "content": stored(content), "summary": None,
                         **derived_fields(content, None, metadata), "confidence": confidence,
                         "source": source, "project": project, "session_id": session_id,
                         "metadata": metadata, "content_hash": key, "created_at": stamp,
                         "updated_at": stamp, "access_count": 0, "version": 1, "trust": trust,
                         "visibility": visibility})
        with self.db.atomic():
            insert_memory_rows(self.db, rows)
        return [row["id"] for row in rows]

    def _visibility(self, memory_type: str, project: str | None) -> str:
        """A new memory's: shared when its author shares its project and its kind may be."""
        shared = memory_type in SHAREABLE_TYPES and project is not None and shares_project(self.db, project)
        return "shared" if shared else "private"

    def share(self, project: str, shared: bool = True) -> int:
        """Share this user's facts, decisions and procedures of `project` with everyone who
        may read the store (those stored and those to come), or stop; return how many
        memories changed."""
        with self.db.atomic():
            return set_project_shared(self.db, project, shared, now())

    def update(self, id_or_prefix: str, *, content: str | None = None, summary: str | None = None,
               confidence: float | None = None, metadata: dict | None = None,
               memory_type: str | None = None, merge_metadata: bool = True,
               expected_version: int | None = None, trust: str | None = None) -> Memory:
        """Change a memory's fields; a content change marks its embedding stale.

        `expected_version`: refuse (StaleEdit) unless the row is still at that version.
        `trust`: the origin of the new text; the memory becomes only as trusted as the least
        trusted of its old and new origins (a tool's output never launders into the user's)."""
        memory_id = self.resolve_id(id_or_prefix)
        Memory = self.models.Memory
        with self.db.atomic():
            memory = Memory.get(Memory.id == memory_id)
            check_version(memory, expected_version)
            if content is not None:
                content = self.redactor.text(content.strip())
                if not content:
                    raise UsageError("the new content is empty")
                # An episode's text stays deflated in a SQLite file (db/packed_text.py).
                memory.content = PackedText(content) if memory.source == EPISODE_SOURCE else content
                memory.content_hash = content_hash(content)
            if summary is not None:
                memory.summary = self.redactor.text(summary) or None
            if metadata is not None:
                if not isinstance(metadata, dict):
                    raise UsageError("metadata must be a JSON object")
                metadata = self.redactor.tree(metadata)
                memory.metadata = {**(memory.metadata or {}), **metadata} if merge_metadata else metadata
            if content is not None or summary is not None or metadata is not None:
                for name, value in derived_fields(memory.content, memory.summary, memory.metadata).items():
                    setattr(memory, name, value)
            if confidence is not None:
                memory.confidence = check_confidence(confidence)
            if memory_type is not None:
                memory.type = check_type(memory_type)
            if trust is not None:
                memory.trust = least_trusted(memory.trust, check_trust(trust))
            memory.updated_at = now()
            memory.version += 1
            memory.save()
        return memory

    def revise(self, memory_id: str, content: str, *, summary: str | None = None,
               confidence: float | None = None, metadata: dict | None = None,
               trust: str | None = None) -> Memory:
        """Update a memory's text with a near-duplicate restatement, keeping the text it had as
        an invalidated row the live one `supersedes` (as the dream keeps what it merges): a
        chain of restatements loses none of them, where `previous_content` holds only the last."""
        Memory = self.models.Memory
        with self.db.atomic():
            old = Memory.get(Memory.id == memory_id)
            stamp = now()
            kept = Memory.create(
                id=new_memory_id(), type=old.type, content=old.content, summary=old.summary,
                hints=old.hints, embed_hash=old.embed_hash, confidence=old.confidence,
                source=old.source, trust=old.trust, project=old.project, session_id=old.session_id,
                metadata={**(old.metadata or {}), "invalidation_reason": f"restated by {old.id}",
                          "superseded_by": old.id},
                content_hash=old.content_hash, created_at=old.created_at, updated_at=stamp,
                valid_from=old.valid_from, valid_until=old.valid_until, invalidated_at=stamp)
            memory = self.update(memory_id, content=content, summary=summary,
                                 confidence=confidence, metadata=metadata, trust=trust)
            self.models.Relation.create(source=memory.id, target=kept.id, type="supersedes", created_at=stamp)
        return memory

    def write_fields(self, memory_id: str, values: dict[str, Any], *, current: dict[str, Any]) -> dict[str, Any]:
        """Set columns of a memory from plain values (the dream journal's fast path), with the
        columns derived from its text; `current` is its row as stored (journal.row_snapshot).

        Returns every column written. `updated_at` is now unless given. Call inside a transaction.
        """
        values = self.prepare_fields(values, current=current)
        write_memory_columns(self.db, memory_id, values)
        return values

    def prepare_fields(self, values: dict[str, Any], *, current: dict[str, Any]) -> dict[str, Any]:
        """The columns write_fields writes for `values` over the row `current`, written by the
        caller (the journal writes a batch of them with one statement, db/bulk.py).

        The derived columns are recomputed only when the text they come from changed: a
        decay that stamps `metadata.decayed_at` must not rewrite `hints`, which re-indexes
        the row in FTS."""
        values = dict(values)
        # A merged text may come from the LLM, which can write a secret-shaped string too.
        for name in ("content", "summary"):
            if isinstance(values.get(name), str):
                values[name] = self.redactor.text(values[name])
        text = {name: values.get(name, current[name]) for name in ("content", "summary", "metadata")}
        if "content" in values and values["content"] != current["content"]:
            values["content_hash"] = content_hash(values["content"])
        if text_changed(current, text):
            values.update(derived_fields(**text))
        values.setdefault("updated_at", now())
        return values

    def restored_fields(self, before: dict[str, Any], *, current: dict[str, Any]) -> dict[str, Any]:
        """The columns an undo writes to put back `before` (a journal's before-image: the
        changed columns, or a whole row in journals written before 0015) over the row
        `current`: derived columns are never taken from the image, and are recomputed only
        when the restored text differs from the current one."""
        values = {name: value for name, value in before.items() if name not in DERIVED_COLUMNS}
        text = {name: values.get(name, current[name]) for name in ("content", "summary", "metadata")}
        if text["content"] != current["content"]:
            values["content_hash"] = content_hash(text["content"])
        if text_changed(current, text):
            values.update(derived_fields(**text))
        return values

    def insert_rows(self, rows: list[dict[str, Any]], *,
                    progress: Callable[[int], None] | None = None) -> None:
        """Insert whole memory rows (import: ids, times and counts as given), with the columns
        derived from their text (a row's content_hash as given when it has one: the import
        hashed every text to find duplicates). Call inside a transaction. `progress(n)`: n
        rows written.

        One prepared INSERT per batch (queries.insert_memory_rows): a peewee insert_many builds its SQL row by
        row, which cost ~3× the database's own time at 100k rows."""
        fields = self.models.Memory._meta.fields
        names = [name for name in MEMORY_INSERT_FIELDS if name != "seq"]
        defaults = {name: _default(fields[name]) for name in names}
        # Each row's stored values in one dict, read out in column order by one itemgetter (a
        # row's fields keyed and listed one by one were a sixth of an import's own work).
        values_of = operator.itemgetter(*names)
        to_json = [(name, fields[name].db_value) for name in names if isinstance(fields[name], JSONText)]
        packs = getattr(self.db, "packs_text", False)  # an episode's text deflated (db/packed_text.py)
        for start in range(0, len(rows), INSERT_BATCH):
            values = []
            for row in rows[start:start + INSERT_BATCH]:
                stored = {**defaults, **row, "content_hash": row.get("content_hash") or content_hash(row["content"]),
                          **derived_fields(row["content"], row.get("summary"), row.get("metadata"))}
                if packs and row.get("source") == EPISODE_SOURCE:
                    stored["content"] = pack(row["content"])
                for name, convert in to_json:
                    stored[name] = convert(stored[name])
                values.append(values_of(stored))
            insert_memory_values(self.db, names, values)
            if progress:
                progress(min(start + INSERT_BATCH, len(rows)))

    def touch_accessed(self, memory_ids: list[str], at: float) -> None:
        """Count one access of each memory (shown in a result). Not a change of the memory:
        `updated_at` stays."""
        Memory = self.models.Memory
        with self.db.atomic():
            Memory.update(access_count=Memory.access_count + 1, accessed_at=at).where(
                Memory.id.in_(memory_ids)).execute()

    def invalidate(self, id_or_prefix: str, reason: str, *, expected_version: int | None = None) -> Memory:
        """Soft-delete: the memory stays for reference but search no longer returns it."""
        if not (reason or "").strip():
            raise UsageError("an invalidation needs a reason", hint='pass --reason "why"')
        memory_id = self.resolve_id(id_or_prefix)
        Memory = self.models.Memory
        with self.db.atomic():
            memory = Memory.get(Memory.id == memory_id)
            check_version(memory, expected_version)
            memory.version += 1
            stamp = now()
            memory.invalidated_at = stamp
            memory.updated_at = stamp
            memory.metadata = {**(memory.metadata or {}),
                               "invalidation_reason": self.redactor.text(reason.strip())}
            for name, value in derived_fields(memory.content, memory.summary, memory.metadata).items():
                setattr(memory, name, value)
            memory.save()
        return memory

    def delete(self, id_or_prefix: str) -> str:
        """Delete a memory for good, with its relations, embedding and recall events."""
        memory_id = self.resolve_id(id_or_prefix)
        Memory, Relation, RecallEvent = self.models.Memory, self.models.Relation, self.models.RecallEvent
        with self.db.atomic():
            memory = Memory.get(Memory.id == memory_id)
            vec.drop_vectors(self.db, [memory.seq])
            # Foreign keys cascade, but say it explicitly: a DB opened without
            # foreign_keys=ON (another tool) must not leave dangling relations.
            Relation.delete().where((Relation.source == memory_id) | (Relation.target == memory_id)).execute()
            RecallEvent.delete().where(RecallEvent.memory == memory_id).execute()
            memory.delete_instance(recursive=False)
        return memory_id

    def relate(self, source_id: str, target_id: str, relation_type: str) -> bool:
        """Link two memories; return False when the link already existed."""
        if relation_type not in RELATION_TYPES:
            raise UsageError(f"unknown relation type {relation_type!r}",
                             hint="use one of: " + ", ".join(RELATION_TYPES))
        source_id, target_id = self.resolve_id(source_id), self.resolve_id(target_id)
        if source_id == target_id:
            raise UsageError("a memory cannot be related to itself")
        with self.db.atomic():
            try:
                with self.db.atomic():
                    self.models.Relation.create(source=source_id, target=target_id, type=relation_type, created_at=now())
            except pw.IntegrityError:
                return False
        return True

    def relations_of(self, memory_ids: list[str]) -> list[Relation]:
        if not memory_ids:
            return []
        Relation = self.models.Relation
        return list(Relation.select().where(Relation.source.in_(memory_ids) | Relation.target.in_(memory_ids)))

    # ---- statistics ------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        Memory = self.models.Memory
        total = Memory.select().count()
        valid = Memory.select().where(Memory.invalidated_at.is_null())
        # COUNT(seq), the rowid every index holds: the count is read from an index alone.
        by_type = {t: c for t, c in valid.select(Memory.type, pw.fn.COUNT(Memory.seq))
                   .group_by(Memory.type).tuples()}
        model, dim = vec.index_state(self.db)
        embedded = 0
        if model:
            embedded = vec.current_embedding_count(self.db, model)
        valid_count = valid.count()
        return {
            "memories": total,
            "valid": valid_count,
            "invalidated": total - valid_count,
            "by_type": dict(sorted(by_type.items())),
            "promoted": Memory.select().where(Memory.promoted_at.is_null(False)).count(),
            "relations": self.models.Relation.select().count(),
            "embedded": embedded,
            "pending_embedding": valid_count - embedded,
            "embedding_model": model,
            "embedding_dim": dim,
            "recall_events": self.models.RecallEvent.select().count(),
            "db_path": self.db.location,
            "db_bytes": Path(self.db.location).stat().st_size if Path(self.db.location).is_file() else 0,
            "sqlite_vec": "loaded" if self.db.vec_loaded else "unavailable",
        }
