"""Memories: the list with filters, search with the score breakdown, one memory's page, and
its actions (edit, correct, invalidate, delete) through the memory service (llmem/memories.py), as
the CLI's and the MCP tools'."""

from __future__ import annotations

import difflib
import json

import peewee as pw
from starlette.routing import Route

from ...db.models import MEMORY_TYPES
from ...errors import UsageError
from ...memories import AlreadyInvalid, already_invalid, memory_journal
from ...store import StaleEdit
from ...times import now
from ..web import form, page_number, redirect, render, store, viewer

NAV = ("Memories", "/memories")

PAGE_SIZE = 50
SEARCH_LIMIT = 30
# validity filter -> what it keeps: "current" is the CLI's default (not invalidated), "valid"
# is `--valid-only` (expired and superseded dropped too), "invalid" only the invalidated.
VALIDITY = ("current", "valid", "invalid", "all")
# How many rows of a memory's journal, recalls and second-hop neighbours its page shows.
DETAIL_ROWS = 50


def _choice(value: str | None, choices, default=None):
    return value if value in choices else default


def _filters(request) -> dict:
    params = request.query_params
    return {"q": (params.get("q") or "").strip(), "type": _choice(params.get("type"), MEMORY_TYPES),
            "project": params.get("project") or None,
            "validity": _choice(params.get("validity"), VALIDITY, "current"), "page": page_number(request)}


def _validity_clause(Memory, Relation, validity: str, at: float):
    if validity == "all":
        return None
    if validity == "invalid":
        return Memory.invalidated_at.is_null(False)
    clause = Memory.invalidated_at.is_null()
    if validity == "valid":
        Newer = Memory.alias()
        superseded = (Relation.select(Relation.id).join(Newer, on=(Relation.source == Newer.id))
                      .where((Relation.target == Memory.id) & (Relation.type == "supersedes")
                             & Newer.invalidated_at.is_null()))
        clause &= (Memory.valid_until.is_null() | (Memory.valid_until > at)) & ~pw.fn.EXISTS(superseded)
    return clause


def _listing(current_store, chosen: dict) -> tuple[list, int]:
    Memory, Relation = current_store.models.Memory, current_store.models.Relation
    at = now()
    scope = [c for c in (Memory.type == chosen["type"] if chosen["type"] else None,
                         Memory.project == chosen["project"] if chosen["project"] else None) if c is not None]
    query = Memory.select()
    for clause in [*scope, _validity_clause(Memory, Relation, chosen["validity"], at)]:
        if clause is not None:
            query = query.where(clause)
    if chosen["validity"] == "valid":
        total = _valid_count(Memory, Relation, scope, at)
    else:
        total = query.count()
    rows = list(query.order_by(Memory.created_at.desc(), Memory.seq.desc())
                .paginate(chosen["page"], PAGE_SIZE))
    return rows, total


def _valid_count(Memory, Relation, scope: list, at: float) -> int:
    """How many memories the "valid" filter keeps, counted as the current ones less the
    expired and the superseded among them: counting the filter itself ran its NOT EXISTS
    once per memory (a second at 100k); these read indexes (0019_viewer_indexes) and touch
    only the few memories that expire or were superseded."""
    current = Memory.invalidated_at.is_null()
    for clause in scope:
        current &= clause
    live = Memory.valid_until.is_null() | (Memory.valid_until > at)
    total = Memory.select().where(current).count()
    expired = Memory.select().where(current & Memory.valid_until.is_null(False) & (Memory.valid_until <= at)).count()
    Newer = Memory.alias()
    superseded = (Relation.select(Relation.target).distinct()
                  .join(Newer, on=(Relation.source == Newer.id))
                  .switch(Relation).join(Memory, on=(Relation.target == Memory.id))
                  .where((Relation.type == "supersedes") & Newer.invalidated_at.is_null() & current & live))
    return total - expired - superseded.count()


def _search(request, chosen: dict):
    """The CLI's search (`llmem search --explain`): the same Searcher and options, but a person
    reading results is not an agent recalling them, so no access or recall is recorded."""
    from ...search import Searcher

    llmem = viewer(request).llmem
    validity = chosen["validity"]
    opts = llmem.search_options(limit=SEARCH_LIMIT, memory_type=chosen["type"],
                                project=chosen["project"], include_invalid=validity in ("invalid", "all"),
                                valid_only=validity == "valid", track=False)
    embedder = llmem.embedder if llmem.embedder.available else None
    result = Searcher(llmem.store, embedder).search(chosen["q"], opts)
    if validity == "invalid":
        result.hits = [h for h in result.hits if h.memory.invalidated_at is not None]
    return result, [_breakdown(hit) for hit in result.hits]


# Width in pixels of a score of 1.0 in the breakdown bar.
BAR_WIDTH = 240


def _breakdown(hit) -> dict:
    """What the final score is made of, as the bar draws it: the relevance (its share weighted
    1 - PRIOR_WEIGHT) split between the lexical and the semantic evidence, and the prior
    (weighted PRIOR_WEIGHT), all times the episode and superseded factors the score carries."""
    from ...search import PRIOR_WEIGHT

    evidence = hit.lexical + hit.semantic
    relevance_share = (1 - PRIOR_WEIGHT) * hit.relevance
    shares = {"fts": relevance_share * hit.lexical / evidence if evidence else 0.0,
              "vec": relevance_share * hit.semantic / evidence if evidence else 0.0,
              "sig": PRIOR_WEIGHT * hit.signal}
    made = sum(shares.values())
    factor = hit.score / made if made else 0.0  # the episode and superseded factors, and reordering
    shares = {name: share * factor for name, share in shares.items()}
    segments, left = [], 0.0
    for name in ("fts", "vec", "sig"):
        width = shares[name] * BAR_WIDTH
        segments.append({"name": name, "x": round(left, 2), "width": round(width, 2),
                         "share": shares[name]})
        left += width
    return {"segments": segments, "components": hit.explain(), "bar_width": BAR_WIDTH}


def memories(request):
    current_store = store(request)
    chosen = _filters(request)
    Memory = current_store.models.Memory
    projects = [row[0] for row in Memory.select(Memory.project).where(Memory.project.is_null(False))
                .distinct().order_by(Memory.project).tuples()]
    context = {"chosen": chosen, "types": MEMORY_TYPES, "projects": projects,
               "validities": VALIDITY, "page_size": PAGE_SIZE}
    if chosen["q"]:
        result, breakdowns = _search(request, chosen)
        return render(request, "memories.html", result=result,
                      results=list(zip(result.hits, breakdowns, strict=True)), **context)
    rows, total = _listing(current_store, chosen)
    return render(request, "memories.html", result=None, rows=rows, total=total, **context)


def _memory_or_404(request):
    return store(request).get(request.path_params["memory_id"])


def _neighbours(current_store, memory) -> tuple[list[dict], list[dict]]:
    """The memory's relations with the memory at the other end, then the relations of those
    neighbours that lead further (second hop), each once."""
    Memory = current_store.models.Memory
    relations = current_store.relations_of([memory.id])
    ends = {r.target_id if r.source_id == memory.id else r.source_id for r in relations}
    by_id = {m.id: m for m in Memory.select().where(Memory.id.in_(list(ends)))} if ends else {}
    first = [{"relation": r, "outgoing": r.source_id == memory.id,
              "other": by_id.get(r.target_id if r.source_id == memory.id else r.source_id)}
             for r in relations]
    seen = ends | {memory.id}
    second, further = [], set()
    for relation in current_store.relations_of(list(ends))[: DETAIL_ROWS * 4]:
        for near, far in ((relation.source_id, relation.target_id), (relation.target_id, relation.source_id)):
            if near in ends and far not in seen and far not in further:
                further.add(far)
                second.append({"relation": relation, "via": near, "far_id": far})
    second = second[:DETAIL_ROWS]
    far_memories = ({m.id: m for m in Memory.select().where(Memory.id.in_([s["far_id"] for s in second]))}
                    if second else {})
    for entry in second:
        entry["other"] = far_memories.get(entry["far_id"])
    return first, second


def memory_page(request):
    current_store = store(request)
    memory = _memory_or_404(request)
    RecallEvent = current_store.models.RecallEvent
    relations, second_hop = _neighbours(current_store, memory)
    journal = memory_journal(current_store, memory.id, limit=DETAIL_ROWS)
    recalls = RecallEvent.select().where(RecallEvent.memory == memory.id)
    shown = list(recalls.order_by(RecallEvent.created_at.desc()).limit(DETAIL_ROWS))
    # The query's words (kept, redacted, for the user's own searches), not its hash.
    RecallQuery = current_store.models.RecallQuery
    hashes = list({recall.query_hash for recall in shown})
    query_texts = dict(RecallQuery.select(RecallQuery.query_hash, RecallQuery.text)
                       .where(RecallQuery.query_hash.in_(hashes)).tuples()) if hashes else {}
    return render(request, "memory.html", memory=memory, relations=relations, second_hop=second_hop,
                  journal=journal, recall_count=recalls.count(), recalls=shown, query_texts=query_texts,
                  metadata=json.dumps(memory.metadata or {}, indent=2, ensure_ascii=False, sort_keys=True),
                  types=MEMORY_TYPES)


def _pending_note(pending: str | None) -> str:
    """The flash's note for a memory the service could not embed yet (the worker catches up)."""
    return f" (not embedded yet: {pending})" if pending else ""


def _page_of(memory) -> str:
    return f"/memories/{memory.id}"


def _form_version(fields: dict[str, str]) -> int:
    """The version of the memory the form was loaded with (every form carries it): a write
    from a form loaded before a concurrent change is refused, never written over it."""
    try:
        return int(fields.get("version", ""))
    except ValueError:
        raise UsageError("the form does not say which version of the memory it edits",
                         hint="reload the page and make the change again") from None


def _conflict(request, exc: StaleEdit, action: str, submitted: dict[str, str]):
    """409: the memory changed since the form was loaded. Shows what it holds now beside what
    was submitted (nothing was written), with a form to submit it again over the new version."""
    current = exc.memory
    shown = {"content": current.content, "summary": current.summary or "", "type": current.type,
             "confidence": f"{current.confidence:.2f}",
             "state": "invalidated" if current.invalidated_at is not None else "current"}
    rows = [(name, shown[name], submitted[name]) for name in submitted if name in shown]
    diff = "\n".join(difflib.unified_diff(current.content.splitlines(), submitted.get("content", current.content).splitlines(),
                                          "current", "submitted", lineterm="")) if "content" in submitted else ""
    return render(request, "memory_conflict.html", status_code=409, memory=current, rows=rows, diff=diff,
                  action=f"{_page_of(current)}/{action}", submitted=submitted)


def edit(request):
    memory = _memory_or_404(request)
    if request.method == "GET":
        return render(request, "memory_edit.html", memory=memory, types=MEMORY_TYPES)
    fields = form(request)
    content = fields.get("content", "")
    summary = fields.get("summary", "")
    try:
        confidence = float(fields.get("confidence", memory.confidence))
    except ValueError:
        raise UsageError(f"confidence {fields.get('confidence')!r} is not a number",
                         hint="use a number from 0.0 to 1.0") from None
    memory_type = _choice(fields.get("type"), MEMORY_TYPES, memory.type)
    version = _form_version(fields)
    try:
        result = viewer(request).memories.update(
            memory.id, content=content, summary=summary, confidence=confidence,
            memory_type=memory_type, expected_version=version)
    except StaleEdit as exc:
        return _conflict(request, exc, "edit", {"content": content, "summary": summary, "type": memory_type,
                                                "confidence": fields.get("confidence", "")})
    return redirect(request, _page_of(result.memory), f"Saved {result.memory.id[:8]}{_pending_note(result.pending)}")


def correct(request):
    memory = _memory_or_404(request)
    if request.method == "GET":
        return render(request, "memory_correct.html", memory=memory)
    fields = form(request)
    try:
        result = viewer(request).memories.correct(
            memory.id, fields.get("content", ""), reason=fields.get("reason"),
            expected_version=_form_version(fields))
    except StaleEdit as exc:
        return _conflict(request, exc, "correct", {"content": fields.get("content", ""),
                                                   "reason": fields.get("reason", "")})
    newer = result.memory
    return redirect(request, _page_of(newer), f"{newer.id[:8]} now supersedes {memory.id[:8]}, "
                    f"which is invalidated{_pending_note(result.pending)}")


def _already_invalid(request, already: AlreadyInvalid):
    return redirect(request, _page_of(already.memory), f"Already invalidated ({already.reason}); left as it was",
                    "error")


def invalidate(request):
    memory = _memory_or_404(request)
    already = already_invalid(memory)  # asked before the form: a second form would change nothing
    if already is not None:
        return _already_invalid(request, already)
    if request.method == "GET":
        return render(request, "confirm.html", question="Invalidate this memory?", subject=memory.content,
                      detail="It stays for reference; search and the session context no longer use it.",
                      action=f"{_page_of(memory)}/invalidate", fields=[("reason", "Why it no longer holds")],
                      hidden=[("version", memory.version)], button="Invalidate", back=_page_of(memory))
    fields = form(request)
    try:
        result = viewer(request).memories.invalidate(memory.id, fields.get("reason", ""),
                                                           expected_version=_form_version(fields))
    except StaleEdit as exc:
        return _conflict(request, exc, "invalidate", {"state": "invalidated", "reason": fields.get("reason", "")})
    if isinstance(result, AlreadyInvalid):  # invalidated by another process since the page loaded
        return _already_invalid(request, result)
    return redirect(request, _page_of(memory), f"Invalidated {memory.id[:8]}")


def delete(request):
    memory = _memory_or_404(request)
    if request.method == "GET":
        return render(request, "confirm.html", question="Delete this memory for good?", subject=memory.content,
                      detail="Its relations, vector and recalls go with it. Invalidating keeps it for reference.",
                      action=f"{_page_of(memory)}/delete", fields=[], button="Delete", back=_page_of(memory))
    deleted = viewer(request).memories.delete(memory.id)
    return redirect(request, "/memories", f"Deleted {deleted[:8]}")


ROUTES = [
    Route("/memories", memories),
    Route("/memories/{memory_id}", memory_page),
    Route("/memories/{memory_id}/edit", edit, methods=["GET", "POST"]),
    Route("/memories/{memory_id}/correct", correct, methods=["GET", "POST"]),
    Route("/memories/{memory_id}/invalidate", invalidate, methods=["GET", "POST"]),
    Route("/memories/{memory_id}/delete", delete, methods=["GET", "POST"]),
]
