"""Dream: background consolidation of the memory store.

light  near-duplicates, exact duplicates, auto-link candidates (reads only)
REM    type counts, themes, clusters, behavioural insights, calibration, stale procedures
deep   merge, decay, boost, invalidate, link, promote
Every applied write is journaled with its before-image; `undo_run` restores a run.
"""

from .journal import PHASES, Action, undo_run
from .lock import DreamLock, DreamLocked
from .outcome import DreamOutcome
from .status import dream_status
from .sweep import run_dream

__all__ = ["PHASES", "Action", "DreamLock", "DreamLocked", "DreamOutcome", "dream_status",
           "run_dream", "undo_run"]
