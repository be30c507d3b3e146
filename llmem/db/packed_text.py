"""An episode's text kept deflated in the SQLite file, read back as text by every reader.

Episodes are most of what a store holds (capture/episodes.py), and English prose deflates to
about half (LoCoMo dev 1.96x, the coding set 1.82x): an episode's `memory.content` is stored
as a BLOB, MAGIC followed by raw deflate of its UTF-8 (Store.add_many, update, insert_rows),
while typed memories stay plain TEXT (a sentence or two: deflate gains nothing under
MIN_PACKED_BYTES, and they stay readable to any SQLite tool). PostgreSQL keeps plain text
(TOAST compresses long values there already).

Who sees what:
- peewee reads: the Memory.content field (models.StoredText) unpacks;
- raw SQL on an llmem connection: the column's declared type is PACKED_TEXT (migration 0024),
  and the connection converts that type (PARSE_DECLTYPES, `register`), so `SELECT content`
  returns text however it was written; an expression over the column (`content || ''`,
  LENGTH) sees the stored value;
- the FTS index: its triggers index `llmem_text(content)`, this module's SQL function, so the
  tokens are the text's; a connection without the function cannot write memory rows ("no such
  function: llmem_text"), which keeps the index and the rows from drifting apart (`connect`
  gives a plain sqlite3 connection the function). FTS5's external content is the view
  memory_fts_text, so a 'rebuild' or a snippet reads the text too.
MAGIC starts with 0xFF, which no UTF-8 text holds, so a value is told apart by its bytes alone
(a converter receives bytes for TEXT and BLOB alike).
"""

from __future__ import annotations

import functools
import zlib

MAGIC = b"\xff\x01"  # 0xFF: never in UTF-8; 0x01: the format (raw deflate, no dictionary)
DECLARED_TYPE = "PACKED_TEXT"  # holds "TEXT": the column keeps TEXT affinity
SQL_FUNCTION = "llmem_text"
# Shorter texts gain too little beside the two bytes of MAGIC and deflate's block header.
MIN_PACKED_BYTES = 200
LEVEL = 6  # zlib's default: level 9 gave the same sizes on LoCoMo dev and the coding set, slower


class PackedText(str):
    """Text a SQLite store keeps deflated (an episode's content); a str everywhere else."""


def pack(text: str) -> bytes | str:
    """The stored value of `text`: MAGIC + raw deflate when that is smaller, else the text."""
    data = text.encode("utf-8")
    if len(data) < MIN_PACKED_BYTES:
        return text
    packed = MAGIC + zlib.compress(data, LEVEL, wbits=-15)
    return packed if len(packed) < len(data) else text


def unpack(value):
    """The text of a stored value (str, bytes of either kind, or None); a packed one comes
    back as PackedText, so writing it again through the model keeps it packed."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if data.startswith(MAGIC):
            return _inflated(data)
        return data.decode("utf-8")
    return value


@functools.lru_cache(maxsize=2048)
def _inflated(data: bytes) -> PackedText:
    # ~7 us of CPU per episode (zlib's inflate set-up, mostly), where a plain text costs 0.2:
    # a search reads each candidate's text for the rerank and again for the hits it returns,
    # and a long-lived process (MCP, viewer, worker) the same episodes search after search.
    # The key is the packed bytes themselves (~650 B an episode), so a changed text is a miss:
    # ~4 MB at most.
    return PackedText(zlib.decompress(memoryview(data)[len(MAGIC):], wbits=-15).decode("utf-8"))


def _convert(data: bytes):
    """The converter of PACKED_TEXT columns: text, or the bytes themselves when they are not
    UTF-8 (a damaged page: db/queries.readable_memory_rows decodes those with U+FFFD)."""
    try:
        return unpack(data)
    except (UnicodeDecodeError, zlib.error):
        return data


def sql_text(value):
    """llmem_text(x) in SQL: the text of a stored content value."""
    try:
        return unpack(value)
    except (UnicodeDecodeError, zlib.error):
        return value if isinstance(value, str) else None


_REGISTERED: set[int] = set()


def register_converter(module) -> None:
    """Teach a SQLite DB-API module (the stdlib's or a bundled one) the PACKED_TEXT type."""
    if id(module) not in _REGISTERED and hasattr(module, "register_converter"):
        module.register_converter(DECLARED_TYPE, _convert)
        _REGISTERED.add(id(module))


def register_function(conn) -> None:
    """Give a raw DB-API connection llmem_text (to write memory rows outside llmem's own
    connections, e.g. a benchmark's copy of a store)."""
    conn.create_function(SQL_FUNCTION, 1, sql_text, deterministic=True)


def connect(database, **kwargs):
    """A stdlib sqlite3 connection to a store that reads packed text back as text and can
    write memory rows (benchmarks and tests that read the file beside llmem)."""
    import sqlite3

    register_converter(sqlite3)
    conn = sqlite3.connect(database, detect_types=sqlite3.PARSE_DECLTYPES, **kwargs)
    register_function(conn)
    return conn
