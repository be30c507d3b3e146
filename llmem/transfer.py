"""`llmem store copy`: the whole store onto another backend (SQLite → PostgreSQL and back).

Every memory, relation, vector, recall, dream run and journal entry, session cursor, event,
watcher state, shared project and the user's settings, copied table by table in batches in
the source's key order. Each batch commits with a progress mark in the target (a setting
naming the source), so a copy killed midway resumes where it stopped; rows with a natural key
are inserted only where absent, so a batch redone adds nothing twice. A target that holds
memories of its own is refused unless `merge`. At the end each table is checked by counts and
by a hash of what identifies its rows, on both sides.

What is derived is made again on the target rather than copied: FTS (its triggers, or the
tsvector), the vector index (rebuilt from the copied vectors), the target's own seqs and ids.
The author of each memory is the target's to say (db/visibility.py): the role copying.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .db import vec
from .db.copying import (
    PROGRESS_PREFIX,
    TABLES,
    Table,
    clear_marks,
    copy_table,
    has_mark,
    identity_hash,
)
from .errors import UsageError


@dataclass
class TableCheck:
    table: str
    source_rows: int
    target_rows: int
    copied: int
    matches: bool


@dataclass
class CopyOutcome:
    target: str
    resumed: bool
    checks: list[TableCheck] = field(default_factory=list)
    vectors_indexed: int = 0

    @property
    def ok(self) -> bool:
        return all(check.matches for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "resumed": self.resumed, "ok": self.ok,
                "vectors_indexed": self.vectors_indexed,
                "tables": [check.__dict__ for check in self.checks]}


def source_name(source) -> str:
    """What names the source in the target's progress marks (its location, never a password)."""
    return hashlib.blake2b(str(source.db.location).encode(), digest_size=8).hexdigest()


def copy_store(source, target, *, merge: bool = False,
               progress: Callable[[str, int], None] | None = None) -> CopyOutcome:
    """Copy `source` (a Store) into `target` (a Store on another location); see the module."""
    mark = PROGRESS_PREFIX + source_name(source) + ":"
    resumed = any(has_mark(target.db, mark + table.name) for table in TABLES)
    if not merge and not resumed and target.models.Memory.select().exists():
        raise UsageError(f"the target store {target.db.location} already holds memories",
                         hint="copy into an empty store, or pass --merge to add to what it holds")
    outcome = CopyOutcome(target=str(target.db.location), resumed=resumed)
    for table in TABLES:
        copied = copy_table(source.db, target.db, table, mark + table.name, progress, merge=merge)
        outcome.checks.append(_check(source.db, target.db, table, copied, exact=not merge))
    model, dim = vec.index_state(source.db)
    if model and dim:
        with target.db.atomic():
            outcome.vectors_indexed = vec.rebuild_index(target.db, model, dim)
    with target.db.atomic():
        clear_marks(target.db, [mark + table.name for table in TABLES])
    return outcome


def _check(source_db, target_db, table: Table, copied: int, *, exact: bool) -> TableCheck:
    source_rows, source_hash = identity_hash(source_db, table)
    target_rows, target_hash = identity_hash(target_db, table)
    # Into an empty store the two sides are the same rows; merged into one that held its own,
    # the target holds at least the source's.
    matches = source_hash == target_hash if exact else target_rows >= source_rows
    return TableCheck(table.name, source_rows, target_rows, copied, matches)
