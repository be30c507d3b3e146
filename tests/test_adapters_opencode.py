"""The OpenCode adapter on real SQLite files built from the fixture SQL, and on a legacy tree."""

import hashlib
import json
import sqlite3
import threading
from pathlib import Path

import pytest
from session_writers import recorded_opencode_store

from llmem.adapters import (
    AdapterError,
    InvalidSessionId,
    NoTranscript,
    OpenCodeAdapter,
    SessionNotFound,
    StoreLocked,
    detect_adapter,
    get_adapter,
)
from llmem.adapters.base import TOOL_OUTPUT_CAP

MAIN = "ses_f0d5df91fffeoLpXSBPHrYDK6h"
CHILD = "ses_f0d5d58f7ffeSsd6eXKN03Ifpf"
FIRST_USER = "msg_0f2a20cbc001MDsRHCUHFK4BB6"
COMPACTION_REQUEST = "msg_0f2a2f140001bhNNkR8t7Po177"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "opencode"
    recorded_opencode_store(directory, journal_mode="WAL")
    return directory


@pytest.fixture
def adapter(data_dir: Path) -> OpenCodeAdapter:
    return OpenCodeAdapter(data_dir, busy_timeout_ms=50, lock_retries=1, retry_delay_s=0.01)


def insert_message(conn, message_id, session_id, created, data, parts=()):
    conn.execute(
        "INSERT INTO message (id, session_id, time_created, time_updated, data) "
        "VALUES (?, ?, ?, ?, ?)",
        (
            message_id,
            session_id,
            created,
            created,
            data if isinstance(data, str) else json.dumps(data),
        ),
    )
    for number, part in enumerate(parts):
        conn.execute(
            "INSERT INTO part (id, message_id, session_id, time_created, time_updated, data) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                f"prt_{message_id}_{number:02d}",
                message_id,
                session_id,
                created,
                created,
                part if isinstance(part, str) else json.dumps(part),
            ),
        )


def test_list_sessions_newest_first_with_parent_link(adapter):
    sessions = adapter.list_sessions()
    assert [info.id for info in sessions] == [MAIN, CHILD]
    assert sessions[0].title == "Fix flaky pagination test"
    assert sessions[0].directory == "/home/dev/acme-api"
    assert sessions[0].updated_ms == 1790777185200
    assert sessions[1].parent_session_id == MAIN


def test_main_session_is_normalised(adapter):
    transcript = adapter.read_transcript(MAIN)
    assert transcript.adapter == "opencode"
    assert transcript.title == "Fix flaky pagination test"
    assert transcript.directory == "/home/dev/acme-api"
    assert transcript.project_root == "/home/dev/acme-api"
    assert transcript.parent_session_id is None
    assert (transcript.created_ms, transcript.updated_ms) == (1790777100000, 1790777185200)
    assert (transcript.skipped_malformed, transcript.skipped_unknown) == (0, 0)
    messages = transcript.messages
    assert [m.role for m in messages] == ["user"] + ["assistant"] * 3 + ["user", "assistant"] * 2
    assert [m.index for m in messages] == list(range(8))
    assert messages[0].id == FIRST_USER
    assert messages[0].text.startswith("test_list_orders_paginates fails")
    assert messages[0].time_ms == 1790777101500

    bash = messages[1].tool_calls[0]
    assert (bash.name, bash.status, bash.call_id) == ("bash", "completed", "toolu_01HxY7qK2mZ9")
    assert bash.input == {"command": "pytest tests/test_orders.py -k paginates --count 10 -q"}
    assert "2 failed, 8 passed" in bash.output
    assert messages[1].reply_to == FIRST_USER
    assert messages[1].finish == "tool-calls"
    assert messages[1].completed_ms == 1790777111900

    assert "non-deterministic ORDER BY" in messages[2].reasoning
    task = messages[2].tool_calls[0]
    assert task.name == "task" and task.child_session_id == CHILD
    assert [call.name for call in messages[3].tool_calls] == ["edit", "bash"]


def test_compaction_messages_are_marked(adapter):
    messages = adapter.read_transcript(MAIN).messages
    request, summary, nudge, final = messages[4:]
    assert request.kind == "compaction_request" and request.text == ""
    assert summary.kind == "compaction_summary" and summary.reply_to == request.id
    assert summary.text.startswith("## Goal")
    assert nudge.kind == "compaction_continue" and nudge.synthetic
    assert nudge.text.startswith("Continue if you have next steps")
    assert final.kind == "message" and final.finish == "stop"


def test_child_session_links_to_parent(adapter):
    transcript = adapter.read_transcript(CHILD)
    assert transcript.parent_session_id == MAIN
    assert transcript.title.endswith("(@explore subagent)")
    assert [m.role for m in transcript.messages] == ["user", "assistant"]
    assert transcript.messages[1].tool_calls[0].name == "grep"


def test_cursor_by_message_id_and_by_index(adapter):
    whole = adapter.read_transcript(MAIN)
    by_id = adapter.read_transcript(MAIN, after=whole.messages[3].id)
    by_index = adapter.read_transcript(MAIN, after=3)
    assert [m.id for m in by_id.messages] == [m.id for m in whole.messages[4:]]
    assert by_id.messages == by_index.messages == whole.messages[4:]
    assert by_id.cursor_found and by_id.cursor == whole.messages[-1].id
    assert adapter.read_transcript(MAIN, after=whole.cursor).messages == []
    assert adapter.read_transcript(MAIN, after=99).messages == []


def test_unknown_cursor_returns_everything_and_says_so(adapter):
    transcript = adapter.read_transcript(MAIN, after="msg_gone")
    assert not transcript.cursor_found
    assert len(transcript.messages) == 8


def test_read_never_modifies_the_database(data_dir, adapter):
    db_path = data_dir / "opencode.db"
    before = hashlib.sha256(db_path.read_bytes()).hexdigest()
    adapter.list_sessions()
    adapter.read_transcript(MAIN)
    assert hashlib.sha256(db_path.read_bytes()).hexdigest() == before


def test_connection_is_read_only(data_dir):
    from llmem.adapters.opencode import _connect_read_only

    conn = _connect_read_only(data_dir / "opencode.db", 100)
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
        conn.execute("DELETE FROM message")
    conn.close()


def test_sees_commits_still_in_the_wal(data_dir, adapter):
    writer = sqlite3.connect(data_dir / "opencode.db", isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint = 0")  # keep the commit in -wal only
    insert_message(
        writer, "msg_zz_new", MAIN, 1790777190000,
        {"role": "user", "time": {"created": 1790777190000}},
        [{"type": "text", "text": "one more thing"}],
    )  # fmt: skip
    try:
        messages = adapter.read_transcript(MAIN).messages
        assert messages[-1].id == "msg_zz_new" and messages[-1].text == "one more thing"
    finally:
        writer.close()


def test_reads_while_another_connection_holds_a_write_transaction(data_dir, adapter):
    writer = sqlite3.connect(data_dir / "opencode.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    insert_message(writer, "msg_zz_uncommitted", MAIN, 1790777190000, {"role": "user"})
    try:
        transcript = adapter.read_transcript(MAIN)
        assert len(transcript.messages) == 8  # the uncommitted row is invisible
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_exclusively_locked_database_raises_a_clear_error(tmp_path):
    data_dir = tmp_path / "oc"
    recorded_opencode_store(data_dir, journal_mode="DELETE")
    holder = sqlite3.connect(data_dir / "opencode.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        adapter = OpenCodeAdapter(data_dir, busy_timeout_ms=30, lock_retries=1, retry_delay_s=0.01)
        with pytest.raises(StoreLocked, match="locked by another process") as caught:
            adapter.read_transcript(MAIN)
        assert str(data_dir / "opencode.db") in str(caught.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_lock_released_during_retries_is_read(tmp_path):
    data_dir = tmp_path / "oc"
    recorded_opencode_store(data_dir, journal_mode="DELETE")
    holder = sqlite3.connect(
        data_dir / "opencode.db", isolation_level=None, check_same_thread=False
    )
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.1, lambda: (holder.execute("ROLLBACK"), holder.close()))
    release.start()
    try:
        adapter = OpenCodeAdapter(data_dir, busy_timeout_ms=30, lock_retries=20, retry_delay_s=0.02)
        assert len(adapter.read_transcript(MAIN).messages) == 8
    finally:
        release.join()


OLD_SCHEMA = """
CREATE TABLE session (id text PRIMARY KEY, project_id text NOT NULL, slug text NOT NULL,
  directory text NOT NULL, title text NOT NULL, version text NOT NULL,
  time_created integer NOT NULL, time_updated integer NOT NULL);
CREATE TABLE message (id text PRIMARY KEY, session_id text NOT NULL,
  time_created integer NOT NULL, time_updated integer NOT NULL, data text NOT NULL);
CREATE TABLE part (id text PRIMARY KEY, message_id text NOT NULL, session_id text NOT NULL,
  time_created integer NOT NULL, time_updated integer NOT NULL, data text NOT NULL);
"""


def test_older_schema_without_newer_columns(tmp_path):
    conn = sqlite3.connect(tmp_path / "opencode.db")
    conn.executescript(OLD_SCHEMA)
    conn.execute(
        "INSERT INTO session VALUES ('ses_old', 'global', 'old-fox', '/srv/app', 'Old one', "
        "'1.2.0', 1000, 3000)"
    )
    insert_message(conn, "msg_a", "ses_old", 1000, {"role": "user", "time": {"created": 1000}},
                   [{"type": "text", "text": "hello"}])  # fmt: skip
    # No `finish` on the message: the last step-finish reason stands in for it.
    insert_message(
        conn, "msg_b", "ses_old", 2000,
        {"role": "assistant", "parentID": "msg_a", "time": {"created": 2000, "completed": 2500}},
        [{"type": "text", "text": "hi"}, {"type": "step-finish", "reason": "stop"}],
    )  # fmt: skip
    conn.commit()
    conn.close()
    adapter = OpenCodeAdapter(tmp_path)
    assert [info.id for info in adapter.list_sessions()] == ["ses_old"]
    transcript = adapter.read_transcript("ses_old")
    assert transcript.parent_session_id is None and transcript.archived_ms is None
    assert transcript.project_root is None
    assert [(m.role, m.text) for m in transcript.messages] == [
        ("user", "hello"),
        ("assistant", "hi"),
    ]
    assert transcript.messages[1].finish == "stop"


def test_unknown_and_malformed_parts_and_rows_are_skipped_and_counted(data_dir, adapter):
    with sqlite3.connect(data_dir / "opencode.db") as conn:
        insert_message(
            conn, "msg_zz_1", MAIN, 1790777190000,
            {"role": "user", "time": {"created": 1790777190000}},
            [{"type": "hologram", "beam": 1}, "{not json", {"type": "text", "text": "still here"}],
        )  # fmt: skip
        insert_message(conn, "msg_zz_2", MAIN, 1790777191000, "[1, 2")
        insert_message(conn, "msg_zz_3", MAIN, 1790777192000, {"role": "narrator"})
        insert_message(conn, "msg_zz_4", MAIN, 1790777193000, {"role": "user"})
    conn.close()
    transcript = adapter.read_transcript(MAIN)
    assert transcript.skipped_unknown == 1
    assert transcript.skipped_malformed == 3  # bad part JSON, bad message JSON, unknown role
    assert transcript.messages[8].text == "still here"
    # Skipped rows keep their place: the next good message's index shows the gap.
    assert (transcript.messages[-1].id, transcript.messages[-1].index) == ("msg_zz_4", 11)


def test_long_tool_output_is_abbreviated(data_dir, adapter):
    with sqlite3.connect(data_dir / "opencode.db") as conn:
        insert_message(
            conn, "msg_zz_1", MAIN, 1790777190000,
            {"role": "assistant", "time": {"created": 1790777190000}},
            [{"type": "tool", "tool": "read", "callID": "c1",
              "state": {"status": "completed", "input": {"filePath": "/x", "blob": "b" * 9000},
                        "output": "a" * 50_000}}],
        )  # fmt: skip
    conn.close()
    call = adapter.read_transcript(MAIN).messages[-1].tool_calls[0]
    assert len(call.output) < TOOL_OUTPUT_CAP + 100 and "48000 more characters" in call.output
    assert len(call.input["blob"]) < TOOL_OUTPUT_CAP + 100 and call.input["filePath"] == "/x"


def test_empty_session_is_a_transcript_without_messages(data_dir, adapter):
    with sqlite3.connect(data_dir / "opencode.db") as conn:
        conn.execute(
            "INSERT INTO session (id, project_id, slug, directory, title, version, time_created,"
            " time_updated) VALUES ('ses_empty', '8c1f3e5a9b2d47c6e0f1a2b3c4d5e6f7a8b9c0d1',"
            " 'x', '/d', 'New session', '1.18.33', 5, 6)"
        )
    conn.close()
    transcript = adapter.read_transcript("ses_empty")
    assert transcript.messages == [] and transcript.cursor is None
    assert transcript.title == "New session"


@pytest.mark.parametrize(
    "bad_id", ["../x", "/etc/passwd", "..", "a/b", "a\\b", "", "ses x", "~root", "x\x00"]
)
def test_session_ids_that_could_escape_are_rejected(adapter, bad_id):
    with pytest.raises(InvalidSessionId):
        adapter.read_transcript(bad_id)


def test_missing_session_and_garbage_database(tmp_path, adapter):
    with pytest.raises(SessionNotFound):
        adapter.read_transcript("ses_nope")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "opencode.db").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(AdapterError, match="cannot read OpenCode database"):
        OpenCodeAdapter(tmp_path / "garbage").read_transcript(MAIN)


def export_legacy_tree(db_path: Path, storage: Path) -> None:
    """Write the DB's rows as OpenCode ≤ 1.1 stored them (one JSON file per object)."""
    conn = sqlite3.connect(db_path)
    sessions = conn.execute(
        "SELECT id, project_id, parent_id, directory, title, time_created, time_updated FROM session"
    ).fetchall()
    for sid, project_id, parent_id, directory, title, created, updated in sessions:
        info = {"id": "ignored-the-path-wins", "projectID": project_id, "directory": directory,
                "title": title, "time": {"created": created, "updated": updated}}  # fmt: skip
        if parent_id:
            info["parentID"] = parent_id
        path = storage / "session" / project_id / f"{sid}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(info))
    for mid, sid, data in conn.execute("SELECT id, session_id, data FROM message"):
        path = storage / "message" / sid / f"{mid}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"id": mid, "sessionID": sid, **json.loads(data)}))
    for pid, mid, data in conn.execute("SELECT id, message_id, data FROM part"):
        path = storage / "part" / mid / f"{pid}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"id": pid, "messageID": mid, **json.loads(data)}))
    (storage / "project").mkdir()
    (storage / "project" / "8c1f3e5a9b2d47c6e0f1a2b3c4d5e6f7a8b9c0d1.json").write_text(
        json.dumps({"worktree": "/home/dev/acme-api"})
    )
    conn.close()


def test_legacy_json_storage_reads_like_the_database(tmp_path, data_dir, adapter):
    legacy_dir = tmp_path / "legacy"
    export_legacy_tree(data_dir / "opencode.db", legacy_dir / "storage")
    (legacy_dir / "storage" / "session" / "bad project").mkdir()
    (legacy_dir / "storage" / "session" / "bad project" / "ses_evil.json").write_text("{}")
    legacy = OpenCodeAdapter(legacy_dir)
    assert [info.id for info in legacy.list_sessions()] == [MAIN, CHILD]
    from_json = legacy.read_transcript(MAIN)
    from_db = adapter.read_transcript(MAIN)
    assert from_json.session_id == MAIN and from_json.project_root == "/home/dev/acme-api"
    assert [(m.id, m.role, m.kind, m.text, m.tool_calls) for m in from_json.messages] == [
        (m.id, m.role, m.kind, m.text, m.tool_calls) for m in from_db.messages
    ]
    assert legacy.read_transcript(CHILD).parent_session_id == MAIN
    assert legacy.read_transcript(MAIN, after=COMPACTION_REQUEST).messages[0].kind == (
        "compaction_summary"
    )
    with pytest.raises(SessionNotFound):
        legacy.read_transcript("ses_evil")


def test_detect_and_get_adapter(tmp_path, data_dir):
    copilot_state = tmp_path / "copilot"
    (copilot_state / "0b1c").mkdir(parents=True)
    (copilot_state / "0b1c" / "workspace.yaml").write_text("id: 0b1c\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    legacy_only = tmp_path / "legacy"
    (legacy_only / "storage").mkdir(parents=True)

    assert detect_adapter({"opencode": data_dir, "copilot": copilot_state}) == "opencode"
    assert detect_adapter({"opencode": legacy_only, "copilot": copilot_state}) == "opencode"
    assert detect_adapter({"opencode": empty, "copilot": copilot_state}) == "copilot"
    assert detect_adapter({"opencode": empty, "copilot": empty}) == "none"
    assert detect_adapter({"opencode": None, "copilot": None}) == "none"

    paths = {"opencode": empty, "copilot": copilot_state}
    assert get_adapter("auto", paths).name == "copilot"
    assert get_adapter("opencode", paths).name == "opencode"
    none = get_adapter("none")
    assert none.list_sessions() == []
    with pytest.raises(NoTranscript, match="no_transcript"):
        none.read_transcript(MAIN)
    with pytest.raises(AdapterError, match="unknown session adapter 'windsurf'.*auto, opencode"):
        get_adapter("windsurf", paths)
    with pytest.raises(AdapterError, match="needs"):
        get_adapter("copilot")
