"""The text a memory's vector is made from, and the hash that tells a stale vector.

Derived from the memory's columns alone, like its FTS hints (fts.py): the store stamps
`memory.embed_hash` on every write, a migration stamps old rows, and the embedding code
compares it with the hash each vector records.
"""

from __future__ import annotations

import hashlib

from .fts import metadata_text


def text_to_embed(content: str, summary: str | None, metadata: dict | None) -> str:
    """What is embedded for a memory: its content, with the summary when it adds words and
    its descriptive metadata (who said it, which file) in front, as FTS indexes them too."""
    text = content
    if summary and summary.strip() and summary not in content:
        text = f"{summary}\n{text}"
    described = metadata_text(metadata)
    return f"{described}: {text}" if described else text


def text_hash(text: str) -> str:
    """The hash an embedding records of the exact text it was made from."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
