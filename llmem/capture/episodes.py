"""Episodes: every turn of a user session kept as searchable memory, the conversation itself.

The typed memories keep what extraction recognised (with no LLM, only cue-led user sentences);
an episode keeps what was said: the user's message, and the agent's answer to it, so the
chosen design, the fix or the exact setting in a reply is found a week later. An episode is a
memory of type `conversation` and source `episode` (db.models.EPISODE_SOURCE): FTS, vectors,
filters, export/import, the viewer and the MCP tools work for it unchanged; search ranks it
below a typed memory saying the same (search.py), and the dream prunes it by age and size but
never merges or promotes it as a fact (dream/light.py, deep.py, promote.py).

What a slice becomes, from its redacted messages (redaction runs on the full texts, before
anything here cuts them):
- turns: each user message, and the agent's messages up to the next user message (its text;
  each tool call one short line, its output left out: it is the tool's text, not the agent's,
  and often megabytes; tool calls with no text are no turn);
- a fenced code block is kept up to CODE_BLOCK_CHARS, a turn up to TURN_CHARS (the rest is
  dropped with a note saying how much); binary or undecodable text is left out, control
  characters are removed;
- chunks of at most CHUNK_TOKENS: consecutive short turns share one, each led by `user:` or
  `assistant:`; a longer turn gets chunks of its own, cut at paragraph boundaries (then lines,
  then spaces);
- each chunk is one memory with provenance in its metadata: agent, role, turn (the record
  index of its first message), its first and last message ids, time, part k of n for a long
  turn. `role` says whose words it holds (user: the user's; assistant: the agent's; mixed: both;
  a list of the two beside it cost ~0.07x the text an episode holds), the origin a trust notion will read.
The writes happen in the transaction that advances the session's cursors (capture/extract.py),
so a slice becomes episodes exactly once however the session ends; an exact duplicate of a
valid memory of the same project (the same content hash) is not stored again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..db.models import EPISODE_SOURCE
from ..trust import least_trusted, trust_of_role
from .markers import CHARS_PER_TOKEN

EPISODE_TYPE = "conversation"
# Below the extractors' stated (0.9) and inferred (0.7): it is what was said, not a fact.
EPISODE_CONFIDENCE = 0.5
# Tokens (chars/4) per episode chunk. Each chunk is a row of its own with a vector, ~400 bytes of
# ids, hashes and metadata, an entry in nine indexes and a journal line, so the fewer the rows
# the less a store grows beside the text it holds (issue 18: <= 3x); 1,600 characters keep a
# row under half a 4 KB page, so two share one (at 2,048, one 2.1 KB row took a page alone).
# The embedder reads a chunk's first 256 word pieces (~1,100 characters); FTS reads it all.
# Measured (bench/recall.py, default mode, backfill): 256 -> 400 tokens took LoCoMo dev's growth
# from 4.3x to 3.8x (rows 528 -> 377), session Hit@5/MRR 0.896/0.762 -> 0.899/0.765, coding
# MRR 0.960 -> 0.951 (Hit@5 1.000); a result now stands for more turns (LoCoMo t/top5 31 -> 47).
CHUNK_TOKENS = 400
CHUNK_CHARS = CHUNK_TOKENS * CHARS_PER_TOKEN
# Characters of one turn kept (~6k tokens, ~6 chunks): a 50 MB pasted log keeps its head.
TURN_CHARS = 24_000
# Characters of one fenced code block kept: the code a reply showed, not a whole file.
CODE_BLOCK_CHARS = 2_000
TOOL_INPUT_CHARS = 80  # of a tool call's input on its one line
TOOL_LINES = 8  # tool-call lines per assistant turn; the rest are counted
MIN_CHARS = 3  # shorter texts ("k", "?") are no episode
# A text with more than this share of control or replacement characters is binary, not prose.
BINARY_SHARE = 0.1

_FENCE = re.compile(r"(^|\n)(```|~~~)[^\n]*\n.*?(?:\n\2[^\S\n]*(?=\n|$)|\Z)", re.DOTALL)
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n\s*")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


@dataclass
class Episode:
    """One chunk of the conversation, as it will be stored: whole short turns packed together
    (each led by its role), or one piece of a long turn."""

    content: str
    roles: list[str]  # whose words, in order: user | assistant
    turn: int  # record index of the chunk's first message (stable across re-reads)
    message_ids: list[str]
    time_ms: int | None
    part: int = 0  # of a long turn cut in pieces: which piece (1-based); 0 = whole turns
    parts: int = 0
    cut: int = 0  # characters left out by the caps

    @property
    def trust(self) -> str:
        """Whose words (llmem/trust.py): the user's, the agent's, or, mixed, the least trusted."""
        return least_trusted(*(trust_of_role(role) for role in self.roles))

    @property
    def role(self) -> str:
        """user or assistant when the words are one side's, mixed when the chunk holds both."""
        return self.roles[0] if len(set(self.roles)) == 1 else "mixed"

    def metadata(self, agent: str | None) -> dict:
        # The first and last message of the chunk (the transcript holds the ones between):
        # a chunk of short turns would otherwise spend more bytes on ids than on words.
        ids = self.message_ids if len(self.message_ids) <= 2 else [self.message_ids[0], self.message_ids[-1]]
        meta = {"agent": agent, "role": self.role, "turn": self.turn, "message_ids": ids}
        if self.parts > 1:
            meta |= {"part": self.part, "parts": self.parts}
        if self.time_ms is not None:
            from ..times import to_iso

            meta["time"] = to_iso(self.time_ms / 1000.0)
        if self.cut:
            meta["cut_chars"] = self.cut
        return meta


@dataclass
class _Turn:
    role: str
    turn: int
    time_ms: int | None
    message_ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    more_tools: int = 0


def episode_roles(config) -> tuple[str, ...]:
    """The roles written as episodes (capture.episodes, capture.episode_roles); () when off."""
    section = config.capture
    if not section.episodes:
        return ()
    return tuple(role for role in ("user", "assistant") if role in section.episode_roles)


def clean_text(text: str) -> str:
    """The text without control characters; a binary or undecodable one is replaced by a note."""
    if not text:
        return ""
    bad = len(_CONTROL.findall(text))
    if bad and bad > BINARY_SHARE * len(text):
        return f"[{len(text)} characters of binary or undecodable text left out]"
    return _CONTROL.sub("", text) if bad else text


def cap_code_blocks(text: str, limit: int = CODE_BLOCK_CHARS) -> str:
    """Each fenced code block cut to `limit` characters, saying how much was dropped."""
    if "```" not in text and "~~~" not in text:
        return text

    def cut(match: re.Match) -> str:
        block = match.group(0)
        if len(block) <= limit:
            return block
        fence = match.group(2)
        return f"{block[:limit].rstrip()}\n…[{len(block) - limit} more characters of code]\n{fence}"

    return _FENCE.sub(cut, text)


def _cap(text: str, limit: int) -> tuple[str, int]:
    if len(text) <= limit:
        return text, 0
    return f"{text[:limit].rstrip()}\n…[{len(text) - limit} more characters]", len(text) - limit


def split_passages(text: str, limit: int = CHUNK_CHARS) -> list[str]:
    """`text` in pieces of at most `limit` characters, cut at paragraph boundaries first, then
    at line ends, then at spaces (a single word longer than `limit` is cut where it must)."""
    pieces: list[str] = []
    current = ""
    for paragraph in (p.strip() for p in _PARAGRAPH.split(text)):
        if not paragraph:
            continue
        parts = [paragraph] if len(paragraph) <= limit else _split_long(paragraph, limit)
        for part in parts:
            if current and len(current) + 2 + len(part) <= limit:
                current = f"{current}\n\n{part}"
            else:
                if current:
                    pieces.append(current)
                current = part
    if current:
        pieces.append(current)
    return pieces


def _split_long(paragraph: str, limit: int) -> list[str]:
    out: list[str] = []
    rest = paragraph
    while len(rest) > limit:
        window = rest[:limit + 1]
        at = window.rfind("\n")
        if at < limit // 2:
            at = window.rfind(" ")
        if at < limit // 2:
            at = limit
        out.append(rest[:at].rstrip())
        rest = rest[at:].lstrip()
    if rest:
        out.append(rest)
    return out


def _tool_line(call) -> str:
    args = " ".join(str(call.input or "").split())
    if len(args) > TOOL_INPUT_CHARS:
        args = args[:TOOL_INPUT_CHARS] + "…"
    return f"[tool {call.name}{': ' + args if args else ''}]"


def _turns(messages, roles: tuple[str, ...]) -> list[_Turn]:
    """The slice's turns: each user message, and the agent's messages after it, grouped."""
    turns: list[_Turn] = []
    current: _Turn | None = None
    for message in messages:
        if message.kind != "message" or message.role not in ("user", "assistant"):
            continue  # system prompts, tool records, compaction summaries and requests
        if message.role == "user":
            current = None
            # A user-role message the harness wrote (a compaction continue, a wake-up) is not
            # the user's; it ends the agent's turn all the same.
            if message.synthetic or "user" not in roles:
                continue
            current = _Turn("user", message.index, message.time_ms)
            turns.append(current)
            current.message_ids.append(message.id)
            current.texts.append(message.text or "")
            current = None  # the next assistant message opens the agent's turn
            continue
        if "assistant" not in roles:
            continue
        if current is None or current.role != "assistant":
            current = _Turn("assistant", message.index, message.time_ms)
            turns.append(current)
        current.message_ids.append(message.id)
        if message.text and message.text.strip():
            current.texts.append(message.text)
        for call in message.tool_calls:
            if len(current.tools) < TOOL_LINES:
                current.tools.append(_tool_line(call))
            else:
                current.more_tools += 1
    return turns


def _turn_text(turn: _Turn) -> tuple[str, int]:
    """A turn's text as kept (cleaned, code and length capped, its tool calls as one line) and
    the number of characters the caps left out."""
    prose = "\n\n".join(text.strip() for text in turn.texts if text.strip())
    if turn.role == "assistant" and not prose:
        return "", 0  # tool calls alone: what the agent did, not what it answered
    # Bound the work on a huge paste before any regex walks it (the caps cut it anyway).
    bounded = prose[:4 * TURN_CHARS]
    text = cap_code_blocks(clean_text(bounded))
    text, cut = _cap(text, TURN_CHARS)
    cut += len(prose) - len(bounded)
    if turn.tools:
        tools = " ".join(turn.tools)
        if turn.more_tools:
            tools += f" [+{turn.more_tools} more tool calls]"
        text = f"{text}\n\n{tools}"
    return text, cut


def build_episodes(messages, roles: tuple[str, ...]) -> list[Episode]:
    """The episodes of a slice of redacted, context-stripped transcript messages.

    Consecutive short turns share a chunk up to CHUNK_CHARS, each led by `user:` or
    `assistant:` (a question and its answer are found together, and the store spends one
    row, not two, on them); a turn too long for the room left starts a chunk of its own, and one
    longer than a chunk is cut at paragraph boundaries into pieces of its role alone.
    """
    if not roles:
        return []
    episodes: list[Episode] = []
    current: Episode | None = None
    for turn in _turns(messages, roles):
        text, cut = _turn_text(turn)
        if len(text.strip()) < MIN_CHARS:
            continue
        line = f"{turn.role}: {text}"
        if current is not None and len(current.content) + 2 + len(line) <= CHUNK_CHARS:
            current.content += "\n\n" + line
            current.roles.append(turn.role)
            current.message_ids += turn.message_ids
            current.cut += cut
            continue
        if len(line) <= CHUNK_CHARS:
            current = Episode(line, [turn.role], turn.turn, list(turn.message_ids), turn.time_ms, cut=cut)
            episodes.append(current)
            continue
        label = f"{turn.role}: "
        pieces = [p for p in split_passages(text, CHUNK_CHARS - len(label)) if len(p.strip()) >= MIN_CHARS]
        for number, piece in enumerate(pieces, start=1):
            episodes.append(Episode(label + piece, [turn.role], turn.turn, list(turn.message_ids), turn.time_ms,
                                    number, len(pieces), cut if number == 1 else 0))
        current = None  # the next turn starts afresh
    return episodes


def messages_after(messages, message_id: str | None) -> list:
    """The messages after the one with `message_id` (all of them when it is not among them)."""
    if message_id:
        for position, message in enumerate(messages):
            if message.id == message_id:
                return list(messages[position + 1:])
    return list(messages)


@dataclass
class EpisodeWrite:
    added: list[str] = field(default_factory=list)  # the ids of the new memories
    duplicates: int = 0
    extended: str | None = None  # the id of the session's last episode, when the slice went on in it


def _merged_metadata(old: dict, episode: Episode, agent: str | None) -> dict:
    roles = {old.get("role"), episode.role}
    ids = [*(old.get("message_ids") or [])[:1], *episode.message_ids[-1:]]
    meta = {**old, "agent": agent or old.get("agent"), "message_ids": ids,
            "role": roles.pop() if len(roles) == 1 else "mixed"}
    meta.pop("roles", None)  # older episodes listed both roles of a mixed one
    if episode.cut:
        meta["cut_chars"] = int(old.get("cut_chars") or 0) + episode.cut
    return meta


def write_episodes(store, episodes: list[Episode], *, agent: str | None, project: str | None,
                   session_id: str | None, extend: bool = True) -> EpisodeWrite:
    """Add the episodes (call inside the transaction that advances the cursors).

    `extend`: a slice of short turns goes on in the session's last episode while that has room
    (an idle slice is often one short exchange: a row of its own would cost the store several
    times its text). The append is in this same transaction, so it happens once with the cursor.
    """
    written = EpisodeWrite()
    Memory = store.models.Memory
    scope = Memory.project.is_null() if project is None else (Memory.project == project)
    if session_id and episodes:
        # A slice read again (a lost cursor reads the whole session) finds its turns kept
        # already, maybe inside a chunk that later slices went on in: they are not kept twice.
        # Compared here, not with LIKE: the stored text is deflated (db/packed_text.py).
        held = [content for (content,) in Memory.select(Memory.content).where(
            (Memory.session_id == session_id) & (Memory.source == EPISODE_SOURCE) & scope
            & Memory.invalidated_at.is_null()).tuples()]
        kept = [e for e in episodes if any(e.content in content for content in held)]
        written.duplicates += len(kept)
        episodes = [e for e in episodes if e not in kept]
    if extend and episodes and session_id and not episodes[0].parts:
        last = (Memory.select().where((Memory.session_id == session_id) & (Memory.source == EPISODE_SOURCE)
                                      & scope & Memory.invalidated_at.is_null())
                .order_by(Memory.seq.desc()).first())
        first = episodes[0]
        if (last is not None and not (last.metadata or {}).get("parts")
                and len(last.content) + 2 + len(first.content) <= CHUNK_CHARS):
            store.update(last.id, content=f"{last.content}\n\n{first.content}",
                         metadata=_merged_metadata(last.metadata or {}, first, agent), merge_metadata=False,
                         trust=first.trust)
            written.extended = last.id
            episodes = episodes[1:]
    written.added = store.add_many([(episode.content, episode.metadata(agent), episode.trust) for episode in episodes],
                                   EPISODE_TYPE, confidence=EPISODE_CONFIDENCE, source=EPISODE_SOURCE,
                                   project=project, session_id=session_id)
    written.duplicates += len(episodes) - len(written.added)
    return written
