"""Session hooks: what each event does, Copilot's stdin JSON, and failing open on every error."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port_url, store_location

from llmem.app import App
from llmem.errors import LLMUnavailable
from llmem.pipeline import handlers
from llmem.providers import llm as llm_module

FIXTURES = Path(__file__).parent / "fixtures" / "copilot"
SESSION = "7d3c2b1a-5e4f-4a8b-9c0d-1e2f3a4b5c6d"
PROJECT = "/home/dev/acme-api"
BASE = "embedding:\n  provider: none\nllm:\n  provider: none\n"


@pytest.fixture
def state_dir(tmp_path):
    state = tmp_path / "copilot" / "session-state"
    shutil.copytree(FIXTURES / "session-state", state)
    return state


@pytest.fixture
def copilot_config(configure, state_dir):
    configure(BASE + f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n")
    return state_dir


def seed(*memories):
    app = App()
    try:
        return [app.store.add(c, t, project=p).memory.id for c, t, p in memories]
    finally:
        app.close()


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("llmem hook "), lines[0]
    return lines[0]


# ---- what each event does ------------------------------------------------------------------

@pytest.fixture
def recorded_steps(monkeypatch):
    """Stand-ins for extract_session / introspect_session that record their calls."""
    calls = []

    def fake(step):
        def run(app, session_id, *, adapter_name=None, llm=None):
            calls.append((step, session_id, adapter_name, llm))
            return {"step": step, "memories_added": 1}
        return run

    monkeypatch.setattr(handlers, "step_function", fake)
    monkeypatch.setattr(llm_module, "make_llm", lambda config, *, model, base_url, store: f"llm:{model}:{base_url}")
    return calls


@pytest.mark.parametrize("kind, steps", [
    ("created", []), ("idle", ["extract", "introspect"]), ("ending", ["extract", "introspect"]),
    ("compacting", ["extract"]),
])
def test_each_event_runs_its_steps(copilot_config, recorded_steps, kind, steps):
    app = App()
    try:
        result = handlers.handle_session_event(app, kind, SESSION, adapter_name="copilot",
                                               model="m1", base_url="http://127.0.0.1:9")
    finally:
        app.close()
    assert [c[0] for c in recorded_steps] == steps
    assert all(c[1:] == (SESSION, "copilot", "llm:m1:http://127.0.0.1:9") for c in recorded_steps)
    assert result.errors == []
    assert (result.context is not None) == (kind in ("created", "compacting"))
    if kind == "compacting":
        assert "preserve across compaction" in result.context


def test_worker_mode_raises_hook_mode_collects(copilot_config, monkeypatch):
    def broken(app, session_id, **kw):
        raise LLMUnavailable("Could not reach Ollama")

    monkeypatch.setattr(handlers, "step_function", lambda step: broken)
    monkeypatch.setattr(llm_module, "make_llm", lambda *a, **kw: None)
    app = App()
    try:
        with pytest.raises(LLMUnavailable):  # the worker retries the event
            handlers.handle_session_event(app, "compacting", SESSION)
        result = handlers.handle_session_event(app, "compacting", SESSION, fail_open=True)
    finally:
        app.close()
    assert result.errors == ["extract: Could not reach Ollama"]
    assert result.steps["extract"]["result"] == "failed"
    assert result.context.startswith("<llmem-context>")  # the compaction still gets its block


def test_deferred_extraction_says_when_to_retry(copilot_config, monkeypatch):
    monkeypatch.setattr(handlers, "step_function",
                        lambda step: lambda app, sid, **kw: {"deferred": True, "llm_error": "budget spent"})
    monkeypatch.setattr(llm_module, "make_llm", lambda *a, **kw: None)
    app = App()
    try:
        result = handlers.handle_session_event(app, "idle", SESSION)
    finally:
        app.close()
    assert result.deferred_until > time.time() and result.deferred_reason == "budget spent"


def test_adapter_none_is_no_transcript_not_an_error(configure, cli):
    configure(BASE + "session:\n  adapter: none\n")
    code, out, err = cli("hook", "--type", "idle", "--session-id", "ses_1", "--sync", "--format", "json")
    assert code == 0 and err == ""
    steps = json.loads(out)["steps"]
    assert {s["result"] for s in steps.values()} == {"no_transcript"}


def test_unknown_kind_and_bad_id_raise_in_the_library(copilot_config):
    from llmem.adapters import InvalidSessionId
    from llmem.errors import UsageError

    app = App()
    try:
        with pytest.raises(UsageError):
            handlers.handle_session_event(app, "exploded", SESSION)
        with pytest.raises(InvalidSessionId):
            handlers.handle_session_event(app, "idle", "../../etc")
    finally:
        app.close()


# ---- the hook command --------------------------------------------------------------------

# How fast a hook answers is bench/hooks.py's to measure (fresh processes, percentiles).

def test_created_prints_the_block(cli, copilot_config):
    [decision] = seed(("Order pages by (created_at, id)", "decision", PROJECT))
    code, out, err = cli("hook", "--type", "created", "--session-id", SESSION)
    assert code == 0 and err == ""
    assert out.startswith("<llmem-context>") and f"[{decision[:8]}]" in out


def test_created_in_a_fresh_process(copilot_config):
    seed(("Order pages by (created_at, id)", "decision", PROJECT))
    proc = subprocess.run([sys.executable, "-m", "llmem", "hook", "--type", "created",
                           "--session-id", SESSION], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stderr == ""
    assert "Order pages by (created_at, id)" in proc.stdout


def test_copilot_session_start_json_on_stdin(cli, copilot_config, monkeypatch, tmp_path):
    [decision] = seed(("Order pages by (created_at, id)", "decision", PROJECT))
    payload = {"sessionId": SESSION, "timestamp": 1, "cwd": PROJECT, "source": "new"}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(payload)))
    code, out, err = cli("hook", "--type", "created", "--format", "copilot")
    assert code == 0 and err == ""
    context = json.loads(out)["additionalContext"]
    assert context.startswith("<llmem-context>") and decision[:8] in context

    # a cwd inside the repo maps to its root (the scope memories are stored under)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    [mine] = seed(("Repo rule: no print statements", "preference", str(repo)))
    payload = {"sessionId": "ses_unknown1", "cwd": str(repo / "src")}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(payload)))
    code, out, err = cli("hook", "--type", "created", "--format", "copilot")
    assert code == 0 and mine[:8] in json.loads(out)["additionalContext"]

    # agentStop: nothing on stdout (Copilot would read an answer as "keep going")
    payload = {"sessionId": SESSION, "cwd": PROJECT, "stopReason": "end_turn"}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(payload)))
    code, out, err = cli("hook", "--type", "idle", "--format", "copilot")
    assert code == 0 and out == ""


def test_idle_and_ending_run_on_the_transcript(cli, copilot_config):
    code, out, err = cli("hook", "--type", "idle", "--session-id", SESSION, "--sync", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert set(result["steps"]) == {"extract", "introspect"}
    code, out, err = cli("hook", "--type", "ending", "--session-id", SESSION, "--sync")
    assert code == 0 and out.startswith(f"ending {SESSION}:")


# ---- failing open ---------------------------------------------------------------------------

def test_invalid_session_id_fails_open(cli, copilot_config, llmem_home):
    code, out, err = cli("hook", "--type", "idle", "--session-id", "../../etc/passwd")
    assert code == 0 and out == ""
    assert "invalid session id" in one_line(err)
    assert "invalid session id" in (llmem_home / "logs" / "hooks.log").read_text()


def test_bad_config_fails_open(cli, configure, llmem_home):
    configure("context:\n  max_tokens: lots\n")
    code, out, err = cli("hook", "--type", "created", "--session-id", SESSION)
    assert code == 0 and out == ""
    assert "max_tokens" in one_line(err)
    assert "max_tokens" in (llmem_home / "logs" / "hooks.log").read_text()


def test_unopenable_store_fails_open(cli, configure, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    configure(BASE + f"db_path: {blocker}/memory.db\n")
    for kind in ("created", "idle", "compacting"):
        code, out, err = cli("hook", "--type", kind, "--session-id", SESSION)
        assert code == 0, kind
        one_line(err)


def test_corrupt_store_fails_open(cli, configure, tmp_path):
    garbage = tmp_path / "memory.db"
    garbage.write_bytes(b"this is not a database" * 100)
    configure(BASE + f"db_path: {garbage}\nsession:\n  adapter: none\n")
    code, out, err = cli("hook", "--type", "created", "--session-id", SESSION)
    assert code == 0 and out == ""
    one_line(err)


def test_locked_store_fails_open(cli, copilot_config, llmem_home, monkeypatch):
    from llmem.db import connection

    seed(("Order pages by (created_at, id)", "decision", PROJECT))
    monkeypatch.setattr(connection, "BUSY_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(connection, "PRAGMAS", tuple(
        (name, 200 if name == "busy_timeout" else value) for name, value in connection.PRAGMAS))
    # Another process holds the write lock (in-process, a second SQLite library copy would not
    # see the lock: POSIX locks are per process).
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); "
         "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(30)",
         str(llmem_home / "memory.db")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    try:
        code, out, err = cli("hook", "--type", "idle", "--session-id", SESSION, "--sync")
        assert code == 0
        assert "locked" in one_line(err)
        code, out, err = cli("hook", "--type", "created", "--session-id", SESSION)
        assert code == 0  # a block, or one line: never a failure
        assert out.startswith("<llmem-context>") or one_line(err)
    finally:
        holder.kill()
        holder.wait()


def test_llm_down_fails_open(cli, configure, state_dir):
    configure(f"embedding:\n  provider: none\nllm:\n  provider: ollama\n  base_url: {free_port_url()}\n"
              f"  timeout: 2\nsession:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n")
    code, out, err = cli("hook", "--type", "idle", "--session-id", SESSION, "--sync")
    assert code == 0
    assert len([line for line in err.splitlines() if line.strip()]) <= 1, err


@pytest.mark.parametrize("stdin", ["", "{not json", "[1, 2]", '{"cwd": "/tmp"}'])
def test_no_usable_session_id_fails_open(cli, copilot_config, monkeypatch, stdin):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code, out, err = cli("hook", "--type", "created", "--format", "copilot")
    assert code == 0 and out == ""
    one_line(err)


def test_detach_returns_at_once_and_the_work_runs_in_background(cli, copilot_config, llmem_home):
    code, out, err = cli("hook", "--type", "idle", "--session-id", SESSION, "--detach",
                         "--format", "json")
    assert code == 0, err
    pid = json.loads(out)["detached"]
    _, status = os.waitpid(pid, 0)  # our child: wait for it rather than sleep
    assert os.waitstatus_to_exitcode(status) == 0
    log_text = (llmem_home / "logs" / "hooks.log").read_text()
    # The background process logged its own run (lines naming its pid, not the parent's line).
    assert [line for line in log_text.splitlines() if str(pid) in line and "(pid" not in line]


# ---- enqueue by default -----------------------------------------------------------------------

def test_hooks_enqueue_when_a_worker_is_alive(cli, copilot_config, llmem_home):
    from llmem.cli.queueing import open_queue
    from llmem.config import load_config
    from llmem.pipeline.events import worker_heartbeat
    from llmem.store import Store

    with Store.open(store_location()) as store:
        worker_heartbeat(store)
    code, out, err = cli("hook", "--type", "idle", "--session-id", SESSION, "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert "event_id" in result and "detached" not in result and result["steps"] == {}
    code, out, err = cli("hook", "--type", "compacting", "--session-id", SESSION, "--format", "json")
    result = json.loads(out)
    assert "event_id" in result and result["context"].startswith("<llmem-context>")
    with Store.open(store_location()) as store:
        Event = store.models.Event
        kinds = [(e.kind, e.status) for e in Event.select().order_by(Event.id)]
    assert kinds == [("idle", "pending"), ("compacting", "pending")]
    huey, _ = open_queue(load_config())
    assert huey.pending_count() == 2
    # the same moment again while still pending is one event, one task
    cli("hook", "--type", "idle", "--session-id", SESSION)
    assert huey.pending_count() == 2


def test_hooks_run_detached_when_no_worker_is_alive(cli, copilot_config, llmem_home):
    from llmem.store import Store

    code, out, err = cli("hook", "--type", "idle", "--session-id", SESSION, "--format", "json")
    assert code == 0, err
    pid = json.loads(out)["detached"]
    _, status = os.waitpid(pid, 0)
    assert status == 0
    with Store.open(store_location()) as store:  # the detached run read the session
        SessionCursor = store.models.SessionCursor
        assert SessionCursor.get(SessionCursor.session_id == SESSION).cursor


def test_the_compaction_block_reads_the_session_with_the_hooks_adapter(cli, configure, state_dir,
                                                                       llmem_home, tmp_path):
    """The hook's --adapter names the agent; the block must read that agent's transcript too,
    not the configured adapter's (which does not hold the session): without it the block lost
    the session's project and with it the project's memories."""
    from llmem.pipeline.events import worker_heartbeat
    from llmem.store import Store

    configure(BASE + f"session:\n  adapter: opencode\n  opencode:\n    data_dir: {tmp_path / 'none'}\n"
              f"  copilot:\n    state_dir: {state_dir}\n")
    [decision] = seed(("Order pages by (created_at, id)", "decision", PROJECT))
    with Store.open(store_location()) as store:
        worker_heartbeat(store)
    code, out, err = cli("hook", "--type", "compacting", "--adapter", "copilot",
                         "--session-id", SESSION, "--format", "json")
    assert code == 0, err
    assert f"[{decision[:8]}]" in json.loads(out)["context"]


# ---- a bad command line fails open too (a stale hook after an upgrade) -------------------------

@pytest.mark.parametrize("args", [
    ["--type", "idle", "--adapter", "claude", "--format", "claude", "--no-such-flag"],
    ["--type", "no-such-moment"],
    ["--format", "claude"],  # --type missing
    ["--type", "idle", "--max-tokens", "3"],
])
def test_a_bad_hook_command_line_fails_open(cli, copilot_config, llmem_home, args):
    code, out, err = cli("hook", *args)
    assert code == 0 and out == ""
    one_line(err)
    assert "bad command line" in (llmem_home / "logs" / "hooks.log").read_text()  # `llmem logs` shows it


def test_a_bad_hook_command_line_fails_open_in_a_real_process(copilot_config):
    done = subprocess.run(
        [sys.executable, "-m", "llmem", "hook", "--type", "idle", "--adapter", "claude",
         "--format", "claude", "--no-such-flag"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == ""
    assert "--no-such-flag" in one_line(done.stderr)


def test_a_bad_command_line_elsewhere_is_still_a_usage_error(cli, copilot_config):
    code, out, err = cli("list", "--no-such-flag")
    assert code == 2 and "--no-such-flag" in err


def test_hooks_see_a_killed_worker_at_once(cli, copilot_config, llmem_home):
    """After `kill -9` of the worker, the next hook runs the work itself (detached) at once,
    not queued for nobody until the heartbeat goes stale."""
    from llmem.store import Store

    Store.open(store_location()).close()
    beater = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from llmem.store import Store; "
         "from llmem.pipeline.events import worker_heartbeat; store = Store.open(sys.argv[1]); "
         "worker_heartbeat(store); store.close(); print('beat', flush=True); time.sleep(60)",
         str(store_location())], stdout=subprocess.PIPE, text=True)
    try:
        assert beater.stdout.readline().strip() == "beat"
        code, out, err = cli("hook", "--type", "idle", "--session-id", SESSION, "--format", "json")
        assert code == 0 and "event_id" in json.loads(out), err  # alive: queued for it
    finally:
        beater.kill()
        beater.wait()
    code, out, err = cli("hook", "--type", "compacting", "--session-id", SESSION, "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert "event_id" not in result
    _, status = os.waitpid(result["detached"], 0)
    assert status == 0
