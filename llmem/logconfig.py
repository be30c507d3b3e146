"""Log files for the long-running processes: one rotating file per component.

Library modules only call logging.getLogger(__name__); handlers are set here, by entry points.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path

from .paths import ensure_private_dir

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def _not_a_heartbeat(record: logging.LogRecord) -> bool:
    # The consumer's once-a-minute heartbeat would be two INFO lines a minute, forever.
    return not (record.name.startswith("huey") and record.levelno <= logging.INFO
                and "heartbeat" in record.getMessage())


def setup_file_logging(config, component: str) -> Path:
    """Send llmem's (and huey's) logs to <log_dir>/<component>.log, rotated."""
    log_dir = ensure_private_dir(config.log_dir)
    path = log_dir / f"{component}.log"
    section = config.values["logging"]
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=section["max_bytes"],
                                                   backupCount=section["backups"], encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT, datefmt="%Y-%m-%dT%H:%M:%S"))
    handler.setLevel(section["level"])
    handler.addFilter(_not_a_heartbeat)
    for name in ("llmem", "workers", "huey"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.getLevelName(section["level"]):
            logger.setLevel(section["level"])
    try:
        os.chmod(path, 0o600)
    except OSError:
        pass
    return path


def log_files(config) -> list[Path]:
    """The current log files, oldest modification first."""
    folder = config.log_dir
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime)
