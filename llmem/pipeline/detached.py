"""Worker-less hooks: the work runs in a background process, one per session at a time.

With no consumer alive, a hook hands its work to a detached `llmem hook --sync`. Two rules:

- The child must not run code from the agent's working folder (the user's project): it is
  started with an isolated interpreter (`-I`: no cwd and no PYTHON* variables on the import
  path, no user site) and with a folder llmem owns as its cwd.
- A burst of hooks (an agent going idle every few seconds against a slow LLM) must not start
  a process each. The first hook takes the session's run lock (flock on a file under the
  state folder) and hands the locked descriptor to the process it starts, so the lock lives
  exactly as long as that process. A hook that finds the lock held notes its kind in the
  session's "again" file; the running process, once done, runs once more for what was noted.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
from pathlib import Path

from ..paths import ensure_private_dir
from ..processes import python_module_command
from .kinds import EventKind

log = logging.getLogger(__name__)

RUN_FOLDER = "detached"
BACKGROUND_KINDS = (EventKind.IDLE, EventKind.ENDING, EventKind.COMPACTING)  # created always runs inline


def run_folder(config) -> Path:
    return config.log_dir / RUN_FOLDER


def covering_kind(kinds: set[str]) -> str:
    """What one run does for the kinds noted while the last one ran: the kind whose work
    (extract, introspect) covers them all, the smallest such."""
    from .handlers import STEPS

    def work(kind: str) -> set[str]:
        return set(STEPS[kind]) - {"context"}

    kinds = {kind for kind in kinds if kind in BACKGROUND_KINDS}
    if len(kinds) == 1:
        return next(iter(kinds))
    wanted = set().union(*(work(kind) for kind in kinds))
    covering = [kind for kind in BACKGROUND_KINDS if wanted <= work(kind)]
    return min(covering, key=lambda kind: len(work(kind))) if covering and wanted else "idle"


class SessionRun:
    """The run lock and the "again" notes of one session's detached work."""

    def __init__(self, config, session_id: str):
        self.folder = run_folder(config)
        # Session ids are validated tokens (letters, digits, '_', '-'): safe as file names.
        self.lock_path = self.folder / f"{session_id}.lock"
        self.again_path = self.folder / f"{session_id}.again"
        self.fd: int | None = None

    def try_lock(self) -> bool:
        """Take the lock if no process holds it (never waits)."""
        ensure_private_dir(self.folder)
        for _ in range(5):
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            if self._fd_is_the_file(fd):
                self.fd = fd
                return True
            # The holder removed the file as it finished (see finish): lock the one there now.
            os.close(fd)
        return False

    def _fd_is_the_file(self, fd: int) -> bool:
        try:
            named, held = os.stat(self.lock_path, follow_symlinks=False), os.fstat(fd)
        except OSError:
            return False
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def adopt(self, fd: int) -> bool:
        """Hold the lock a parent hook passed down as `fd`, if it is this session's lock file."""
        if not self._fd_is_the_file(fd):
            return False
        self.fd = fd
        return True

    def record_holder(self, pid: int) -> None:
        """Write the pid of the process doing the work (for "coalesced into pid N")."""
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, str(pid).encode(), 0)

    def holder(self) -> int | None:
        try:
            text = self.lock_path.read_text()
        except OSError:
            return None
        return int(text) if text.strip().isdigit() else None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def finish(self) -> None:
        """Release after a run, removing the lock file first (one per session would pile up);
        whoever opened the removed file sees that in try_lock and locks the new one."""
        if self.fd is not None:
            self.lock_path.unlink(missing_ok=True)
        self.release()

    def note_again(self, kind: str) -> None:
        """Ask the running process for one more run of `kind` when it is done."""
        ensure_private_dir(self.folder)
        fd = os.open(self.again_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, f"{kind}\n".encode())
        finally:
            os.close(fd)

    def take_notes(self) -> set[str]:
        """The kinds noted so far, removing the notes (a hook arriving later notes anew)."""
        taken = self.again_path.with_name(f"{self.again_path.name}.{os.getpid()}")
        try:
            os.rename(self.again_path, taken)
        except FileNotFoundError:
            return set()
        try:
            return {line for line in taken.read_text().split() if line in BACKGROUND_KINDS}
        finally:
            taken.unlink(missing_ok=True)

    def has_notes(self) -> bool:
        return self.again_path.exists()


def start_detached(config, kind: str, session_id: str, hook_args: list[str],
                   config_path: str | None) -> tuple[str, int | None]:
    """Hand the hook's work to a background process, or to the one already running.

    Returns ("detached", pid of the new process) or ("coalesced", pid of the running one,
    None when it has not said yet).
    """
    run = SessionRun(config, session_id)
    if not run.try_lock():
        run.note_again(kind)
        # The holder may have finished between our two looks without seeing the note: take
        # the lock again, and if it is free now, start the run ourselves.
        if not run.try_lock():
            return "coalesced", run.holder()
    try:
        args = python_module_command()
        if config_path:
            args += ["--config", os.path.abspath(config_path)]
        args += ["hook", "--type", kind, "--session-id", session_id, "--sync", *hook_args,
                 "--run-lock-fd", str(run.fd)]
        env = dict(os.environ)
        for name in ("LLMEM_HOME", "LLMEM_CONFIG"):  # the child's cwd is not ours
            if env.get(name):
                env[name] = os.path.abspath(os.path.expanduser(env[name]))
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, cwd=run.folder, env=env,
                                 start_new_session=True, close_fds=True, pass_fds=(run.fd,))
        run.record_holder(child.pid)
    finally:
        run.release()  # our copy only: the child's descriptor keeps the lock
    return "detached", child.pid


def run_coalesced(config, kind: str, session_id: str, lock_fd: int, run_once) -> dict:
    """In the detached process: run `run_once(kind)`, then again while hooks noted more.

    Returns the last run's result, with "runs" (how many were made).
    """
    run = SessionRun(config, session_id)
    if not run.adopt(lock_fd):
        log.warning("%s %s: descriptor %d is not this session's run lock; running once", kind,
                    session_id, lock_fd)
        return run_once(kind)
    runs = 0
    kinds = {kind}
    while True:
        kinds |= run.take_notes()  # hooks that came before this run starts are covered by it
        result = run_once(covering_kind(kinds))
        runs += 1
        run.finish()  # then look for notes: a hook noting after this sees the lock free
        if not run.has_notes() or not run.try_lock():
            break  # nothing more, or a newer process took the lock and will see the notes
        run.record_holder(os.getpid())
        kinds = set()
    if runs > 1:
        log.info("%s %s: %d runs in this process (later hooks coalesced)", kind, session_id, runs)
    result["runs"] = runs
    return result
