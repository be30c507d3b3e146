"""One bad record costs that record only, and its text never reaches a log or an error
(issue 14 item 5): an OpenCode part row that is not UTF-8, a Copilot line nested 100k deep."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import uuid
from pathlib import Path

import pytest
from conftest import store_location
from inproc import run_llmem
from servers import store_rows
from session_writers import copilot_events_file, copilot_line

from llmem.adapters import CopilotAdapter, OpenCodeAdapter
from llmem.db.packed_text import MAGIC, register_function, unpack

FIXTURES = Path(__file__).parent / "fixtures"
SECRET = "hunter2-TOPSECRET-7731"
DECISION = "We decided to use PostgreSQL for the billing service."
SESSION = "ses_0badc0ffee00BadRowSession01"


def insert_turn(conn, session_id: str, number: int, role: str, parts: list, parent: str | None = None):
    """One message and its parts; a part given as bytes is stored as TEXT exactly as those bytes."""
    message_id = f"msg_{number:03d}badrowmessage{number:010d}"
    created = 1_790_000_000_000 + number * 1000
    info = {"role": role, "time": {"created": created, "completed": created + 500}}
    if role == "assistant":
        info.update(parentID=parent, finish="stop", modelID="m", providerID="p", mode="build")
    conn.execute("INSERT INTO message (id, session_id, time_created, time_updated, data) VALUES (?, ?, ?, ?, ?)",
                 (message_id, session_id, created, created, json.dumps(info)))
    for index, part in enumerate(parts):
        data = part if isinstance(part, bytes) else json.dumps(part).encode()
        # CAST(blob AS TEXT) keeps the bytes: a TEXT value that is not valid UTF-8.
        conn.execute("INSERT INTO part (id, message_id, session_id, time_created, time_updated, data) "
                     "VALUES (?, ?, ?, ?, ?, CAST(? AS TEXT))",
                     (f"prt_{number:03d}{index:02d}badrowpart{number:08d}", message_id, session_id,
                      created, created, data))
    return message_id


def bad_part_id(number: int = 3, index: int = 1) -> str:
    return f"prt_{number:03d}{index:02d}badrowpart{number:08d}"


@pytest.fixture
def opencode_dir(tmp_path):
    """The fixture database plus a session whose second user turn has one part not in UTF-8."""
    directory = tmp_path / "opencode"
    directory.mkdir()
    conn = sqlite3.connect(directory / "opencode.db")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript((FIXTURES / "opencode" / "opencode_fixture.sql").read_text(encoding="utf-8"))
    project = conn.execute("SELECT id FROM project LIMIT 1").fetchone()[0]
    conn.execute("INSERT INTO session (id, project_id, slug, directory, title, version, time_created, "
                 "time_updated) VALUES (?, ?, 'bad-row', '/work/billing', 'Billing', '1.18.33', ?, ?)",
                 (SESSION, project, 1_790_000_000_000, 1_790_000_010_000))
    first = insert_turn(conn, SESSION, 1, "user", [{"type": "text", "text": DECISION}])
    insert_turn(conn, SESSION, 2, "assistant", [{"type": "text", "text": "Noted."}], parent=first)
    bad = b'{"type": "text", "text": "password: ' + SECRET.encode() + b' \xff\xfe broken"}'
    second = insert_turn(conn, SESSION, 3, "user", [{"type": "text", "text": "Also add an index."}, bad])
    insert_turn(conn, SESSION, 4, "assistant", [{"type": "text", "text": "Index added."}], parent=second)
    conn.commit()
    conn.close()
    return directory


def test_a_part_row_not_in_utf8_is_skipped_counted_and_named_without_its_text(opencode_dir, caplog):
    db = opencode_dir / "opencode.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with caplog.at_level(logging.DEBUG, logger="llmem"):
        transcript = OpenCodeAdapter(opencode_dir).read_transcript(SESSION)
    assert [m.text for m in transcript.messages] == [DECISION, "Noted.", "Also add an index.", "Index added."]
    assert transcript.skipped_malformed == 1
    assert bad_part_id() in caplog.text and "not valid UTF-8" in caplog.text
    assert SECRET not in caplog.text
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # read strictly read-only
    # The other sessions in the same database read as before.
    assert OpenCodeAdapter(opencode_dir).list_sessions()


def test_a_session_title_not_in_utf8_does_not_fail_the_session(opencode_dir):
    conn = sqlite3.connect(opencode_dir / "opencode.db")
    conn.execute("UPDATE session SET title = CAST(? AS TEXT) WHERE id = ?", (b"\xff" + SECRET.encode(), SESSION))
    conn.commit()
    conn.close()
    adapter = OpenCodeAdapter(opencode_dir)
    transcript = adapter.read_transcript(SESSION)
    assert transcript.title is None and len(transcript.messages) == 4
    [info] = [s for s in adapter.list_sessions() if s.id == SESSION]
    assert info.title is None


def test_a_part_nested_too_deep_is_skipped(opencode_dir):
    conn = sqlite3.connect(opencode_dir / "opencode.db")
    deep = '{"type": "tool", "tool": "bash", "state": {"input": ' + "[" * 900 + "]" * 900 + "}}"
    insert_turn(conn, SESSION, 5, "assistant", [{"type": "text", "text": "Ran it."}, deep.encode()])
    conn.commit()
    conn.close()
    transcript = OpenCodeAdapter(opencode_dir).read_transcript(SESSION)
    assert transcript.messages[-1].text == "Ran it." and transcript.messages[-1].tool_calls == ()
    assert transcript.skipped_malformed == 2


def run_cli(*args):
    """The real entry point in this process (tests/inproc.py): what it prints and writes is
    the subject here, not its process."""
    done = run_llmem(list(args))
    return done.returncode, done.stdout, done.stderr


def everything_llmem_wrote(home: Path) -> str:
    """hooks.log and every text cell of the store (dream_run rows included), as one string."""
    texts = [path.read_text(errors="replace") for path in (home / "logs").glob("*.log*")]
    assert texts, "no log written"
    location = store_location()
    if isinstance(location, str):  # the suite's PostgreSQL run: every row of every table
        return "\n".join(texts + [str(value) for rows in store_rows(location).values()
                                   for row in rows for value in row])
    # (the store is memory.db: connecting to a name that is not there makes an empty file)
    conn = sqlite3.connect(f"file:{location}?mode=ro", uri=True)
    register_function(conn)  # the FTS view reads episodes through llmem_text (db/packed_text.py)
    try:
        tables = [table for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert "memory" in tables
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                # An episode's text is deflated in the file: read as text, or a secret in it
                # would go unseen.
                texts.extend(str(unpack(value)) if isinstance(value, bytes) and value.startswith(MAGIC)
                             else str(value) for value in row)
    finally:
        conn.close()
    return "\n".join(texts)


def test_a_bad_part_row_costs_no_good_turn_and_leaks_nowhere(opencode_dir, configure, llmem_home):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {opencode_dir}\n")
    code, out, err = run_cli("hook", "--type", "idle", "--session-id", SESSION, "--sync", "--format", "json")
    assert code == 0 and SECRET not in err and SECRET not in out
    result = json.loads(out)
    assert result["errors"] == [] and result["steps"]["extract"]["result"]["adapter"] == "opencode"
    code, out, err = run_cli("search", "PostgreSQL billing", "--json")
    assert code == 0, err
    assert any("PostgreSQL" in hit["content"] for hit in json.loads(out))
    code, out, err = run_cli("backfill", "--no-llm", "--json")
    assert code == 0 and SECRET not in out + err and json.loads(out)["errors"] == []
    assert SECRET not in everything_llmem_wrote(llmem_home)


# ---- Copilot -----------------------------------------------------------------------------------

def deep_line(depth: int) -> str:
    """A user.message whose data holds a secret and a list nested `depth` levels deep."""
    head = json.dumps({"type": "user.message", "id": str(uuid.uuid4()),
                       "data": {"content": f"password: {SECRET}"}})[:-1]
    return head + ', "extra": ' + "[" * depth + "]" * depth + "}\n"


@pytest.fixture
def copilot_state(tmp_path):
    state = tmp_path / "session-state"
    session_id, _ = copilot_events_file(
        state,
        copilot_line("user.message", {"content": DECISION}),
        copilot_line("assistant.message", {"messageId": "a1", "content": "Noted.", "toolRequests": []}),
        deep_line(100_000),
        deep_line(900),  # parses, but too deep for the code that walks tool inputs
        copilot_line("user.message", {"content": "Also add an index."}),
        copilot_line("assistant.message", {"messageId": "a2", "content": "Index added.", "toolRequests": []}),
        cwd="/work/billing")
    return state, session_id


def test_a_copilot_line_nested_100k_deep_is_skipped_and_counted(copilot_state, caplog):
    state, session_id = copilot_state
    with caplog.at_level(logging.DEBUG, logger="llmem"):
        transcript = CopilotAdapter(state).read_transcript(session_id)
    assert [m.text for m in transcript.messages] == [DECISION, "Noted.", "Also add an index.", "Index added."]
    assert transcript.skipped_malformed == 2
    assert "line 4" in caplog.text and "line 5" in caplog.text and "nested deeper" in caplog.text
    assert SECRET not in caplog.text


def test_a_deep_copilot_line_costs_no_good_turn_and_leaks_nowhere(copilot_state, configure, llmem_home, tmp_path):
    state, session_id = copilot_state
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {tmp_path / 'no-opencode'}\n"
              f"  copilot:\n    state_dir: {state}\n    share_dir: {tmp_path}\n")
    code, out, err = run_cli("hook", "--type", "idle", "--session-id", session_id, "--sync", "--format", "json")
    assert code == 0 and SECRET not in err and SECRET not in out
    assert json.loads(out)["errors"] == []
    code, out, err = run_cli("search", "PostgreSQL billing", "--json")
    assert code == 0, err
    assert any("PostgreSQL" in hit["content"] for hit in json.loads(out))
    assert SECRET not in everything_llmem_wrote(llmem_home)


def test_a_workspace_yaml_nested_100k_deep_costs_only_the_title(copilot_state):
    state, session_id = copilot_state
    (state / session_id / "workspace.yaml").write_text("name: " + "[" * 100_000 + "]" * 100_000 + "\n")
    adapter = CopilotAdapter(state)
    transcript = adapter.read_transcript(session_id)
    assert transcript.title is None and len(transcript.messages) == 4
    assert [s.id for s in adapter.list_sessions()] == [session_id]


def test_a_message_id_not_in_utf8_costs_that_message_only(opencode_dir, caplog):
    conn = sqlite3.connect(opencode_dir / "opencode.db")
    info = json.dumps({"role": "user", "time": {"created": 1_790_000_009_000}, "text": SECRET})
    conn.execute("INSERT INTO message (id, session_id, time_created, time_updated, data) "
                 "VALUES (CAST(? AS TEXT), ?, ?, ?, ?)",
                 (b"msg_\xff" + SECRET.encode(), SESSION, 1_790_000_009_000, 1_790_000_009_000, info))
    conn.commit()
    conn.close()
    with caplog.at_level(logging.DEBUG, logger="llmem"):
        transcript = OpenCodeAdapter(opencode_dir).read_transcript(SESSION)
    assert len(transcript.messages) == 4 and transcript.skipped_malformed == 2
    assert "id is not valid UTF-8" in caplog.text and SECRET not in caplog.text
