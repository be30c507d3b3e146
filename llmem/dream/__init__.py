"""Dream: background consolidation of the memory store.

light  near-duplicates, exact duplicates, auto-link candidates (reads only)
REM    type counts, themes, clusters, behavioural insights, calibration, stale procedures
deep   merge, decay, boost, invalidate, link, promote
Every applied write is journaled with its before-image; `undo_run` restores a run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Each name is imported from its module on first use (PEP 562): `llmem queue`, a hook or the
# worker that only needs dream/lock.py no longer imports the phases, the extraction
# heuristics and numpy with it (~0.4 s of CPU in a fresh process).
_WHERE = {"PHASES": "journal", "Action": "journal", "undo_run": "journal", "DreamLock": "lock",
          "DreamLocked": "lock", "DreamOutcome": "outcome", "dream_status": "status",
          "run_dream": "sweep"}

__all__ = ["PHASES", "Action", "DreamLock", "DreamLocked", "DreamOutcome", "dream_status",
           "run_dream", "undo_run"]

if TYPE_CHECKING:
    from .journal import PHASES, Action, undo_run
    from .lock import DreamLock, DreamLocked
    from .outcome import DreamOutcome
    from .status import dream_status
    from .sweep import run_dream


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
