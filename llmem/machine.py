"""Which machine this llmem runs on, for a store that several machines share.

A session's transcript lives on the machine that ran it, so only that machine's worker can
extract it: its events, the watcher's per-session state, the worker's heartbeat and a Redis
queue's name are keyed by the machine (pipeline/events.py, db/watch_sessions.py,
workers/app.py), and two machines on one store never take each other's work.

The key is an id made once and kept in llmem's data folder (beside the queue, so each
LLMEM_HOME is its own machine), not the hostname: two boxes may share a name, and a laptop's
changes with the network.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
from pathlib import Path

from .paths import default_paths

MACHINE_FILE = "machine-id"
_ids: dict[Path, str] = {}


def machine_id() -> str:
    """This machine's id (16 hex digits), made on first use."""
    path = default_paths().queue_path.parent / MACHINE_FILE
    known = _ids.get(path)
    if known is None:
        known = _ids[path] = _read_or_make(path)
    return known


def _read_or_make(path: Path) -> str:
    found = _read(path)
    if found:
        return found
    made = secrets.token_hex(8)
    temp = path.with_name(f".{MACHINE_FILE}.{os.getpid()}.{made}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(made + "\n", encoding="ascii")
        os.chmod(temp, 0o600)
        # A hard link appears whole or not at all: of two processes starting at once, one
        # links its id and the other finds the file there and reads it.
        os.link(temp, path)
    except FileExistsError:
        return _read(path) or made
    except OSError:
        # A read-only or full disk: an id derived from what names this home on this host,
        # the same on every run until the file can be written.
        return hashlib.blake2b(f"{socket.gethostname()}\0{path}".encode(), digest_size=8).hexdigest()
    finally:
        temp.unlink(missing_ok=True)
    return made


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if len(text) == 16 and all(c in "0123456789abcdef" for c in text) else None
