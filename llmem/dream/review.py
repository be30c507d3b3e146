"""Review of the proposed changes: the entries REM writes into proposed-changes.md, each with
a stable id, and the human's accept/reject decisions, recorded in the store.

The seeds make Tier 2 insights and Tier 3 `[SKILL PATCH]` entries human-reviewed by design:
a decision is a record of what the person said (what, when, who and from where), never an
action. Accepting a skill patch changes no skill and no file; the person applies it by hand.

An entry's id comes from the marker comment REM writes under its heading
(`<!-- llmem:skill-patch KEY -->` → `skill-patch:KEY`), so it survives edits to the text and
reordering of the file. A section someone wrote by hand has no marker; its id is taken from
its heading, so it stays the same while the heading does.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..db.settings import get_setting, set_setting
from ..errors import NotFound, UsageError
from ..times import now

DECISIONS_KEY = "dream_review_decisions"  # setting row: a JSON list of decisions, oldest first
DECISIONS = ("accepted", "rejected")
MAX_NOTE = 2000  # characters of a reviewer's note

_MARKER = re.compile(r"<!--\s*llmem:(insight|skill-patch)\s+(\S+)\s*-->")
_KIND = {"insight": "insight", "skill-patch": "skill_patch"}


@dataclass
class Decision:
    proposal_id: str
    decision: str  # accepted | rejected
    at: float
    by: str  # who and where: "llmem ui on 127.0.0.1", "cli alice@laptop"
    sha256: str  # of the entry's text when it was decided
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Proposal:
    id: str
    kind: str  # insight | skill_patch | note (a section without llmem's marker)
    key: str
    title: str
    text: str  # the whole section, heading included
    decision: Decision | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def changed_since_decision(self) -> bool:
        """The entry was edited after it was decided (the decision was about other words)."""
        return self.decision is not None and self.decision.sha256 != self.sha256

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "key": self.key, "title": self.title,
                "text": self.text, "sha256": self.sha256,
                "decision": self.decision.as_dict() if self.decision else None,
                "changed_since_decision": self.changed_since_decision}


def parse_proposals(text: str) -> list[Proposal]:
    """The `## ` sections of proposed-changes.md, in file order (the preamble is not one)."""
    sections: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    out: list[Proposal] = []
    seen: dict[str, int] = {}
    for lines in sections:
        body = "\n".join(lines).strip("\n") + "\n"
        title = lines[0][3:].strip()
        marker = _MARKER.search(body)
        if marker:
            kind, key = _KIND[marker.group(1)], marker.group(2)
            proposal_id = f"{marker.group(1)}:{key}"
        else:
            kind = "note"
            key = hashlib.sha256(title.encode("utf-8")).hexdigest()[:12]
            proposal_id = f"note:{key}"
        # The same marker twice (a section pasted again by hand) must still give distinct ids.
        seen[proposal_id] = seen.get(proposal_id, 0) + 1
        if seen[proposal_id] > 1:
            proposal_id = f"{proposal_id}#{seen[proposal_id]}"
        out.append(Proposal(proposal_id, kind, key, title, body))
    return out


def decisions(db) -> list[Decision]:
    """Every decision recorded, oldest first."""
    raw = get_setting(db, DECISIONS_KEY)
    try:
        rows = json.loads(raw) if raw else []
    except ValueError:
        rows = []
    fields = Decision.__dataclass_fields__
    return [Decision(**{k: v for k, v in row.items() if k in fields}) for row in rows
            if isinstance(row, dict) and fields.keys() - {"note"} <= row.keys()]


def list_proposals(db, path: Path) -> list[Proposal]:
    """The entries of the proposed-changes file at `path`, each with its latest decision."""
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    proposals = parse_proposals(text)
    latest = {d.proposal_id: d for d in decisions(db)}
    for proposal in proposals:
        proposal.decision = latest.get(proposal.id)
    return proposals


def find_proposal(db, path: Path, proposal_id: str) -> Proposal:
    for proposal in list_proposals(db, path):
        if proposal.id == proposal_id:
            return proposal
    raise NotFound(f"no proposed change {proposal_id!r} in {path}",
                   hint="`llmem dream review` lists them with their ids")


def reviewer(via: str) -> str:
    """Who decides and where: the local login and host, and the way in (`cli`, `llmem ui`)."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name for this uid (a container)
        user = "unknown"
    return f"{via} {user}@{socket.gethostname()}"


def record_decision(store, path: Path, proposal_id: str, decision: str, *, by: str,
                    note: str = "", at: float | None = None) -> Decision:
    """Record that a person accepted or rejected a proposed change. Nothing is applied."""
    if decision not in DECISIONS:
        raise UsageError(f"decision {decision!r} is not one of {', '.join(DECISIONS)}")
    proposal = find_proposal(store.db, path, proposal_id)
    made = Decision(proposal.id, decision, at if at is not None else now(), by[:200],
                    proposal.sha256, (note or "")[:MAX_NOTE])
    # Read and write in one IMMEDIATE transaction: two reviewers never lose each other's row.
    with store.db.atomic():
        rows = [d.as_dict() for d in decisions(store.db)]
        rows.append(made.as_dict())
        set_setting(store.db, DECISIONS_KEY, json.dumps(rows, ensure_ascii=False, sort_keys=True))
    return made
