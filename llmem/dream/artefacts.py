"""Dream artefacts: the diary, DREAMS.md, the phase reports, the HTML report and the grounded
backfill's diary entries are written for people and are never promotion material.

A memory is an artefact when its text carries llmem's own markers or headings from those
files (an agent that read DREAMS.md and had the session extracted, an `llmem add` pasted from
the diary), or when its metadata says it came from one of those files. Only grounded memory
snippets — what a user or session actually stated — may reach MEMORY.md.
"""

from __future__ import annotations

import re
from pathlib import PurePath

ARTEFACT_FILES = frozenset({"dreams.md", "dream-diary.md", "proposed-changes.md", "memory.md"})
REPORTS_DIR = "dreaming"
# Metadata keys that name the file a memory's text was taken from.
_PATH_KEYS = ("path", "file", "source_path", "source_file", "note")

_MARKERS = re.compile(r"<!--\s*llmem:|<llmem-context>|llmem dream report", re.IGNORECASE)
_HEADINGS = re.compile(
    r"^\s*#{1,3}\s*(?:dream diary\b|dreams\s*$|dream (?:run|preview)\b|light sleep\b|rem sleep\b"
    r"|deep sleep\b|grounded replay\b|llmem dream report\b)", re.IGNORECASE | re.MULTILINE)


def artefact_path(path: str | PurePath) -> bool:
    """Whether a file is a dream artefact: DREAMS.md, the diary, a phase report, an HTML report."""
    parts = PurePath(str(path)).parts
    if not parts:
        return False
    name = parts[-1].lower()
    return name in ARTEFACT_FILES or REPORTS_DIR in parts[:-1] or name.endswith((".html", ".htm"))


def artefact_reason(content: str | None, metadata: dict | None) -> str | None:
    """Why a memory is diary or report text (None: it is a memory snippet)."""
    meta = metadata or {}
    if meta.get("dream_artefact"):
        return "marked as a dream artefact"
    for key in _PATH_KEYS:
        value = meta.get(key)
        if isinstance(value, str) and value and artefact_path(value):
            return f"taken from {PurePath(value).name}, a dream artefact"
    grounded = meta.get("grounded")
    if isinstance(grounded, dict) and artefact_path(str(grounded.get("note") or "")):
        return "staged from a dream artefact"
    text = content or ""
    if _MARKERS.search(text):
        return "holds llmem's own output markers"
    if _HEADINGS.search(text):
        return "holds a dream diary or report heading"
    return None
