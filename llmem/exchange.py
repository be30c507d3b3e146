"""Export and import of the whole store as one JSON document.

Format: {"version": 1, "memories": [...], "relations": [...]}. Import checks the entire file
before writing anything and applies it in one transaction: all or nothing, ids kept. What it
stores is redacted like every other write, and every value must be one the store can keep and
give back (times in years 1 to 9999, integers SQLite can hold, text that is valid Unicode).
"""

from __future__ import annotations

import base64
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .db import bulk, vec
from .db.derived import stored_hash
from .db.models import MEMORY_TYPES, RELATION_TYPES, SOURCES
from .errors import UsageError
from .store import content_hash, memory_to_dict
from .times import from_iso, now, to_iso
from .trust import TRUST_LEVELS, trust_of_source

FORMAT_VERSION = 1
# SQLite integers are signed 64-bit.
MAX_INTEGER = 2**63 - 1
# Metadata nested deeper than this is no note about a memory (and would strain every reader).
MAX_METADATA_DEPTH = 32
_TIME_FIELDS = ("created_at", "updated_at", "accessed_at", "valid_from", "valid_until",
                "invalidated_at", "promoted_at")


def export_data(store, *, include_embeddings: bool = False) -> dict[str, Any]:
    """Every memory (invalid ones too) and every relation, optionally with vectors.

    A store SQLite cannot read whole (a damaged page, a column that is not UTF-8) is read
    row by row instead (`rescue_data`): every readable row is saved, the rest counted."""
    try:
        return _export_whole(store, include_embeddings)
    except (UnicodeDecodeError, ValueError):
        return rescue_data(store)
    except Exception as exc:
        # peewee's DatabaseError, or the driver's own raised while rows are fetched
        if not any(cls.__name__ == "DatabaseError" for cls in type(exc).__mro__):
            raise
        return rescue_data(store)


def rescue_data(store) -> dict[str, Any]:
    """What can still be read of a damaged store, in the export format, with a `rescue`
    section counting what could not be (no embeddings: they are derived, re-made on import)."""
    import json

    from .db.queries import readable_memory_rows, readable_relation_rows

    Memory = store.models.Memory
    fields = {f.column_name: f.name for f in Memory._meta.sorted_fields}
    memories, unreadable, damaged_text = [], 0, 0
    for _seq, values, bad in readable_memory_rows(store.db):
        if values is None:
            unreadable += 1
            continue
        raw_metadata = values.pop("metadata", None)
        try:
            metadata = json.loads(raw_metadata) if raw_metadata else {}
        except ValueError:
            metadata, bad = {"unreadable_metadata": raw_metadata}, bad + 1
        if not isinstance(values.get("content"), str) or not isinstance(values.get("id"), str):
            unreadable += 1
            continue
        damaged_text += bool(bad)
        memory = Memory(**{fields[c]: v for c, v in values.items() if c in fields}, metadata=metadata)
        memories.append(memory_to_dict(memory))
    relations, lost_relations = readable_relation_rows(store.db)
    return {"version": FORMAT_VERSION, "exported_at": to_iso(now()), "memories": memories,
            "relations": [{"source_id": a, "target_id": b, "type": t, "created_at": to_iso(at)}
                          for a, b, t, at in relations],
            "rescue": {"unreadable_memories": unreadable, "memories_with_damaged_text": damaged_text,
                       "unreadable_relations": lost_relations}}


def _export_whole(store, include_embeddings: bool) -> dict[str, Any]:
    Memory, Relation, Embedding = store.models.Memory, store.models.Relation, store.models.Embedding
    memories = []
    vectors = {}
    if include_embeddings:
        vectors = {e.memory_id: e for e in Embedding.select()}
    for memory in Memory.select().order_by(Memory.seq):
        row = memory_to_dict(memory)
        if memory.id in vectors:
            e = vectors[memory.id]
            row["embedding"] = {"model": e.model, "dim": e.dim, "content_hash": e.content_hash,
                                "vector": base64.b64encode(vec.to_blob(vec.decode(e.vector, e.dim))).decode("ascii")}
        memories.append(row)
    relations = [{"source_id": r.source_id, "target_id": r.target_id, "type": r.type,
                  "created_at": to_iso(r.created_at)}
                 for r in Relation.select().order_by(Relation.id)]
    return {"version": FORMAT_VERSION, "exported_at": to_iso(now()),
            "memories": memories, "relations": relations}


@dataclass
class ImportPlan:
    """What an import would do, computed before anything is written."""

    new: list[dict] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)  # same id, same content
    duplicates: dict[str, str] = field(default_factory=dict)  # imported id → existing id
    relations: list[tuple[str, str, str, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        return {"new": len(self.new), "already_present": len(self.already_present),
                "duplicates": len(self.duplicates), "relations": len(self.relations)}


def _text_problem(value: Any, depth: int = 0) -> str | None:
    """What makes JSON data unstorable: a lone surrogate (not Unicode text), deep nesting, an
    integer SQLite cannot hold, NaN or infinity."""
    if depth > MAX_METADATA_DEPTH:
        return f"is nested more than {MAX_METADATA_DEPTH} levels deep"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text"
        return None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
        return f"holds an integer beyond ±{MAX_INTEGER}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"holds {value}, which is not a number JSON can carry"
    items = value.items() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        parts = item if isinstance(value, dict) else (item,)
        for part in parts:
            problem = _text_problem(part, depth + 1)
            if problem:
                return problem
    return None


# An id as export writes it: a UUID, any case, at least 8 characters (prefixes are refused).
_ID_SHAPE = re.compile(r"[0-9a-f-]{8,}")


def _check_memory(i: int, row: Any, errors: list[str]) -> dict | None:
    where = f"memories[{i}]"
    if not isinstance(row, dict):
        errors.append(f"{where}: not an object")
        return None
    out: dict[str, Any] = {}
    mid = row.get("id")
    if not isinstance(mid, str) or not _ID_SHAPE.fullmatch(mid.lower()):
        errors.append(f"{where}: 'id' must be a UUID string")
        return None
    out["id"] = mid.lower()
    for key, value in row.items():
        kind = type(value)
        if value is None or kind is bool or (kind is float and math.isfinite(value)) \
                or (kind is int and -MAX_INTEGER <= value <= MAX_INTEGER) or (kind is dict and not value):
            continue  # the common values asked no more than this: the walk cost ~10 µs a row
        if kind is str:
            if value.isascii():  # a flag CPython keeps on the string: no encoding to try
                continue
            try:
                value.encode("utf-8")
                continue
            except UnicodeEncodeError:
                pass  # _text_problem says what is wrong
        problem = _text_problem(value) if key != "embedding" else None
        if problem:
            errors.append(f"{where} ({mid}): '{key}' {problem}")
            return None
    content = row.get("content")
    if not isinstance(content, str) or not content.strip():
        errors.append(f"{where} ({mid}): 'content' must be a non-empty string")
    else:
        out["content"] = content.strip()
    mtype = row.get("type", "fact")
    if not isinstance(mtype, str) or mtype not in MEMORY_TYPES:
        errors.append(f"{where} ({mid}): unknown type {mtype!r}")
    out["type"] = mtype
    confidence = row.get("confidence", 0.7)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        errors.append(f"{where} ({mid}): 'confidence' must be a number from 0 to 1")
    out["confidence"] = confidence
    source = row.get("source") or "import"
    if not isinstance(source, str) or source not in SOURCES:
        errors.append(f"{where} ({mid}): unknown source {source!r}")
    out["source"] = source
    for key in ("summary", "project", "session_id"):
        value = row.get(key)
        if value is not None and not isinstance(value, str):
            errors.append(f"{where} ({mid}): '{key}' must be a string or null")
        out[key] = value
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        errors.append(f"{where} ({mid}): 'metadata' must be an object")
    out["metadata"] = metadata
    # Whose words these are: as exported, or what the source says (an export of an older llmem).
    trust = row.get("trust")
    if trust is not None and trust not in TRUST_LEVELS:
        errors.append(f"{where} ({mid}): unknown trust {trust!r} (one of: {', '.join(TRUST_LEVELS)})")
    out["trust"] = trust or trust_of_source(source, metadata if isinstance(metadata, dict) else None,
                                            out.get("project"))
    access_count = row.get("access_count", 0)
    if isinstance(access_count, bool) or not isinstance(access_count, int) \
            or not 0 <= access_count <= MAX_INTEGER:
        errors.append(f"{where} ({mid}): 'access_count' must be an integer from 0 to {MAX_INTEGER}")
    out["access_count"] = access_count
    for key in _TIME_FIELDS:
        value = row.get(key)
        if value is None:  # most of the seven are unset
            out[key] = None
            continue
        try:
            out[key] = from_iso(value)
        except (ValueError, TypeError) as exc:
            errors.append(f"{where} ({mid}): '{key}' is not a storable time: {exc}")
    embedding = row.get("embedding")
    if embedding is not None:
        try:
            blob = base64.b64decode(embedding["vector"], validate=True)
            dim = int(embedding["dim"])
            if len(blob) != 4 * dim or not isinstance(embedding["model"], str):
                raise ValueError
            out["embedding"] = {"model": embedding["model"], "dim": dim, "vector": blob,
                                # an export of a store before migration 0023 holds the 64-character hash
                                "content_hash": stored_hash(embedding.get("content_hash"))}
        except (KeyError, TypeError, ValueError, OverflowError):
            errors.append(f"{where} ({mid}): 'embedding' is malformed")
    return out


# Rows redacted per pass (Redactor.texts): each pass runs every pattern once over the
# joined texts, where one pass per row cost more than the database's own insert of it.
REDACT_BATCH = 500


def _redact_rows(memories: list[dict], redactor) -> None:
    """Redact the rows' texts as every write does; a vector made from a secret goes."""
    for start in range(0, len(memories), REDACT_BATCH):
        chunk = memories[start:start + REDACT_BATCH]
        contents = redactor.texts([m["content"] for m in chunk])
        with_summary = [m for m in chunk if isinstance(m.get("summary"), str) and m["summary"]]
        summaries = redactor.texts([m["summary"] for m in with_summary])
        metadata = redactor.trees([m["metadata"] for m in chunk])
        for memory, content in zip(chunk, contents, strict=True):
            if content != memory["content"]:
                memory["content"] = content
                memory.pop("embedding", None)
        for memory, summary in zip(with_summary, summaries, strict=True):
            if summary != memory["summary"]:
                memory["summary"] = summary
                memory.pop("embedding", None)
        for memory, tree in zip(chunk, metadata, strict=True):
            if tree != memory["metadata"]:
                memory["metadata"] = tree
                memory.pop("embedding", None)


def plan_import(store, document: Any) -> ImportPlan:
    """Validate a whole export document against the store; write nothing."""
    plan = ImportPlan()
    if not isinstance(document, dict):
        plan.errors.append("the file must hold a JSON object with 'version' and 'memories'")
        return plan
    if document.get("version") != FORMAT_VERSION:
        plan.errors.append(f"unsupported format version {document.get('version')!r} (expected {FORMAT_VERSION})")
        return plan
    rows = document.get("memories")
    if not isinstance(rows, list):
        plan.errors.append("'memories' must be a list")
        return plan
    relations = document.get("relations", [])
    if not isinstance(relations, list):
        plan.errors.append("'relations' must be a list")
        relations = []

    seen: set[str] = set()
    checked = []
    for i, row in enumerate(rows):
        memory = _check_memory(i, row, plan.errors)
        if memory is None:
            continue
        if memory["id"] in seen:
            plan.errors.append(f"memories[{i}]: id {memory['id']} appears twice in the file")
            continue
        seen.add(memory["id"])
        checked.append(memory)
    if plan.errors:
        return plan
    _redact_rows(checked, store.redactor)

    Memory = store.models.Memory
    for memory in checked:
        memory["content_hash"] = content_hash(memory["content"])
    # The file's ids and hashes looked up a few hundred at a time (db/bulk.py): one query
    # per row is ~1k rows/s, and peewee building each IN list cost more than the lookup.
    existing = {memory_id: row[0] for memory_id, row in
                bulk.memory_rows_by_id(store.db, ("content_hash",), [m["id"] for m in checked]).items()}
    valid_by_hash = bulk.valid_memories_by_hash(store.db, [m["content_hash"] for m in checked])
    hashes_in_file: dict[tuple[str, str | None], str] = {}
    for memory in checked:
        if memory["id"] in existing:
            if existing[memory["id"]] != memory["content_hash"]:
                plan.errors.append(f"memory {memory['id']} already exists with different content")
            else:
                plan.already_present.append(memory["id"])
            continue
        scope_key = (memory["content_hash"], memory["project"])
        if memory["invalidated_at"] is None:
            duplicate = valid_by_hash.get(scope_key) or hashes_in_file.get(scope_key)
            if duplicate is not None:
                plan.duplicates[memory["id"]] = duplicate
                continue
            hashes_in_file[scope_key] = memory["id"]
        plan.new.append(memory)

    known = seen | set(existing)
    for i, rel in enumerate(relations):
        if not isinstance(rel, dict):
            plan.errors.append(f"relations[{i}]: not an object")
            continue
        problem = _text_problem(rel)
        if problem:
            plan.errors.append(f"relations[{i}]: {problem}")
            continue
        src, dst, rtype = rel.get("source_id"), rel.get("target_id"), rel.get("type")
        if not isinstance(rtype, str) or rtype not in RELATION_TYPES:
            plan.errors.append(f"relations[{i}]: unknown type {str(rtype)[:60]!r}")
            continue
        if not isinstance(src, str) or not isinstance(dst, str):
            plan.errors.append(f"relations[{i}]: 'source_id' and 'target_id' must be memory id strings")
            continue
        src, dst = src.lower(), dst.lower()
        src = plan.duplicates.get(src, src)
        dst = plan.duplicates.get(dst, dst)
        for end in (src, dst):
            if end not in known and end not in plan.duplicates.values() \
                    and not Memory.select().where(Memory.id == end).exists():
                plan.errors.append(f"relations[{i}]: memory {end!r} is neither in the file nor in the store")
        if src == dst:
            continue
        try:
            created = from_iso(rel.get("created_at")) or now()
        except ValueError:
            created = now()
        plan.relations.append((src, dst, rtype, created))
    return plan


def apply_import(store, plan: ImportPlan, *,
                 progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Write a validated plan in one transaction; `progress(n)`: n new memories written so far."""
    if plan.errors:
        raise UsageError("the import file has errors; nothing was written")
    stamp = now()
    embedded = []
    with store.db.atomic():
        rows = []
        for memory in plan.new:
            # The checked row as it is (insert_rows reads only the columns' keys: its
            # "embedding" stays out), with the times an export may leave out.
            created = memory["created_at"] or stamp
            rows.append({**memory, "created_at": created, "updated_at": memory["updated_at"] or created})
        store.insert_rows(rows, progress=progress)
        embedding_rows = []
        for memory in plan.new:
            if "embedding" in memory:
                e = memory["embedding"]
                stored = vec.vector_blobs(store.db, vec.decode(e["vector"], e["dim"])[None])[0]
                embedding_rows.append((memory["id"], e["model"], e["dim"], stored,
                                       e["content_hash"] or memory["content_hash"], stamp))
                embedded.append(memory["id"])
        bulk.upsert_embeddings(store.db, embedding_rows)
        added_relations = bulk.insert_relations(store.db, plan.relations)
        if embedded:
            model, dim = vec.index_state(store.db)
            if not model:
                # A fresh store has no index yet: build it for the vectors the file brought
                # (their most common model), or they would sit unsearchable, never pending.
                model, dim = Counter((m["embedding"]["model"], m["embedding"]["dim"])
                                     for m in plan.new if "embedding" in m).most_common(1)[0][0]
            vec.rebuild_index(store.db, model, dim)
    return {**plan.summary(), "relations_added": added_relations}
