"""The last session-start block built for each project, kept on this machine's disk.

A laptop away from its store's server (or a store that cannot be opened) still starts its
agents' sessions with what llmem last told them about the project: when the SessionStart hook
cannot build the block, it gives the cached one, after the connect timeout, instead of
nothing. The block holds only what this user could read when it was built; the files are
llmem's own (0600, in its data folder, beside the queue), like the store itself.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .paths import default_paths, write_private_text

CACHE_DIR = "context-cache"


def _path(project: str | None) -> Path:
    name = hashlib.blake2b((project or "").encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return default_paths().queue_path.parent / CACHE_DIR / f"{name}.txt"


def remember_block(project: str | None, block: str) -> None:
    """Keep `block` as the project's last session-start block (never fails a hook). Written
    only when it changed: most session starts of a project give the same block, and the
    atomic write's fsync would be paid on each."""
    if last_block(project) == block:
        return
    try:
        write_private_text(_path(project), block)
    except OSError:  # a full or read-only disk: the next session start tries again
        pass


def last_block(project: str | None) -> str | None:
    """The project's last session-start block, if one was kept."""
    try:
        return _path(project).read_text(encoding="utf-8") or None
    except (OSError, UnicodeDecodeError):
        return None
