"""Text on one line: whitespace collapsed and cut with an ellipsis, and an exception so told.

The bottom layer's only text helpers, so that every log line, table cell and reply cuts the
same way. Redaction is the caller's (it runs on the text as given, before the cut)."""

from __future__ import annotations


def one_line(text: str | None, width: int | None = None) -> str:
    """`text` with every run of whitespace (newlines too) folded into one space, cut to `width`
    characters with "…" as the last of them when it is longer."""
    line = " ".join((text or "").split())
    if width is None or len(line) <= width:
        return line
    return line[: width - 1] + "…"


def error_line(exc: BaseException, width: int | None = None, *, hint: bool = False) -> str:
    """An exception as one line: an llmem error's own message (with its hint when `hint`), any
    other as `Class: text` (the class alone when it says nothing)."""
    message = getattr(exc, "message", None)  # LlmemError's; duck-typed, errors is a sibling
    if message is not None:
        said = message + (f" (hint: {exc.hint})" if hint and getattr(exc, "hint", None) else "")
    else:
        said = f"{exc.__class__.__name__}: {exc}" if str(exc).strip() else exc.__class__.__name__
    return one_line(said, width)
