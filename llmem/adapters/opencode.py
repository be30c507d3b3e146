"""Read OpenCode sessions: the `opencode*.db` SQLite store (read-only) and the legacy JSON tree."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from llmem.adapters.base import (
    AdapterError,
    Cursor,
    SessionInfo,
    SessionNotFound,
    StoreLocked,
    ToolCall,
    Transcript,
    TranscriptMessage,
    abbreviate,
    abbreviate_input,
    as_int,
    decode_text,
    is_valid_session_id,
    messages_after,
    output_text,
    read_json_object,
    report_skipped,
    validate_session_id,
)
from llmem.adapters.detect import find_databases

NAME = "opencode"

# Part types OpenCode 1.18 writes. Anything else is a newer type: skip, count.
KNOWN_PART_TYPES = frozenset(
    {
        "text",
        "reasoning",
        "tool",
        "step-start",
        "step-finish",
        "file",
        "patch",
        "snapshot",
        "agent",
        "subtask",
        "retry",
        "compaction",
    }
)

# Session columns we use beyond the ones every schema has; older DBs may lack any of them.
_OPTIONAL_SESSION_COLUMNS = ("parent_id", "project_id", "time_archived", "time_compacting")

_T = TypeVar("_T")


@dataclass
class _Counts:
    malformed: int = 0
    unknown: int = 0


class OpenCodeAdapter:
    """Sessions from an OpenCode data dir (`~/.local/share/opencode` by default)."""

    name = NAME

    def __init__(
        self,
        data_dir: str | Path,
        *,
        busy_timeout_ms: int = 2000,
        lock_retries: int = 3,
        retry_delay_s: float = 0.2,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser()
        self.busy_timeout_ms = busy_timeout_ms
        self.lock_retries = lock_retries
        self.retry_delay_s = retry_delay_s

    @property
    def storage_dir(self) -> Path:
        """The legacy JSON tree (written by OpenCode ≤ 1.1, left frozen after the upgrade)."""
        return self.data_dir / "storage"

    def list_sessions(self) -> list[SessionInfo]:
        """Every session in the databases and the legacy tree, newest first."""
        sessions: dict[str, SessionInfo] = {}
        for db_path in find_databases(self.data_dir):
            for info in self._read_db(db_path, _list_db_sessions):
                sessions.setdefault(info.id, info)
        for info in _list_legacy_sessions(self.storage_dir):
            sessions.setdefault(info.id, info)
        return sorted(sessions.values(), key=lambda info: info.updated_ms or 0, reverse=True)

    def read_transcript(self, session_id: str, after: Cursor = None) -> Transcript:
        """The session's transcript; with `after`, only messages after that id or index."""
        validate_session_id(session_id)
        for db_path in find_databases(self.data_dir):
            transcript = self._read_db(
                db_path, lambda conn, path=db_path: _read_db_transcript(conn, path, session_id, after)
            )
            if transcript is not None:
                transcript.source_path = str(db_path)
                return transcript
        transcript = _read_legacy_transcript(self.storage_dir, session_id, after)
        if transcript is not None:
            return transcript
        raise SessionNotFound(f"OpenCode session {session_id} not found under {self.data_dir}")

    def has_session(self, session_id: str) -> bool:
        """True if a database or the legacy tree holds this session (one indexed lookup each)."""
        validate_session_id(session_id)
        for db_path in find_databases(self.data_dir):
            if self._read_db(db_path, lambda conn: _db_has_session(conn, session_id)):
                return True
        # The id is a plain token (validated above), so it is no glob pattern.
        return any((self.storage_dir / "session").glob(f"*/{session_id}.json"))

    def _read_db(self, db_path: Path, read: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `read` in one read transaction, retrying briefly while the DB is locked."""
        last_error: sqlite3.OperationalError | None = None
        for attempt in range(self.lock_retries + 1):
            if attempt:
                time.sleep(self.retry_delay_s)
            try:
                with closing(_connect_read_only(db_path, self.busy_timeout_ms)) as conn:
                    # One transaction = one consistent WAL snapshot across the three tables.
                    conn.execute("BEGIN")
                    try:
                        return read(conn)
                    finally:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
            except sqlite3.OperationalError as error:
                if not _is_lock_error(error):
                    raise AdapterError(
                        f"cannot read OpenCode database {db_path}: {error}"
                    ) from error
                last_error = error
            except sqlite3.DatabaseError as error:
                raise AdapterError(
                    f"cannot read OpenCode database {db_path}: {error} "
                    "(is it an OpenCode database, and is it intact?)"
                ) from error
        waited_s = (self.lock_retries + 1) * self.busy_timeout_ms / 1000
        raise StoreLocked(
            f"OpenCode database {db_path} stayed locked by another process for about "
            f"{waited_s:.1f} s ({last_error}); try again when OpenCode is not writing"
        )


class ChangedSessions:
    """The sessions of one OpenCode database written to since the last look (the watcher's feed).

    It keeps one read-only connection: PRAGMA data_version, which changes when another
    connection commits, tells cheaply whether anything was written; only then are the
    message and session times read.
    """

    def __init__(self, db_path: Path, since_ms: int) -> None:
        self.conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=2.0,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA query_only = ON")
        self.version = -1
        self.since_ms = since_ms

    def poll(self) -> list[str]:
        """Ids of the sessions with a message or session row updated since the last poll."""
        current = self.conn.execute("PRAGMA data_version").fetchone()[0]
        if current == self.version:
            return []
        rows = self.conn.execute(
            "SELECT session_id, MAX(time_updated) FROM message WHERE time_updated > ? GROUP BY session_id "
            "UNION SELECT id, time_updated FROM session WHERE time_updated > ?",
            (self.since_ms, self.since_ms)).fetchall()
        self.since_ms = max([self.since_ms, *[r[1] or 0 for r in rows]])
        self.version = current
        return list(dict.fromkeys(r[0] for r in rows))

    def close(self) -> None:
        self.conn.close()


def _connect_read_only(db_path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    # mode=ro, not immutable=1: immutable would ignore the -wal file and miss recent commits.
    uri = db_path.resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_ms / 1000, isolation_level=None)
    # A row whose text is not UTF-8 must cost that row only: the default decoder fails the
    # whole query, with the row's text (secrets and all) in the error message.
    conn.text_factory = decode_text
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA query_only = ON")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _is_lock_error(error: sqlite3.OperationalError) -> bool:
    message = str(error).lower()
    return "locked" in message or "busy" in message


def _table_columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info(`{table}`)")}


def _require_tables(conn: sqlite3.Connection) -> set[str]:
    session_columns = _table_columns(conn, "session")
    if not {"id", "title", "directory"} <= session_columns or not _table_columns(conn, "message"):
        raise AdapterError("not an OpenCode database: no session/message tables")
    return session_columns


def _session_select(conn: sqlite3.Connection, session_columns: set[str]) -> str:
    """SELECT over `session`, with NULL standing in for columns an older schema lacks."""
    picks = [
        "s.id",
        "s.title",
        "s.directory",
        "s.time_created" if "time_created" in session_columns else "NULL",
        "s.time_updated" if "time_updated" in session_columns else "NULL",
    ]
    picks += [f"s.{col}" if col in session_columns else "NULL" for col in _OPTIONAL_SESSION_COLUMNS]
    project_columns = _table_columns(conn, "project")
    if "project_id" in session_columns and "worktree" in project_columns:
        picks.append("p.worktree")
        source = "session s LEFT JOIN project p ON p.id = s.project_id"
    else:
        picks.append("NULL")
        source = "session s"
    return f"SELECT {', '.join(picks)} FROM {source}"


def _db_has_session(conn: sqlite3.Connection, session_id: str) -> bool:
    _require_tables(conn)
    return conn.execute("SELECT 1 FROM session WHERE id = ?", (session_id,)).fetchone() is not None


def _list_db_sessions(conn: sqlite3.Connection) -> list[SessionInfo]:
    session_columns = _require_tables(conn)
    rows = conn.execute(_session_select(conn, session_columns)).fetchall()
    return [
        SessionInfo(
            id=row[0],
            title=_text(row[1]),
            directory=_text(row[2]),
            updated_ms=row[4],
            parent_session_id=_text(row[5]),
        )
        for row in rows
        if is_valid_session_id(row[0])
    ]


def _text(value: Any) -> str | None:
    """A text column's value, or None when it is not valid UTF-8 (or not text)."""
    return value if isinstance(value, str) else None


def _row_object(db_path: Path, table: str, row_id: Any, text: Any) -> dict[str, Any] | None:
    """A row's `data` JSON; a bad one is reported by id and reason (never its text) and skipped."""
    value, problem = read_json_object(text)
    if problem is not None:
        label = row_id if isinstance(row_id, str) else "with an id that is not valid UTF-8"
        report_skipped(f"OpenCode database {db_path}", f"{table} row {label}", f"data is {problem}")
    return value


def _read_db_transcript(
    conn: sqlite3.Connection, db_path: Path, session_id: str, after: Cursor
) -> Transcript | None:
    session_columns = _require_tables(conn)
    row = conn.execute(
        _session_select(conn, session_columns) + " WHERE s.id = ?", (session_id,)
    ).fetchone()
    if row is None:
        return None
    transcript = Transcript(
        adapter=NAME,
        session_id=row[0],
        title=_text(row[1]),
        directory=_text(row[2]),
        created_ms=row[3],
        updated_ms=row[4],
        parent_session_id=_text(row[5]),
        archived_ms=row[7],
        compacting_ms=row[8],
        project_root=_text(row[9]),
    )
    where, params, first_index, cursor_found = _cursor_clause(conn, session_id, after)
    transcript.cursor_found = cursor_found
    message_rows = conn.execute(
        f"SELECT m.id, m.time_created, m.time_updated, m.data FROM message m WHERE {where} "
        "ORDER BY m.time_created, m.id",
        params,
    ).fetchall()
    parts_by_message: dict[str, list[tuple[str, str]]] = {}
    part_rows = conn.execute(
        "SELECT p.message_id, p.id, p.data FROM part p JOIN message m ON m.id = p.message_id "
        f"WHERE {where} ORDER BY p.message_id, p.id",
        params,
    )
    for message_id, part_id, data in part_rows:
        parts_by_message.setdefault(message_id, []).append((part_id, data))
    counts = _Counts()
    for offset, (message_id, time_created, time_updated, data) in enumerate(message_rows):
        if not isinstance(message_id, str):
            report_skipped(f"OpenCode database {db_path}", "a message row", "its id is not valid UTF-8")
            counts.malformed += 1
            continue
        info = _row_object(db_path, "message", message_id, data)
        parts = [
            _row_object(db_path, "part", part_id, part_data)
            for part_id, part_data in parts_by_message.get(message_id, [])
        ]
        message = _build_message(
            message_id, first_index + offset, info, parts, time_created, time_updated, counts
        )
        if message is not None:
            transcript.messages.append(message)
    transcript.skipped_malformed = counts.malformed
    transcript.skipped_unknown = counts.unknown
    return transcript


def _cursor_clause(
    conn: sqlite3.Connection, session_id: str, after: Cursor
) -> tuple[str, tuple[Any, ...], int, bool]:
    """WHERE clause over `message m` selecting rows after the cursor, and the first index."""
    everything = ("m.session_id = ?", (session_id,), 0, True)
    if after is None:
        return everything
    if isinstance(after, bool) or not isinstance(after, int | str):
        raise AdapterError(f"cursor must be a message id or an index, not {after!r}")
    if isinstance(after, int):
        if after < 0:
            return everything
        return (
            "m.id IN (SELECT id FROM message WHERE session_id = ? "
            "ORDER BY time_created, id LIMIT -1 OFFSET ?)",
            (session_id, after + 1),
            after + 1,
            True,
        )
    found = conn.execute(
        "SELECT time_created FROM message WHERE id = ? AND session_id = ?", (after, session_id)
    ).fetchone()
    if found is None:
        # The cursor row is gone (reverted or deleted): hand back everything and say so.
        return (*everything[:3], False)
    cursor_time = found[0]
    (seen,) = conn.execute(
        "SELECT COUNT(*) FROM message WHERE session_id = ? "
        "AND (time_created < ? OR (time_created = ? AND id <= ?))",
        (session_id, cursor_time, cursor_time, after),
    ).fetchone()
    return (
        "m.session_id = ? AND (m.time_created > ? OR (m.time_created = ? AND m.id > ?))",
        (session_id, cursor_time, cursor_time, after),
        seen,
        True,
    )


def _build_message(
    message_id: str,
    index: int,
    info: dict[str, Any] | None,
    parts: Iterable[dict[str, Any] | None],
    time_created: int | None,
    time_updated: int | None,
    counts: _Counts,
) -> TranscriptMessage | None:
    """Normalise one message object and its parts."""
    if info is None or info.get("role") not in ("user", "assistant"):
        counts.malformed += 1
        return None
    role = info["role"]
    times = info.get("time") if isinstance(info.get("time"), dict) else {}
    kind = "message"
    if role == "assistant" and (info.get("summary") is True or info.get("mode") == "compaction"):
        kind = "compaction_summary"
    texts: list[str] = []
    synthetic_texts: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[ToolCall] = []
    last_step_reason: str | None = None
    for part in parts:
        if part is None or not isinstance(part.get("type"), str):
            counts.malformed += 1
            continue
        part_type = part["type"]
        if part_type not in KNOWN_PART_TYPES:
            counts.unknown += 1
            continue
        if part_type == "text":
            if part.get("ignored") or not isinstance(part.get("text"), str):
                continue
            metadata = part.get("metadata") if isinstance(part.get("metadata"), dict) else {}
            if metadata.get("compaction_continue"):
                kind = "compaction_continue"
            (synthetic_texts if part.get("synthetic") else texts).append(part["text"])
        elif part_type == "reasoning" and isinstance(part.get("text"), str):
            reasoning.append(part["text"])
        elif part_type == "tool":
            tool_calls.append(_tool_call(part))
        elif part_type == "compaction":
            kind = "compaction_request"
        elif part_type == "subtask":
            texts.append(f"[subtask @{part.get('agent', '?')}] {part.get('prompt', '')}".rstrip())
        elif part_type == "file":
            texts.append(f"[attached file: {part.get('filename') or part.get('mime') or 'file'}]")
        elif part_type == "step-finish" and isinstance(part.get("reason"), str):
            last_step_reason = part["reason"]
    # Synthetic text (file contents OpenCode pasted in, the compaction "continue" nudge) only
    # stands in when the message has nothing the user or model actually wrote.
    synthetic = not texts and bool(synthetic_texts)
    error = info.get("error")
    finish = info.get("finish") if isinstance(info.get("finish"), str) else None
    if role == "assistant" and finish is None:
        # Older OpenCode versions did not set `finish`; the last step's reason says the same.
        finish = last_step_reason
    created_ms = as_int(times.get("created")) or time_created
    completed_ms = as_int(times.get("completed"))
    return TranscriptMessage(
        id=message_id,
        index=index,
        role=role,
        text="\n\n".join(synthetic_texts if synthetic else texts),
        tool_calls=tuple(tool_calls),
        time_ms=created_ms,
        updated_ms=time_updated or completed_ms or created_ms,
        completed_ms=completed_ms,
        reply_to=info.get("parentID") if isinstance(info.get("parentID"), str) else None,
        finish=finish,
        error=error.get("name") if isinstance(error, dict) else None,
        kind=kind,
        synthetic=synthetic,
        reasoning="\n\n".join(reasoning),
    )


def _tool_call(part: dict[str, Any]) -> ToolCall:
    state = part.get("state") if isinstance(part.get("state"), dict) else {}
    status = state.get("status") if isinstance(state.get("status"), str) else None
    if status == "error":
        output = output_text(state.get("error"))
    else:
        output = output_text(state.get("output"))
    metadata = state.get("metadata") if isinstance(state.get("metadata"), dict) else {}
    child = metadata.get("sessionId")
    return ToolCall(
        name=str(part.get("tool") or "unknown"),
        input=abbreviate_input(state.get("input")),
        output=abbreviate(output),
        status=status,
        call_id=part.get("callID") if isinstance(part.get("callID"), str) else None,
        child_session_id=child if isinstance(child, str) else None,
    )


# ---------------------------------------------------------------- legacy JSON storage (≤ 1.1)


def _read_json_file(path: Path) -> dict[str, Any] | None:
    try:
        return read_json_object(path.read_text(encoding="utf-8"))[0]
    except (OSError, UnicodeDecodeError):
        return None


def _legacy_session_files(storage_dir: Path) -> Iterable[tuple[str, Path]]:
    """(project id, session file) pairs; ids come from the path, as OpenCode's importer does."""
    session_root = storage_dir / "session"
    if not session_root.is_dir():
        return
    for path in session_root.glob("*/*.json"):
        if is_valid_session_id(path.stem) and is_valid_session_id(path.parent.name):
            yield path.parent.name, path


def _legacy_session_info(session_id: str, info: dict[str, Any]) -> SessionInfo:
    times = info.get("time") if isinstance(info.get("time"), dict) else {}
    parent = info.get("parentID")
    return SessionInfo(
        id=session_id,
        title=info.get("title") if isinstance(info.get("title"), str) else None,
        directory=info.get("directory") if isinstance(info.get("directory"), str) else None,
        updated_ms=as_int(times.get("updated")) or as_int(times.get("created")),
        parent_session_id=parent if isinstance(parent, str) else None,
    )


def _list_legacy_sessions(storage_dir: Path) -> list[SessionInfo]:
    sessions = []
    for _, path in _legacy_session_files(storage_dir):
        info = _read_json_file(path)
        if info is not None:
            sessions.append(_legacy_session_info(path.stem, info))
    return sessions


def _read_legacy_transcript(storage_dir: Path, session_id: str, after: Cursor) -> Transcript | None:
    session_path = next(
        (path for _, path in _legacy_session_files(storage_dir) if path.stem == session_id), None
    )
    if session_path is None:
        return None
    info = _read_json_file(session_path)
    if info is None:
        raise AdapterError(f"OpenCode session file {session_path} is not valid JSON")
    summary = _legacy_session_info(session_id, info)
    times = info.get("time") if isinstance(info.get("time"), dict) else {}
    project = _read_json_file(storage_dir / "project" / f"{session_path.parent.name}.json") or {}
    transcript = Transcript(
        adapter=NAME,
        session_id=session_id,
        title=summary.title,
        directory=summary.directory,
        project_root=project.get("worktree") if isinstance(project.get("worktree"), str) else None,
        parent_session_id=summary.parent_session_id,
        created_ms=as_int(times.get("created")),
        updated_ms=summary.updated_ms,
        archived_ms=as_int(times.get("archived")),
        compacting_ms=as_int(times.get("compacting")),
        source_path=str(session_path),
    )
    counts = _Counts()
    loaded: list[tuple[int, str, dict[str, Any]]] = []
    message_dir = storage_dir / "message" / session_id
    for path in message_dir.glob("*.json") if message_dir.is_dir() else ():
        message_info = _read_json_file(path)
        if message_info is None or not is_valid_session_id(path.stem):
            counts.malformed += 1
            continue
        message_times = message_info.get("time")
        created = as_int(message_times.get("created")) if isinstance(message_times, dict) else None
        loaded.append((created or 0, path.stem, message_info))
    loaded.sort(key=lambda item: (item[0], item[1]))
    messages = []
    for index, (created, message_id, message_info) in enumerate(loaded):
        part_dir = storage_dir / "part" / message_id
        part_paths = sorted(part_dir.glob("*.json")) if part_dir.is_dir() else []
        parts = [_read_json_file(path) for path in part_paths]
        message = _build_message(message_id, index, message_info, parts, created, None, counts)
        if message is not None:
            messages.append(message)
    transcript.messages, transcript.cursor_found = messages_after(messages, after)
    transcript.skipped_malformed = counts.malformed
    transcript.skipped_unknown = counts.unknown
    return transcript
