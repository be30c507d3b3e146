"""Extraction: the new slice of a session transcript (or plain text) into typed memories.

Order of work, each step for a reason:
1. read the transcript after the session's cursor (SessionCursor), so a slice is read once;
2. strip `<llmem-context>` blocks, so llmem never re-learns what it injected;
3. redact secrets, before anything reaches an LLM, an embedder or the store;
4. chunk to a token budget and ask the LLM for memories; the heuristics add the explicit
   statements it did not restate (and do it all when it cannot answer);
5. embed the candidates (HTTP, outside any transaction) to find near-duplicates;
6. one IMMEDIATE transaction: add, update near-duplicates, relate, advance the cursor;
7. store the vectors already computed (embedder down: the memories stay pending).
Running the same slice twice adds nothing: the cursor has moved, and exact duplicates are
dropped by content hash anyway.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field, replace

from ..db.derived import text_to_embed
from ..db.models import MEMORY_TYPES, Memory
from ..db.queries import metadata_equals
from ..errors import BudgetExhausted, EmbedderUnavailable, LLMReplyInvalid, LLMUnavailable
from ..providers.llm import step_llm
from ..redact import redact
from ..store import content_hash
from ..trust import trust_of_role, trust_of_source
from .episodes import build_episodes, episode_roles, messages_after, write_episodes
from .heuristics import STATED, Candidate, statements
from .markers import CHARS_PER_TOKEN, estimate_tokens, strip_context_blocks

log = logging.getLogger(__name__)

# Transcript tokens per LLM call: small enough for an 8k-context local model with the prompt,
# the existing memories and the reply.
CHUNK_TOKENS = 3000
TOOL_OUTPUT_CHARS = 300
TOOL_INPUT_CHARS = 200
EXISTING_IN_PROMPT = 20
INFERRED = 0.7

EXTRACT_TYPES = tuple(t for t in MEMORY_TYPES if t != "self_assessment")


@dataclass
class ExtractionReport:
    """What one extraction did; `deferred` means the slice must be read again later."""

    session_id: str | None
    adapter: str | None = None
    project: str | None = None
    messages_read: int = 0
    memories_added: int = 0
    memories_updated: int = 0
    duplicates: int = 0
    relations: int = 0
    redactions: int = 0
    redactions_by_kind: dict[str, int] = field(default_factory=dict)
    used_llm: bool = False
    deferred: bool = False
    cursor: str | None = None
    chunks: int = 0
    embedded: int = 0
    pending_embedding: int = 0
    llm_error: str | None = None
    concurrent: bool = False  # another run processed this slice first; nothing was written
    # A subagent's session: nothing read, nothing written (ARCHITECTURE.md, "Subagents are not users").
    subagent: bool = False
    memory_ids: list[str] = field(default_factory=list)
    updated_ids: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # Episodes (capture/episodes.py): the slice's turns kept as conversation memories.
    episodes_added: int = 0
    episode_duplicates: int = 0
    episode_ids: list[str] = field(default_factory=list)
    episode_extended: str | None = None  # the session's last episode, when the slice went on in it

    def as_dict(self) -> dict:
        data = asdict(self)
        # A 10,000-turn session makes ~20,000 episodes: the event row keeps a sample of ids.
        data["episode_ids"] = data["episode_ids"][:EPISODE_IDS_SHOWN]
        return data


EPISODE_IDS_SHOWN = 100
# Episodes embedded right after the slice is stored; the rest wait for `llmem embed --pending`
# (a backfilled 10,000-turn session must not hold its event for minutes of embedding: the
# built-in MiniLM took ~0.27 s a chunk on the 2 loaded cores measured).
EPISODES_EMBEDDED_INLINE = 64


@dataclass
class SliceLine:
    """One transcript message, context-stripped and redacted, as the LLM will see it."""

    message_id: str | None
    role: str
    text: str  # the message's own text (user statements are read from it)
    rendered: str  # role label, text and abbreviated tool calls


@dataclass
class PreparedSlice:
    lines: list[SliceLine]
    redactions: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    # The messages themselves, context-stripped and redacted (episodes are made from them).
    messages: list = field(default_factory=list)


def redactor(config):
    """apply(text, tally): `text` redacted as config `redaction` says, counts added to `tally`."""
    section = config.redaction
    enabled, patterns = section.enabled, section.patterns

    def apply(text: str, tally: dict[str, int]) -> str:
        if not enabled or not text:
            return text
        result = redact(text, patterns)
        for kind, count in result.by_kind.items():
            tally[kind] = tally.get(kind, 0) + count
        return result.text

    return apply


def _tool_line(call) -> str:
    status = f" {call.status}" if call.status else ""
    args = f" {_cut(' '.join(call.input.split()), TOOL_INPUT_CHARS)}" if call.input else ""
    output = f" → {_cut(' '.join(call.output.split()), TOOL_OUTPUT_CHARS)}" if call.output else ""
    return f"  [tool {call.name}{status}]{args}{output}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


# Texts are redacted in one pass over their concatenation (one regex scan per pattern
# instead of one per text: ~6x faster on a long transcript). The separator cannot occur in a
# secret; a match that swallows one (an unclosed <private> block) changes the number of
# pieces, and the batch is then redacted text by text.
_SEPARATOR = "\n\u241e\u241e\n"


def _redact_batch(config, texts: list[str], tally: dict[str, int]) -> list[str]:
    section = config.redaction
    if not section.enabled or not texts:
        return list(texts)
    patterns = section.patterns
    if not any(_SEPARATOR.strip() in text for text in texts):
        result = redact(_SEPARATOR.join(texts), patterns)
        pieces = result.text.split(_SEPARATOR)
        if len(pieces) == len(texts):
            for kind, count in result.by_kind.items():
                tally[kind] = tally.get(kind, 0) + count
            return pieces
    apply = redactor(config)
    return [apply(text, tally) for text in texts]


class _Slot(int):
    """The position of a string in a redaction batch, standing in for it meanwhile."""


def _collect(value, texts: list[str]):
    if isinstance(value, str):
        texts.append(value)
        return _Slot(len(texts) - 1)
    if isinstance(value, dict):
        return {key: _collect(item, texts) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_collect(item, texts) for item in value]
    return value


def _fill(value, texts: list[str]):
    if isinstance(value, _Slot):
        return texts[value]
    if isinstance(value, dict):
        return {key: _fill(item, texts) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill(item, texts) for item in value]
    return value


def redact_messages(config, messages) -> tuple[list, dict[str, int]]:
    """Copies of transcript messages with context blocks stripped and secrets redacted.

    Redaction runs on the full texts, before anything is cut short: a secret cut in half
    would no longer match its pattern. Tool inputs become (redacted) JSON text: each string
    is redacted first (JSON escapes the quotes that `key = "value"` rules look for), then
    the JSON text (where a key and its value sit side by side).
    """
    tally: dict[str, int] = {}
    texts: list[str] = []
    shapes = []
    for message in messages:
        calls = []
        for call in message.tool_calls:
            args = call.input
            if args in (None, "", {}, []):
                args = ""
            calls.append((_collect(args, texts), _collect(strip_context_blocks(call.output or ""), texts)))
        shapes.append((_collect(strip_context_blocks(message.text or ""), texts),
                       _collect(message.error, texts) if message.error else None, calls))
    texts = _redact_batch(config, texts, tally)
    # Second pass: the JSON text of structured tool inputs.
    json_texts: list[str] = []
    json_slots: dict[tuple[int, int], int] = {}
    for m_index, (_, _, calls) in enumerate(shapes):
        for c_index, (args, _) in enumerate(calls):
            if not isinstance(args, _Slot):
                json_slots[(m_index, c_index)] = len(json_texts)
                json_texts.append(json.dumps(_fill(args, texts), ensure_ascii=False, default=str))
    json_texts = _redact_batch(config, json_texts, tally)
    out = []
    for m_index, (message, (text, error, calls)) in enumerate(zip(messages, shapes, strict=True)):
        new_calls = []
        for c_index, (call, (args, output)) in enumerate(zip(message.tool_calls, calls, strict=True)):
            if isinstance(args, _Slot):
                args_text = texts[args]
            else:
                args_text = json_texts[json_slots[(m_index, c_index)]]
            new_calls.append(replace(call, input=args_text, output=texts[output]))
        out.append(replace(message, text=texts[text], reasoning="", tool_calls=tuple(new_calls),
                           error=texts[error] if error is not None else message.error))
    return out, tally


def prepare_slice(config, messages) -> PreparedSlice:
    """Transcript messages as redacted, context-free lines (the only form that goes on)."""
    redacted, tally = redact_messages(config, messages)
    lines = []
    for message in redacted:
        if message.kind not in ("message", "compaction_summary") or message.role == "system":
            continue
        text = message.text.strip()
        parts = [f"{message.role}: {text}"] if text else []
        parts += [_tool_line(call) for call in message.tool_calls]
        if message.error:
            parts.append(f"  [error] {_cut(message.error, TOOL_OUTPUT_CHARS)}")
        if not parts:
            continue
        if not text:
            parts.insert(0, f"{message.role}:")
        # A user-role message the harness wrote (OpenCode's compaction continue, a Claude Code
        # wake-up prompt) is not the user's statement: the heuristics read role "user" only.
        role = "synthetic" if message.role == "user" and message.synthetic else message.role
        if message.kind == "compaction_summary":
            role = "summary"  # the agent's own summary: never read as user statements
        lines.append(SliceLine(message.id, role, text, "\n".join(parts)))
    return PreparedSlice(lines, sum(tally.values()), tally, redacted)


def chunk_lines(lines: list[SliceLine], budget_tokens: int = CHUNK_TOKENS) -> list[list[SliceLine]]:
    """Consecutive lines grouped to at most `budget_tokens` each (a huge line is cut)."""
    chunks: list[list[SliceLine]] = []
    current: list[SliceLine] = []
    used = 0
    limit_chars = max(1, budget_tokens - 1) * CHARS_PER_TOKEN  # a piece plus its separator fits
    for line in lines:
        pieces = [line]
        if len(line.rendered) > limit_chars:
            pieces = [SliceLine(line.message_id, line.role, line.text if i == 0 else "",
                                line.rendered[i:i + limit_chars])
                      for i in range(0, len(line.rendered), limit_chars)]
        for piece in pieces:
            cost = estimate_tokens(piece.rendered) + 1
            if current and used + cost > budget_tokens:
                chunks.append(current)
                current, used = [], 0
            current.append(piece)
            used += cost
    if current:
        chunks.append(current)
    return chunks


# ---- the LLM step ---------------------------------------------------------------------------

EXTRACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "memories": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": list(EXTRACT_TYPES)},
                    "content": {"type": "string"},
                    "summary": {"type": "string"},
                    "stated_by_user": {"type": "boolean"},
                    "supersedes": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["type", "content"],
            },
        },
    },
    "required": ["memories"],
}

SYSTEM_PROMPT = """You read part of a conversation between a user and an AI coding agent and \
extract durable memories that will help in future sessions.

Memory types:
- fact: objective truths about the project, code or environment
- decision: a choice that was made, with its rationale
- preference: how the user likes things done
- procedure: how to do something here (build, test, deploy, conventions)
- project_state: the current status of the project or a piece of work
- event: something notable that happened at a point in time
- conversation: a notable outcome or commitment of the conversation

Rules:
- Keep only what stays useful later; skip chit-chat, transient steps and guesses.
- Each memory stands alone (name things; no "this" or "the above"), one idea, at most two sentences.
- stated_by_user: true only when the user said it in so many words.
- When a memory changes or replaces one of the existing memories listed, put that memory's id \
(as shown in brackets) in supersedes.
- Never copy secrets; text like [REDACTED:kind] must not appear in a memory.
- Answer {"memories": []} when there is nothing durable."""


def _existing_memories(store, project: str | None, limit: int = EXISTING_IN_PROMPT) -> list[Memory]:
    """Recent valid memories of the scope, shown to the LLM so it can say what it supersedes."""
    Memory = store.models.Memory
    scope = Memory.project.is_null() if project is None else (
        (Memory.project == project) | Memory.project.is_null())
    return list(Memory.select().where(
        Memory.invalidated_at.is_null() & scope & Memory.type.in_(("decision", "preference", "procedure", "project_state", "fact")))
        .order_by(Memory.updated_at.desc()).limit(limit))


def llm_candidates(llm, chunk: list[SliceLine], project: str | None,
                    existing: list[Memory]) -> list[Candidate]:
    listing = "\n".join(f"[{m.id[:8]}] ({m.type}) {_cut(' '.join(m.content.split()), 300)}"
                        for m in existing) or "(none)"
    transcript = "\n".join(line.rendered for line in chunk)
    user = (f"Project: {project or '(global)'}\n\nExisting memories:\n{listing}\n\n"
            f"Conversation:\n{transcript}")
    reply = llm.chat_json([{"role": "system", "content": SYSTEM_PROMPT},
                           {"role": "user", "content": user}], EXTRACTION_SCHEMA, task="extract")
    shown = {m.id[:8]: m.id for m in existing}
    candidates = []
    for item in reply["memories"]:
        content = " ".join(item["content"].split())
        if len(content) < 8:
            continue
        supersedes = []
        for ref in item.get("supersedes") or []:
            ref = ref.strip().strip("[]").lower()
            # Only ids we showed: the model must not point at arbitrary memories.
            target = shown.get(ref[:8])
            if target and target.startswith(ref):
                supersedes.append(target)
        candidates.append(Candidate(
            item["type"], content, summary=(item.get("summary") or "").strip() or None,
            confidence=STATED if item.get("stated_by_user") else INFERRED,
            supersedes=supersedes, rule="llm", message_id=chunk[-1].message_id))
    return candidates


def _heuristic_candidates(chunk: list[SliceLine], *, all_roles: bool = False) -> list[Candidate]:
    found = []
    for line in chunk:
        if line.role == "user" or (all_roles and line.role != "summary"):
            for candidate in statements(line.text, line.message_id):
                candidate.trust = trust_of_role(line.role)  # a user turn holds the user's words
                found.append(candidate)
    return found


# ---- storing --------------------------------------------------------------------------------


def _embedding_text(content: str, summary: str | None) -> str:
    # text_to_embed without the metadata prefix: _embed_touched reuses a candidate's vector
    # only when the stored memory embeds to this same text.
    return text_to_embed(content, summary, None)


def _near_duplicate(searcher, vector, memory_type: str, project: str | None,
                    threshold: float) -> tuple[int, float] | None:
    where = "m.invalidated_at IS NULL AND m.type = ? AND " + (
        "m.project IS NULL" if project is None else "m.project = ?")
    params = [memory_type] if project is None else [memory_type, project]
    nearest = searcher.vector_candidates(vector, 1, where, params)
    if nearest and 1.0 - nearest[0][1] >= threshold:
        return nearest[0][0], 1.0 - nearest[0][1]
    return None


def _embed_candidates(app, candidates: list[Candidate]):
    """Unit vectors of the candidates, or None when no embedder answers."""
    embedder = app.embedder
    if not candidates or not embedder.available:
        return None
    try:
        return embedder.embed_documents([_embedding_text(c.content, c.summary) for c in candidates])
    except EmbedderUnavailable as exc:
        log.info("embedder unavailable, near-duplicates not checked: %s", exc.message)
        return None


def store_candidates(app, candidates: list[Candidate], report: ExtractionReport, *,
                     project: str | None, session_id: str | None, source: str = "extraction",
                     metadata: dict | None = None, cursor_update=None,
                     trust: str | None = None) -> list[Memory]:
    """Dedupe, add or update, relate, run `cursor_update` — in one transaction — then embed.

    `trust`: whose words the candidates are, unless a candidate says (Candidate.trust); by
    default what `source` says (llmem/trust.py)."""
    import numpy as np

    from ..search import Searcher

    store = app.store
    threshold = app.config.dream.similarity_threshold
    redact_again = redactor(app.config)
    tally: dict[str, int] = {}
    # The model saw only redacted text, but may still invent a secret-shaped string.
    for candidate in candidates:
        candidate.content = redact_again(candidate.content, tally)
        if candidate.summary:
            candidate.summary = redact_again(candidate.summary, tally)
    for kind, count in tally.items():
        report.redactions_by_kind[kind] = report.redactions_by_kind.get(kind, 0) + count
    report.redactions += sum(tally.values())

    vectors = _embed_candidates(app, candidates)
    searcher = Searcher(store, app.embedder) if vectors is not None else None
    touched: list[tuple[Memory, object, str]] = []  # (memory, candidate vector, its text)
    written: list[Memory] = []
    with store.db.atomic():
        if cursor_update is not None and cursor_update(check=True) is False:
            report.concurrent = True
            return []
        seen_hashes: set[str] = set()
        accepted_vectors: list = []
        for index, candidate in enumerate(candidates):
            vector = vectors[index] if vectors is not None else None
            text_hash = content_hash(candidate.content)
            if text_hash in seen_hashes:
                report.duplicates += 1
                continue
            seen_hashes.add(text_hash)
            existing = store.find_duplicate(text_hash, project)
            target = existing
            if existing is not None:
                report.duplicates += 1
            elif vector is not None and any(float(np.dot(vector, v)) >= threshold for v in accepted_vectors):
                report.duplicates += 1  # a near-duplicate of one added in this same run
                continue
            else:
                near = _near_duplicate(searcher, vector, candidate.type, project, threshold) \
                    if vector is not None else None
                if near is not None:
                    old = store.models.Memory.get(store.models.Memory.seq == near[0])
                    meta = {"previous_content": _cut(old.content, 500), "near_duplicate_of_session": session_id,
                            "similarity": round(near[1], 4)}
                    target = store.revise(old.id, candidate.content,
                                          summary=candidate.summary if candidate.summary else None,
                                          confidence=max(old.confidence, candidate.confidence),
                                          metadata=meta,
                                          trust=candidate.trust or trust
                                          or trust_of_source(source, metadata, project))
                    report.memories_updated += 1
                    report.updated_ids.append(target.id)
                    touched.append((target, vector, _embedding_text(candidate.content, candidate.summary)))
                else:
                    meta = {"rule": candidate.rule, **candidate.metadata, **(metadata or {})}
                    if candidate.message_id:
                        meta["message_id"] = candidate.message_id
                    result = store.add(candidate.content, candidate.type, summary=candidate.summary,
                                       confidence=candidate.confidence, source=source,
                                       project=project, session_id=session_id, metadata=meta,
                                       trust=candidate.trust or trust)
                    target = result.memory
                    if result.created:
                        report.memories_added += 1
                        report.memory_ids.append(target.id)
                        touched.append((target, vector, _embedding_text(candidate.content, candidate.summary)))
                        written.append(target)
                    else:
                        report.duplicates += 1
                if vector is not None:
                    accepted_vectors.append(vector)
            for old_id in candidate.supersedes:
                if old_id != target.id and store.relate(target.id, old_id, "supersedes"):
                    report.relations += 1
        if cursor_update is not None:
            cursor_update(check=False)
    _embed_touched(app, touched, report)
    return written


def _embed_touched(app, touched, report: ExtractionReport) -> None:
    """Store the candidates' vectors where the memory's text is what was embedded; embed the rest."""
    if not touched:
        return
    from ..vectors import embed_memories, embedding_text, store_vectors

    reuse, fresh = [], []
    for memory, vector, text in touched:
        if vector is not None and embedding_text(memory) == text:
            reuse.append((memory, vector))
        else:
            fresh.append(memory)
    try:
        if reuse:
            import numpy as np

            store_vectors(app.store, app.embedder, [m for m, _ in reuse], np.vstack([v for _, v in reuse]))
            report.embedded += len(reuse)
        if fresh and app.embedder.available:
            report.embedded += embed_memories(app.store, app.embedder, fresh)
    except EmbedderUnavailable as exc:
        log.info("memories stored without embedding (%s); `llmem embed --pending` fills them in", exc.message)
    report.pending_embedding = len(touched) - report.embedded


def _embed_episodes(app, episode_ids: list[str]) -> None:
    """Vectors for the first EPISODES_EMBEDDED_INLINE new episodes (outside any transaction);
    the rest, or all of them when the embedder is down, wait for `llmem embed --pending`."""
    if not episode_ids or not app.embedder.available:
        return
    from ..vectors import embed_memories

    Memory = app.store.models.Memory
    first = episode_ids[:EPISODES_EMBEDDED_INLINE]
    memories = list(Memory.select().where(Memory.id.in_(first)).order_by(Memory.seq))
    try:
        embed_memories(app.store, app.embedder, memories)
    except EmbedderUnavailable as exc:
        log.info("episodes stored without embedding (%s); `llmem embed --pending` fills them in", exc.message)
        return
    if len(episode_ids) > len(first):
        log.info("%d episodes wait for `llmem embed --pending`", len(episode_ids) - len(first))


# ---- the entry points ---------------------------------------------------------------------


def _extract_chunks(store, llm, chunks, project, report: ExtractionReport, *,
                    all_roles: bool = False) -> list[Candidate]:
    """Candidates of every chunk: the LLM's when it answers, plus the explicit statements the
    heuristics find that the LLM did not restate (a model may leave out a "remember …" or a
    "we decided …"; a user who said it expects it kept); the heuristics alone otherwise."""
    candidates: list[Candidate] = []
    existing = _existing_memories(store, project) if llm is not None and chunks else []
    llm_usable = llm is not None
    for chunk in chunks:
        if llm_usable:
            try:
                from_llm = llm_candidates(llm, chunk, project, existing)
                report.used_llm = True
                candidates.extend(from_llm)
                candidates.extend(stated for stated in _heuristic_candidates(chunk, all_roles=all_roles)
                                  if not any(restates(c.content, stated.content) for c in from_llm))
                continue
            except BudgetExhausted as exc:
                report.deferred = True
                report.llm_error = exc.message
                llm_usable = False
            except LLMUnavailable as exc:
                report.llm_error = exc.message
                llm_usable = False  # do not wait for a dead server once per chunk
                log.warning("LLM unavailable, extracting with heuristics: %s", exc.message)
            except LLMReplyInvalid as exc:
                report.llm_error = str(exc)
                log.warning("LLM reply unusable, extracting this chunk with heuristics: %s", exc)
        candidates.extend(_heuristic_candidates(chunk, all_roles=all_roles))
    return candidates


# Runs of one session that lost the race for its cursor (idle and ending at once) read again
# from where the winner stopped, so a turn only the loser saw is not dropped.
CURSOR_RACE_RETRIES = 3


def extract_session(app, session_id: str, *, adapter_name: str | None = None, llm=None,
                    use_llm: bool = True, hold_cursor: bool = False,
                    extend_episodes: bool = True) -> ExtractionReport:
    """Extract memories from a session's transcript after its cursor, then advance the cursor.

    The memories and the cursor move in one transaction. When another run advanced the
    cursor meanwhile, nothing is written and the slice past its new position is read again.
    `hold_cursor`: store what is found but leave the cursor where it was, so a later run
    (with the LLM, once the session's extraction interval has passed) reads the slice again.
    `extend_episodes`: False writes the slice's episodes as new rows only (a backfill, whose
    rollback deletes what it created, must not have appended to an older row).
    """
    from ..adapters import resolve_adapter

    adapter = resolve_adapter(app.config, session_id, adapter_name)
    for _ in range(CURSOR_RACE_RETRIES):
        report = _extract_session_once(app, adapter, session_id, llm=llm, use_llm=use_llm,
                                       hold_cursor=hold_cursor, extend_episodes=extend_episodes)
        if not report.concurrent:
            break
        log.info("session %s: another run moved the cursor first; reading on from it", session_id)
    return report


def _extract_session_once(app, adapter, session_id: str, *, llm, use_llm: bool,
                          hold_cursor: bool, extend_episodes: bool = True) -> ExtractionReport:
    from ..cursors import EPISODES, EXTRACTION, CursorRun

    started = time.perf_counter()
    cursor_run = CursorRun(app.store.models, adapter.name, session_id, EXTRACTION)
    roles = episode_roles(app.config)
    # Episodes keep their own cursor: it moves even when the extraction cursor is held for a
    # later LLM pass (hold_cursor, a spent token budget), so no turn is written twice.
    episode_run = CursorRun(app.store.models, adapter.name, session_id, EPISODES) if roles else None
    start_cursor = cursor_run.start
    transcript = adapter.read_transcript(session_id, after=start_cursor)
    if start_cursor and not transcript.cursor_found:
        log.warning("session %s: cursor %s not found in the transcript; reading it whole "
                    "(exact duplicates are dropped)", session_id, start_cursor)
    project = transcript.project
    if transcript.is_subagent:
        log.info("session %s is a subagent's: its findings reach memory through its parent", session_id)
        return ExtractionReport(session_id=session_id, adapter=adapter.name, project=project,
                                cursor=start_cursor, subagent=True)
    report = ExtractionReport(session_id=session_id, adapter=adapter.name, project=project,
                              messages_read=len(transcript.messages), cursor=start_cursor)
    prepared = prepare_slice(app.config, transcript.messages)
    report.redactions, report.redactions_by_kind = prepared.redactions, dict(prepared.by_kind)
    chunks = chunk_lines(prepared.lines)
    report.chunks = len(chunks)
    with step_llm(app, llm, use_llm) as llm:
        candidates = _extract_chunks(app.store, llm, chunks, project, report)
    if hold_cursor:
        report.deferred = True
    new_cursor = transcript.cursor or start_cursor
    llm_contents = [c.content for c in candidates if c.rule == "llm"]
    episodes = (build_episodes(messages_after(prepared.messages, episode_run.start), roles)
                if episode_run is not None else [])

    def cursor_update(check: bool):
        if check:
            # Another run (watcher and hook at once) advanced a cursor while we worked.
            return cursor_run.unmoved() and (episode_run is None or episode_run.unmoved())
        if report.deferred:
            cursor_run.advance(start_cursor, project=project, status="deferred")
        else:
            cursor_run.advance(new_cursor, project=project, status="done",
                               messages_read=len(transcript.messages))
            _settle_provisional(app.store, session_id, project, llm_contents, report)
        report.cursor = start_cursor if report.deferred else new_cursor
        if episode_run is not None and transcript.messages:
            written = write_episodes(app.store, episodes, agent=adapter.name, project=project,
                                     session_id=session_id, extend=extend_episodes)
            report.episodes_added = len(written.added)
            report.episode_duplicates = written.duplicates
            report.episode_ids = written.added
            report.episode_extended = written.extended
            episode_run.advance(transcript.messages[-1].id, project=project)
        return True

    metadata = {"adapter": adapter.name}
    if hold_cursor:
        metadata[PROVISIONAL] = True
    store_candidates(app, candidates, report, project=project, session_id=session_id,
                     metadata=metadata, cursor_update=cursor_update)
    _embed_episodes(app, ([report.episode_extended] if report.episode_extended else []) + report.episode_ids)
    report.seconds = round(time.perf_counter() - started, 4)
    log.info("extracted session %s: %d messages, %d added, %d updated, %d duplicates, %d episodes, "
             "%d redactions%s", session_id, report.messages_read, report.memories_added,
             report.memories_updated, report.duplicates, report.episodes_added, report.redactions,
             " (deferred)" if report.deferred else "")
    return report


# Heuristic memories stored while a session waits for its LLM pass (`hold_cursor`) are
# provisional: that pass reads the same turns again, and the model words a statement its own
# way, so without an embedder to spot the near-duplicate the turn would be stored twice.
PROVISIONAL = "provisional"
_WORD = re.compile(r"\w[\w./-]*")
# Words that carry no fact: articles, pronouns, auxiliaries, and the heuristics' own cue words.
# Negations and quantifiers (never, always, not) stay: they change what is stated.
_FILLER = frozenset({
    "a", "an", "the", "this", "that", "these", "those", "it", "its", "we", "our", "us",
    "you", "your", "i", "me", "my", "they", "them", "their", "he", "she", "is", "are",
    "was", "were", "be", "been", "being", "am", "do", "does", "did", "has", "have", "had",
    "will", "would", "shall", "should", "can", "could", "to", "of", "in", "on", "at", "by",
    "for", "with", "from", "as", "into", "about", "over", "and", "or", "but", "so", "then",
    "than", "remember", "note", "noted", "decided", "decide", "decision", "prefer",
    "prefers", "preferred", "user", "team", "please", "also",
})


def _words(text: str) -> set[str]:
    words = set()
    for word in _WORD.findall(text.lower()):
        word = word.strip("./-")
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]  # releases / release
        if word and word not in _FILLER:
            words.add(word)
    return words


def restates(candidate: str, provisional: str) -> bool:
    """Whether `candidate` states what `provisional` says: every identifier or number of it,
    and at least half of its other words."""
    wanted, have = _words(provisional), _words(candidate)
    if not wanted:
        return False
    exact = {w for w in wanted if any(ch.isdigit() for ch in w) or re.search(r"[._/-]", w)}
    return exact <= have and 2 * len(wanted & have) >= len(wanted)


def _settle_provisional(store, session_id: str, project: str | None, llm_contents: list[str],
                        report: ExtractionReport) -> None:
    """After the pass that moves the cursor: a provisional memory the LLM restated gives way to
    the LLM's memory (invalidated, superseded); one it did not restate is kept for good."""
    Memory = store.models.Memory
    waiting = list(Memory.select().where(
        (Memory.session_id == session_id) & Memory.invalidated_at.is_null()
        & metadata_equals(Memory.metadata, PROVISIONAL, True)))
    for memory in waiting:
        restated_by = next((c for c in llm_contents if restates(c, memory.content)), None)
        newer = store.find_duplicate(content_hash(restated_by), project) if restated_by else None
        if newer is not None and newer.id != memory.id:
            store.invalidate(memory.id, "restated by the LLM extraction of the same turns")
            store.relate(newer.id, memory.id, "supersedes")
            report.duplicates += 1
        else:
            kept = {k: v for k, v in memory.metadata.items() if k != PROVISIONAL}
            store.update(memory.id, metadata=kept, merge_metadata=False)


def extract_text(app, text: str, *, project: str | None = None, session_id: str | None = None,
                 llm=None, use_llm: bool = True) -> ExtractionReport:
    """Extract memories from plain text (treated as what the user said)."""
    from ..adapters import TranscriptMessage

    started = time.perf_counter()
    message = TranscriptMessage(id="text", index=0, role="user", text=text or "")
    prepared = prepare_slice(app.config, [message])
    report = ExtractionReport(session_id=session_id, project=project, messages_read=1,
                              redactions=prepared.redactions, redactions_by_kind=dict(prepared.by_kind))
    chunks = chunk_lines(prepared.lines)
    report.chunks = len(chunks)
    with step_llm(app, llm, use_llm) as llm:
        candidates = _extract_chunks(app.store, llm, chunks, project, report, all_roles=True)
    store_candidates(app, candidates, report, project=project, session_id=session_id)
    report.seconds = round(time.perf_counter() - started, 4)
    return report
