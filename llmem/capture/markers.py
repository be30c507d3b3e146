"""The `<llmem-context>` block's markers and the token estimate its budget is counted in.

Context writes the block into an agent's session; extraction and introspection must cut it
out of the transcripts they read, so llmem never re-learns what it injected. Both sides
take the markers from here, and extraction budgets its slices in the same tokens.
"""

from __future__ import annotations

import re

# The estimate lives at the bottom of the layers (the LLM's daily budget counts in it too).
from ..tokens import CHARS_PER_TOKEN, estimate_tokens  # noqa: F401 (re-exported)

OPEN_MARKER = "<llmem-context>"
CLOSE_MARKER = "</llmem-context>"
# Case-insensitive and with attributes: an agent may echo the block back altered.
_BLOCK_RE = re.compile(r"<llmem-context\b[^>]*>.*?(?:</llmem-context>|\Z)", re.DOTALL | re.IGNORECASE)
# A lone marker inside a memory's text would close the block early (or open a nested one).
MARKER_RE = re.compile(r"</?\s*llmem-context\s*>", re.IGNORECASE)


def strip_context_blocks(text: str) -> str:
    """Remove `<llmem-context>` blocks (an unclosed one runs to the end of the text)."""
    if not text or "llmem-context" not in text.lower():
        return text or ""
    return _BLOCK_RE.sub("", text)
