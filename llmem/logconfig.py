"""Log files written: one rotating file per long-running component, hooks.log for the hooks.

Library modules only call logging.getLogger(__name__); handlers are set here, by entry points.
Every file has one line layout and one timestamp format, so `logreader.py` (`llmem logs`, the
viewer) can merge them.
Logging must never be what fails: a full disk, or a file that cannot be opened, costs the log
line, never the hook or the worker (no "--- Logging error ---" traceback on their stderr).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .paths import ensure_private_dir, open_own_file, private_file
from .redact import redact

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"


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
