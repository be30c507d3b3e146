"""Introspection: self_assessment memories in the seeds' nine-field format and error taxonomy.

Four ways in: manual (`introspect --category …`), automatic over a session or a text (an LLM
when one answers, else heuristics over error signals), `learn --wrong --right`, and
`track-review`. `Recurring` is filled by looking up earlier self_assessments of the same
category, so repeated mistakes become visible to the dream's behavioural insights.

Without an LLM the heuristics read what the user's corrections state (a fact, preference,
procedure, decision or wrong → right pair, stored as such) and make a self_assessment only of a
mistake whose wording names a category; those carry `source: heuristic` in their metadata and
a lower confidence, and dream does not build lessons on them alone.

Running the same introspection twice adds nothing: recurrence lives in the metadata (the
content of an assessment does not depend on what was stored before), a session's cursor moves
in the transaction that stores what it covers, and a text already introspected is recognised.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from ..db.models import Memory
from ..db.queries import metadata_equals
from ..errors import (
    BudgetExhausted,
    LLMReplyInvalid,
    LLMUnavailable,
    UsageError,
)
from ..providers.llm import step_llm
from ..times import now, to_iso
from .extract import chunk_lines, prepare_slice, redact_messages, redactor
from .heuristics import classify_correction, error_signals, stated_corrections
from .markers import strip_context_blocks
from .taxonomy import CATEGORIES, ERROR_CATEGORIES, HEURISTIC, POSITIVE_CATEGORIES, TAXONOMY

log = logging.getLogger(__name__)


# The nine fields, in the seeds' order; metadata uses their lower-case names.
FIELDS = ("Category", "Context", "What_happened", "Outcomes", "What_caught_it",
          "Estimates_vs_actual", "Recurring", "Proposed_update", "Iteration_count")
# The content holds every field but Recurring: that one depends on what was stored before, and
# a content that changes with it would make a re-run store the same assessment twice.
CONTENT_FIELDS = tuple(f for f in FIELDS if f != "Recurring")

# Deterministic Proposed_update when none is given and no LLM proposes one.
DEFAULT_UPDATES: dict[str, str] = {
    "NULL_SAFETY": "Check for None/null/undefined before accessing attributes or calling methods on values that may be missing.",
    "ERROR_HANDLING": "Handle the specific exceptions a call can raise; never swallow errors silently or use a bare except.",
    "OFF_BY_ONE": "Check loop bounds and slice ends against the first, last and empty cases before running.",
    "RACE_CONDITION": "Identify shared state and guard it (locks, transactions, awaited tasks) before running concurrent code.",
    "AUTH_BYPASS": "Check authorisation and validate untrusted input on every new entry point.",
    "DATA_INTEGRITY": "Update or invalidate every derived copy (cache, index, embedding) in the same change as its source.",
    "MISSING_VERIFICATION": "Run the relevant tests and check the actual output before reporting a task as done.",
    "EDGE_CASE": "Consider empty input, unexpected types and boundary values before calling the change done.",
    "PERFORMANCE": "Look for repeated queries and recomputation in loops; measure before and after.",
    "DESIGN": "Sketch the responsibilities and dependencies of a change before writing it.",
    "REVIEW_PASSED": "Keep the practices that produced a clean review.",
}

MANUAL_CONFIDENCE = 0.9  # stated by the user or the agent itself
AUTO_CONFIDENCE = 0.7  # inferred by an LLM
HEURISTIC_CONFIDENCE = 0.5  # guessed from wording by the heuristics
RECURRING_LOOKUP = 10
TRACK_REVIEW = "track-review"


def check_category(category: str | None) -> str:
    """The category in canonical form, or a usage error naming the allowed values."""
    value = (category or "").strip().upper().replace("-", "_")
    if value not in TAXONOMY:
        raise UsageError(f"unknown category {category!r}",
                         hint="use one of: " + ", ".join(CATEGORIES))
    return value


def format_self_assessment(fields: dict) -> str:
    """The fields as `Name: value` lines (unknown values shown as '-'); Recurring is metadata."""
    lines = []
    for name in CONTENT_FIELDS:
        value = fields.get(name)
        text = "-" if value is None or value == "" else " ".join(str(value).split())
        lines.append(f"{name}: {text}")
    return "\n".join(lines)


def earlier_assessments(store, category: str, project: str | None = None) -> list[Memory]:
    """Valid self_assessments of a category, newest first (what makes one `Recurring`)."""
    Memory = store.models.Memory
    query = (Memory.select().where(
        (Memory.type == "self_assessment") & Memory.invalidated_at.is_null()
        & metadata_equals(Memory.metadata, "category", category)))
    if project is not None:
        query = query.where((Memory.project == project) | Memory.project.is_null())
    return list(query.order_by(Memory.created_at.desc(), Memory.seq.desc()).limit(RECURRING_LOOKUP))


def _redact_fields(app, fields: dict) -> dict:
    apply = redactor(app.config)
    return {k: (apply(v, {}) if isinstance(v, str) else v) for k, v in fields.items()}


def _checked_fields(app, fields: dict) -> dict:
    """The fields redacted, context blocks stripped, category and counts validated."""
    fields = _redact_fields(app, {k: (strip_context_blocks(v) if isinstance(v, str) else v)
                                  for k, v in fields.items()})
    fields["Category"] = check_category(fields.get("Category"))
    if not (fields.get("What_happened") or "").strip():
        raise UsageError("a self_assessment needs What_happened", hint='pass --what-happened "…"')
    iteration = fields.get("Iteration_count")
    if iteration is not None:
        try:
            iteration = int(iteration)
        except (TypeError, ValueError):
            raise UsageError(f"Iteration_count must be an integer, not {iteration!r}") from None
        if iteration < 1:
            raise UsageError("Iteration_count counts attempts: 1 or more")
        fields["Iteration_count"] = iteration
    return fields


def _write_assessment(store, fields: dict, *, source: str, confidence: float, origin: str,
                      project: str | None, session_id: str | None, extra: dict | None):
    """Fill Recurring (metadata only) and add the assessment; an AddResult (call in a txn)."""
    category = fields["Category"]
    recurring_ids: list[str] = []
    if category != "REVIEW_PASSED":
        recurring_ids = [m.id for m in earlier_assessments(store, category, project)]
    fields = {**fields, "Recurring": "yes" if recurring_ids else "no"}
    metadata = {name.lower(): fields.get(name) for name in FIELDS}
    metadata.update({"recurring_ids": recurring_ids, "origin": origin, **(extra or {})})
    summary = f"{category}: {' '.join(fields['What_happened'].split())}"
    if len(summary) > 140:
        summary = summary[:139] + "…"
    return store.add(format_self_assessment(fields), "self_assessment", summary=summary,
                     confidence=confidence, source=source, project=project,
                     session_id=session_id, metadata=metadata)


def store_assessment(app, fields: dict, *, source: str, confidence: float, origin: str,
                     project: str | None = None, session_id: str | None = None,
                     extra: dict | None = None) -> Memory:
    """Store one self_assessment (content and metadata carry the fields), then embed it."""
    result = _write_assessment(app.store, _checked_fields(app, fields), source=source,
                               confidence=confidence, origin=origin, project=project,
                               session_id=session_id, extra=extra)
    if result.created:
        app.memories.embed([result.memory])
    return result.memory


# ---- manual ---------------------------------------------------------------------------------

PROPOSAL_SCHEMA = {
    "type": "object",
    "properties": {"proposed_update": {"type": "string"}, "outcomes": {"type": "string"}},
    "required": ["proposed_update"],
}


def _propose_update(llm, category: str, what_happened: str, context: str | None) -> str | None:
    prompt = (f"An AI coding agent made a mistake of category {category} "
              f"({TAXONOMY[category]}).\nWhat happened: {what_happened}\n"
              f"Context: {context or '-'}\n\nWrite proposed_update: one specific procedural "
              "directive (imperative, one sentence) that would prevent it from recurring.")
    try:
        reply = llm.chat_json([{"role": "user", "content": prompt}], PROPOSAL_SCHEMA, task="introspect")
    except (LLMUnavailable, LLMReplyInvalid) as exc:
        log.warning("no LLM proposal, using the category's default: %s", getattr(exc, "message", exc))
        return None
    except Exception as exc:  # BudgetExhausted and the like: the default is fine
        log.info("no LLM proposal: %s", exc)
        return None
    return reply["proposed_update"].strip() or None


def introspect_manual(app, category: str, what_happened: str, *, context: str | None = None,
                      caught_by: str | None = None, proposed_fix: str | None = None,
                      outcomes: str | None = None, estimates_vs_actual: str | None = None,
                      iteration_count: int | None = None, llm=None,
                      project: str | None = None) -> list[Memory]:
    """Store one self_assessment from fields given by hand (an LLM may propose the fix)."""
    category = check_category(category)
    if not (what_happened or "").strip():
        raise UsageError("--what-happened is empty", hint="describe the behaviour, e.g. 'missing null check'")
    if not proposed_fix and llm is not None:
        proposed_fix = _propose_update(llm, category, what_happened, context)
    fields = {
        "Category": category, "Context": context, "What_happened": what_happened,
        "Outcomes": outcomes, "What_caught_it": caught_by, "Estimates_vs_actual": estimates_vs_actual,
        "Proposed_update": proposed_fix or DEFAULT_UPDATES[category], "Iteration_count": iteration_count,
    }
    return [store_assessment(app, fields, source="introspection", confidence=MANUAL_CONFIDENCE,
                             origin="manual", project=project)]


# ---- automatic --------------------------------------------------------------------------------

AUTO_SCHEMA = {
    "type": "object",
    "properties": {
        "assessments": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "category": {"type": "string", "enum": list(ERROR_CATEGORIES)},
                    "context": {"type": "string"},
                    "what_happened": {"type": "string"},
                    "outcomes": {"type": "string"},
                    "what_caught_it": {"type": "string"},
                    "estimates_vs_actual": {"type": "string"},
                    "proposed_update": {"type": "string"},
                    "iteration_count": {"type": "integer", "minimum": 1},
                },
                "required": ["category", "what_happened"],
            },
        },
    },
    "required": ["assessments"],
}

AUTO_PROMPT = """You review the work of an AI coding agent for its own mistakes, to learn from them.

Error categories:
""" + "\n".join(f"- {c}: {d}" for c, d in TAXONOMY.items() if c not in POSITIVE_CATEGORIES) + """

Rules:
- Record only real mistakes of the agent: failed attempts it caused, user corrections, bugs it \
introduced, verification it skipped. Reproducing a bug the user reported is not a mistake.
- what_happened: the behaviour, not a narrative ("called .name on a possibly-None user").
- what_caught_it: self-review, test, user or CI.
- proposed_update: one specific procedural directive that prevents it recurring.
- iteration_count: attempts before success (1 = first try).
- Answer {"assessments": []} when nothing went wrong."""


def _llm_assessments(llm, text: str) -> list[dict]:
    reply = llm.chat_json([{"role": "system", "content": AUTO_PROMPT},
                           {"role": "user", "content": text}], AUTO_SCHEMA, task="introspect")
    return reply["assessments"]


def _fields_from_llm(item: dict, default_context: str | None) -> dict:
    category = item["category"]
    return {
        "Category": category, "Context": item.get("context") or default_context,
        "What_happened": item["what_happened"], "Outcomes": item.get("outcomes"),
        "What_caught_it": item.get("what_caught_it"),
        "Estimates_vs_actual": item.get("estimates_vs_actual"),
        "Proposed_update": item.get("proposed_update") or DEFAULT_UPDATES[category],
        "Iteration_count": item.get("iteration_count"),
    }


def _run_llm(llm, texts: list[str]) -> list[dict] | None:
    """Assessments from the LLM over each text, or None when it cannot answer (use heuristics)."""
    if llm is None:
        return None
    found: list[dict] = []
    try:
        for text in texts:
            found.extend(_llm_assessments(llm, text))
    except BudgetExhausted as exc:
        log.info("introspection with heuristics: %s", exc.message)
        return None
    except LLMUnavailable as exc:
        log.warning("LLM unavailable, introspecting with heuristics: %s", exc.message)
        return None
    except LLMReplyInvalid as exc:
        log.warning("LLM reply unusable, introspecting with heuristics: %s", exc)
        return None
    return found


def _group_signals(signals) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for signal in signals:
        grouped.setdefault(signal.category, []).append(signal)
    return grouped


def _fields_from_signals(category: str, signals, context: str | None) -> dict:
    kinds = {s.kind for s in signals}
    shown = "; ".join(" ".join(s.text.split())[:200] for s in signals[:3])
    if len(signals) > 3:
        shown += f"; and {len(signals) - 3} more"
    if "correction" in kinds:
        caught = "user"
    elif "admission" in kinds:
        caught = "self-review"
    elif any(re.search(r"\bfailed\b|FAILED|AssertionError|pytest|test", s.text) for s in signals):
        caught = "test"
    else:
        caught = "tool error"
    failures = sum(1 for s in signals if s.kind in ("tool_failure", "retry"))
    return {
        "Category": category, "Context": context, "What_happened": shown,
        "Outcomes": f"{len(signals)} error signal(s) before the work went on "
                    f"({', '.join(sorted(kinds))})",
        "What_caught_it": caught, "Estimates_vs_actual": None,
        "Proposed_update": DEFAULT_UPDATES[category],
        "Iteration_count": failures + 1 if failures else None,
    }


def _write_stated(store, candidates, *, origin: str, project: str | None, session_id: str | None,
                  extra: dict | None = None):
    """Add what corrections state (facts, preferences, steps, wrong → right pairs); AddResults."""
    results = []
    for candidate in candidates:
        metadata = {"rule": candidate.rule, **candidate.metadata, "origin": origin,
                    "source": HEURISTIC, **(extra or {})}
        if candidate.message_id:
            metadata["message_id"] = candidate.message_id
        results.append(store.add(candidate.content, candidate.type, summary=candidate.summary,
                                 confidence=candidate.confidence, source="introspection",
                                 project=project, session_id=session_id, metadata=metadata))
    return results


def _introspected_before(store, text_key: str) -> list[Memory]:
    """The valid memories an earlier `--auto --text` run stored from this same text."""
    Memory = store.models.Memory
    return list(Memory.select().where(
        Memory.invalidated_at.is_null() & (Memory.source == "introspection")
        & metadata_equals(Memory.metadata, "text_key", text_key)).order_by(Memory.seq))


def introspect_text(app, text: str, *, llm=None, use_llm: bool = True,
                    project: str | None = None) -> list[Memory]:
    """What a free text teaches: self_assessments of the mistakes it tells of, or, for a user's
    correction read without an LLM, what the correction states. Nothing when nothing went
    wrong; the memories of the first run when the same text is introspected again."""
    from ..store import content_hash

    if not (text or "").strip():
        raise UsageError("--text is empty", hint='describe what happened, e.g. --text "null pointer in handler"')
    store = app.store
    cleaned = _redact_fields(app, {"t": strip_context_blocks(text)})["t"]
    text_key = content_hash(f"{project or ''}\n{cleaned}")
    earlier = _introspected_before(store, text_key)
    if earlier:
        return earlier
    stated = []
    with step_llm(app, llm, use_llm) as llm:
        items = _run_llm(llm, [cleaned])
    if items is not None:
        field_sets = [_fields_from_llm(item, None) for item in items]
        confidence, extra = AUTO_CONFIDENCE, {"text_key": text_key}
    else:
        verdict = classify_correction(cleaned)
        field_sets, stated = [], verdict.candidates
        if verdict.kind == "self_assessment":
            what = " ".join(cleaned.split())[:400]
            field_sets = [{"Category": verdict.category, "Context": None, "What_happened": what,
                           "Outcomes": None, "What_caught_it": None, "Estimates_vs_actual": None,
                           "Proposed_update": DEFAULT_UPDATES[verdict.category], "Iteration_count": None}]
        confidence, extra = HEURISTIC_CONFIDENCE, {"text_key": text_key, "source": HEURISTIC}
    field_sets = [_checked_fields(app, fields) for fields in field_sets]
    with store.db.atomic():
        results = [_write_assessment(store, fields, source="introspection", confidence=confidence,
                                     origin="auto-text", project=project, session_id=None, extra=extra)
                   for fields in field_sets]
        results += _write_stated(store, stated, origin="auto-text", project=project, session_id=None,
                                 extra={"text_key": text_key})
    app.memories.embed([r.memory for r in results if r.created])
    return [r.memory for r in results]


def introspect_session(app, session_id: str, *, adapter_name: str | None = None, llm=None,
                       use_llm: bool = True) -> list[Memory]:
    """What a session's transcript after its introspection cursor teaches (see introspect_text).

    The memories and the cursor move in one transaction; when another run moved the cursor
    meanwhile, this one writes nothing (that run covered the slice).
    """
    from ..adapters import resolve_adapter
    from ..cursors import INTROSPECTION, CursorRun

    adapter = resolve_adapter(app.config, session_id, adapter_name)
    store = app.store
    cursor_run = CursorRun(store.models, adapter.name, session_id, INTROSPECTION)
    start = cursor_run.start
    transcript = adapter.read_transcript(session_id, after=start)
    if transcript.is_subagent:
        # A subagent's prompt is its parent agent's, not the user's correction
        # (ARCHITECTURE.md, "Subagents are not users").
        log.info("session %s is a subagent's: not introspected on its own", session_id)
        return []
    project = transcript.project
    context = f"session {session_id}" + (f" ({transcript.title})" if transcript.title else "")
    if project:
        context += f" in {project}"
    field_sets: list[dict] = []
    stated = []
    confidence, extra = AUTO_CONFIDENCE, {"adapter": adapter.name}
    if transcript.messages:
        prepared = prepare_slice(app.config, transcript.messages)
        texts = ["\n".join(line.rendered for line in chunk) for chunk in chunk_lines(prepared.lines)]
        with step_llm(app, llm, use_llm) as llm:
            items = _run_llm(llm, texts) if texts else []
        if items is not None:
            field_sets = [_fields_from_llm(item, context) for item in items]
        else:
            redacted, _ = redact_messages(app.config, transcript.messages)
            grouped = _group_signals(error_signals(redacted))
            field_sets = [_fields_from_signals(c, s, context) for c, s in grouped.items()]
            stated = stated_corrections(redacted)
            confidence, extra = HEURISTIC_CONFIDENCE, {**extra, "source": HEURISTIC}
    field_sets = [_checked_fields(app, fields) for fields in field_sets]
    with store.db.atomic():
        if not cursor_run.unmoved():
            log.info("session %s: another run introspected this slice first", session_id)
            return []
        results = [_write_assessment(store, fields, source="introspection", confidence=confidence,
                                     origin="auto-session", project=project, session_id=session_id,
                                     extra=extra)
                   for fields in field_sets]
        results += _write_stated(store, stated, origin="auto-session", project=project,
                                 session_id=session_id, extra={"adapter": adapter.name})
        cursor_run.advance(transcript.cursor or start, project=project)
    app.memories.embed([r.memory for r in results if r.created])
    return [r.memory for r in results if r.created]


# ---- learn and track-review ---------------------------------------------------------------------


def learn(app, wrong: str, right: str, context: str | None = None, *, project: str | None = None,
          trust: str | None = None) -> list[Memory]:
    """Store a lesson from a wrong → right correction as a procedure memory (global unless
    `project`; `trust`: whose words, by default the user's, who ran `llmem learn`)."""
    if not (wrong or "").strip() or not (right or "").strip():
        raise UsageError("learn needs both --wrong and --right",
                         hint='e.g. --wrong "called wrong function" --right "call correctFunction() instead"')
    fields = _redact_fields(app, {"wrong": wrong.strip(), "right": right.strip(),
                                  "context": (context or "").strip() or None})
    content = f"Do: {fields['right']}\nInstead of: {fields['wrong']}"
    if fields["context"]:
        content += f"\nContext: {fields['context']}"
    summary = " ".join(fields["right"].split())
    summary = summary if len(summary) <= 120 else summary[:119] + "…"
    result = app.store.add(content, "procedure", summary=summary, confidence=MANUAL_CONFIDENCE,
                           source="learn", project=project, metadata={**fields, "origin": "learn"},
                           trust=trust)
    if result.created:
        app.memories.embed([result.memory])
    return [result.memory]


def review_memories(store) -> list[Memory]:
    """Valid self_assessments that track-review stored."""
    Memory = store.models.Memory
    return list(Memory.select().where(
        (Memory.type == "self_assessment") & Memory.invalidated_at.is_null()
        & metadata_equals(Memory.metadata, "origin", TRACK_REVIEW)))


def clean_reviews(app) -> int:
    """Invalidate every track-review memory; return how many."""
    stale = review_memories(app.store)
    for memory in stale:
        app.store.invalidate(memory.id, "cleaned by track-review --clean")
    return len(stale)


def _finding_fields(finding: dict, default_context: str | None, where: str) -> dict:
    if not isinstance(finding, dict):
        raise UsageError(f"{where}: a finding must be a JSON object")
    category = check_category(finding.get("category"))
    location = finding.get("context")
    if not location and finding.get("file"):
        location = str(finding["file"]) + (f":{finding['line']}" if finding.get("line") is not None else "")
    location = location or default_context
    what = (finding.get("what_happened") or finding.get("description") or finding.get("message")
            or finding.get("title") or f"review finding: {TAXONOMY[category]}")
    if finding.get("severity"):
        what = f"[{finding['severity']}] {what}"
    for key in ("what_happened", "description", "message", "context", "proposed_fix", "title"):
        if finding.get(key) is not None and not isinstance(finding[key], str):
            raise UsageError(f"{where}: '{key}' must be a string")
    return {
        "Category": category, "Context": location, "What_happened": what,
        "Outcomes": finding.get("outcomes"), "What_caught_it": "review",
        "Estimates_vs_actual": None,
        "Proposed_update": (finding.get("proposed_fix") or finding.get("proposed_update")
                            or finding.get("suggestion") or DEFAULT_UPDATES[category]),
        "Iteration_count": finding.get("iteration_count"),
    }


def load_findings(path: str | Path, context: str | None) -> list[dict]:
    """Check a findings file whole (a list, or {"findings": [...]}) and return the field sets."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}",
                         hint='expected [{"category": "NULL_SAFETY", "context": "handler.py:42", …}]') from None
    findings = document.get("findings") if isinstance(document, dict) else document
    if not isinstance(findings, list):
        raise UsageError(f"{path}: expected a list of findings or {{\"findings\": [...]}}")
    out, errors = [], []
    for index, finding in enumerate(findings):
        try:
            out.append(_finding_fields(finding, context, f"{path} finding #{index + 1}"))
        except UsageError as exc:
            where = f"finding #{index + 1}"
            message = exc.message if where in exc.message else f"{where}: {exc.message}"
            errors.append(message + (f" ({exc.hint})" if exc.hint else ""))
    if errors:
        raise UsageError("; ".join(errors[:5]) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else ""),
                         hint="nothing was stored; fix the file and run again")
    return out


class ReviewMemories(list):
    """The memories track-review stored; `invalidated` counts those --clean retired."""

    invalidated = 0


def track_review(app, *, single: dict | None = None, findings_file: str | Path | None = None,
                 context: str | None = None, clean: bool = False) -> ReviewMemories:
    """Persist review findings as self_assessments; no findings → one REVIEW_PASSED memory.

    `clean` first invalidates every earlier track-review memory (alone, it stores nothing).
    """
    if single is not None and findings_file is not None:
        raise UsageError("--single and --findings cannot be combined", hint="use one or the other")
    field_sets: list[dict] | None = None
    # Check everything before writing anything (the clean included).
    if single is not None:
        field_sets = [_finding_fields(single, context, "--single")]
    elif findings_file is not None:
        field_sets = load_findings(findings_file, context)
    result = ReviewMemories()
    if clean:
        result.invalidated = clean_reviews(app)
        log.info("track-review: invalidated %d earlier review memories", result.invalidated)
        if field_sets is None:
            return result
    if not field_sets:
        stamp = to_iso(now())
        field_sets = [{"Category": "REVIEW_PASSED", "Context": context or f"review at {stamp}",
                       "What_happened": "Review completed with no findings",
                       "Outcomes": f"clean review ({stamp})", "What_caught_it": "review",
                       "Estimates_vs_actual": None, "Proposed_update": DEFAULT_UPDATES["REVIEW_PASSED"],
                       "Iteration_count": None}]
    reviewed_at = to_iso(now())
    result.extend(store_assessment(app, fields, source="review", confidence=MANUAL_CONFIDENCE,
                                   origin=TRACK_REVIEW, extra={"reviewed_at": reviewed_at})
                  for fields in field_sets)
    return result
