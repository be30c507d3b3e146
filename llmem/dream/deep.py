"""Deep phase: merge duplicates, decay idle memories, boost used ones, invalidate weak ones,
link related ones and promote the best-recalled ones.

Planning reads only. Applying a merge may ask the LLM for one merged text; that call is
made outside any transaction, and its answer is kept only if it preserves the originals'
facts (at most a quarter of their distinct terms may go missing). Otherwise, or without an
LLM, the originals are concatenated.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..db import bulk
from ..db.models import EPISODE_SOURCE, Memory
from ..db.queries import decay_rows
from ..errors import NotFound
from ..times import now
from ..trust import AGENT, least_trusted
from .journal import Action, Actions, Journal, _json, _loads, _value_json
from .promote import Candidate, promotable, recheck, recheck_many
from .text import distinct_terms

if TYPE_CHECKING:
    from ..config import DreamSettings

log = logging.getLogger(__name__)

MAX_GROUP = 6  # memories merged into one at most
MAX_TERM_LOSS = 0.25
MERGE_SCHEMA = {
    "type": "object",
    "properties": {"content": {"type": "string"}, "summary": {"type": "string"}},
    "required": ["content"],
}
MERGE_PROMPT = (
    "You merge near-duplicate memories of an AI coding agent into one memory. Keep every fact, "
    "name, number, path, identifier and decision from every input; drop only repetition. "
    "Write plain sentences, no preamble. Answer JSON: {\"content\": ..., \"summary\": ...}.")


@dataclass
class DeepResult:
    actions: Actions = field(default_factory=Actions)
    promote: list[Candidate] = field(default_factory=list)
    held: int = 0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (_, kind), count in self.actions.kind_counts().items():
            out[kind] = out.get(kind, 0) + count
        return out


_DECAY, _BOOST = 1, 2  # DecayRows' change codes (0: none, the row is only invalidated)
_KIND_NAMES = {_DECAY: "decay", _BOOST: "boost"}
# What DecayRows.apply reads and writes of a memory, and its images' texts (as _image writes
# them: the names sorted, the metadata as stored): a decay or boost sets the confidence and
# one metadata key, an invalidation the stamp and its reason; both stamp updated_at.
_APPLY_READ = ("metadata", "confidence", "updated_at", "invalidated_at")
_CHANGED_COLUMNS = ("confidence", "metadata", "updated_at")
_INVALIDATED_COLUMNS = ("invalidated_at", "metadata", "updated_at")
_BOTH = ("confidence", "invalidated_at", "metadata", "updated_at")
_CHANGED = '{"confidence": %s, "metadata": %s, "updated_at": %s}'
_INVALIDATED = '{"invalidated_at": %s, "metadata": %s, "updated_at": %s}'


class DecayRows:
    """The deep plan's decays, boosts and the invalidations they lead to, a few numbers a
    memory (a compact run of journal.Actions): its Actions are made when read, its updates
    when applied. At 1M memories these are ~1.1M actions, which as Action objects held ~1 GB.

    Row i: memory ids[i] (its seq seqs[i]), its change codes[i] (_DECAY, _BOOST or 0), confidence old[i] →
    new[i], for a decay its idle intervals steps[i] (negative: a stale procedure's, doubled)
    and new decayed_at stamps[i], for a boost its access count steps[i]; invalidated[i]: an
    invalidation follows (its confidence at or below the floor)."""

    kinds = frozenset({"decay", "boost", "invalidate"})

    def __init__(self, at: float, confidence_floor: float):
        from array import array

        self.at, self.floor = at, confidence_floor
        self.ids: list[str] = []
        self.seqs = array("q")
        self.codes = bytearray()
        self.invalidated = bytearray()
        self.old, self.new, self.stamps = array("d"), array("d"), array("d")
        self.steps = array("q")
        self._count = 0

    def add(self, memory_id: str, seq: int, code: int, old: float, new: float, steps: int, stamp: float,
            invalidate: bool) -> None:
        self.ids.append(memory_id)
        self.seqs.append(seq)
        self.codes.append(code)
        self.invalidated.append(invalidate)
        self.old.append(old)
        self.new.append(new)
        self.steps.append(steps)
        self.stamps.append(stamp)
        self._count += (code != 0) + invalidate

    def __len__(self) -> int:
        return self._count

    @property
    def rows(self) -> int:
        """How many memories it holds (one or two actions each)."""
        return len(self.ids)

    def _reason(self, new: float) -> str:
        return f"dream: confidence {new:.2f} at or below confidence_floor {self.floor}"

    def updates(self):
        """(phase, kind, memory_id, changes) of every action, in the order of the Actions."""
        at = self.at
        for memory_id, code, new, steps, stamp, invalidate in zip(
                self.ids, self.codes, self.new, self.steps, self.stamps, self.invalidated, strict=True):
            if code == _DECAY:
                yield "deep", "decay", memory_id, {"confidence": new, "metadata": {"decayed_at": stamp}}
            elif code == _BOOST:
                yield "deep", "boost", memory_id, {"confidence": new, "metadata": {"boosted_at_count": steps}}
            if invalidate:
                yield "deep", "invalidate", memory_id, {
                    "invalidated_at": at, "metadata": {"invalidation_reason": self._reason(new)}}

    def apply(self, journal: Journal, start: int, stop: int) -> None:
        """Apply rows start…stop as Journal.update_many applies their updates (the same
        writes, the same journal rows), without a dict a change: read the columns they
        change, work out each image's text, and write each memory once. Call inside a txn."""
        ids, seqs = self.ids[start:stop], self.seqs[start:stop]
        current = bulk.memory_rows_by_seq(journal.db, _APPLY_READ, seqs)
        stamp = now()
        run_id, at, loads, dumps, value_json = journal.run.id, self.at, _loads, _json, _value_json
        at_json, stamp_json = value_json(at), value_json(stamp)
        entries, writes = [], []
        for memory_id, seq, code, new, steps, decayed_at, invalidate in zip(
                ids, seqs, self.codes[start:stop], self.new[start:stop], self.steps[start:stop],
                self.stamps[start:stop], self.invalidated[start:stop], strict=True):
            row = current.get(seq)
            if row is None or row[0] != memory_id:  # deleted since the plan (its seq may be another's now)
                raise NotFound(f"no memory with id {memory_id!r}")
            _, text, confidence, updated_at, invalidated_at = row
            text = text or "{}"
            metadata = loads(text)
            if code:
                metadata["decayed_at" if code == _DECAY else "boosted_at_count"] = \
                    decayed_at if code == _DECAY else steps
                new_text = dumps(metadata)
                new_json = value_json(new)
                entries.append((run_id, "deep", _KIND_NAMES[code], "update", memory_id,
                                _CHANGED % (value_json(confidence), text, value_json(updated_at)),
                                _CHANGED % (new_json, new_text, stamp_json), stamp))
                text, updated_at = new_text, stamp
            if invalidate:
                metadata["invalidation_reason"] = self._reason(new)
                new_text = dumps(metadata)
                entries.append((run_id, "deep", "invalidate", "update", memory_id,
                                _INVALIDATED % (value_json(invalidated_at), text, value_json(updated_at)),
                                _INVALIDATED % (at_json, new_text, stamp_json), stamp))
                writes.append((seq, _BOTH, [new, at, new_text, stamp]) if code else
                              (seq, _INVALIDATED_COLUMNS, [at, new_text, stamp]))
            else:
                writes.append((seq, _CHANGED_COLUMNS, [new, text, stamp]))
        journal.write_updates(writes, entries)

    def __iter__(self):
        changes = self.updates()
        for i, (code, invalidate) in enumerate(zip(self.codes, self.invalidated, strict=True)):
            old, new, steps = self.old[i], self.new[i], self.steps[i]
            if code == _DECAY:
                idle, doubled = abs(steps), steps < 0
                text = (f"decay {old:.2f} → {new:.2f} (idle {idle} interval{'s' if idle > 1 else ''}"
                        f"{', stale procedure ×2' if doubled else ''})")
            elif code == _BOOST:
                text = f"boost {old:.2f} → {new:.2f} ({steps} accesses)"
            if code:
                phase, kind, memory_id, change = next(changes)
                yield Action(phase, kind, memory_id, text, changes=change)
            if invalidate:
                phase, kind, memory_id, change = next(changes)
                yield Action(phase, kind, memory_id, change["metadata"]["invalidation_reason"], changes=change)

    def kind_counts(self) -> dict[tuple[str, str], int]:
        """(phase, kind) → how many, in the order each kind first comes (a row's change before
        its invalidation). Counted and found in the byte arrays: a run asks this several
        times, and a loop over 100k rows cost 50 ms each."""
        firsts = []  # (where the kind first comes, (phase, kind), how many)
        for code in (_DECAY, _BOOST):
            if (at := self.codes.find(code)) >= 0:
                firsts.append((2 * at, ("deep", _KIND_NAMES[code]), self.codes.count(code)))
        if (at := self.invalidated.find(1)) >= 0:
            firsts.append((2 * at + 1, ("deep", "invalidate"), self.invalidated.count(1)))
        return {key: count for _, key, count in sorted(firsts)}


def _groups(pairs: list[dict[str, Any]], valid: set[str]) -> list[list[str]]:
    """Near-duplicate pairs joined into groups (strongest pairs first, at most MAX_GROUP each)."""
    group_of: dict[str, int] = {}
    groups: list[list[str]] = []
    for pair in sorted(pairs, key=lambda p: -p["similarity"]):
        a, b = pair["a"], pair["b"]
        if a not in valid or b not in valid:
            continue
        ga, gb = group_of.get(a), group_of.get(b)
        if ga is None and gb is None:
            group_of[a] = group_of[b] = len(groups)
            groups.append([a, b])
        elif ga is not None and gb is None and len(groups[ga]) < MAX_GROUP:
            group_of[b] = ga
            groups[ga].append(b)
        elif gb is not None and ga is None and len(groups[gb]) < MAX_GROUP:
            group_of[a] = gb
            groups[gb].append(a)
    return groups


def concatenate(contents: list[str]) -> str:
    """The originals joined, oldest first, without those another one already contains."""
    normal = [" ".join(c.lower().split()) for c in contents]
    kept = []
    for i, content in enumerate(contents):
        inside_other = any(j != i and normal[i] in normal[j] and (normal[i] != normal[j] or j < i)
                           for j in range(len(contents)))
        if not inside_other:
            kept.append(content.strip())
    return "\n".join(kept)


def term_loss(originals: list[str], merged: str) -> float:
    """The share of the originals' distinct terms missing from the merged text."""
    wanted = set().union(*(distinct_terms(c) for c in originals)) if originals else set()
    if not wanted:
        return 0.0
    return len(wanted - distinct_terms(merged)) / len(wanted)


def llm_merge(llm, contents: list[str]) -> tuple[str | None, str]:
    """Ask the LLM for a merge; (text, why) — text is None when unusable or rejected."""
    if llm is None:
        return None, "no LLM configured"
    from ..errors import LlmemError

    messages = [{"role": "system", "content": MERGE_PROMPT},
                {"role": "user", "content": "\n\n".join(f"Memory {i + 1}:\n{c}" for i, c in enumerate(contents))}]
    try:
        reply = llm.chat_json(messages, MERGE_SCHEMA, task="dream_merge")
    except LlmemError as exc:  # LLMUnavailable, LLMReplyInvalid, BudgetExhausted
        return None, f"LLM unavailable: {getattr(exc, 'message', exc)}"
    text = (reply or {}).get("content") if isinstance(reply, dict) else None
    if not isinstance(text, str) or not text.strip():
        return None, "LLM reply had no content"
    loss = term_loss(contents, text)
    if loss > MAX_TERM_LOSS:
        return None, f"LLM merge rejected: it lost {loss:.0%} of the originals' terms"
    return text.strip(), f"LLM merge kept {1 - loss:.0%} of the originals' terms"


def plan_deep(store, cfg: DreamSettings, *, near_duplicates: list[dict[str, Any]],
              exact_duplicates: list[list[str]], auto_links: list[dict[str, Any]],
              stale_ids: set[str], phase_hits: dict[str, float], at: float | None = None,
              promote_limit: int | None = None) -> DeepResult:
    """Everything deep would do, computed without writing."""
    at = at or now()
    db = store.db
    result = DeepResult()
    busy: set[str] = set()  # memories already handled by a merge or dedupe

    involved = {m for g in exact_duplicates for m in g} | {p[k] for p in near_duplicates + auto_links for k in ("a", "b")}
    Memory = store.models.Memory
    info: dict[str, Memory] = {}
    ids = list(involved)
    for start in range(0, len(ids), 500):
        for memory in Memory.select().where(Memory.id.in_(ids[start:start + 500]) & Memory.invalidated_at.is_null()):
            info[memory.id] = memory

    for group in exact_duplicates:
        members = [m for m in group if m in info and m not in busy
                   and info[m].source != EPISODE_SOURCE]
        if len(members) < 2:
            continue
        keeper, rest = members[0], members[1:]
        busy.update(members)
        result.actions.append(Action("deep", "dedupe", keeper,
                                     f"exact duplicates: keep {keeper[:8]}, invalidate {', '.join(r[:8] for r in rest)}",
                                     detail={"keep": keeper, "drop": rest}))

    episodes = {m for m, memory in info.items() if memory.source == EPISODE_SOURCE}
    for group in _groups(near_duplicates, set(info) - busy - episodes):
        members = sorted(group, key=lambda m: (info[m].created_at, info[m].seq))
        busy.update(members)
        contents = [info[m].content for m in members]
        first = info[members[0]]
        result.actions.append(Action(
            "deep", "merge", None,
            f"merge {len(members)} near-duplicates ({', '.join(m[:8] for m in members)}) into one {first.type}",
            detail={"ids": members, "type": first.type, "project": first.project,
                    "confidence": max(info[m].confidence for m in members),
                    "concatenation": concatenate(contents)}))

    for pair in auto_links:
        if pair["a"] in info and pair["b"] in info and not (pair["a"] in busy or pair["b"] in busy):
            result.actions.append(Action("deep", "link", pair["a"],
                                         f"related_to {pair['a'][:8]} → {pair['b'][:8]} (cosine {pair['similarity']:.3f})",
                                         detail={"target": pair["b"], "similarity": pair["similarity"]}))

    interval = float(cfg.decay_interval_days) * 86400
    # Episodes are kept by their own retention (light.plan_episode_retention), not by
    # confidence: what was said does not grow less true by not being recalled.
    rows = decay_rows(db, except_source=EPISODE_SOURCE)
    invalidated: set[str] = set(busy)
    decays = DecayRows(at, cfg.confidence_floor)
    add = decays.add
    decay_floor, confidence_floor, decay_rate = cfg.decay_floor, cfg.confidence_floor, cfg.decay_rate
    boost_threshold, boost_amount = cfg.boost_threshold, cfg.boost_amount
    floor = math.floor
    while chunk := rows.fetchmany(10_000):  # a cursor: 1M rows at once held ~350 MB
        for memory_id, mtype, confidence, accessed_at, created_at, access_count, decayed_at, boosted_at, stale, seq \
                in chunk:
            if memory_id in busy:
                continue
            new_conf = confidence
            reference = max(accessed_at or created_at, float(decayed_at or 0))
            steps = floor((at - reference) / interval) if interval > 0 else 0
            code, count, stamp = 0, 0, 0.0
            if steps >= 1 and confidence > decay_floor:
                doubled = mtype == "procedure" and (bool(stale) or memory_id in stale_ids)
                rate = decay_rate * (2 if doubled else 1)
                new_conf = round(max(decay_floor, confidence - rate * steps), 6)
                code, count, stamp = _DECAY, -steps if doubled else steps, reference + steps * interval
            elif (access_count or 0) >= boost_threshold and \
                    (access_count or 0) >= int(boosted_at or 0) + boost_threshold and confidence < 1.0:
                new_conf = round(min(1.0, confidence + boost_amount), 6)
                code, count = _BOOST, access_count
            invalidate = new_conf <= confidence_floor
            if invalidate:
                invalidated.add(memory_id)
            if code or invalidate:
                add(memory_id, seq, code, confidence, new_conf, count, stamp, invalidate)
    result.actions.add_compact(decays)

    chosen, held = promotable(store, cfg, limit=promote_limit, at=at, phase_hits=phase_hits)
    for candidate in chosen:
        if candidate.memory_id in invalidated:
            continue
        result.promote.append(candidate)
        result.actions.append(Action("deep", "promote", candidate.memory_id,
                                     f"promote (score {candidate.score:.2f}, {candidate.recalls} recalls, "
                                     f"{candidate.unique_queries} queries, {candidate.recall_days} days)",
                                     changes={"promoted_at": at},
                                     detail={"score": candidate.score, "content_hash": candidate.content_hash}))
    result.held = len(held)
    return result


# The actions apply_action does more for than a journaled update of the memory's fields.
SPECIAL_KINDS = frozenset({"merge", "dedupe", "link", "promote"})


def apply_promotes(store, journal: Journal, actions: list[Action]) -> None:
    """Apply planned promote actions as apply_action does each (re-read first, a stale one
    skipped), with one read and one journaled bulk update. Call inside a transaction."""
    reasons = recheck_many(store, [(a.memory_id, a.detail["content_hash"]) for a in actions])
    for action in actions:
        reason = reasons.get(action.memory_id)
        if reason:
            action.kind, action.text = "skip_promote", f"not promoted: {reason}"
            action.detail["skipped"] = reason
    journal.update_many([(a.phase, a.kind, a.memory_id, a.changes) for a in actions if a.kind == "promote"])


def apply_action(store, journal: Journal, action: Action, *, llm=None, at: float | None = None) -> dict[str, Any]:
    """Execute one planned deep (or REM metadata) action through the journal. Call inside a txn,
    except for merges, which open their own (the LLM is asked first, outside any transaction)."""
    at = at or now()
    if action.kind == "merge":
        return _apply_merge(store, journal, action, llm, at)
    if action.kind == "dedupe":
        keeper = action.detail["keep"]
        for other in action.detail["drop"]:
            reason = f"dream: exact duplicate of {keeper}"
            journal.update(action.phase, "dedupe", other,
                           {"invalidated_at": at, "metadata": {"invalidation_reason": reason}})
            journal.relate(action.phase, "dedupe", keeper, other, "supersedes")
        return {}
    if action.kind == "link":
        journal.relate(action.phase, "link", action.memory_id, action.detail["target"], "related_to")
        return {}
    if action.kind == "promote":
        reason = recheck(store, action.memory_id, action.detail["content_hash"])
        if reason:  # re-read before writing: a stale, invalidated or deleted snippet is skipped
            action.kind, action.text = "skip_promote", f"not promoted: {reason}"
            action.detail["skipped"] = reason
            return {"skipped": reason}
    journal.update(action.phase, action.kind, action.memory_id, action.changes)
    return {}


def _apply_merge(store, journal: Journal, action: Action, llm, at: float) -> dict[str, Any]:
    ids = action.detail["ids"]
    Memory = store.models.Memory
    originals = {m.id: m for m in Memory.select().where(Memory.id.in_(ids) & Memory.invalidated_at.is_null())}
    if len(originals) < 2:
        return {"skipped": "originals changed since planning"}
    members = [m for m in ids if m in originals]
    contents = [originals[m].content for m in members]
    text, why = llm_merge(llm, contents)
    method = "llm" if text else "concatenation"
    if text is None:
        text = concatenate(contents)
    # As trusted as its least trusted original (a tool's output merged into the user's words
    # stays a tool's output); the model's rewording is the agent's words at best.
    trust = least_trusted(AGENT if method == "llm" else None, *(originals[m].trust for m in members))
    with store.db.atomic():
        added = store.add(text, action.detail["type"], confidence=action.detail["confidence"], source="dream",
                          project=action.detail["project"], trust=trust,
                          metadata={"merged_from": members, "merge_method": method, "merge_note": why})
        merged = added.memory
        if added.created:
            journal.create(action.phase, "merge", merged)
        others = [memory_id for memory_id in members if memory_id != merged.id]
        reason = f"dream: merged into {merged.id}"
        # The originals invalidated with one journaled bulk update, then related (undo, newest
        # first, removes the relations, restores the originals, then deletes the merged one).
        journal.update_many([(action.phase, "merge", memory_id,
                              {"invalidated_at": at, "metadata": {"invalidation_reason": reason}})
                             for memory_id in others])
        for memory_id in others:
            journal.relate(action.phase, "merge", merged.id, memory_id, "derived_from")
            journal.relate(action.phase, "merge", merged.id, memory_id, "supersedes")
    action.detail["merged_id"] = merged.id
    action.detail["method"] = method
    return {"merged_id": merged.id, "method": method, "note": why}
