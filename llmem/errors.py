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
    """No memory matches the given id or prefix."""


class AmbiguousId(UsageError):
    """An id prefix matches more than one memory."""


class EmbedderUnavailable(LlmemError):
    """The embedding service could not be reached or answered with an error."""


class LLMUnavailable(LlmemError):
    """The chat LLM could not be reached or answered with an error."""


class StoreError(LlmemError):
    """The memory store could not be opened, migrated or written."""
