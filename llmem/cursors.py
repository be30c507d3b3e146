"""How far a run has read one agent session: the SessionCursor row, moved by compare-and-advance.

Extraction and introspection each read a transcript past their own cursor, work a while (LLM
calls), then store what they found and move the cursor in one write transaction. Two runs of
one session can overlap (the watcher's idle and the hook's ending): the one that finds its
cursor moved meanwhile must write nothing, since the other run covered the slice.
"""

from __future__ import annotations

from .times import now

EXTRACTION = "cursor"
INTROSPECTION = "introspect_cursor"
EPISODES = "episode_cursor"


class CursorRun:
    """One run's hold on a session's cursor (`field`: EXTRACTION or INTROSPECTION): where it
    started, whether that still holds, and the move past what it read."""

    def __init__(self, models, adapter: str, session_id: str, field: str):
        self._model = models.SessionCursor
        self.adapter, self.session_id, self.field = adapter, session_id, field
        row = self._read()
        self.start: str | None = getattr(row, field) if row else None
        self._row = None

    def _read(self):
        model = self._model
        return model.get_or_none((model.adapter == self.adapter) & (model.session_id == self.session_id))

    def unmoved(self) -> bool:
        """Inside the write transaction: the cursor is still where this run started."""
        self._row = self._read()
        return (getattr(self._row, self.field) if self._row else None) == self.start

    def advance(self, to: str | None, *, project: str | None, status: str | None = None,
                messages_read: int = 0) -> None:
        """In the same transaction, after `unmoved`: the cursor moves to `to`, the status
        becomes `status` (None keeps it) and `messages_read` is added to the session's count."""
        # Two runs of one row (extraction and episodes) in one transaction: the second to
        # advance finds the row the first created.
        row = self._row or self._read()
        if row is None:
            self._model.create(adapter=self.adapter, session_id=self.session_id, project=project,
                               **{self.field: to}, status=status or "idle",
                               messages_read=messages_read, updated_at=now())
            return
        row.project = project or row.project
        setattr(row, self.field, to)
        if status is not None:
            row.status = status
        row.messages_read += messages_read
        row.updated_at = now()
        row.save()
