"""Planned actions, the journal of applied writes with their before-images, and undo.

Phases plan first (read-only: that plan is what a preview prints) and the sweep applies the
plan through a Journal. Every write goes through one of four journaled operations:
  update  a memory's fields changed; `before` is the whole row as it was
  create  a memory was added; undo deletes it (with its relations and vectors)
  relate  a relation was added; undo removes it
  file    a file was rewritten; `before` is its old text (null: it did not exist)
  report  a finding (a shadow verdict, a staged grounded recall): nothing to restore
  session a backfill's session: the creates and the cursor `row` it stands for, in one action
Undo replays a run's journal backwards in one transaction, so a run is undone exactly; a
memory (like a file) changed since the run is left as it is and reported, unless forced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peewee as pw

from ..db import bulk, journal_rows
from ..db.fts import DESCRIPTIVE_METADATA
from ..db.models import DreamRun, Memory
from ..db.queries import MEMORY_ROW_FIELDS, memory_snapshot
from ..errors import NotFound, UsageError
from ..memories import EDIT_RUN
from ..paths import write_private_text
from ..store import DERIVED_COLUMNS
from ..times import now

log = logging.getLogger(__name__)

PHASES = ("light", "rem", "deep")
# Tables other than memory whose rows `row` actions restore (names are never taken from input).
RESTORABLE_TABLES = {"session_cursor": ("adapter", "session_id", "project", "cursor", "introspect_cursor",
                                        "messages_read", "status", "updated_at", "episode_cursor"),
                      "setting": ("key", "value")}


@dataclass
class Action:
    """One planned change: what a preview shows and what apply executes."""

    phase: str
    kind: str  # decay, boost, invalidate, merge, dedupe, link, promote, flag_stale, calibrate, insight
    memory_id: str | None
    text: str  # one human-readable line
    changes: dict[str, Any] = field(default_factory=dict)  # fields to set; "metadata" is merged
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "kind": self.kind, "memory_id": self.memory_id,
                "text": self.text, "changes": self.changes, "detail": self.detail}


class Actions:
    """A plan's actions in their order: Action objects, and compact runs of them (a night's
    decays: deep.DecayRows) that make each Action only when it is read.

    Reads like the list it replaces (len, iteration, indexes and slices, +=). At 1M memories
    a deep plan is ~1.1M decays and invalidations; as Action objects, each with its dicts
    and line of text, they held ~1 GB through the whole apply (issue 22: a dream's peak RSS).
    A compact run holds a few numbers a row, and the apply reads it as updates (`updates`)
    without an Action at all.

    A compact run has len, iteration (Actions), `kinds` (the kinds it can hold),
    `kind_counts()` ({(phase, kind): n}), `updates()` ((phase, kind, memory_id, changes)
    in its order), and `rows` with `apply(journal, start, stop)`: it applies rows start…stop
    of its own, as Journal.update_many would their updates."""

    __slots__ = ("_parts",)

    def __init__(self, actions=()):
        self._parts: list = []
        self.extend(actions)

    def append(self, action: Action) -> None:
        if not self._parts or type(self._parts[-1]) is not list:
            self._parts.append([])
        self._parts[-1].append(action)

    def add_compact(self, run) -> None:
        """Add a compact run (see the class) after the actions held."""
        self._parts.append(run)

    def extend(self, actions) -> None:
        if isinstance(actions, Actions):
            for part in actions._parts:  # a list copied (the same Actions), a compact run shared
                self._parts.append(list(part) if type(part) is list else part)
        else:
            for action in actions:
                self.append(action)

    def __iadd__(self, actions) -> Actions:
        self.extend(actions)
        return self

    def __len__(self) -> int:
        return sum(len(part) for part in self._parts)

    def __bool__(self) -> bool:
        return any(len(part) for part in self._parts)

    def __iter__(self):
        for part in self._parts:
            yield from part

    def __getitem__(self, index):
        import itertools

        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return list(itertools.islice(self, start, stop, step)) if stop > start else []
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("action index out of range")
        return next(itertools.islice(self, index, None))

    def of_kind(self, *kinds: str) -> list[Action]:
        """The actions of `kinds`, in order, without reading the compact runs that hold none."""
        wanted = set(kinds)
        return [action for part in self._parts if type(part) is list or wanted & part.kinds
                for action in part if action.kind in wanted]

    def updates(self, leave_out: frozenset[str] = frozenset()):
        """(phase, kind, memory_id, changes) of every action not of a kind in `leave_out`, in
        order: what Journal.update_many applies, made without an Action for a compact run."""
        for part in self.update_parts(leave_out):
            if type(part) is list:
                yield from part
            else:
                yield from part.updates()

    def update_parts(self, leave_out: frozenset[str] = frozenset()):
        """The updates of `updates`, in the same order, by part: a list of (phase, kind,
        memory_id, changes), or a compact run that applies its own (`apply(journal, start,
        stop)`: the same writes and journal rows, made without a dict a change)."""
        for part in self._parts:
            if type(part) is not list and not (part.kinds & leave_out):
                yield part
                continue
            updates = [(a.phase, a.kind, a.memory_id, a.changes) for a in part if a.kind not in leave_out]
            if updates:
                yield updates

    def kind_counts(self) -> dict[tuple[str, str], int]:
        """(phase, kind) → how many actions, in the order first met."""
        out: dict[tuple[str, str], int] = {}
        for part in self._parts:
            if type(part) is list:
                for action in part:
                    key = (action.phase, action.kind)
                    out[key] = out.get(key, 0) + 1
            else:
                for key, count in part.kind_counts().items():
                    out[key] = out.get(key, 0) + count
        return out


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def row_snapshot(memory_id: str, db) -> dict[str, Any]:
    """The memory's row as stored (what `update` journals as its before-image)."""
    snapshot = memory_snapshot(db, memory_id)
    if snapshot is None:
        raise NotFound(f"no memory with id {memory_id!r}")
    return snapshot


def _dumps(value: Any) -> str | None:
    # The same encoding as models.JSONText, so journaled rows read back identically.
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def file_hash(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class _SessionAction:
    """A backfill's session action as it grows (Journal.session): what it holds and its size."""

    phase: str
    id: int | None = None
    created: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    cursors: list[tuple[str, str, dict[str, Any] | None]] = field(default_factory=list)
    size: int = 0  # bytes of its images


class Journal:
    """Applies writes for one run and records each with its before-image."""

    def __init__(self, store, run: DreamRun):
        self.store = store
        self.db = store.db
        self.run = run
        self.count = 0
        self._sessions: _SessionAction | None = None  # the action sessions are joining

    def _record(self, phase: str, kind: str, op: str, memory_id: str | None, before, after) -> None:
        journal_rows.insert_action(self.db, self.run.id, phase, kind, op, memory_id,
                                   _dumps(before), _dumps(after), now())
        self.count += 1

    def update(self, phase: str, kind: str, memory_id: str, changes: dict[str, Any]) -> None:
        """Set fields of a memory (metadata is merged into the current one). Call inside a txn."""
        self.update_many([(phase, kind, memory_id, changes)])

    def update_many(self, items: list[tuple[str, str, str, dict[str, Any]]]) -> None:
        """Apply (phase, kind, memory_id, changes) updates in order, as `update` does each, with one
        read of the rows, one prepared UPDATE per shape of writes and one journal INSERT
        (db/bulk.py). The journal keeps what changed: the old values of the columns written
        (derived ones aside, undo recomputes them) and the new ones. Call inside a txn.

        Only the columns the changes name are read, and a change that leaves the text alone
        (a decay's confidence and stamp: most of a night) writes no derived column, so the
        FTS row stays; one that touches it goes through the store (prepare_fields). Each
        metadata is encoded once: its text is what is stored and what the images hold."""
        if not items:
            return
        ids = list(dict.fromkeys(memory_id for _, _, memory_id, _ in items))
        touching = [_touches_text(changes) for _, _, _, changes in items]
        names = {name for _, _, _, changes in items for name in changes} | {"updated_at"}
        if any(touching):
            names |= _TEXT_FIELDS
        names.discard("metadata")
        read = ("metadata", *sorted(names))  # metadata first: it is decoded, the rest as stored
        current: dict[str, dict[str, Any]] = {}
        texts: dict[str, str] = {}  # memory id → its metadata as stored
        seqs: dict[str, int] = {}  # memory id → its seq, the key of its write (bulk.update_memory_rows)
        loads = _loads
        for memory_id, row in bulk.memory_rows_by_id(self.db, (*read, "seq"), ids).items():
            seqs[memory_id] = row[-1]
            snapshot = dict(zip(read, row[:-1], strict=True))
            texts[memory_id] = text = row[0] or "{}"
            snapshot["metadata"] = loads(text)
            current[memory_id] = snapshot
        stamp = now()
        run_id = self.run.id
        journal = []
        # memory id → (columns, stored values) of its one write of the batch: a memory changed
        # twice (a decay, then the invalidation it leads to) is written once, with what both
        # set, as the journal keeps each step.
        final: dict[str, tuple[tuple[str, ...], list[Any]]] = {}
        for (phase, kind, memory_id, changes), text in zip(items, touching, strict=True):
            before_row = current.get(memory_id)
            if before_row is None:
                raise NotFound(f"no memory with id {memory_id!r}")
            values = dict(changes)
            if "metadata" in values:
                values["metadata"] = {**before_row["metadata"], **values["metadata"]}
            if text:
                # Through the store: a changed text is redacted and re-derives its hints and hashes.
                values = self.store.prepare_fields(values, current=before_row)
            elif "updated_at" not in values:
                values["updated_at"] = stamp  # all prepare_fields adds to a change of no text
            columns = _shape(values)
            written = columns.written
            old_text = texts[memory_id]
            new_text = _json(values["metadata"]) if "metadata" in values else old_text
            journal.append((run_id, phase, kind, "update", memory_id, columns.before_image(before_row, old_text),
                            columns.after_image(values, new_text), stamp))
            row = [new_text if name == "metadata" else values[name] for name in written]
            held = final.get(memory_id)
            if held is None:
                final[memory_id] = (written, row)
            else:
                merged = dict(zip(*held, strict=True))
                merged.update(zip(written, row, strict=True))
                final[memory_id] = (tuple(merged), list(merged.values()))
            before_row.update(values)
            texts[memory_id] = new_text
        _write_shapes(self.db, [(seqs[memory_id], names, row) for memory_id, (names, row) in final.items()], key="seq")
        bulk.insert_actions(self.db, journal)
        self.count += len(journal)

    def write_updates(self, writes: list[tuple[int, tuple[str, ...], list[Any]]], entries: list[tuple]) -> None:
        """Write updates a compact run worked out itself (deep.DecayRows.apply): `writes`
        (the memory's seq, columns, stored values), each memory once, and their journal rows
        (dream_action's columns, as update_many makes them). Call inside a txn."""
        _write_shapes(self.db, writes, key="seq")
        bulk.insert_actions(self.db, entries)
        self.count += len(entries)

    def create(self, phase: str, kind: str, memory: Memory) -> None:
        """Journal a memory this run has just added (undo checks it is still as added). Its id
        and the stamp of its last write are all that needs: any edit since stamps it anew (a
        backfill journals one create per memory it keeps, and the content hash was most of it)."""
        self._record(phase, kind, "create", memory.id, None, {"updated_at": memory.updated_at})

    def session(self, phase: str, created: dict[str, list[Memory]], cursor_table: str,
                cursor_key: dict[str, Any], cursor_before: dict[str, Any] | None, *,
                cursor_moved: bool) -> None:
        """Journal what a backfill did to one session (journal_rows.SESSION_OP): the memories it
        created, by kind, each by id and stamp as `create` journals it, and the session cursor
        as it was when the backfill moved it. The run's sessions join one action, rewritten
        with each, until it passes journal_rows.SESSION_ACTION_BYTES. Undo reads it as those
        `create`s and `row`s."""
        if cursor_table != journal_rows.CURSOR_TABLE:
            raise ValueError(f"table {cursor_table!r} is no session cursor table")
        pairs = {kind: [(m.id, m.updated_at) for m in memories] for kind, memories in created.items()}
        if not cursor_moved and not any(pairs.values()):
            return
        held = self._sessions
        if held is None or held.phase != phase or held.size > journal_rows.SESSION_ACTION_BYTES:
            held = self._sessions = _SessionAction(phase)
        for kind, made in pairs.items():
            held.created.setdefault(kind, []).extend(made)
        if cursor_moved:
            held.cursors.append((cursor_key["adapter"], cursor_key["session_id"], cursor_before))
        before, after = journal_rows.session_action_images(held.created, held.cursors)
        held.size = len(before or "") + len(after)
        if held.id is None:
            held.id = journal_rows.insert_session_action(self.db, self.run.id, phase, before, after, now())
            self.count += 1
        else:
            journal_rows.rewrite_images(self.db, held.id, before, after)

    def relate(self, phase: str, kind: str, source_id: str, target_id: str, relation_type: str) -> bool:
        """Add a relation unless it exists; journal it when added."""
        # One prepared INSERT that adds nothing when the triple exists (its unique index): a
        # peewee exists() then create() cost ~1 ms a relation, four for each merge.
        if not bulk.insert_relations(self.db, [(source_id, target_id, relation_type, now())]):
            return False
        self._record(phase, kind, "relate", source_id, None,
                     {"source_id": source_id, "target_id": target_id, "type": relation_type})
        return True

    def report(self, phase: str, kind: str, memory_id: str | None, detail: dict[str, Any]) -> None:
        """Journal what a run found or staged outside the memory rows (a shadow verdict, a
        grounded recall): nothing for undo to restore; the run's own rollback reads it."""
        self._record(phase, kind, "report", memory_id, None, detail)

    def record_row(self, phase: str, kind: str, table: str, key: dict[str, Any],
                   row: dict[str, Any] | None) -> None:
        """Journal a row of another table as it was before (None: it did not exist)."""
        if table not in RESTORABLE_TABLES:
            raise ValueError(f"table {table!r} cannot be journaled")
        self._record(phase, kind, "row", None, {"table": table, "key": key, "row": row}, None)

    def write_file(self, phase: str, kind: str, path: Path, text: str) -> None:
        """Rewrite a file (0600, atomic) and journal its old text."""
        path = Path(path)
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            return
        write_private_text(path, text)
        with self.db.atomic():
            self._record(phase, kind, "file", None, {"path": str(path), "text": old},
                         {"path": str(path), "sha256": file_hash(text)})


def _touches_text(changes: dict[str, Any]) -> bool:
    """Whether a change can alter what the derived columns come from (content, summary, the
    descriptive metadata: store.text_changed); one that cannot needs no text read."""
    return "content" in changes or "summary" in changes or \
        not _DESCRIPTIVE.isdisjoint(changes.get("metadata") or ())


_TEXT_FIELDS = frozenset({"content", "summary", "metadata"})
_DESCRIPTIVE = frozenset(DESCRIPTIVE_METADATA)


class _Columns:
    """The columns of one shape of write: all of them (sorted: the statement and the
    after-image), and those the before-image holds (derived ones are recomputed by undo),
    with the text of each image around its values (_image)."""

    __slots__ = ("written", "journaled", "_before", "_after")

    def __init__(self, names: tuple[str, ...]):
        self.written = tuple(sorted(names))
        self.journaled = tuple(name for name in self.written if name not in DERIVED_COLUMNS)
        self._before, self._after = _image_template(self.journaled), _image_template(self.written)

    def before_image(self, row: dict[str, Any], metadata_text: str) -> str:
        """The before-image of `row` (its journaled columns), JSON text."""
        return _image(self.journaled, self._before, row, metadata_text)

    def after_image(self, values: dict[str, Any], metadata_text: str) -> str:
        """The after-image of `values` (every column written, those JSON cannot hold left out)."""
        return _image(self.written, self._after, values, metadata_text, only_json=True)


_SHAPES: dict[tuple[str, ...], _Columns] = {}


def _shape(values: dict[str, Any]) -> _Columns:
    key = tuple(values)
    columns = _SHAPES.get(key)
    if columns is None:
        columns = _SHAPES[key] = _Columns(key)
    return columns


def _c_encoder():
    """json's C encoder with JSONText's options, made once: json.dumps with options builds an
    encoder and its C part on every call, most of its time for a metadata of a few keys."""
    from json import encoder

    if encoder.c_make_encoder is None:  # an interpreter without the C part (PyPy)
        return None
    defaults = json.JSONEncoder()
    return encoder.c_make_encoder(None, defaults.default, encoder.encode_basestring, None, ": ", ", ",
                                  True, False, True)


_ENCODE = _c_encoder()


def _json(value: Any) -> str:
    """`value` as JSONText stores it (json.dumps(ensure_ascii=False, sort_keys=True)), and as
    _dumps encodes it inside an image."""
    if _ENCODE is None or isinstance(value, str):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return "".join(_ENCODE(value, 0))


_SCAN = json.JSONDecoder().scan_once


def _loads(text: str) -> Any:
    """json.loads(text), calling the decoder's scanner at once for a document without white
    space around it (every image and metadata llmem writes): json.loads's Python wrapping
    cost more than the C scan of such a short text."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)  # raises what json.loads says of it
    return value if end == len(text) else json.loads(text)


_JSON_TYPES = (str, int, float, bool, dict, list, type(None))


def _value_json(value: Any) -> str | None:
    """`value` as _json writes it, or None when JSON cannot hold it: the common kinds (a
    number, None) written without calling the encoder."""
    kind = type(value)
    if kind is float and value - value == 0:  # finite: json writes float.__repr__
        return float.__repr__(value)
    if value is None:
        return "null"
    if kind is int:
        return int.__repr__(value)
    return _json(value) if isinstance(value, _JSON_TYPES) else None


_float_repr = float.__repr__  # what json writes of a finite float


def _image_template(names: tuple[str, ...]) -> str:
    """`_dumps` of a mapping of `names` (sorted) with a %s where each value's JSON goes."""
    return "{" + ", ".join(f'"{name}": %s' for name in names) + "}"


def _image(names: tuple[str, ...], template: str, values: dict[str, Any], metadata_text: str,
           only_json: bool = False) -> str:
    """`_dumps({name: values[name] for name in names})` (names sorted; `template` its text
    with a %s for each value, _image_template), built from each value's JSON with the
    metadata's given as its stored text, so no metadata is encoded twice (a decay journals
    two images of it). `only_json`: values JSON cannot hold are left out (an after-image
    holds what it can); else such a value raises, as json.dumps does."""
    texts = tuple([metadata_text if name == "metadata" else
                   _float_repr(value) if type(value := values[name]) is float and value - value == 0 else
                   _value_json(value) for name in names])  # a finite float (most values) without a call
    if None not in texts:
        return template % texts
    if not only_json:
        _json(values[names[texts.index(None)]])  # raises json's TypeError for it
    pairs = [(name, text) for name, text in zip(names, texts, strict=True) if text is not None]
    return "{" + ", ".join([f'"{name}": {text}' for name, text in pairs]) + "}"


def _write_shapes(db, writes: list[tuple[Any, tuple[str, ...], list[Any]]], key: str = "id") -> int:
    """Write (the memory's `key`: its id or seq, names, stored values of those names), each
    memory once, with one prepared statement per shape (the columns written): the order
    among them does not matter. Returns how many rows were written."""
    groups: dict[tuple[str, ...], list] = {}
    for memory_key, names, stored in writes:
        stored.append(memory_key)
        rows = groups.get(names)
        if rows is None:
            rows = groups[names] = []
        rows.append(stored)
    return sum(bulk.update_memory_rows(db, names, rows, key=key) for names, rows in groups.items())


def start_run(store, kind: str, phases: list[str], run_id: str | None = None) -> DreamRun:
    with store.db.atomic():
        return store.models.DreamRun.create(id=run_id or new_run_id(), kind=kind, phases=",".join(phases),
                               status="running", started_at=now(), summary={})


def finish_run(store, run: DreamRun, summary: dict, error: str | None = None) -> None:
    with store.db.atomic():
        run.status = "failed" if error else "done"
        run.error = error
        run.finished_at = now()
        run.summary = summary
        run.save()


def end_failed_run(store, run: DreamRun, lock, summary: dict, error: str) -> None:
    """Mark a failed run failed and release its lock, in one transaction, best effort: the
    failure may be a full disk that refuses these writes too. Then the row is marked without
    its summary (less to write), and at worst the lock is left, stale for this process at
    once and for any other when this one ends (dream/lock.py); never raises."""
    import peewee as pw

    for with_summary in (True, False):
        try:
            with store.db.atomic():
                finish_run(store, run, summary if with_summary else {}, error=error)
                lock.release()
            return
        except pw.DatabaseError as exc:
            log.warning("could not record the failure of dream run %s%s: %s", run.id,
                        "" if with_summary else " (even without its summary)", exc)
    try:
        lock.release()
    except pw.DatabaseError:
        pass


def roll_back_failed_run(store, run_id: str) -> bool:
    """Undo what a run that failed midway wrote, so it leaves nothing half-written: its journal
    replayed backwards in one transaction (undo_run); the run is then 'undone', its error kept.
    Best effort, never raises (the failure may be a full disk that refuses this too): the run
    stays 'failed' then, and `llmem dream undo` rolls it back later. Returns whether it did."""
    try:
        undo_run(store, run_id)
    except Exception as exc:  # the driver's error family, a file that cannot be written back
        log.warning("could not roll back the failed dream run %s: %s", run_id, exc)
        return False
    return True


def find_run(store, run_id: str) -> DreamRun:
    run_id = (run_id or "").strip().lower()
    if len(run_id) < 4:
        raise UsageError(f"run id {run_id!r} is too short", hint="give at least 4 characters; `llmem dream status` lists runs")
    DreamRun = store.models.DreamRun
    rows = list(DreamRun.select().where((DreamRun.id >= run_id) & (DreamRun.id < run_id + "\U0010ffff")).limit(2))
    if not rows:
        raise NotFound(f"no dream run {run_id!r}", hint="`llmem dream status` lists recent runs")
    if len(rows) > 1:
        raise UsageError(f"run id {run_id!r} matches several runs", hint="give more characters")
    return rows[0]


@dataclass
class UndoResult:
    run_id: str
    restored: int = 0
    deleted: int = 0
    unlinked: int = 0
    files: int = 0
    skipped_files: list[str] = field(default_factory=list)
    skipped_memories: list[str] = field(default_factory=list)  # changed since the run: left alone

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


# The columns a person (or another process) changes when editing a memory: a row whose
# values differ from the run's after-image was changed since and is not restored over.
# Access counts are left out: a search that showed the memory is not an edit.
EDITED_FIELDS = ("content", "summary", "confidence", "type", "project", "metadata", "updated_at",
                 "invalidated_at", "valid_from", "valid_until", "promoted_at", "content_hash")
UNDO_SKIPPED = "undo_skipped"  # the run summary's list of memories a plain undo left alone


def changed_since(after: dict[str, Any], current: dict[str, Any] | None) -> bool:
    """True when the row no longer holds what the run wrote (its after-image)."""
    if current is None:
        return False  # gone: nothing of it to lose
    for name, value in after.items():  # noqa: SIM110 - a loop, not any(…): undo asks this of 100k rows
        if name in _EDITED and current.get(name) != value:
            return True
    return False


_EDITED = frozenset(EDITED_FIELDS)


def undo_run(store, run_id: str, *, force: bool = False) -> UndoResult:
    """Restore everything a run wrote, newest write first, in one transaction.

    A memory changed since the run (its row differs from the run's last after-image of it)
    is left as it is and listed in `skipped_memories`; `force` restores it anyway, and also
    finishes what an earlier plain undo of this run left (the run summary lists those).
    A file changed since is always left alone (`skipped_files`).
    """
    run = find_run(store, run_id)
    only: set[str] | None = None
    if run.status == "undone":
        left = (run.summary or {}).get(UNDO_SKIPPED) or []
        if not (force and left):
            raise UsageError(f"run {run.id} was already undone")
        only = set(left)
    if run.kind == "rem-backfill":
        raise UsageError(f"run {run.id} is a grounded backfill: its rollback removes exactly what it staged",
                         hint=f"use `llmem dream rem-backfill --rollback {run.id}`")
    if run.status == "running":
        raise UsageError(f"run {run.id} is still running (or died: its lock is taken over by the next run)",
                         hint="wait for it to finish")
    if run.kind == EDIT_RUN and store.models.DreamAction.select().where(
            (store.models.DreamAction.run == run.id) & (store.models.DreamAction.op == "delete")).exists():
        raise UsageError(f"run {run.id} deleted a memory for good: a delete cannot be undone",
                         hint="add the memory again with `llmem add`")
    db = store.db
    # A person's edit since the run is no reason to refuse it: the memory it changed is left
    # as the person made it and reported (changed_since), as before edits were journaled.
    later_ids = journal_rows.later_runs_on_same_memories(db, run.id, run.started_at, except_kind=EDIT_RUN)
    if later_ids:
        raise UsageError(f"run {run.id} cannot be undone alone: later runs changed the same memories ({', '.join(later_ids)})",
                         hint="undo those runs first, newest first")
    result = UndoResult(run.id)
    file_actions = []
    checked: set[str] = set()  # memories whose newest action of this run was compared
    held: dict[str, Any] = {}  # memory id → the metadata a compare-and-set restore left in its row
    with db.atomic():
        rows = journal_rows.actions_newest_first(db, run.id)
        while True:
            chunk = rows.fetchmany(2000)
            if not chunk:
                break
            _undo_chunk(store, chunk, result, checked, held, only, force, file_actions)
        run.status = "undone"
        run.undone_at = now()
        run.summary = {**(run.summary or {}), UNDO_SKIPPED: result.skipped_memories}
        run.save()
    # Files after the store commit: a file changed by hand since the run is left alone.
    for before, after in file_actions:
        path = Path(after["path"])
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if file_hash(current) != after["sha256"]:
            result.skipped_files.append(str(path))
            continue
        old = before.get("text")
        if old is None:
            path.unlink(missing_ok=True)
        else:
            write_private_text(path, old)
        result.files += 1
    return result


class _RowsChanged(Exception):
    """A compare-and-set restore met a row that no longer holds the run's after-image, or is gone."""


def _undo_chunk(store, chunk: list[tuple], result: UndoResult, checked: set[str], held: dict[str, Any],
                only: set[str] | None, force: bool, file_actions: list) -> None:
    """Undo one chunk of a run's actions (newest first), as replaying them one by one would.

    First the memories that plain updates alone wrote and whose restore leaves their text as
    it is (a night's decays, stamps and invalidations: nearly all of them), without reading
    a row: one compare-and-set UPDATE per shape, each row written only where it still holds
    the run's after-image. Should any not (an edit since the run, a memory gone), that write
    is rolled back and the whole chunk goes the careful way (_undo_actions), which reads the
    rows and tells which to leave alone."""
    plain = _plain_restores(chunk, checked, held, set(result.skipped_memories)) if only is None else {}
    rest = chunk
    if plain:
        try:
            with store.db.savepoint():
                _compare_and_set(store.db, plain, force)
        except _RowsChanged:
            pass
        else:
            checked.update(plain)
            for memory_id, (image, after, _) in plain.items():
                metadata = image.get("metadata", (after or {}).get("metadata", held.get(memory_id)))
                if metadata is not None:
                    held[memory_id] = metadata
            result.restored += sum(count for _, _, count in plain.values())
            rest = [row for row in chunk if not (row[0] == "update" and row[1] in plain)]
    for op, memory_id, _, _ in rest:
        if op == "update":
            held.pop(memory_id, None)  # the careful path may put another metadata back
    _undo_actions(store, rest, result, checked, only, force, file_actions)


def _plain_restores(chunk: list[tuple], checked: set[str], held: dict[str, Any],
                    skipped: set[str]) -> dict[str, tuple]:
    """memory id → (its before-images folded, the oldest winning; the run's last after-image
    of it, or None when an earlier chunk held that one and compared it; how many updates)
    for the memories of `chunk` that only updates wrote and whose restore needs no row: it
    puts back no content or summary, and no descriptive metadata other than the row's (which
    is known without a read: the after-image's, or what an earlier chunk put back, `held`)."""
    loads = _loads
    found: dict[str, list] = {}
    excluded = set(skipped)  # memories left alone (or created by the run: deleted by undo)
    for op, memory_id, before_text, after_text in chunk:
        if op == "create":
            excluded.add(memory_id)
        if op != "update" or memory_id in excluded:
            continue
        before = loads(before_text) if before_text else {}
        image = before if before.keys() <= _ROW_FIELDS else {f: before[f] for f in MEMORY_ROW_FIELDS if f in before}
        entry = found.get(memory_id)
        if entry is None:  # its newest action of the chunk
            after = None if memory_id in checked else (loads(after_text) if after_text else {})
            found[memory_id] = [image, after, 1]
        else:
            entry[0] = {**entry[0], **image}
            entry[2] += 1
    plain = {}
    for memory_id, (image, after, count) in found.items():
        if memory_id in excluded or "content" in image or "summary" in image:
            continue
        if "metadata" in image:
            row = (after or {}).get("metadata", held.get(memory_id))
            if row is None or _restores_text(image, {"metadata": row}):
                continue
        plain[memory_id] = (image, after, count)
    return plain


def _compare_and_set(db, plain: dict[str, tuple], force: bool) -> None:
    """Put back the images of `plain` (_plain_restores), each row only where its edited
    columns still hold the run's after-image (`force`: whatever they hold); raises
    _RowsChanged when a row was not written."""
    groups: dict[tuple, list] = {}
    # (an image's names, an after-image's names or None) → (the names written, those compared,
    # and the rows of their group): worked out once a shape, not once a memory.
    shapes: dict[tuple, tuple[tuple[str, ...], tuple[str, ...], list]] = {}
    for memory_id, (image, after, _) in plain.items():
        key = (tuple(image), None if force or after is None else tuple(after))
        shape = shapes.get(key)
        if shape is None:
            names = _shape({name: None for name in image if name not in DERIVED_COLUMNS}).written
            compared = () if key[1] is None else tuple(sorted(name for name in key[1] if name in _EDITED))
            shape = shapes[key] = (names, compared, groups.setdefault((names, compared), []))
        names, compared, rows = shape
        row = [image[name] for name in names]
        if "metadata" in image:
            metadata = image["metadata"]
            row[names.index("metadata")] = None if metadata is None else _json(metadata)
        row.append(memory_id)
        if compared:
            row += [after[name] for name in compared]
            if "metadata" in compared:
                metadata = after["metadata"]
                row[len(names) + 1 + compared.index("metadata")] = None if metadata is None else _json(metadata)
        rows.append(row)
    for (names, compared), rows in groups.items():
        if bulk.update_memory_rows(db, names, rows, where=compared) != len(rows):
            raise _RowsChanged


def _undo_actions(store, chunk: list[tuple], result: UndoResult, checked: set[str], only: set[str] | None,
                  force: bool, file_actions: list) -> None:
    """Undo the actions of `chunk` (newest first) as replaying them one by one would:
    the memory rows it restores are read with one query (the columns the images name) and
    written back with one prepared statement per shape of rows (each memory once: its images
    folded, the oldest winning), as no other kind of action reads or writes a memory's columns."""
    db = store.db
    loads = _loads
    # First the images: which actions count, and which columns of the rows they need.
    actions = []
    needed = {"metadata"}
    shapes: set[tuple[str, ...]] = set()  # the names of the after-images read
    for op, memory_id, before_text, after_text in chunk:
        if op in ("update", "create"):
            if only is not None and memory_id not in only:
                continue
            after = None
            if memory_id not in checked:  # its newest action of the run: compared with the row
                checked.add(memory_id)
                after = loads(after_text) if after_text else {}
                shapes.add(tuple(after))
            before = (loads(before_text) if before_text else {}) if op == "update" else None
        elif only is not None:
            continue  # a forced second pass only restores the memories left before
        else:
            before = loads(before_text) if before_text else None
            after = loads(after_text) if after_text else None
        actions.append((op, memory_id, before, after))
    needed.update(name for shape in shapes for name in shape if name in _EDITED)
    ids = [memory_id for op, memory_id, _, _ in actions if op in ("update", "create") and memory_id]
    current = _rows_of(db, list(dict.fromkeys(ids)), tuple(sorted(needed)))
    pending: dict[str, dict[str, Any]] = {}  # memory id → the columns to put back (oldest image wins)
    counts: dict[str, int] = {}
    skipped = set(result.skipped_memories)

    def flush() -> None:
        writes = []
        textual = [memory_id for memory_id, before in pending.items()
                   if memory_id in current and _restores_text(before, current[memory_id])]
        whole = _rows_of(db, textual, UNDO_READ) if textual else {}
        for memory_id, before in pending.items():
            row = current.get(memory_id)
            if row is None:
                continue  # gone: nothing to restore
            if memory_id in whole:
                values = store.restored_fields(before, current=whole[memory_id])
            else:  # what restored_fields gives for an image that leaves the text as it is
                values = {name: value for name, value in before.items() if name not in DERIVED_COLUMNS}
            names = _shape(values).written
            writes.append((memory_id, names,
                           [_stored_metadata(values[name]) if name == "metadata" else values[name]
                            for name in names]))
            result.restored += counts[memory_id]
        _write_shapes(db, writes)
        pending.clear()
        counts.clear()

    unlinks: list[tuple[str, str, str]] = []  # (source, target, type) of the relations to remove

    def unlink() -> None:
        result.unlinked += bulk.delete_relations(db, unlinks)
        unlinks.clear()

    for op, memory_id, before, after in actions:
        if op in ("update", "create"):
            if after is not None and not force and changed_since(after, current.get(memory_id)):
                result.skipped_memories.append(memory_id)
                skipped.add(memory_id)
            if memory_id in skipped:
                continue
            if op == "update":
                # An image journaled before a column existed lacks it; the derived ones (hints,
                # hashes) are recomputed from the text anyway.
                image = before if before.keys() <= _ROW_FIELDS else \
                    {f: before[f] for f in MEMORY_ROW_FIELDS if f in before}
                held = pending.get(memory_id)
                pending[memory_id] = image if held is None else {**held, **image}
                counts[memory_id] = counts.get(memory_id, 0) + 1
                continue
            unlink()  # a create: the relations undone before it go first, as one by one
            if memory_id in pending:  # restored, then deleted: as replaying them one by one
                del pending[memory_id]
                result.restored += counts.pop(memory_id)
            if memory_id in current:
                store.delete(memory_id)
                result.deleted += 1
            current.pop(memory_id, None)
        elif op == "relate":
            unlinks.append((after["source_id"], after["target_id"], after["type"]))
        elif op == "row":
            _restore_row(db, before)
        elif op == "file":
            file_actions.append((before, after))
    unlink()
    flush()


def _stored_metadata(value: Any) -> str | None:
    return None if value is None else _json(value)


_ROW_FIELDS = frozenset(MEMORY_ROW_FIELDS)


def _restores_text(image: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether putting `image` back over `row` (its metadata read) can change what the derived
    columns come from (store.text_changed): its content or summary, or descriptive metadata
    other than the row's."""
    if "content" in image or "summary" in image:
        return True
    if "metadata" not in image:
        return False
    old, new = image["metadata"], row["metadata"]
    if not isinstance(old, dict) or not isinstance(new, dict):
        return True
    if not (old.keys() & _DESCRIPTIVE or new.keys() & _DESCRIPTIVE):
        return False  # neither has any: the same (empty) descriptive text
    return tuple(map(old.get, DESCRIPTIVE_METADATA)) != tuple(map(new.get, DESCRIPTIVE_METADATA))


# What undo reads of each memory it restores: the columns compared with the run's
# after-image and the text restored_fields re-derives from (half the row: reading all of it
# was a fifth of an undo's time).
UNDO_READ = tuple(dict.fromkeys((*EDITED_FIELDS, "content", "summary", "metadata")))


def _rows_of(db, memory_ids: list[str], columns: tuple[str, ...] = UNDO_READ) -> dict[str, dict[str, Any]]:
    """memory id → the `columns` of its row as row_snapshot reads them (metadata decoded),
    for the ids that exist."""
    rows = {}
    loads = _loads
    for memory_id, row in bulk.memory_rows_by_id(db, columns, memory_ids).items():
        snapshot = dict(zip(columns, row, strict=True))
        if "metadata" in snapshot:
            snapshot["metadata"] = loads(snapshot["metadata"] or "{}")
        rows[memory_id] = snapshot
    return rows


def _restore_row(db, before: dict[str, Any]) -> None:
    table = before["table"]
    columns = RESTORABLE_TABLES[table]  # KeyError for anything else: never build SQL from data
    journal_rows.replace_row(db, table, columns, before["key"], before.get("row"))


def last_run(store, kind: str = "dream", phase: str | None = None) -> DreamRun | None:
    """The newest finished (applied, not undone) run of `kind`, optionally one that ran `phase`."""
    DreamRun = store.models.DreamRun
    query = DreamRun.select().where((DreamRun.kind == kind) & (DreamRun.status == "done"))
    if phase:
        query = query.where(DreamRun.phases.contains(phase))
    return query.order_by(DreamRun.started_at.desc()).first()


def action_counts(store, run_id: str) -> dict[str, dict[str, int]]:
    DreamAction = store.models.DreamAction
    rows = (DreamAction.select(DreamAction.phase, DreamAction.kind, pw.fn.COUNT(DreamAction.id))
            .where(DreamAction.run == run_id).group_by(DreamAction.phase, DreamAction.kind).tuples())
    out: dict[str, dict[str, int]] = {}
    for phase, kind, count in rows.where(DreamAction.op != journal_rows.SESSION_OP):
        out.setdefault(phase, {})[kind] = count
    # A backfill's session action counts as the memories it created, by kind, and its cursor.
    for phase, before, after in (DreamAction.select(DreamAction.phase, DreamAction.before, DreamAction.after)
                                 .where((DreamAction.run == run_id) & (DreamAction.op == journal_rows.SESSION_OP))
                                 .tuples()):
        kinds = out.setdefault(phase, {})
        for kind, pairs in (after or {}).items():
            kinds[kind] = kinds.get(kind, 0) + len(pairs)
        if before:
            kinds["cursor"] = kinds.get("cursor", 0) + len(journal_rows.cursor_images(before))
    return out
