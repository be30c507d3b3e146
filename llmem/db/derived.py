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
    return described_text_to_embed(content, summary, metadata_text(metadata))


def described_text_to_embed(content: str, summary: str | None, described: str) -> str:
    """text_to_embed, given the metadata's descriptive text (metadata_text)."""
    text = content
    if summary and summary.strip() and summary not in content:
        text = f"{summary}\n{text}"
    return f"{described}: {text}" if described else text


# Hex characters kept of a sha256 (64 bits). The hashes of a memory are compared for equality
# only (the dedupe key within a project, a vector's staleness), and each is stored in the
# memory row, its index, the embedding row and the journal: the whole 64 were ~0.3x the text
# a store holds (migration 0023 / pg0009 cut the older ones to this length).
HASH_CHARS = 16


def short_hash(text: str) -> str:
    """The first HASH_CHARS hex characters of the sha256 of `text`."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_CHARS]


def stored_hash(value: str | None) -> str | None:
    """A hash as the store keeps it: one written before migration 0023 (an old export file)
    is cut to HASH_CHARS, so it still matches the memory it was made for."""
    return value[:HASH_CHARS] if isinstance(value, str) else value


def text_hash(text: str) -> str:
    """The hash an embedding records of the exact text it was made from."""
    return short_hash(text)
