"""Log files: one rotating file per long-running component, hooks.log for the hooks.

Library modules only call logging.getLogger(__name__); handlers are set here, by entry points.
Every file has one line layout and one timestamp format, so `llmem logs` can merge them.
Logging must never be what fails: a full disk, or a file that cannot be opened, costs the log
line, never the hook or the worker (no "--- Logging error ---" traceback on their stderr).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .paths import ensure_private_dir, open_own_file, private_file
from .redact import redact

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# The head of a record's first line; a line without it continues the record above (a traceback).
_HEAD = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)\S* (?:\d+ )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def _not_a_heartbeat(record: logging.LogRecord) -> bool:
    # The consumer's once-a-minute heartbeat would be two INFO lines a minute, forever.
    return not (record.name.startswith("huey") and record.levelno <= logging.INFO
                and "heartbeat" in record.getMessage())


def _expected_in_one_line(record: logging.LogRecord) -> bool:
    """An expected condition (embedder or LLM down, a bad input: an LlmemError) logs one line.

    huey logs every failed task with its traceback; for a failure llmem names and explains
    itself the traceback is noise that buries real faults, so it is folded into the message.
    """
    from .errors import LlmemError

    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, LlmemError):
        record.msg = f"{record.getMessage()}: {exc.__class__.__name__}: {' '.join(str(exc).split())}"
        record.args = None
        record.exc_info = None
        record.exc_text = None
    return True


def _without_secrets(record: logging.LogRecord) -> bool:
    """Every record redacted before it is written: a message or a traceback may quote a secret
    (a model's raw reply, a request's body, the text a parser choked on), and the log files are
    shown by `llmem logs` and the viewer."""
    message = record.getMessage()
    clean = redact(message).text
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact(record.exc_text).text
    if record.stack_info:
        record.stack_info = redact(record.stack_info).text
    return True


class _OwnFileMixin:
    """Opens the file without following a planted symlink; a failed write costs only the line."""

    def _open(self):
        fd = open_own_file(Path(self.baseFilename), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)

    def handleError(self, record):  # noqa: N802 - logging's name
        # The default prints a traceback to stderr: an agent would see it for a full disk.
        self.failed = True

    def close(self):
        try:
            super().close()
        except OSError:  # its last flush, on a full disk
            pass


class OwnFileHandler(_OwnFileMixin, logging.FileHandler):
    """A plain append handler (hooks rotate hooks.log themselves: logging.handlers is slow to import)."""


def file_handler(path: Path, level: str | int) -> logging.Handler:
    """A handler appending to one of llmem's own log files, in the common layout."""
    handler = OwnFileHandler(path, encoding="utf-8")
    _configure(handler, level)
    return handler


def _configure(handler: logging.Handler, level: str | int) -> None:
    handler.failed = False
    handler.setFormatter(logging.Formatter(FORMAT, datefmt=TIME_FORMAT))
    handler.setLevel(level)
    handler.addFilter(_not_a_heartbeat)
    handler.addFilter(_expected_in_one_line)
    handler.addFilter(_without_secrets)


def setup_file_logging(config, component: str, extra_loggers: tuple[str, ...] = ()) -> Path:
    """Send llmem's (and huey's) logs to <log_dir>/<component>.log, rotated; `extra_loggers`
    names other libraries' loggers to send there too (the MCP SDK's, for `llmem mcp`)."""
    import logging.handlers

    class OwnRotatingFileHandler(_OwnFileMixin, logging.handlers.RotatingFileHandler):
        pass

    from .errors import LlmemError

    log_dir = ensure_private_dir(config.log_dir)
    path = log_dir / f"{component}.log"
    section = config.logging
    try:
        handler = OwnRotatingFileHandler(path, maxBytes=section.max_bytes,
                                         backupCount=section.backups, encoding="utf-8")
    except OSError as exc:
        raise LlmemError(f"cannot open the log file {path}: {exc.strerror or exc}",
                         hint="check logging.dir in config.yaml and that folder") from None
    private_file(path)  # one an older llmem made with a looser mode
    _configure(handler, section.level)
    for name in ("llmem", "workers", "huey", *extra_loggers):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.getLevelName(section.level):
            logger.setLevel(section.level)
    return path


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
