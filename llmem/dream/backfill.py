"""Backfill: extract memories from past agent sessions, journaled so a rollback removes them.

Sessions are read oldest first through the configured adapter — under `auto`, every agent
whose store is present, interleaved by time; extraction itself works from
each session's cursor, so an interrupted backfill resumes where it stopped and a session
already extracted adds nothing. What a backfill does to its sessions is journaled in
`session` actions that the run's sessions share (db/journal_rows.py), each session joining
one in its own transaction: the memories it added, each by id and stamp as a `create`, and
the session cursor as it was: `--rollback RUN_ID` (the journal's undo)
deletes those memories and puts the cursors back, so a later backfill reads the sessions
again. Memories that extraction *updated* (near-duplicates of existing ones) are
counted but not rolled back: extraction does not hand out their before-images.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..db.fts import compact_after_bulk_add
from ..db.queries import session_cursor_values
from ..errors import LlmemError, LLMUnavailable, UsageError
from ..paths import is_agent_call_dir
from .journal import RESTORABLE_TABLES, Journal, find_run, finish_run, start_run, undo_run

log = logging.getLogger(__name__)

_CURSOR_COLUMNS = RESTORABLE_TABLES["session_cursor"]


@dataclass
class BackfillOutcome:
    run_id: str
    # The agents whose sessions were read (every present one under session.adapter auto).
    adapters: list[str]
    sessions: int = 0
    sessions_by_adapter: dict[str, int] = field(default_factory=dict)
    added: int = 0
    episodes: int = 0  # the turns kept as episodes (capture/episodes.py), rolled back with the rest
    updated: int = 0
    duplicates: int = 0
    deferred: int = 0
    # Why the LLM was given up on (it could not be reached): the sessions after were read
    # with the heuristics alone.
    llm_unreachable: str | None = None
    errors: list[dict[str, str]] = field(default_factory=list)
    interrupted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _cursor_row(db, adapter: str, session_id: str) -> dict[str, Any] | None:
    row = session_cursor_values(db, adapter, session_id, _CURSOR_COLUMNS)
    return dict(zip(_CURSOR_COLUMNS, row, strict=True)) if row else None


def _memories(store, ids: list[str]) -> list:
    """The memories of `ids` that exist, in the order of `ids` (the order they were made)."""
    Memory = store.models.Memory
    found = {}
    for start in range(0, len(ids), 500):
        found.update((m.id, m) for m in Memory.select(Memory.id, Memory.updated_at)
                     .where(Memory.id.in_(ids[start:start + 500])))
    return [found[memory_id] for memory_id in ids if memory_id in found]


def backfill_adapters(config, adapter_name: str | None = None) -> list:
    """The adapters a backfill reads: the one named (or configured), else every present agent's."""
    from ..adapters import adapter_from_config, present_adapters

    name = adapter_name or config.session.adapter
    return present_adapters(config) if name == "auto" else [adapter_from_config(config, name)]


def pick_sessions(adapters, *, since: float | None, limit: int | None) -> list[tuple[str, Any]]:
    """(adapter name, session) pairs active since `since`, oldest first, at most `limit`;
    subagents' sessions are no sessions of their own (ARCHITECTURE.md, "Subagents are not users"),
    nor are llmem's own agent calls (llm.provider: agent), run in its agent-calls folder."""
    sessions = [(adapter.name, s) for adapter in adapters for s in adapter.list_sessions()
                if not s.is_subagent and not is_agent_call_dir(s.directory)
                and (since is None or (s.updated_ms or 0) / 1000.0 >= since)]
    sessions.sort(key=lambda pair: (pair[1].updated_ms or 0, pair[1].id))
    return sessions[:limit] if limit else sessions


class _RunLLM:
    """The backfill's one LLM, which remembers being unreachable: then the remaining sessions
    are read with the heuristics alone (one warning for the run, and no wait on a dead server
    per session)."""

    def __init__(self, llm):
        self._llm = llm
        self.unreachable: str | None = None

    def __getattr__(self, name: str):
        return getattr(self._llm, name)

    def chat_json(self, *args, **kwargs):
        try:
            return self._llm.chat_json(*args, **kwargs)
        except LLMUnavailable as exc:
            self.unreachable = exc.message
            raise


def run_backfill(app, *, adapter_name: str | None = None, since: float | None = None,
                 limit: int | None = None, use_llm: bool = True, llm=None,
                 progress: Callable[[Any], None] | None = None, sessions: list | None = None) -> BackfillOutcome:
    """Extract every picked session; journal what was added. Keeps going past a failing session.

    `sessions`: (adapter name, session) pairs picked from backfill_adapters(); default: every
    session since `since`, at most `limit`.
    """
    from ..capture.extract import extract_session
    from ..providers.llm import make_llm

    made = make_llm(app.config, store=app.store) if use_llm and llm is None else None
    try:
        chosen = llm if llm is not None else made
        return _backfill(app, extract_session, adapter_name=adapter_name, since=since, limit=limit,
                         llm=_RunLLM(chosen) if use_llm and chosen is not None else None,
                         progress=progress, sessions=sessions)
    finally:
        if made is not None:
            made.close()


def _backfill(app, extract_session, *, adapter_name, since, limit, llm: _RunLLM | None, progress,
              sessions) -> BackfillOutcome:
    adapters = backfill_adapters(app.config, adapter_name)
    if sessions is None:
        sessions = pick_sessions(adapters, since=since, limit=limit)
    store = app.store
    run = start_run(store, "backfill", ["backfill"])
    journal = Journal(store, run)
    outcome = BackfillOutcome(run.id, [adapter.name for adapter in adapters])
    try:
        for adapter, info in sessions:
            before = _cursor_row(store.db, adapter, info.id)
            try:
                use_llm = llm is not None and llm.unreachable is None
                # New episode rows only: the rollback deletes what the backfill created.
                report = extract_session(app, info.id, adapter_name=adapter,
                                         llm=llm if use_llm else None, use_llm=use_llm,
                                         extend_episodes=False)
            except LlmemError as exc:
                outcome.errors.append({"adapter": adapter, "session_id": info.id, "error": exc.message})
                log.warning("backfill: session %s failed: %s", info.id, exc.message)
                continue
            finally:
                if progress:
                    progress(info)
            outcome.sessions += 1
            outcome.sessions_by_adapter[adapter] = outcome.sessions_by_adapter.get(adapter, 0) + 1
            outcome.updated += len(report.updated_ids)
            outcome.duplicates += report.duplicates
            outcome.deferred += int(report.deferred)
            with store.db.atomic():
                created = {"add": _memories(store, report.memory_ids),
                           "episode": _memories(store, report.episode_ids)}
                outcome.added += len(created["add"])
                outcome.episodes += len(created["episode"])
                after = _cursor_row(store.db, adapter, info.id)
                journal.session("backfill", created, "session_cursor",
                                {"adapter": adapter, "session_id": info.id}, before,
                                cursor_moved=after != before)
    except KeyboardInterrupt:
        outcome.interrupted = True
        outcome.llm_unreachable = llm.unreachable if llm is not None else None
        finish_run(store, run, outcome.as_dict(), error="interrupted (run backfill again to resume)")
        raise
    outcome.llm_unreachable = llm.unreachable if llm is not None else None
    finish_run(store, run, outcome.as_dict())
    # A first backfill is most of the store: its index merged and the file compacted once.
    compact_after_bulk_add(store.db, outcome.added + outcome.episodes)
    return outcome


def rollback_backfill(store, run_id: str):
    """Remove what a backfill run added and put its session cursors back."""
    run = find_run(store, run_id)
    if run.kind != "backfill":
        raise UsageError(f"run {run.id} is a {run.kind} run, not a backfill",
                         hint=f"use `llmem dream undo {run.id}` for dream and promote runs")
    return undo_run(store, run.id)
