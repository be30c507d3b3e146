"""Under `session.adapter: auto` with OpenCode and Copilot both installed, every command that
takes a session id reads it from the agent that owns it (issue 9 item 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from inproc import run_llmem
from session_writers import recorded_opencode_store

from llmem.adapters import SessionNotFound, id_shape, resolve_adapter
from llmem.config import load_config

FIXTURES = Path(__file__).parent / "fixtures"
OPENCODE_ID = "ses_f0d5df91fffeoLpXSBPHrYDK6h"
COPILOT_ID = "7d3c2b1a-5e4f-4a8b-9c0d-1e2f3a4b5c6d"
UNKNOWN_ID = "0f0f0f0f-1111-4222-8333-444444444444"


@pytest.fixture
def both_agents(configure, tmp_path):
    """Both agents installed, each with the recorded fixture sessions; session.adapter auto."""
    opencode = tmp_path / "opencode"
    recorded_opencode_store(opencode)
    state = tmp_path / "copilot" / "session-state"
    shutil.copytree(FIXTURES / "copilot" / "session-state", state)
    shares = tmp_path / "shares"
    shares.mkdir()
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              "session:\n  adapter: auto\n"
              f"  opencode:\n    data_dir: {opencode}\n"
              f"  copilot:\n    state_dir: {state}\n    share_dir: {shares}\n")
    return opencode, state


def run_cli(*args, stdin: str | None = None):
    """The real entry point in this process, the agent's JSON on its stdin (tests/inproc.py)."""
    done = run_llmem(list(args), stdin=stdin.encode() if stdin is not None else None)
    return done.returncode, done.stdout, done.stderr


def recent_events(cli) -> list[dict]:
    code, out, err = cli("queue", "--json", "-n", "50")
    assert code == 0, err
    return json.loads(out)["recent"]


# ---- the resolver ------------------------------------------------------------------------------

def test_ids_have_each_agents_shape():
    assert id_shape(OPENCODE_ID) == "opencode"
    assert id_shape(COPILOT_ID) == "copilot"
    assert id_shape(COPILOT_ID.upper()) == "copilot"
    assert id_shape("my-session") is None


def test_each_id_resolves_to_the_store_that_holds_it(both_agents):
    config = load_config()
    assert resolve_adapter(config, OPENCODE_ID).name == "opencode"
    assert resolve_adapter(config, COPILOT_ID).name == "copilot"
    # An explicit adapter is taken as given, without a lookup.
    assert resolve_adapter(config, UNKNOWN_ID, "opencode").name == "opencode"


def test_an_id_of_neither_shape_is_looked_up_in_every_store(both_agents):
    _, state = both_agents
    (state / "imported-session").mkdir()
    (state / "imported-session" / "events.jsonl").write_text("")
    assert resolve_adapter(load_config(), "imported-session").name == "copilot"


def test_an_id_no_store_holds_names_every_store_looked_in(both_agents):
    opencode, state = both_agents
    with pytest.raises(SessionNotFound) as caught:
        resolve_adapter(load_config(), UNKNOWN_ID)
    message = caught.value.message
    assert "not found" in message and str(opencode) in message and str(state) in message


def test_no_agent_installed_means_nothing_to_read(configure, tmp_path):
    configure(f"session:\n  adapter: auto\n  opencode:\n    data_dir: {tmp_path / 'none-a'}\n"
              f"  copilot:\n    state_dir: {tmp_path / 'none-b'}\n")
    assert resolve_adapter(load_config(), COPILOT_ID).name == "none"


# ---- each command under auto -----------------------------------------------------------------

def test_enqueue_records_the_owning_agent(both_agents, cli):
    for session_id, agent in ((COPILOT_ID, "copilot"), (OPENCODE_ID, "opencode")):
        code, out, err = cli("enqueue", "idle", session_id, "--json")
        assert code == 0, err
        event_id = json.loads(out)["event_id"]
        [event] = [e for e in recent_events(cli) if e["id"] == event_id]
        assert event["adapter"] == agent and event["session_id"] == session_id


def test_enqueue_of_an_unknown_id_is_not_found(both_agents, cli):
    opencode, state = both_agents
    code, _, err = cli("enqueue", "idle", UNKNOWN_ID)
    assert code == 1
    assert "not found" in err and str(opencode) in err and str(state) in err
    assert "Traceback" not in err
    assert recent_events(cli) == []


def test_enqueue_rejects_an_unknown_adapter(both_agents, cli):
    code, _, err = cli("enqueue", "idle", COPILOT_ID, "--adapter", "windsurf")
    assert code == 2 and "windsurf" in err


def test_introspect_a_copilot_session(both_agents, cli):
    code, out, err = cli("introspect", "--auto", "--session", COPILOT_ID, "--json")
    assert code == 0, err
    assert isinstance(json.loads(out), list)
    code, _, err = cli("introspect", "--auto", "--session", UNKNOWN_ID)
    assert code == 1 and "not found" in err


def test_context_reads_a_copilot_session(both_agents, cli):
    code, out, err = cli("context", "--session-id", COPILOT_ID, "--json")
    assert code == 0, err
    block = json.loads(out)
    assert block["session_found"] and block["project"] == "/home/dev/acme-api"
    code, out, err = cli("context", "--session-id", OPENCODE_ID, "--json")
    assert code == 0 and json.loads(out)["session_found"], err
    code, _, err = cli("context", "--session-id", UNKNOWN_ID)
    assert code == 1 and "not found" in err


def test_hook_runs_on_a_copilot_session(both_agents, cli):
    code, out, err = cli("hook", "--type", "idle", "--session-id", COPILOT_ID, "--sync", "--format", "json")
    assert code == 0 and err == "", err
    result = json.loads(out)
    assert result["errors"] == []
    assert result["steps"]["extract"]["result"]["adapter"] == "copilot"


def test_a_copilot_hook_installed_before_adapters_were_named_queues_for_copilot(both_agents):
    from llmem.app import App
    from llmem.pipeline.events import worker_heartbeat

    app = App()
    try:
        worker_heartbeat(app.store)  # a worker is alive: the hook queues its event
    finally:
        app.close()
    payload = json.dumps({"sessionId": COPILOT_ID, "timestamp": 1, "cwd": "/home/dev/acme-api",
                          "stopReason": "end_turn"})
    code, _, err = run_cli("hook", "--type", "idle", "--format", "copilot", stdin=payload)
    assert code == 0 and "queued as event" in err and "not found" not in err
    code, out, _ = run_cli("queue", "--json")
    [event] = json.loads(out)["recent"]
    assert (event["adapter"], event["session_id"]) == ("copilot", COPILOT_ID)


def test_a_hook_for_an_unknown_id_fails_open_naming_the_stores(both_agents, cli):
    from llmem.app import App
    from llmem.pipeline.events import worker_heartbeat

    app = App()
    try:
        worker_heartbeat(app.store)
    finally:
        app.close()
    code, _, err = cli("hook", "--type", "idle", "--session-id", UNKNOWN_ID)
    assert code == 0 and "not found" in err and str(both_agents[1]) in err


# ---- the worker ------------------------------------------------------------------------------

def test_the_worker_reads_the_session_an_event_names(both_agents, cli):
    from llmem.app import App
    from llmem.pipeline.events import run_event

    code, out, err = cli("enqueue", "idle", COPILOT_ID, "--json")
    assert code == 0, err
    app = App()
    try:
        outcome = run_event(app, json.loads(out)["event_id"])
    finally:
        app.close()
    assert outcome.status == "done", outcome.error


@pytest.mark.parametrize("adapter, session_id, error", [
    ("opencode", COPILOT_ID, "not found"),  # what `auto` recorded before sessions were resolved
    ("copilot", UNKNOWN_ID, "not found"),
    ("windsurf", COPILOT_ID, "unknown session adapter"),  # an agent llmem does not read
])
def test_an_event_that_can_never_succeed_fails_once(both_agents, cli, adapter, session_id, error):
    from llmem.app import App
    from llmem.pipeline.events import events_to_reconcile, record_event, run_event

    app = App()
    try:
        event, _ = record_event(app.store, adapter, session_id, "idle")
        outcome = run_event(app, event.id)
        # Nothing puts it back on the queue, however long one waits.
        lost = events_to_reconcile(app.store, pending_after=-1e9, running_after=-1e9)
    finally:
        app.close()
    assert outcome.status == "failed" and error in outcome.error
    assert event.id not in [e.id for e in lost]
    [row] = [e for e in recent_events(cli) if e["id"] == event.id]
    assert row["status"] == "failed" and row["attempts"] == 1 and error in row["error"]


# ---- backfill --------------------------------------------------------------------------------

def test_backfill_under_auto_reads_every_agent_and_says_so(both_agents, cli):
    code, out, err = cli("backfill", "--no-llm", "--json")
    assert code == 0, err
    outcome = json.loads(out)
    assert outcome["adapters"] == ["opencode", "copilot"]
    assert outcome["sessions_by_adapter"]["opencode"] >= 1
    assert outcome["sessions_by_adapter"]["copilot"] >= 1
    assert outcome["errors"] == []
    # Resumable across both agents: nothing is read twice.
    code, out, err = cli("backfill", "--no-llm")
    assert code == 0, err
    assert "opencode" in out and "copilot" in out and "0 memories added" in out


def test_backfill_of_one_named_agent_reads_only_it(both_agents, cli):
    code, out, err = cli("backfill", "--no-llm", "--adapter", "copilot", "--json")
    assert code == 0, err
    outcome = json.loads(out)
    assert outcome["adapters"] == ["copilot"] and set(outcome["sessions_by_adapter"]) == {"copilot"}


def test_doctor_names_every_agent_auto_reads(both_agents, cli):
    code, out, err = cli("doctor", "--json")
    assert json.loads(out)["adapter"] == "opencode, copilot", err
