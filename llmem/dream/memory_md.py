"""MEMORY.md: every valid promoted memory as one readable line with its id and source.

Each line holds a snippet of the memory, at most dream.max_promoted_snippet_tokens (the seed's
phases.deep.maxPromotedSnippetTokens, 160) estimated tokens, cut at the end of a sentence; a
self_assessment is shown as its lesson (the proposed update, else what happened), not as its
nine flattened fields. The file is generated from the store: the snippet is always the
memory's current text.
"""

from __future__ import annotations

import re
from typing import Any

from ..capture.markers import CHARS_PER_TOKEN, MARKER_RE
from ..redact import redact
from .text import assessment_fields, category_of

HEAD = ("# MEMORY.md\n\nCore memories promoted by `llmem dream` / `llmem promote`, one a line: its text "
        "(cut at a sentence end), its id and where it came from. Generated from the store: edits here "
        "are overwritten.\n")
# A sentence ends at . ! ? (after any closing quote or bracket) followed by a space or the end.
_SENTENCE_END = re.compile(r"[.!?…][\"')\]]*(?=\s|$)")


def cut_snippet(text: str, max_tokens: int) -> str:
    """`text` on one line within `max_tokens` (chars / 4), cut after its last whole sentence
    that fits; a first sentence longer than that is cut at a word, with an ellipsis. Redacted
    first (see text.one_line)."""
    text = " ".join(MARKER_RE.sub("", redact(text or "").text).split())
    budget = max_tokens * CHARS_PER_TOKEN
    if len(text) <= budget:
        return text
    ends = [m.end() for m in _SENTENCE_END.finditer(text, 0, budget + 1)]
    if ends:
        return text[:ends[-1]]
    space = text.rfind(" ", 0, budget)
    return text[:space if space > 0 else budget - 1].rstrip(" ,;:-") + "…"


def lesson_of(content: str, metadata: dict[str, Any] | None) -> str:
    """A self_assessment's lesson: its proposed update, else what happened, else its text."""
    fields = assessment_fields(content, metadata)
    return fields.get("Proposed_update") or fields.get("What_happened") or content


def _label_and_text(memory) -> tuple[str, str]:
    if memory.type == "self_assessment":
        category = category_of(memory.content, memory.metadata)
        return (f"lesson ({category})" if category else "lesson"), lesson_of(memory.content, memory.metadata)
    return memory.type, memory.content


def source_of(memory) -> str:
    """Where a memory came from, in words: its source, and its note or session when known."""
    meta = memory.metadata or {}
    grounded = meta.get("grounded")
    if isinstance(grounded, dict) and grounded.get("note"):
        return f"{memory.source}, note {grounded['note']} line {grounded.get('line', '?')}"
    if memory.session_id:
        return f"{memory.source}, session {memory.session_id[:8]}"
    return memory.source


def entry_line(memory, max_tokens: int) -> str:
    label, text = _label_and_text(memory)
    return f"- {label}: {cut_snippet(text, max_tokens)} (id {memory.id[:8]}, {source_of(memory)})"


def render(store, max_tokens: int) -> str:
    """MEMORY.md from the store: every valid promoted memory, grouped by scope."""
    Memory = store.models.Memory
    rows = (Memory.select().where(Memory.promoted_at.is_null(False) & Memory.invalidated_at.is_null())
            .order_by(Memory.project.asc(nulls="first"), Memory.type, Memory.promoted_at, Memory.seq))
    scopes: dict[str | None, list] = {}
    for memory in rows:
        scopes.setdefault(memory.project, []).append(memory)
    lines = [HEAD]
    for project, memories in scopes.items():
        lines.append(f"## {'Global' if project is None else 'Project ' + project}\n")
        lines += [entry_line(memory, max_tokens) for memory in memories]
        lines.append("")
    if not scopes:
        lines.append("_No promoted memories yet._\n")
    return "\n".join(lines).rstrip("\n") + "\n"
