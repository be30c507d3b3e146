"""What a dream sweep found and did: the one value the sweep fills and the diary and report read.

It has its own module so that the sweep imports the diary and the report, and they import
nothing of the sweep's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .deep import DeepResult
from .journal import Actions
from .light import LightResult
from .rem import RemResult

SUMMARY_PAIRS = 5000  # light candidates kept in the run summary for a later `--phase deep`


@dataclass
class DreamOutcome:
    """What a sweep found and did (or, for a preview, would do)."""

    applied: bool
    phases: list[str]
    started_at: float
    run_id: str | None = None
    finished_at: float | None = None
    light: LightResult | None = None
    rem: RemResult | None = None
    deep: DeepResult | None = None
    actions: Actions = field(default_factory=Actions)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    confidence_before: list[float] = field(default_factory=list)
    confidence_after: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    merge_results: list[dict[str, Any]] = field(default_factory=list)
    type_counts: dict[str, int] = field(default_factory=dict)
    # Per phase: the narrative written after it and by whom (model NAME, template, none).
    narratives: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def has_news(self) -> bool:
        """Whether the run changed or found anything (else the diary gets no entry)."""
        light = self.light
        found = light is not None and bool(light.near_duplicates or light.exact_duplicates or light.auto_links)
        return bool(self.actions) or found

    def action_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {phase: {} for phase in self.phases}
        for (phase, kind), count in self.actions.kind_counts().items():
            bucket = out.setdefault(phase, {})
            bucket[kind] = bucket.get(kind, 0) + count
        return out

    def phase_hits(self) -> dict[str, int]:
        hits: dict[str, int] = {}
        for source in (self.light, self.rem):
            if source is not None:
                for memory_id, count in source.hits().items():
                    hits[memory_id] = hits.get(memory_id, 0) + count
        return hits

    def summary(self) -> dict[str, Any]:
        """What the run row keeps (and `--json` prints)."""
        out: dict[str, Any] = {
            "run_id": self.run_id, "applied": self.applied, "phases": self.phases,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "counts": self.action_counts(), "phase_seconds": self.phase_seconds,
            "notes": self.notes,
        }
        if self.light is not None:
            out["light"] = self.light.as_dict(limit=SUMMARY_PAIRS)
        if self.rem is not None:
            out["rem"] = self.rem.as_dict()
        if self.deep is not None:
            out["deep"] = {"counts": self.deep.counts(), "held_back": self.deep.held,
                           "promoted": [c.memory_id for c in self.deep.promote]}
        out["phase_hits"] = self.phase_hits()
        if self.merge_results:
            out["merges"] = self.merge_results
        if self.narratives:
            out["narratives"] = self.narratives
        return out
