"""`llmem import-native`: the agents' own instruction and memory files become memories.

Each note (adapters/native.py) is stored through the Store, so it is redacted and an exact
duplicate in the same scope is not stored twice: a second run adds nothing. The file is the
truth for the memories imported from it: when a note of a section changes, the new text
supersedes the old memory (a `supersedes` relation, the old one invalidated); a note that is
gone from its file is invalidated with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..adapters.native import NativeFile, NativeNote, read_notes
from ..db.queries import metadata_equals
from ..store import content_hash

IMPORT_CONFIDENCE = 0.9  # the user wrote these down for their agent themselves


@dataclass
class NativeImport:
    files: list[str] = field(default_factory=list)
    added: list[dict] = field(default_factory=list)
    unchanged: int = 0
    superseded: list[dict] = field(default_factory=list)
    retired: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"files": self.files, "added": self.added, "unchanged": self.unchanged,
                "superseded": self.superseded, "retired": self.retired}


def _imported_from(store, path: str) -> list:
    Memory = store.models.Memory
    return list(Memory.select().where(metadata_equals(Memory.metadata, "native_path", path)
                                      & Memory.invalidated_at.is_null()).order_by(Memory.seq))


def _from_vanished_files(store, agent: str, project: str | None, read: set[str]) -> list:
    """Valid memories imported from a file of `agent` that is gone from disk, for this project
    or for every project (the user's own files)."""
    from pathlib import Path

    Memory = store.models.Memory
    scope = Memory.project.is_null() if project is None else (Memory.project.is_null() | (Memory.project == project))
    rows = Memory.select().where(metadata_equals(Memory.metadata, "native_agent", agent)
                                 & Memory.invalidated_at.is_null() & scope).order_by(Memory.seq)
    return [m for m in rows
            if (path := (m.metadata or {}).get("native_path")) not in read and not Path(str(path)).exists()]


def import_native(store, agent: str, files: list[NativeFile], *, project: str | None = None,
                  dry_run: bool = False) -> NativeImport:
    """Add the notes of `files` as memories; with dry_run, only say what would change.

    Memories from a file of this agent that no longer exists (for `project`, or the user's
    own) are retired too: the file was their truth."""
    outcome = NativeImport(files=[str(f.path) for f in files])
    for memory in _from_vanished_files(store, agent, project, set(outcome.files)):
        if not dry_run:
            store.invalidate(memory.id, f"its file {memory.metadata.get('native_path')} is gone")
        outcome.retired.append({"id": memory.id, "content": memory.content})
    seen_this_run: set[tuple[str, str | None]] = set()
    for file in files:
        path = str(file.path)
        previous = _imported_from(store, path)
        kept_hashes = set()
        fresh: list[tuple[NativeNote, str]] = []
        for note in read_notes(file):
            # What the store keeps, and so what the outcome shows (a dry run included): redacted.
            note = replace(note, content=store.redactor.text(note.content))
            digest = content_hash(note.content)
            key = (digest, note.project)
            if key in seen_this_run or store.find_duplicate(digest, note.project) is not None:
                kept_hashes.add(digest)
                outcome.unchanged += 1
                continue
            seen_this_run.add(key)
            fresh.append((note, digest))
        gone = [m for m in previous if m.content_hash not in kept_hashes]
        for note, _ in fresh:
            # A changed note: the first memory of the same section that is no longer in the file.
            old = next((m for m in gone if (m.metadata or {}).get("native_section") == note.section), None)
            if old is not None:
                gone.remove(old)
            row = {"type": note.type, "content": note.content, "path": path, "section": note.section,
                   "project": note.project}
            if not dry_run:
                memory = store.add(note.content, note.type, confidence=IMPORT_CONFIDENCE, source="import",
                                   project=note.project,
                                   metadata={"native_agent": agent, "native_path": path,
                                             "native_section": note.section}).memory
                row["id"] = memory.id
                if old is not None:
                    store.relate(memory.id, old.id, "supersedes")
                    store.invalidate(old.id, f"changed in {path}")
            outcome.added.append(row)
            if old is not None:
                outcome.superseded.append({"id": old.id, "content": old.content, "by": row.get("id")})
        for memory in gone:
            if not dry_run:
                store.invalidate(memory.id, f"no longer in {path}")
            outcome.retired.append({"id": memory.id, "content": memory.content})
    return outcome
