"""The session moments an event stands for, named once for the hooks, the watcher's events,
the queue and the CLI.

A StrEnum: a kind is stored in event rows, passed to tasks and printed as its plain string.
Nothing else lives here, so `llmem --help` can build its choices without importing more.
"""

from enum import StrEnum


class EventKind(StrEnum):
    CREATED = "created"
    IDLE = "idle"
    ENDING = "ending"
    COMPACTING = "compacting"
