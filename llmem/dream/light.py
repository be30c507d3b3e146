"""Light phase: near-duplicate pairs, exact duplicates and auto-link candidates (found, not
written), and the episodes' retention (planned here, applied through the journal by the sweep).

Incremental: only memories whose vector changed since the last applied light run (new or
re-embedded: `embedding.created_at`) are compared, against every valid embedded memory.
The comparison is blocked numpy matrix products over the store's vectors in chunks (read
from the memory-mapped vector file, _stored_chunks), so the memory it allocates stays bounded
by the changed set plus one chunk.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import peewee as pw

from ..db import vec, vector_file
from ..db.models import EPISODE_SOURCE
from ..db.queries import shared_content_rows
from ..times import to_iso
from ..vectors import pending_query
from .journal import Action

if TYPE_CHECKING:
    from ..config import CaptureSettings

log = logging.getLogger(__name__)

CHUNK_ROWS = 8192  # store rows streamed per matrix product
BLOCK_ROWS = 1024  # changed rows per matrix product
MAX_PAIRS = 50_000  # a pathological store (everything identical) must not exhaust memory
# Episodes invalidated by one run at most (each is journaled with its before-image); the next
# night goes on where this one stopped.
MAX_PRUNED = 20_000
PRUNE = "prune_episode"

@dataclass
class LightResult:
    since: float | None
    model: str | None
    changed: int = 0
    compared_with: int = 0
    near_duplicates: list[dict[str, Any]] = field(default_factory=list)
    exact_duplicates: list[list[str]] = field(default_factory=list)
    auto_links: list[dict[str, Any]] = field(default_factory=list)
    truncated: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None  # why the vector comparison did not run, in the user's terms

    def hits(self) -> dict[str, int]:
        """How often each memory turned up in this phase (a small promotion signal)."""
        counts: dict[str, int] = {}
        for pair in self.near_duplicates + self.auto_links:
            for key in ("a", "b"):
                counts[pair[key]] = counts.get(pair[key], 0) + 1
        return counts

    def as_dict(self, limit: int | None = None) -> dict[str, Any]:
        cut = (lambda items: items[:limit]) if limit else (lambda items: items)
        return {"since": self.since, "model": self.model, "changed": self.changed,
                "compared_with": self.compared_with,
                "near_duplicates": cut(self.near_duplicates),
                "exact_duplicates": cut(self.exact_duplicates),
                "auto_links": cut(self.auto_links), "truncated": self.truncated,
                "seconds": round(self.seconds, 3), "notes": self.notes, "skipped": self.skipped}


class _Codes:
    """Small integer codes for types and projects, so scope checks are vectorised."""

    def __init__(self):
        self.table: dict[Any, int] = {}
        self.values: list[Any] = []  # code → value

    def __call__(self, values: list) -> np.ndarray:
        for value in set(values).difference(self.table):  # a few new ones, then a C-level map
            self.table[value] = len(self.values)
            self.values.append(value)
        return np.fromiter(map(self.table.__getitem__, values), dtype=np.int32, count=len(values))


def _matrix(blobs: list[bytes], dim: int) -> np.ndarray:
    return vec.decode_rows(blobs, dim)


def _stored_chunks(db, model: str, dim: int, types: _Codes, projects: _Codes):
    """Every valid memory's current vector as chunks of (seqs, type codes, project codes, rows,
    scales or None): a row times its scale is the stored vector.

    From the vector file searches keep beside the store (db/vector_file.py: the stored int8
    rows as they are, caught up with the table), with the valid memories' scopes read beside
    it, no vector: decoding 100k vectors from the table cost more than the whole journaled
    write of a night's decay. Without a file (PostgreSQL has none; a store never searched
    nor embedded by `llmem embed`) the rows stream from the table: a dream, a preview above
    all, writes no file of its own."""
    path = vector_file.file_path(db)
    index = vector_file.index_for(db, model, dim) if path is not None and path.exists() else None
    if index is None:
        cursor = vec.current_embeddings(db, model, dim)
        while rows := cursor.fetchmany(CHUNK_ROWS):
            yield (np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
                   types([r[2] for r in rows]), projects([r[3] for r in rows]),
                   _matrix([r[4] for r in rows], dim), None)
        return
    view = index.snapshot()
    seqs, type_codes, project_codes = [], [], []
    cursor = vec.current_embedding_scopes(db, model, dim)
    while rows := cursor.fetchmany(CHUNK_ROWS):
        seqs.append(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))
        type_codes.append(types([r[1] for r in rows]))
        project_codes.append(projects([r[2] for r in rows]))
    if not seqs:
        return
    valid = np.concatenate(seqs)
    type_codes, project_codes = np.concatenate(type_codes), np.concatenate(project_codes)

    def scoped(row_seqs, hidden=None):
        """Where each of `row_seqs` is among the valid ones, -1 where it is not (or hidden)."""
        at = np.minimum(np.searchsorted(valid, row_seqs), len(valid) - 1)
        found = valid[at] == row_seqs
        if hidden is not None:
            found &= ~hidden
        return np.where(found, at, -1)

    where = scoped(view.seqs, view.hidden)
    release = _page_release(view.matrix)
    for start in range(0, len(where), CHUNK_ROWS):
        picked = np.flatnonzero(where[start:start + CHUNK_ROWS] >= 0) + start
        if len(picked):
            at = where[picked]
            # Most chunks are every row of their range: converted from the mapping as a slice,
            # not gathered into an int8 copy first (a tenth of light's CPU at 100k).
            whole = picked[-1] - picked[0] + 1 == len(picked)
            rows = (view.matrix[picked[0]:picked[-1] + 1] if whole else view.matrix[picked]).astype(np.float32)
            release(start, start + CHUNK_ROWS)
            yield view.seqs[picked], type_codes[at], project_codes[at], rows, view.scales[picked]
    where = scoped(view.extra_seqs)
    picked = np.flatnonzero(where >= 0)
    if len(picked):  # the overlay: rows changed since the file was written, decoded
        at = where[picked]
        yield view.extra_seqs[picked], type_codes[at], project_codes[at], view.extra[picked], None


def _page_release(matrix: np.ndarray):
    """A function (start row, stop row) that gives the pages of those rows of the memory-mapped
    `matrix` back to the kernel once they are copied: a light run reads the whole vector file
    once, and the pages it touched stayed in the process's resident set (0.75 GB at 1M) for
    the rest of the night. Only the process's mapping lets go (MADV_DONTNEED on a read-only
    file mapping): the file stays in the page cache, and a search of this process that reads
    those rows again faults them back in, unchanged. A no-op where the rows are not a mapping
    (read from the table) or the platform has no madvise."""
    import mmap

    mapped = matrix.base
    while mapped is not None and not isinstance(mapped, mmap.mmap):
        mapped = getattr(mapped, "base", None) if not isinstance(mapped, memoryview) else mapped.obj
    if mapped is None or not hasattr(mapped, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return lambda _start, _stop: None
    first = matrix.__array_interface__["data"][0] - np.frombuffer(mapped, dtype=np.uint8, count=1).ctypes.data
    row_bytes = matrix.strides[0]
    page = mmap.PAGESIZE

    def release(start: int, stop: int) -> None:
        begin = (first + start * row_bytes) // page * page
        end = min(len(mapped), first + min(stop, len(matrix)) * row_bytes)
        if end > begin:
            mapped.madvise(mmap.MADV_DONTNEED, begin, end - begin)

    return release


def _pairs_by_id(store, found: dict[tuple[int, int], list], changed_ids: dict[int, str],
                 types: _Codes, projects: _Codes) -> dict[tuple[int, int], dict[str, Any]]:
    """The pairs found (by seq) as light reports them: a = the older memory (lower seq), b =
    the newer one, each by id, and the type of a."""
    Memory = store.models.Memory
    ids = dict(changed_ids)
    wanted = list({seq for key in found for seq in key if seq not in ids})
    for start in range(0, len(wanted), 500):
        ids.update(Memory.select(Memory.seq, Memory.id).where(Memory.seq.in_(wanted[start:start + 500])).tuples())
    return {key: {"a": ids[key[0]], "b": ids[key[1]], "similarity": round(sim, 4), "same_type": same_type,
                  "type": types.values[type_code], "project": projects.values[project_code]}
            for key, (sim, same_type, type_code, project_code) in found.items()}


def _embed_hint(embedder_provider: str | None) -> str:
    if embedder_provider == "none":
        return "no embedder is configured (embedding.provider: none): set one in config.yaml, then run `llmem embed`"
    return "run `llmem embed` (a running worker embeds new memories by itself)"


def find_candidates(store, *, similarity_threshold: float, auto_link_threshold: float | None,
                    since: float | None, embedder_provider: str | None = None) -> LightResult:
    """Compare what changed since `since` (None: everything) against every valid memory."""
    started = time.perf_counter()
    db = store.db
    model, dim = vec.index_state(db)
    result = LightResult(since=since, model=model)
    result.exact_duplicates = exact_duplicate_groups(db)
    _keep_within_one_audience(store, result, {})
    if not model or not dim:
        result.skipped = (f"0 memories embedded: {_embed_hint(embedder_provider)}; "
                          "only exact duplicates were looked for")
        result.seconds = time.perf_counter() - started
        return result

    changed_rows = vec.current_embeddings(db, model, dim, since=since).fetchall()
    result.changed = len(changed_rows)
    if not changed_rows:
        embedded = vec.current_embedding_count(db, model)
        waiting = pending_query(store, model).count()
        if not embedded:
            why = f"0 memories embedded with {model}: {_embed_hint(embedder_provider)}"
        else:
            why = (f"no memory embedded since the last light run ({to_iso(since)}); its "
                   f"{embedded} embedded memories were compared then")
            if waiting:
                why += f"; {waiting} memories wait for a vector: {_embed_hint(embedder_provider)}"
        result.skipped = why
        result.seconds = time.perf_counter() - started
        return result

    types, projects = _Codes(), _Codes()
    c_seq = np.fromiter((r[0] for r in changed_rows), dtype=np.int64, count=len(changed_rows))
    c_ids = dict(zip(c_seq.tolist(), (r[1] for r in changed_rows), strict=True))
    c_type = types([r[2] for r in changed_rows])
    c_proj = projects([r[3] for r in changed_rows])
    c_mat = _matrix([r[4] for r in changed_rows], dim)
    del changed_rows

    low = similarity_threshold if auto_link_threshold is None else min(similarity_threshold, auto_link_threshold)
    # (lower seq, higher seq) → [similarity, same type, the older one's type code, project code]
    found: dict[tuple[int, int], list] = {}
    for s_seq, s_type, s_proj, s_rows, s_scales in _stored_chunks(db, model, dim, types, projects):
        result.compared_with += len(s_seq)
        s_rows = s_rows.T
        # A row's similarity is its product times its scale: rather than scale every product
        # (a pass over the block), each column's product is held against the threshold over
        # its scale, a hair lower, and the few that pass are scaled and checked exactly.
        cut = None
        if s_scales is not None and low > 0:
            with np.errstate(divide="ignore"):
                cut = (np.float32(low) / s_scales) * np.float32(1 - 1e-5)
        for start in range(0, len(c_seq), BLOCK_ROWS):
            block = slice(start, start + BLOCK_ROWS)
            sims = c_mat[block] @ s_rows
            if s_scales is not None and cut is None:
                sims *= s_scales
            hits = sims >= (low if cut is None else cut)
            rows = np.flatnonzero(hits.any(axis=1))  # few: nonzero over them alone
            if not len(rows):
                continue
            ci, si = np.nonzero(hits[rows])
            ci = rows[ci]
            values = sims[ci, si]
            if cut is not None:
                values = values * s_scales[si]  # float32, as the product scaled in place
                exact = values >= low
                ci, si, values = ci[exact], si[exact], values[exact]
            ci_abs = ci + start
            keep = (c_seq[ci_abs] != s_seq[si]) & (c_proj[ci_abs] == s_proj[si])
            ci_abs, si, values = ci_abs[keep], si[keep], values[keep]
            for a_idx, b_idx, similarity in zip(ci_abs.tolist(), si.tolist(), values.tolist(), strict=True):
                a_seq, b_seq = int(c_seq[a_idx]), int(s_seq[b_idx])
                key = (min(a_seq, b_seq), max(a_seq, b_seq))
                if key in found:
                    continue
                if len(found) >= MAX_PAIRS:
                    result.truncated = True
                    break
                older_type = c_type[a_idx] if a_seq < b_seq else s_type[b_idx]
                found[key] = [similarity, bool(c_type[a_idx] == s_type[b_idx]),
                              int(older_type), int(s_proj[b_idx])]
    found = _pairs_by_id(store, found, c_ids, types, projects)
    _leave_episodes_out(store, result, found)
    _keep_within_one_audience(store, result, found)  # the pairs (the groups are split already)
    exact_members = {m for group in result.exact_duplicates for m in group}
    for _key, pair in sorted(found.items(), key=lambda kv: (-kv[1]["similarity"], kv[0])):
        entry = {k: pair[k] for k in ("a", "b", "similarity", "type", "project")}
        if pair["similarity"] >= similarity_threshold and pair["same_type"]:
            if pair["a"] in exact_members and pair["b"] in exact_members:
                continue  # already an exact duplicate
            result.near_duplicates.append(entry)
        elif auto_link_threshold is not None and pair["similarity"] >= auto_link_threshold:
            result.auto_links.append(entry)
    result.seconds = time.perf_counter() - started
    return result


def _episode_ids(store, ids: set[str]) -> set[str]:
    Memory = store.models.Memory
    wanted, found = list(ids), set()
    for start in range(0, len(wanted), 500):
        found.update(m for (m,) in Memory.select(Memory.id).where(
            Memory.id.in_(wanted[start:start + 500]) & (Memory.source == EPISODE_SOURCE)).tuples())
    return found


def _audiences(store, ids: set[str]) -> dict[str, tuple]:
    """Who may read each memory: ("shared",), or ("private", its author)."""
    Memory = store.models.Memory
    wanted, found = list(ids), {}
    for start in range(0, len(wanted), 500):
        for memory_id, visibility, author in Memory.select(Memory.id, Memory.visibility, Memory.author).where(
                Memory.id.in_(wanted[start:start + 500])).tuples():
            found[memory_id] = ("shared",) if visibility == "shared" else ("private", author)
    return found


def _keep_within_one_audience(store, result: LightResult, found: dict) -> None:
    """A merge keeps one of the memories: never a private memory into a shared one (its text
    would reach the team) nor one author's into another's. Links stay: they copy no text."""
    involved = {m for group in result.exact_duplicates for m in group}
    involved |= {pair[k] for pair in found.values() for k in ("a", "b")}
    audience = _audiences(store, involved) if involved else {}
    if len(set(audience.values())) < 2:
        return
    split: dict[tuple, list[str]] = {}
    for group in result.exact_duplicates:
        for memory_id in group:
            split.setdefault((tuple(group), audience.get(memory_id)), []).append(memory_id)
    result.exact_duplicates = [ids for ids in split.values() if len(ids) > 1]
    for pair in found.values():
        if audience.get(pair["a"]) != audience.get(pair["b"]):
            pair["same_type"] = False  # not a merge candidate; a link at most


def _leave_episodes_out(store, result: LightResult, found: dict) -> None:
    """Episodes are what was said, not facts: never merged or deduplicated into (or with) a
    memory, and never linked to one another (turns of one session all look alike); a link
    from an episode to a typed memory stays."""
    involved = {m for group in result.exact_duplicates for m in group}
    involved |= {pair[k] for pair in found.values() for k in ("a", "b")}
    episodes = _episode_ids(store, involved) if involved else set()
    if not episodes:
        return
    groups = [[m for m in group if m not in episodes] for group in result.exact_duplicates]
    result.exact_duplicates = [group for group in groups if len(group) > 1]
    for key in [k for k, pair in found.items() if pair["a"] in episodes or pair["b"] in episodes]:
        pair = found[key]
        if (pair["a"] in episodes and pair["b"] in episodes) or pair["same_type"]:
            del found[key]  # a same-type pair would be a merge candidate; it can only be a link
        # else: an episode beside a typed memory: an auto-link candidate, nothing more


def plan_episode_retention(store, capture: CaptureSettings, at: float) -> list[Action]:
    """Invalidations that keep the episodes within capture.episode_max_age_days (by when they
    were stored) and capture.episode_max_total_mb (of their text as stored: deflated in a SQLite file, where the
    cap is the disk it takes; the oldest go first)."""
    Memory = store.models.Memory
    valid = (Memory.source == EPISODE_SOURCE) & Memory.invalidated_at.is_null()
    chosen: dict[str, str] = {}
    max_days = int(capture.episode_max_age_days)
    if max_days > 0:
        reason = f"dream: episode older than capture.episode_max_age_days ({max_days})"
        rows = (Memory.select(Memory.id).where(valid & (Memory.created_at < at - max_days * 86400))
                .order_by(Memory.created_at, Memory.seq).limit(MAX_PRUNED).tuples())
        chosen.update((memory_id, reason) for (memory_id,) in rows)
    max_mb = float(capture.episode_max_total_mb)
    if max_mb > 0 and len(chosen) < MAX_PRUNED:
        budget, held = max_mb * 1_000_000, 0
        reason = f"dream: episodes past capture.episode_max_total_mb ({max_mb:g}), the oldest go first"
        rows = (Memory.select(Memory.id, pw.fn.LENGTH(Memory.content)).where(valid)
                .order_by(Memory.created_at.desc(), Memory.seq.desc()).tuples())
        for memory_id, size in rows.iterator():
            if memory_id in chosen:
                continue
            held += int(size or 0)
            if held > budget:
                chosen[memory_id] = reason
                if len(chosen) >= MAX_PRUNED:
                    break
    return [Action("light", PRUNE, memory_id, f"invalidate episode {memory_id[:8]}: {reason[7:]}",
                   changes={"invalidated_at": at, "metadata": {"invalidation_reason": reason}})
            for memory_id, reason in chosen.items()]


def exact_duplicate_groups(db) -> list[list[str]]:
    """Valid memories with the same normalised content in the same scope, oldest first."""
    groups: dict[tuple[str, Any], list[str]] = {}
    for text_hash, project, memory_id in shared_content_rows(db):
        groups.setdefault((text_hash, project), []).append(memory_id)
    return [ids for ids in groups.values() if len(ids) > 1]
