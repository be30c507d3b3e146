"""Condensation: before the light phase lets old episodes go, the LLM (when one answers) reads
them again, session by session, and keeps what lasts as typed memories linked back to them.

The episodes are what was said; what they settled (the decision, the fix, the setting) outlives
them as a `source: dream` memory with a `derived_from` relation to each episode it was read
from, so the typed memory can always be traced to the turns. The LLM is asked outside any
transaction; each session's memories, links and the episodes' invalidation are journaled, so
`dream undo` removes the memories and restores the episodes. Without an LLM, or when it fails,
the episodes are pruned as planned: retention must hold whether or not a model answers.
"""

from __future__ import annotations

import logging

from ..capture.extract import SliceLine, chunk_lines, llm_candidates
from ..errors import LlmemError
from .journal import Action, Journal

log = logging.getLogger(__name__)

# Sessions condensed per run: the other sessions' episodes wait for the next run rather than
# go without being read (a night's LLM time stays bounded; llm.daily_token_budget bounds it
# too: a spent budget prunes the rest unread, so retention holds whatever the backlog).
MAX_SESSIONS = 200
CONDENSE = "condense"


def condense_episodes(store, journal: Journal, llm, prunes: list[Action]) -> tuple[list[Action], list[Action]]:
    """(the prunes to apply now, the condensations made), the memories written through `journal`."""
    if llm is None or not prunes:
        return prunes, []
    Memory = store.models.Memory
    by_id = {action.memory_id: action for action in prunes}
    ids = list(by_id)
    groups: dict[tuple[str | None, str | None], list] = {}
    for start in range(0, len(ids), 500):
        for memory in Memory.select().where(Memory.id.in_(ids[start:start + 500])).order_by(Memory.seq):
            groups.setdefault((memory.session_id, memory.project), []).append(memory)
    kept: list[Action] = []
    made: list[Action] = []
    for number, ((session_id, project), members) in enumerate(groups.items()):
        if llm is not None and number >= MAX_SESSIONS:
            continue  # next run
        kept += [by_id[m.id] for m in members]
        if llm is None:
            continue
        lines = [SliceLine(m.id, (m.metadata or {}).get("role", "user"), m.content,
                           f"{(m.metadata or {}).get('role', 'user')}: {m.content}") for m in members]
        found = []
        try:
            for chunk in chunk_lines(lines):
                found += [(candidate, chunk) for candidate in llm_candidates(llm, chunk, project, [])]
        except LlmemError as exc:  # unavailable, a spent budget, a reply past repair
            log.warning("dream: episodes pruned without condensing from session %s on: %s", session_id,
                        getattr(exc, "message", exc))
            llm = None  # do not wait for a dead server once per session
            continue
        with store.db.atomic():
            for candidate, chunk in found:
                added = store.add(candidate.content, candidate.type, summary=candidate.summary,
                                  confidence=candidate.confidence, source="dream", project=project,
                                  session_id=session_id,
                                  metadata={"rule": CONDENSE, "condensed_from_session": session_id})
                if added.created:
                    journal.create("light", CONDENSE, added.memory)
                for line in chunk:
                    journal.relate("light", CONDENSE, added.memory.id, line.message_id, "derived_from")
                made.append(Action("light", CONDENSE, added.memory.id,
                                   f"condensed {len(chunk)} episodes of session {str(session_id)[:8]} into a "
                                   f"{candidate.type}: {candidate.content[:80]}",
                                   detail={"episodes": [line.message_id for line in chunk]}))
    return kept, made
