"""Hooks with no worker: the detached process is isolated from the agent's folder, and a
burst of hooks for one session runs one process at a time (issue 14 items 2 and 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import store_location
from fakes import wait_until
from session_writers import CopilotSession, copilot_session

from llmem.config import load_config
from llmem.pipeline.detached import SessionRun, covering_kind
from llmem.store import Store

PLANTED = "import pathlib\npathlib.Path({marker!r}).write_text(__name__)\n"


def new_session(state: Path, *texts: str) -> tuple[str, CopilotSession]:
    session = copilot_session(state)
    for text in texts:
        session.turn(text)
    return session.id, session


def run_is_over(session_id: str) -> bool:
    """No process holds the session's run lock and no hook's request is left waiting."""
    run = SessionRun(load_config(), session_id)
    if not run.try_lock():
        return False
    run.release()
    return not run.has_notes()


def session_cursor(llmem_home: Path, session_id: str):
    with Store.open(store_location()) as store:
        SessionCursor = store.models.SessionCursor
        row = SessionCursor.get_or_none(SessionCursor.session_id == session_id)
        return row.cursor if row else None


@pytest.fixture
def copilot_home(configure, tmp_path):
    state = tmp_path / "copilot" / "session-state"
    state.mkdir(parents=True)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n")
    return state


def test_detached_hook_runs_no_code_from_the_agents_folder(copilot_home, llmem_home, tmp_path):
    session_id, _ = new_session(copilot_home, "remember that the build needs node 20")
    project = tmp_path / "cloned-project"  # the agent's cwd: a project nobody vetted
    marker = tmp_path / "planted-code-ran"
    (project / "llmem").mkdir(parents=True)
    for planted in (project / "yaml.py", project / "peewee.py", project / "llmem" / "__init__.py"):
        planted.write_text(PLANTED.format(marker=str(marker)))
    # The installed entry point, as the agents' hook files run it (its own folder is on the
    # path, not the cwd): what imports the planted files, if anything, is the detached child.
    entry_point = Path(sys.executable).parent / "llmem"
    done = subprocess.run([str(entry_point), "hook", "--type", "idle", "--session-id", session_id,
                           "--format", "json"], cwd=project, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "detached" in json.loads(done.stdout)
    wait_until(lambda: marker.exists() or session_cursor(llmem_home, session_id),
               timeout=60, interval=0.1)
    wait_until(lambda: run_is_over(session_id), timeout=60, interval=0.1)
    assert not marker.exists(), f"the hook imported {marker.read_text()} from the agent's folder"
    assert session_cursor(llmem_home, session_id)  # and the work was done


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_a_burst_of_idle_hooks_runs_one_process_at_a_time(cli, configure, tmp_path, llmem_home, model_server):
    state = tmp_path / "copilot" / "session-state"
    state.mkdir(parents=True)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"  timeout: 30\nsession:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n")
    model_server.mode, model_server.delay = "slow", 0.3
    session_id, session = new_session(state)
    answers = []
    started = time.monotonic()
    for i in range(15):  # an agent going idle after every turn, 15 times in two seconds
        session.turn(f"remember that service {i} listens on port {7000 + i}")
        code, out, err = cli("hook", "--type", "idle", "--session-id", session_id, "--format", "json")
        assert code == 0, err
        answers.append(json.loads(out))
        time.sleep(0.13)
    assert time.monotonic() - started < 6
    spawned = {a["detached"] for a in answers if "detached" in a}
    assert len(spawned) <= 2, answers
    assert all("detached" in a or "coalesced" in a for a in answers)
    for pid in spawned:  # our children: wait for them rather than poll
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    run = SessionRun(load_config(), session_id)
    # Nothing left waiting, and no lock file left behind per session.
    assert not run.again_path.exists() and not run.lock_path.exists()
    with Store.open(store_location()) as store:
        Memory = store.models.Memory
        contents = [m.content for m in Memory.select()]
    missing = [7000 + i for i in range(15) if not any(str(7000 + i) in c for c in contents)]
    assert not missing, (missing, contents)
    chats = [body for path, body in model_server.requests if path == "/api/chat"]
    assert len(chats) <= 16, len(chats)  # a few runs of 4 calls each, not 15 runs


def test_coalesced_kinds_run_as_one_kind_that_covers_them():
    from llmem.pipeline.handlers import STEPS

    for kind in ("idle", "ending", "compacting"):
        assert covering_kind({kind}) == kind
    for kinds in ({"ending", "compacting"}, {"idle", "ending"}, {"idle", "compacting", "ending"}):
        chosen = covering_kind(kinds)
        assert set().union(*(STEPS[k] for k in kinds)) - {"context"} <= set(STEPS[chosen])


@pytest.mark.parametrize("how", ["detached", "queued", "coalesced"])
def test_a_hook_that_does_not_run_inline_says_what_happened(cli, copilot_home, llmem_home, how):
    from llmem.pipeline.events import worker_heartbeat

    session_id, _ = new_session(copilot_home, "remember that the api is versioned")
    if how == "queued":
        with Store.open(store_location()) as store:
            worker_heartbeat(store)
    held = SessionRun(load_config(), session_id)
    if how == "coalesced":
        assert held.try_lock()  # a background run for this session is going on
        held.record_holder(4242)
    try:
        code, out, err = cli("hook", "--type", "idle", "--session-id", session_id, "--format", "copilot")
    finally:
        held.release()
    assert code == 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    expected = {"detached": "llmem hook idle: running in the background (pid ",
                "queued": "llmem hook idle: queued as event ",
                "coalesced": "llmem hook idle: joined the background run already going for this "
                             "session (pid 4242)"}[how]
    assert lines[0].startswith(expected), lines[0]
    if how == "detached":
        pid = int(lines[0].rsplit(" ", 1)[1].rstrip(")"))
        os.waitpid(pid, 0)
    if how == "coalesced":  # the request waits for the running process
        assert held.take_notes() == {"idle"}
