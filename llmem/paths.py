"""Where llmem keeps its files: XDG defaults, all moved under LLMEM_HOME when it is set."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    """The standard locations of llmem's own files (config may override some)."""

    config_file: Path
    db_path: Path
    queue_path: Path
    log_dir: Path
    diary_path: Path
    proposed_changes_path: Path
    memory_md_path: Path

    @property
    def config_dir(self) -> Path:
        return self.config_file.parent


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / fallback


def default_paths() -> Paths:
    """Standard paths: XDG directories, or everything under $LLMEM_HOME when set."""
    home = os.environ.get("LLMEM_HOME")
    if home:
        root = Path(home).expanduser()
        config_dir = data_dir = root
        state_dir = root / "logs"
    else:
        config_dir = _xdg("XDG_CONFIG_HOME", ".config") / "llmem"
        data_dir = _xdg("XDG_DATA_HOME", ".local/share") / "llmem"
        state_dir = _xdg("XDG_STATE_HOME", ".local/state") / "llmem"
    return Paths(
        config_file=config_dir / "config.yaml",
        db_path=config_dir / "memory.db",
        queue_path=data_dir / "queue.db",
        log_dir=state_dir,
        diary_path=config_dir / "dream-diary.md",
        proposed_changes_path=config_dir / "proposed-changes.md",
        memory_md_path=config_dir / "MEMORY.md",
    )


def expand(path: str | os.PathLike) -> Path:
    """Expand ~ and environment variables in a configured path."""
    return Path(os.path.expandvars(os.path.expanduser(str(path))))


def ensure_private_dir(path: Path) -> Path:
    """Create a directory (and parents) readable by the user alone (0700)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        path.chmod(0o700)
    except OSError:  # a directory we do not own (e.g. a shared tmp): leave it be
        pass
    return path


def private_file(path: Path) -> Path:
    """Make sure an existing file is readable by the user alone (0600)."""
    try:
        path.chmod(0o600)
    except OSError:
        pass
    return path


def write_private_text(path: Path, text: str) -> None:
    """Write a file atomically with mode 0600 (temp file + rename: never half-written)."""
    ensure_private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
