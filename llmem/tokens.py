"""The token estimate every budget counts in, when no tokenizer reports the real number.

A unit of its own at the bottom of the layers: context and extraction budget their text in
it, and the chat LLM's daily token budget counts in it too when an agent CLI reports no usage.
"""

from __future__ import annotations

import math

CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """The token estimate used for every budget (no tokenizer dependency): characters / 4."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)
