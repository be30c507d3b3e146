"""Where llmem keeps its files: XDG defaults, all moved under LLMEM_HOME when it is set."""

from __future__ import annotations

import os
from contextlib import contextmanager
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
    """Create one of llmem's own folders, and any missing parent, readable by the user alone.

    Only folders this call creates get mode 0700: an existing folder keeps its mode, since it
    may be shared (a 1777 /tmp losing its sticky bit) or the user's own choice.
    """
    missing = []
    folder = path
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # made by a concurrent process meanwhile
            continue
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a folder")
    return path


def private_file(path: Path) -> Path:
    """Make sure an existing file of llmem's own is readable by the user alone (0600).

    A symlink planted in its place is not followed: its target is not ours to change.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # a symlink, or gone
        return path
    try:
        os.fchmod(fd, 0o600)
    except OSError:  # a file we do not own
        pass
    finally:
        os.close(fd)
    return path


def open_own_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open one of llmem's own files without following a symlink planted in its place.

    A symlink there (someone else's link, or a mistake) would make llmem append to or chmod
    whatever it points at, so it is refused: OSError naming the file. Refusing rather than
    replacing the link leaves the evidence for the user and never deletes what llmem did not make.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if os.path.islink(path):
            raise OSError(exc.errno, f"{path} is a symlink; llmem does not follow links for its own "
                                     "files (remove it to let llmem recreate the file)") from None
        raise


def write_private_text(path: Path, text: str) -> None:
    """Write one of llmem's own files atomically, mode 0600, creating its folder if needed."""
    ensure_private_dir(path.parent)
    write_atomically(path, text)


def write_output_file(path: Path, text: str) -> None:
    """Write a file the user named (an export, a report) atomically, mode 0600.

    Its folder must exist: a mistyped path is an error, not a new folder somewhere (`-o
    /nonexistent/dir/x.json` must not create /nonexistent). UsageError names the folder; a
    failed write (full disk) is an LlmemError and leaves any earlier file as it was.
    """
    from .errors import LlmemError

    check_output_folder(path)
    try:
        write_atomically(path, text)
    except OSError as exc:  # a full disk, no permission: a runtime failure, the old file kept
        raise LlmemError(f"cannot write {path}: {exc.strerror or exc}; nothing was changed") from None


def check_output_folder(path: Path) -> None:
    """UsageError unless `path` can be a file the user named: its folder exists, it is no folder."""
    from .errors import UsageError

    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"cannot write {path}: the folder {folder} {what}",
                         hint="create the folder first or choose another path")
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a folder", hint="give a file name")


def decode_utf8(data: bytes, source: str, hint: str) -> str:
    """`data` as text, or a UsageError naming the first byte that is not UTF-8 and where it is."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        from .errors import UsageError

        raise UsageError(f"cannot read {source}: not UTF-8 text (byte {data[exc.start]:#04x} at offset "
                         f"{exc.start})", hint=hint) from None


def write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Temp file beside `path`, then rename: a failure (full disk, kill) leaves no half file."""
    with atomic_file(path, mode) as fh:
        fh.write(text)


@contextmanager
def atomic_file(path: Path, mode: int = 0o600, *, binary: bool = False, sync_folder: bool = False):
    """The one atomic file write: the caller writes to a temp file beside `path`, which is
    fsynced and renamed over `path` (a planted symlink is replaced, never written through);
    on any failure the temp file goes and `path` is as it was. `sync_folder` also fsyncs the
    folder, so the rename itself survives a power cut."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_folder:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def project_root_of(directory: str | None) -> str | None:
    """The repository root holding `directory` (the nearest parent with .git), else itself.

    Here rather than in context.py: a Claude Code or Copilot hook maps its stdin `cwd` to the
    project on every turn, and importing context costs such a hook ~25 ms."""
    if not directory:
        return None
    path = Path(directory).expanduser()
    for candidate in (path, *path.parents):
        if (candidate / ".git").exists():
            return str(candidate)
    return str(path)



def project_key(directory: str | None) -> str | None:
    """The project a folder belongs to, as memories are keyed by it: its repository's remote,
    normalised (`git@github.com:acme/api.git` and `https://github.com/acme/api` are both
    `github.com/acme/api`), so one project is one project on every machine; else the
    repository root's path (project_root_of), as before remotes were read.

    Read from the repository's config file, not by running git: a hook asks on every turn."""
    root = project_root_of(directory)
    if root is None:
        return None
    remote = _remote_url(Path(root))
    return (_normalised_remote(remote) if remote else None) or root


def _remote_url(root: Path) -> str | None:
    """`origin`'s URL in the repository's config (else its first remote's), or None."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree or submodule: `gitdir: …`, whose commondir holds the config
            text = git.read_text(encoding="utf-8", errors="replace").strip()
            if not text.startswith("gitdir:"):
                return None
            gitdir = (root / text[len("gitdir:"):].strip()).resolve()
            common = gitdir / "commondir"
            if common.is_file():
                gitdir = (gitdir / common.read_text(encoding="utf-8").strip()).resolve()
            git = gitdir
        config = (git / "config").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    remotes: dict[str, str] = {}
    section = None
    for raw in config.splitlines():
        line = raw.strip()
        if line.startswith("["):
            head = line.strip("[]").strip()
            section = head[len("remote"):].strip().strip('"') if head.startswith("remote ") else None
        elif section is not None and "=" in line:
            key, _, value = line.partition("=")
            if key.strip().lower() == "url" and section not in remotes:
                remotes[section] = value.strip().strip('"')
    return remotes.get("origin") or next(iter(remotes.values()), None)


def _normalised_remote(url: str) -> str | None:
    """`host/path` of a network remote (scheme, user, port and `.git` dropped, the host in
    lower case); None for a remote on this machine's disk, which names no shared project."""
    from urllib.parse import urlsplit

    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme == "file" or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path
    elif ":" in url.split("/", 1)[0] and len(url.partition(":")[0].rpartition("@")[2]) > 1:
        where, _, path = url.partition(":")  # scp-like: [user@]host:path (not a drive letter)
        host = where.rpartition("@")[2]
    else:
        return None  # a path on this disk
    path = path.strip("/")
    if path.endswith(".git"):
        path = path[:-len(".git")]
    return f"{host.lower()}/{path.rstrip('/')}" if host and path else None

# ---- llmem's own agent calls (llm.provider: agent) -------------------------------------------
# llmem may ask an agent CLI the user has (`claude -p`, `codex exec`, …) to extract memories.
# That call is a session of the agent's own, and must never come back as a user's session:
# it runs with this variable set (`llmem hook` does nothing under it), in a folder of
# llmem's that holds AGENT_CALLS_MARKER (the watcher and backfill skip sessions run there).
AGENT_CALL_ENV = "LLMEM_AGENT_CALL"
AGENT_CALLS_MARKER = ".llmem-agent-calls"


def agent_calls_dir() -> Path:
    """The working folder of llmem's agent calls, beside the queue in llmem's data folder."""
    return default_paths().queue_path.parent / "agent-calls"


def is_agent_call_dir(directory: str | os.PathLike | None) -> bool:
    """Whether a session that ran in `directory` is one of llmem's own agent calls.

    The marker file, not the folder's name, decides: a watcher started with another
    LLMEM_HOME than the worker that made the call still recognises it."""
    if not directory:
        return False
    try:
        return (Path(directory).expanduser() / AGENT_CALLS_MARKER).is_file()
    except (OSError, ValueError, TypeError):  # a NUL byte, not a path, unreadable: not ours
        return False
