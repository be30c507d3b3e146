"""Word-level helpers shared by the phases: distinct terms, categories of self_assessments,
one-line excerpts for the diary and the report."""

from __future__ import annotations

import re

from ..db.fts import STOPWORDS
from ..redact import redact
from ..text import one_line as _one_line

_TERM = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*[A-Za-z0-9]|\d+(?:\.\d+)+|[^\W\d_]{3,}", re.UNICODE)
_CATEGORY_LINE = re.compile(r"^[\s*_\-#>]*category[\s*_]*:[\s*_`]*([A-Za-z_]+)", re.IGNORECASE | re.MULTILINE)
_FIELD_LINE = re.compile(r"^[\s*_\-#>]*([A-Za-z_ ]{3,30}?)[\s*_]*:[\s*_]*(.*)$", re.MULTILINE)

NINE_FIELDS = ("Category", "Context", "What_happened", "Outcomes", "What_caught_it",
               "Estimates_vs_actual", "Recurring", "Proposed_update", "Iteration_count")


def distinct_terms(text: str) -> set[str]:
    """The content-bearing terms of a text (lowercased; identifiers, paths and numbers kept)."""
    terms = set()
    for match in _TERM.findall(text or ""):
        term = match.lower().strip("./-_")
        if len(term) < 3 or term in STOPWORDS:
            continue
        terms.add(term)
    return terms


def one_line(text: str | None, width: int) -> str:
    """The text on one line (whitespace collapsed), cut to `width` characters with an ellipsis.

    Redacted first, on the text as stored: a store an older llmem wrote may hold a secret its
    patterns missed, and a secret cut or joined onto one line no longer matches its pattern."""
    return _one_line(redact(text or "").text, width)


def category_of(content: str, metadata: dict | None) -> str | None:
    """A self_assessment's taxonomy category: metadata `category`, else a `Category:` line."""
    value = (metadata or {}).get("category")
    if isinstance(value, str) and value.strip():
        return value.strip().upper()
    match = _CATEGORY_LINE.search(content or "")
    return match.group(1).upper() if match else None


def assessment_fields(content: str, metadata: dict | None) -> dict[str, str]:
    """The nine fields of a self_assessment, from metadata first, then `Field: value` lines."""
    wanted = {f.lower(): f for f in NINE_FIELDS}
    fields: dict[str, str] = {}
    for match in _FIELD_LINE.finditer(content or ""):
        key = match.group(1).strip().replace(" ", "_").lower()
        if key in wanted and match.group(2).strip():
            fields.setdefault(wanted[key], match.group(2).strip().strip("`*_ "))
    for key, value in (metadata or {}).items():
        name = wanted.get(str(key).lower())
        if name and value not in (None, ""):
            fields[name] = str(value)
    return fields


def iteration_count(fields: dict[str, str]) -> int | None:
    match = re.search(r"\d+", fields.get("Iteration_count", ""))
    return int(match.group()) if match else None
