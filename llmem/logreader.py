"""Log files read: the entries of every log file llmem writes (logconfig.py), merged, for
`llmem logs` (all, or followed) and the viewer's Queue page (the latest, and a live tail)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .redact import redact

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# The head of a record's first line (logconfig.FORMAT); a line without it continues the record
# above (a traceback).
_HEAD = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)\S* (?:\d+ )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def log_files(config) -> list[Path]:
    """The current log files, oldest modification first."""
    folder = config.log_dir
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime)


@dataclass
class LogEntry:
    """One logged record: its first line and the lines that continue it (a traceback)."""

    time: str
    level: str
    file: str
    lines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"time": self.time, "level": self.level, "file": self.file, "text": "\n".join(self.lines)}


class EntryReader:
    """Turns the lines of one log file into entries, across reads (for `logs --follow`)."""

    def __init__(self, path: Path):
        self.path = path
        self.current: LogEntry | None = None

    def feed(self, lines) -> list[LogEntry]:
        """The entries completed by these lines; the last one stays open for what follows."""
        done = []
        for line in lines:
            # A file an older llmem wrote may hold a secret its records were not redacted of.
            line = redact(line.rstrip("\n")).text
            head = _HEAD.match(line)
            if head:
                if self.current is not None:
                    done.append(self.current)
                self.current = LogEntry(head.group(1).replace(" ", "T"), head.group(2), self.path.name, [line])
            elif self.current is not None:
                self.current.lines.append(line)
            elif line.strip():  # text before any record (a file cut by rotation): show it as is
                done.append(LogEntry("", "", self.path.name, [line]))
        return done

    def flush(self) -> list[LogEntry]:
        done, self.current = ([self.current] if self.current else []), None
        return done


def at_least(entry: LogEntry, level: str | None) -> bool:
    """Whether the entry is at `level` or above (entries of no known level always are)."""
    if not level or entry.level not in LEVELS:
        return True
    return LEVELS.index(entry.level) >= LEVELS.index(level)


def read_entries(config, level: str | None = None) -> list[LogEntry]:
    """Every entry of every log file at `level` or above, oldest first (a traceback stays whole)."""
    entries = []
    for path in log_files(config):
        reader = EntryReader(path)
        with path.open(encoding="utf-8", errors="replace") as fh:
            entries.extend(reader.feed(fh))
        entries.extend(reader.flush())
    entries.sort(key=lambda entry: entry.time)  # ISO times sort as text; stable within a file
    return [entry for entry in entries if at_least(entry, level)]


TAIL_BYTES = 256 * 1024  # of each file, for the latest entries


def tail_entries(config, level: str | None = None, count: int = 200) -> list[LogEntry]:
    """The latest `count` entries at `level` or above, from the end of each file only: the
    viewer's Queue page refreshes every few seconds and must not parse megabytes each time."""
    entries = []
    for path in log_files(config):
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_BYTES)
            fh.seek(start)
            lines = fh.read().decode("utf-8", errors="replace").splitlines(keepends=True)
        if start:
            # Cut mid-file: drop the cut line and the rest of a record that began before it.
            lines = lines[1:]
            while lines and not _HEAD.match(lines[0]):
                lines.pop(0)
        reader = EntryReader(path)
        entries.extend(reader.feed(lines))
        entries.extend(reader.flush())
    entries.sort(key=lambda entry: entry.time)
    return [entry for entry in entries if at_least(entry, level)][-count:]


class LogFollower:
    """New entries of the log files since the last poll, as `llmem logs --follow` and the
    viewer's live tail read them: from each file's size at the start, a rotated (shrunk)
    file from its top, a record complete once its file stops growing."""

    def __init__(self, config):
        self.config = config
        self.readers: dict[Path, EntryReader] = {}
        self.offsets = {path: path.stat().st_size for path in log_files(config)}

    def poll(self) -> list[LogEntry]:
        entries: list[LogEntry] = []
        for path in log_files(self.config):
            reader = self.readers.setdefault(path, EntryReader(path))
            try:
                size = path.stat().st_size
            except FileNotFoundError:  # rotated away between the listing and now
                continue
            start = self.offsets.get(path, 0)
            if size < start:  # rotated
                start = 0
            if size > start:
                with path.open(encoding="utf-8", errors="replace") as fh:
                    fh.seek(start)
                    entries.extend(reader.feed(fh))
                self.offsets[path] = size
            entries.extend(reader.flush())
        return entries
