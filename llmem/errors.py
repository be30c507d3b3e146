"""The llmem error family: library code raises these, the CLI turns them into messages."""


class LlmemError(Exception):
    """A failure the user can act on; `hint` says what to do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(LlmemError):
    """Bad input from the user: a flag, an argument, a file's contents."""

    exit_code = 2


class ConfigError(UsageError):
    """The config file is unreadable or holds a value that is not allowed."""


class NotFound(UsageError):
    """No memory (or run, or event) has the given id or prefix."""

    # The README's exit codes: bad input 2, but an id that names nothing is "not found", 1.
    exit_code = 1


class AmbiguousId(UsageError):
    """An id prefix matches more than one memory."""


class EmbedderUnavailable(LlmemError):
    """The embedding service could not be reached or answered with an error."""


class LLMUnavailable(LlmemError):
    """The chat LLM could not be reached or answered with an error."""


class LLMReplyInvalid(LlmemError):
    """The chat LLM answered, but not with JSON matching the schema: the caller falls back
    to its heuristics. Caught by name, so that a bug is not mistaken for a bad reply."""


class BudgetExhausted(LlmemError):
    """Today's llm.daily_token_budget is spent: LLM work is deferred until tomorrow."""


class StoreError(LlmemError):
    """The memory store could not be opened, migrated or written."""


class StoreUnreachable(StoreError):
    """The store's server does not answer (down, refused, timed out): what waiting may fix,
    unlike a refused password or a missing database, so a long-lived command waits for it."""


def failed_in_queue(exc: BaseException) -> bool:
    """Whether a failure came out of huey's storage, so from the queue file, not the store."""
    seen = exc
    while seen is not None:
        tb = seen.__traceback__
        while tb is not None:
            if "/huey/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
                return True
            tb = tb.tb_next
        seen = seen.__cause__ or seen.__context__
    return False


def queue_failure(exc: BaseException, queue_path) -> StoreError | None:
    """A SQLite failure of the queue file (huey's queue.db) said in the user's terms: it holds
    nothing the store does not (every task is an event row of the store), so the fix is to
    rebuild it, never to touch the store."""
    said = store_failure(exc, queue_path, what="the queue")
    if said is not None and "damaged" in said.message:
        said.hint = ("rebuild it from the store's event rows with `llmem queue --reset` (the damaged "
                     "file is kept beside it); the memory store is not affected")
    return said


def store_failure(exc: BaseException, db_path, *, what: str = "the memory store") -> StoreError | None:
    """A SQLite failure said in the user's terms (a damaged file, a full disk), or None.

    SQLite's own words ("database disk image is malformed", or after a full disk "cannot
    rollback - no transaction is active", the failure of the rollback that followed) do not
    say what happened to the user's store nor what to do. Walks the exception's chain, since
    the first failure is often the context of the one that surfaced.
    """
    import shutil
    from pathlib import Path

    messages = []
    seen = exc
    while seen is not None and len(messages) < 10:
        if any(cls.__name__ == "DatabaseError" for cls in type(seen).__mro__):
            messages.append(str(seen).lower())
        seen = seen.__cause__ or seen.__context__
    if not messages:
        return None
    path = Path(db_path)
    try:
        disk_full = shutil.disk_usage(path.parent).free == 0
    except OSError:
        disk_full = False
    if any("database or disk is full" in m for m in messages) or (
            disk_full and any(("disk i/o error" in m or "cannot rollback" in m) for m in messages)):
        return StoreError(f"the disk holding {what} {path} is full; the change was not saved",
                          hint=f"free some space on that disk (`df -h {path.parent}`) and run the command again")
    if any(("malformed" in m or "file is not a database" in m) for m in messages):
        return StoreError(
            f"{what} {path} is damaged ({messages[-1]})",
            hint=f"check it with `sqlite3 {path} \"PRAGMA integrity_check\"`; save what can still be "
                 "read with `llmem export -o rescue.json`; then restore the file from a backup, or move "
                 "it aside, run `llmem init` and `llmem import rescue.json`")
    return None
