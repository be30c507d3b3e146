"""The grounded lane: REM over dated notes (`YYYY-MM-DD.md`), previewed or written to
DREAMS.md as reversible diary entries, optionally staging durable candidates as short-term
evidence for deep ranking.

Grounded means every line of an entry quotes its note: the topics (its headings), the terms
several of its lines share, and the explicit statements the no-LLM extractor recognises
(decisions, preferences, "remember …", "always …"), each with its line number. Nothing is
invented, so no model is asked.

`rem-backfill --path DIR` writes one entry per note between `<!-- llmem:grounded RUN DAY … -->`
markers, after everything else in DREAMS.md; a day replayed by an earlier run that was not
rolled back is skipped. `--stage-short-term` adds each candidate's evidence to the store:
the memory (added as source `backfill` unless the same text exists) and one recall of origin
`grounded` on the note's day, marked `staged_by` the run — the evidence deep ranking reads.

The rollbacks remove exactly that: `--rollback RUN_ID` the run's entries and staged evidence,
`--rollback-short-term` only the staged evidence (of every run, or of RUN_ID). Diary entries
of dream runs, the user's text in DREAMS.md, live recalls and memories that live use adopted
since (recalled by a search, promoted, edited) stay as they are.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, time, tzinfo
from pathlib import Path
from typing import Any

from ..capture.heuristics import classify_statement, statement_sentences
from ..errors import UsageError
from ..paths import write_private_text
from ..redact import Redactor
from ..times import now
from .artefacts import REPORTS_DIR, artefact_path, artefact_reason
from .dreams_md import HEAD as DREAMS_HEAD
from .dreams_md import dreams_path
from .journal import Journal, file_hash, find_run, finish_run, start_run
from .narrate import md
from .promote import recall_zone
from .text import distinct_terms

RUN_KIND = "rem-backfill"
DATED_NOTE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.md$")
GROUNDED_SCORE = 0.5  # a note's mention weighs like a fair search match, not a perfect one
GROUNDED_CONFIDENCE = 0.6  # of a memory staged from a note: stated, but long ago
_LIST_MARK = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+(?:\[[ xX]\]\s+)?")
_HEADING = re.compile(r"^\s*#{1,6}\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def entry_marker(run_id: str, day: str, edge: str) -> str:
    return f"<!-- llmem:grounded {run_id} {day} {edge} -->"


_ENTRY = re.compile(r"\n?<!-- llmem:grounded (?P<run>\S+) (?P<day>\d{4}-\d{2}-\d{2}) begin -->\n"
                    r".*?<!-- llmem:grounded (?P=run) (?P=day) end -->\n", re.DOTALL)


@dataclass
class NoteCandidate:
    memory_type: str
    content: str
    line: int
    confidence: float


@dataclass
class GroundedNote:
    day: str
    path: Path
    lines: int = 0
    topics: list[str] = field(default_factory=list)
    themes: list[tuple[str, int]] = field(default_factory=list)
    candidates: list[NoteCandidate] = field(default_factory=list)
    skipped: str | None = None

    def entry(self, run_id: str | None) -> str:
        """The grounded diary entry (with its markers when written by a run)."""
        by = f"`llmem dream rem-backfill` run {run_id}" if run_id else "a preview (nothing written)"
        lines = [f"## Grounded replay: {self.day}", "",
                 f"_From the note {md(self.path.name)} ({self.lines} lines), replayed by {by}; "
                 "every line below quotes it._", ""]
        if self.topics:
            lines.append("- Topics: " + "; ".join(md(t) for t in self.topics))
        if self.themes:
            lines.append("- Themes: " + ", ".join(f"{md(t)} ({n} lines)" for t, n in self.themes))
        if self.candidates:
            lines.append("- Durable candidates:")
            lines += [f"  - {c.memory_type} (line {c.line}): {md(c.content)}" for c in self.candidates]
        else:
            lines.append("- No durable statement: nothing here to stage.")
        text = "\n".join(lines) + "\n"
        if run_id is None:
            return text
        return f"{entry_marker(run_id, self.day, 'begin')}\n{text}{entry_marker(run_id, self.day, 'end')}\n"

    def as_dict(self) -> dict[str, Any]:
        return {"day": self.day, "note": str(self.path), "lines": self.lines, "topics": self.topics,
                "themes": [{"term": t, "lines": n} for t, n in self.themes],
                "candidates": [vars(c) for c in self.candidates], "skipped": self.skipped}


def read_note(day: str, path: Path, redactor: Redactor) -> GroundedNote:
    """One note's grounded reading; secrets are redacted before anything quotes the text."""
    note = GroundedNote(day, path)
    text = redactor.text(path.read_text(encoding="utf-8", errors="replace"))
    reason = artefact_reason(text, None)
    if reason:
        note.skipped = f"it {reason}: dream output is never replayed"
        return note
    terms: Counter[str] = Counter()
    in_fence = False
    for number, raw in enumerate(text.splitlines(), start=1):
        if _FENCE.match(raw):
            in_fence = not in_fence
            continue
        if in_fence or not raw.strip():
            continue
        note.lines += 1
        heading = _HEADING.match(raw)
        if heading:
            note.topics.append(heading.group(1))
            continue
        line = _LIST_MARK.sub("", raw)
        terms.update(distinct_terms(line))
        for sentence in statement_sentences(line):
            found = classify_statement(sentence)
            if found is not None:
                note.candidates.append(NoteCandidate(found.type, found.content, number,
                                                     min(found.confidence, GROUNDED_CONFIDENCE)))
    note.topics = note.topics[:6]
    note.themes = [(t, n) for t, n in terms.most_common(6) if n >= 2]
    return note


def read_notes(folder: Path, redactor: Redactor) -> tuple[list[GroundedNote], list[str]]:
    """The dated notes directly in `folder`, oldest first, and the names of the files left out."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UsageError(f"--path {folder} is not a folder", hint="give the folder that holds YYYY-MM-DD.md notes")
    if REPORTS_DIR in folder.resolve().parts:
        raise UsageError(f"{folder} holds dream phase reports, which are never replayed",
                         hint="give the folder of your own dated notes")
    notes, ignored = [], []
    for path in sorted(folder.iterdir()):
        match = DATED_NOTE.match(path.name)
        if not path.is_file() or not match or artefact_path(path):
            if path.is_file():
                ignored.append(path.name)
            continue
        try:
            date.fromisoformat(match.group(1))
        except ValueError:
            ignored.append(path.name)
            continue
        notes.append(read_note(match.group(1), path, redactor))
    return notes, ignored


def replayed_days(text: str | None) -> dict[str, str]:
    """day → the run whose grounded entry for it is in DREAMS.md."""
    return {m.group("day"): m.group("run") for m in _ENTRY.finditer(text or "")}


def _note_time(day: str, zone: tzinfo | None) -> float:
    """Noon of the note's day: the time its staged evidence carries."""
    moment = datetime.combine(date.fromisoformat(day), time(12))
    return (moment.replace(tzinfo=zone) if zone else moment.astimezone()).timestamp()


@dataclass
class BackfillOutcome:
    run_id: str | None
    path: str
    dreams_md: str
    notes: list[GroundedNote]
    ignored: list[str]
    written: list[str] = field(default_factory=list)  # days given an entry
    already: dict[str, str] = field(default_factory=dict)  # day → the earlier run that replayed it
    staged_memories: int = 0  # memories added by staging
    staged_recalls: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "path": self.path, "dreams_md": self.dreams_md,
                "notes": [n.as_dict() for n in self.notes], "ignored": self.ignored,
                "written": self.written, "already_replayed": self.already,
                "staged": {"memories": self.staged_memories, "recalls": self.staged_recalls}}


def preview(config, folder: Path) -> BackfillOutcome:
    notes, ignored = read_notes(folder, Redactor.from_section(config.redaction))
    return BackfillOutcome(None, str(folder), str(dreams_path(config)), notes, ignored)


def run_rem_backfill(store, config, folder: Path, *, stage: bool) -> BackfillOutcome:
    """Write grounded entries for the notes in `folder` (and stage their candidates), journaled."""
    notes, ignored = read_notes(folder, store.redactor)
    path = dreams_path(config)
    old = path.read_text(encoding="utf-8") if path.exists() else None
    outcome = BackfillOutcome(None, str(folder), str(path), notes, ignored, already=replayed_days(old))
    fresh = [n for n in notes if n.skipped is None and n.day not in outcome.already]
    run = start_run(store, RUN_KIND, ["rem"])
    outcome.run_id = run.id
    journal = Journal(store, run)
    try:
        if fresh:
            base = old if old else DREAMS_HEAD
            text = base + ("" if base.endswith("\n") else "\n") + "".join("\n" + n.entry(run.id) for n in fresh)
            journal.write_file("rem", "grounded_diary", path, text)
            outcome.written = [n.day for n in fresh]
        if stage:
            _stage(store, config, journal, fresh, outcome)
    except Exception as exc:
        finish_run(store, run, outcome.as_dict(), error=f"{exc.__class__.__name__}: {exc}")
        raise
    finish_run(store, run, outcome.as_dict())
    return outcome


def _stage(store, config, journal: Journal, notes: list[GroundedNote], outcome: BackfillOutcome) -> None:
    zone = recall_zone(config.dream)
    RecallEvent = store.models.RecallEvent
    with store.db.atomic():
        for note in notes:
            at = _note_time(note.day, zone)
            for candidate in note.candidates:
                # Created now, not on the note's day: decay must not retire it before deep
                # has weighed its evidence (which carries the note's day).
                added = store.add(candidate.content, candidate.memory_type, confidence=candidate.confidence,
                                  source="backfill",
                                  metadata={"grounded": {"note": note.path.name, "line": candidate.line,
                                                         "day": note.day},
                                            "staged_by": journal.run.id})
                if added.created:
                    journal.create("rem", "stage", added.memory)
                    outcome.staged_memories += 1
                RecallEvent.create(memory=added.memory.id, query_hash=f"grounded:{note.day}", rank=1,
                                   score=GROUNDED_SCORE, origin="grounded", created_at=at,
                                   staged_by=journal.run.id)
                journal.report("rem", "stage_recall", added.memory.id, {"day": note.day, "line": candidate.line})
                outcome.staged_recalls += 1


@dataclass
class RollbackOutcome:
    runs: list[str]
    short_term_only: bool
    recalls_removed: int = 0
    memories_removed: int = 0
    memories_kept: dict[str, str] = field(default_factory=dict)  # memory_id → why live use keeps it
    entries_removed: int = 0
    dreams_md: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _backfill_runs(store, run_id: str | None, short_term_only: bool) -> list:
    if run_id:
        run = find_run(store, run_id)
        if run.kind != RUN_KIND:
            raise UsageError(f"run {run.id} is a {run.kind} run, not a grounded backfill",
                             hint=f"use `llmem dream undo {run.id}` for dream and promote runs")
        if run.status == "undone":
            raise UsageError(f"grounded backfill {run.id} was already rolled back")
        return [run]
    if not short_term_only:
        raise UsageError("--rollback needs the RUN_ID of a grounded backfill",
                         hint="`llmem dream rem-backfill --json` printed it; or --rollback-short-term for all staged evidence")
    DreamRun = store.models.DreamRun
    return list(DreamRun.select().where((DreamRun.kind == RUN_KIND) & (DreamRun.status == "done"))
                .order_by(DreamRun.started_at))


def rollback(store, config, run_id: str | None, *, short_term_only: bool) -> RollbackOutcome:
    """Remove what grounded backfills staged (and, unless short_term_only, their entries)."""
    runs = _backfill_runs(store, run_id, short_term_only)
    outcome = RollbackOutcome([r.id for r in runs], short_term_only)
    Memory, RecallEvent, DreamAction = store.models.Memory, store.models.RecallEvent, store.models.DreamAction
    files = []
    with store.db.atomic():
        for run in runs:
            outcome.recalls_removed += RecallEvent.delete().where(RecallEvent.staged_by == run.id).execute()
            created = (DreamAction.select(DreamAction.memory_id, DreamAction.after)
                       .where((DreamAction.run == run.id) & (DreamAction.op == "create")).tuples())
            for memory_id, after in created:
                memory = Memory.get_or_none(Memory.id == memory_id)
                if memory is None:
                    continue
                why = _adopted(store, memory, (after or {}).get("content_hash"))
                if why:
                    outcome.memories_kept[memory_id] = why
                    continue
                store.delete(memory_id)
                outcome.memories_removed += 1
            files += list(DreamAction.select(DreamAction.before, DreamAction.after).where(
                (DreamAction.run == run.id) & (DreamAction.op == "file")).tuples())
            summary = dict(run.summary or {})
            if short_term_only:
                summary["short_term_rolled_back_at"] = now()
            else:
                run.status, run.undone_at = "undone", now()
            summary["rollback"] = outcome.as_dict()
            run.summary = summary
            run.save()
    if not short_term_only:
        for before, after in files:
            outcome.entries_removed += _remove_entries(Path(after["path"]), before.get("text"), after["sha256"],
                                                       {r.id for r in runs})
            outcome.dreams_md = after["path"]
    return outcome


def _adopted(store, memory, staged_hash: str | None) -> str | None:
    """Why a memory a backfill staged now belongs to live use (None: it can go)."""
    if memory.promoted_at:
        return "promoted since"
    if memory.invalidated_at:
        return "invalidated since (a dream merged or retired it)"
    if staged_hash and memory.content_hash != staged_hash:
        return "edited since"
    RecallEvent, Relation = store.models.RecallEvent, store.models.Relation
    if RecallEvent.select().where(RecallEvent.memory == memory.id).exists():
        return "recalled by live use since"
    if Relation.select().where((Relation.source == memory.id) | (Relation.target == memory.id)).exists():
        return "linked to other memories since"
    return None


def _remove_entries(path: Path, before: str | None, written_hash: str, run_ids: set[str]) -> int:
    """Take a run's entries out of DREAMS.md. Untouched since: the file as it was, exactly;
    else only the marked entries go, every other byte stays."""
    if not path.exists():
        return 0
    current = path.read_text(encoding="utf-8")
    removed = sum(1 for m in _ENTRY.finditer(current) if m.group("run") in run_ids)
    if file_hash(current) == written_hash:
        if before is None:
            path.unlink()
        else:
            write_private_text(path, before)
        return removed
    text = _ENTRY.sub(lambda m: "" if m.group("run") in run_ids else m.group(0), current)
    if text != current:
        write_private_text(path, text)
    return removed
