"""The pipeline with a real huey consumer in a separate process over a temp queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from fakes import wait_until
from session_writers import CopilotSession, append_lines, copilot_turn_lines

from llmem.store import Store

LLMEM = [sys.executable, "-m", "llmem"]
FIXTURE_STATE = Path(__file__).parent / "fixtures" / "copilot" / "session-state"


@pytest.fixture
def home(llmem_home, tmp_path, configure):
    state = tmp_path / "copilot" / "session-state"
    state.mkdir(parents=True)
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n"
              f"  opencode:\n    data_dir: {tmp_path / 'no-opencode'}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n"
              "  running_timeout_minutes: 0.002\n  reconcile_pending_seconds: 1\n")
    return llmem_home, state


def start(*args, env=None):
    # Output goes to a file, never to a pipe nobody reads: `llmem run` logs each event to
    # stderr, and once the 64 KiB pipe buffer is full every logging thread blocks on it
    # (events stall, and a stop waits for them).
    env = env or os.environ.copy()
    output = Path(env["LLMEM_HOME"]).parent / f"{args[0]}-{uuid.uuid4().hex[:8]}.out"
    with output.open("w") as sink:
        process = subprocess.Popen([*LLMEM, *args], env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    process.output = output
    return process


def wait_started(process, timeout: float = 60.0) -> None:
    """Until `llmem run`/`watch` says it is up (its watcher attached: the line ending in
    "Ctrl-C stops" comes after it), instead of guessing a time; a start that takes longer
    under load, or with the resident hook server starting first, is waited for."""
    from fakes import wait_until

    wait_until(lambda: "Ctrl-C stops" in process.output.read_text() or process.poll() is not None,
               timeout=timeout)
    assert process.poll() is None, process.output.read_text()


def run_cli(*args):
    done = subprocess.run([*LLMEM, *args], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def events(home):
    code, out, _ = run_cli("queue", "--json", "-n", "50")
    return json.loads(out)["recent"]


def memories(home):
    code, out, _ = run_cli("list", "--json", "--limit", "500")
    return json.loads(out)


def typed_memories(home):
    """The memories extraction wrote, not the episodes (source `episode`: each turn kept as it
    was said, capture/episodes.py), which every session also leaves."""
    return [m for m in memories(home) if m["source"] != "episode"]


def episodes(home):
    return [m for m in memories(home) if m["source"] == "episode"]


def new_session(state: Path, *texts: str) -> str:
    """A finished session, session.start and every turn in one write."""
    session = CopilotSession(state)
    session.start(locked=False)
    for text in texts:
        session.turn(text, "done", flush=False)
    session.write()
    return session.id


def stop(process, sig=signal.SIGINT, timeout=20):
    process.send_signal(sig)
    try:
        return process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_worker_processes_an_enqueued_event_and_stops_on_sigint(home):
    _, state = home
    session_id = new_session(state, "remember that the staging database listens on port 6543")
    code, out, err = run_cli("enqueue", "idle", session_id, "--adapter", "copilot")
    assert code == 0, err
    assert out.startswith("event:")
    worker = start("worker", "-w", "2")
    try:
        wait_until(lambda: [e for e in events(home) if e["status"] == "done"])
        found = [m for m in typed_memories(home) if "6543" in m["content"]]
        assert found and found[0]["session_id"] == session_id
        [episode] = [m for m in episodes(home) if "6543" in m["content"]]
        assert (episode["type"], episode["session_id"]) == ("conversation", session_id)
        # the same event again adds nothing: no second fact, no second episode
        event_id = events(home)[0]["id"]
        run_cli("queue", "retry", str(event_id))
        wait_until(lambda: events(home)[0]["status"] == "done" and events(home)[0]["attempts"] == 1)
        assert len([m for m in typed_memories(home) if "6543" in m["content"]]) == 1
        assert len([m for m in episodes(home) if "6543" in m["content"]]) == 1
    finally:
        assert stop(worker) == 0


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_run_end_to_end_turn_becomes_searchable(home):
    _, state = home
    runner = start("run", "-w", "2")
    try:
        wait_started(runner)
        session_id = new_session(state, "remember that deploys need the vpn turned on")
        wait_until(lambda: json.loads(run_cli("search", "vpn deploys", "--json", "--no-track")[1]), timeout=30)
        kinds = {e["kind"] for e in events(home) if e["session_id"] == session_id}
        assert {"created", "idle"} <= kinds
    finally:
        assert stop(runner) in (0, -signal.SIGINT)


@pytest.mark.slow
def test_restarted_run_announces_nothing_twice_and_extracts_what_was_written_meanwhile(home):
    _, state = home
    runner = start("run", "-w", "2")
    try:
        wait_started(runner)
        session_id = new_session(state, "remember that the first fact is about apples")
        wait_until(lambda: json.loads(run_cli("search", "apples", "--json", "--no-track")[1]), timeout=30)
    finally:
        assert stop(runner) in (0, -signal.SIGINT)
    append_lines(state / session_id / "events.jsonl", *copilot_turn_lines("remember that the second fact is about pears"))
    meanwhile = new_session(state, "remember that the third fact is about plums")
    runner = start("run", "-w", "2")
    try:
        for fruit in ("pears", "plums"):
            wait_until(lambda fruit=fruit: json.loads(run_cli("search", fruit, "--json", "--no-track")[1]),
                       timeout=30)
    finally:
        assert stop(runner) in (0, -signal.SIGINT)
    kinds = [e["kind"] for e in events(home) if e["session_id"] == session_id]
    assert kinds.count("created") == 1 and kinds.count("idle") == 2
    assert {e["kind"] for e in events(home) if e["session_id"] == meanwhile} == {"created", "idle"}
    assert len([m for m in typed_memories(home) if "fact is about" in m["content"]]) == 3
    # Each turn is kept once as it was said: the pears turn went on in the first session's last
    # episode (short turns share one, capture/episodes.py), the plums session has its own.
    said = "\n".join(m["content"] for m in episodes(home))
    assert [said.count(f"user: remember that the {n} fact is about {fruit}")
            for n, fruit in (("first", "apples"), ("second", "pears"), ("third", "plums"))] == [1, 1, 1]
    assert {m["session_id"] for m in episodes(home)} == {session_id, meanwhile}


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_kill_9_during_a_task_loses_nothing_and_duplicates_nothing(home, model_server, configure):
    llmem_home, state = home
    text = (llmem_home / "config.yaml").read_text().replace(
        "llm:\n  provider: none\n", f"llm:\n  provider: ollama\n  base_url: {model_server.url}\n  timeout: 30\n")
    # The default running_timeout_minutes (30): the restarted worker sees that the event's
    # owner died and runs it at once, rather than after the timeout.
    text = text.replace("  running_timeout_minutes: 0.002\n", "")
    assert "running_timeout_minutes" not in text
    (llmem_home / "config.yaml").write_text(text)
    model_server.mode, model_server.delay = "slow", 6.0
    session_id = new_session(state, "remember that the cache ttl is ten minutes",
                             "we decided to use redis for sessions")
    run_cli("enqueue", "idle", session_id, "--adapter", "copilot")
    worker = start("worker", "-w", "1")
    wait_until(lambda: model_server.requests, timeout=20)  # the task is inside the LLM call
    worker.kill()  # kill -9: huey has already removed the task from the queue
    worker.wait(10)
    assert events(home)[0]["status"] == "running"
    model_server.mode = "ok"
    restarted = time.monotonic()
    worker = start("worker", "-w", "1")
    try:
        wait_until(lambda: events(home)[0]["status"] == "done", timeout=30)
    finally:
        stop(worker)
    assert time.monotonic() - restarted < 30
    assert events(home)[0]["attempts"] == 1  # the killed run is not counted as a failed attempt
    contents = [m["content"] for m in memories(home)]
    assert len(contents) == len(set(contents))
    assert any("ten minutes" in c for c in contents)


@pytest.mark.slow  # the same path in-process: test_tasks.py (SIGNAL_INTERRUPTED → release)
def test_sigterm_requeues_the_in_flight_event(home, model_server):
    llmem_home, state = home
    text = (llmem_home / "config.yaml").read_text().replace(
        "llm:\n  provider: none\n", f"llm:\n  provider: ollama\n  base_url: {model_server.url}\n  timeout: 30\n")
    (llmem_home / "config.yaml").write_text(text)
    model_server.mode, model_server.delay = "slow", 4.0
    session_id = new_session(state, "remember that logs rotate daily")
    run_cli("enqueue", "idle", session_id, "--adapter", "copilot")
    worker = start("worker", "-w", "1")
    wait_until(lambda: model_server.requests, timeout=20)
    stop(worker, signal.SIGTERM)  # inside the 4 s LLM call: the task cannot have finished
    interrupted = events(home)[0]
    assert (interrupted["status"], interrupted["attempts"]) == ("pending", 0), interrupted
    assert "requeued" in interrupted["error"]
    model_server.mode = "ok"
    worker = start("worker", "-w", "1")
    try:
        wait_until(lambda: events(home)[0]["status"] == "done", timeout=90)
    finally:
        stop(worker)
    assert events(home)[0]["attempts"] == 1  # the interrupted run is not counted


@pytest.mark.slow
def test_sigint_stops_promptly_while_a_task_waits_on_the_llm(home, model_server):
    llmem_home, state = home
    text = (llmem_home / "config.yaml").read_text().replace(
        "llm:\n  provider: none\n", f"llm:\n  provider: ollama\n  base_url: {model_server.url}\n  timeout: 60\n")
    (llmem_home / "config.yaml").write_text(text)
    model_server.mode, model_server.delay = "slow", 40.0
    session_id = new_session(state, "remember that stops are prompt")
    run_cli("enqueue", "idle", session_id, "--adapter", "copilot")
    runner = start("run", "-w", "2")
    try:
        wait_until(lambda: model_server.requests, timeout=20)  # the task is inside the LLM call
        started = time.monotonic()
        runner.send_signal(signal.SIGINT)
        runner.wait(20)
        took = time.monotonic() - started
    finally:
        if runner.poll() is None:
            runner.kill()
    assert took < 12, f"SIGINT took {took:.1f} s"
    # The idle event, put back for the next worker. (Not the newest event: `run`'s watcher may
    # announce the session's start as well, when it was written less than START_SLACK_SECONDS
    # before the watch began; that event is done at once.)
    [idle] = [e for e in events(home) if e["kind"] == "idle"]
    assert idle["status"] == "pending"


@pytest.mark.slow
def test_concurrent_workers_watcher_and_cli_never_lock(home):
    llmem_home, state = home
    runner = start("run", "-w", "4")
    try:
        wait_started(runner)
        deadline = time.monotonic() + 30  # the 30 s of concurrent writers
        i = 0
        errors = []
        while time.monotonic() < deadline:
            new_session(state, f"remember that service {i} uses port {7000 + i}")
            code, _, err = run_cli("add", "--content", f"cli note number {i}")
            if code != 0:
                errors.append(err)
            i += 1
        def every_event_done():
            counts = json.loads(run_cli("queue", "--json")[1])["events"]
            return counts["done"] >= 2 * i and counts["pending"] == counts["running"] == 0

        try:
            wait_until(every_event_done, timeout=120)
        except AssertionError:
            raise AssertionError(f"events not done: {json.loads(run_cli('queue', '--json')[1])['events']}") from None
    finally:
        stop(runner)
    logs = "".join(p.read_text() for p in (llmem_home / "logs").glob("*.log"))
    locked = [line for line in logs.splitlines() if "database is locked" in line]
    assert not locked and not errors, (locked[:5], errors[:5])
    counts = json.loads(run_cli("queue", "--json")[1])["events"]
    assert counts == {"pending": 0, "running": 0, "done": 2 * i, "failed": 0}  # created + idle each
    with Store.open(_store_location()) as store:  # every session's fact and turn, once
        Memory = store.models.Memory
        for episodes in (False, True):
            kind = (Memory.source == "episode") if episodes else (Memory.source != "episode")
            # Read as text and matched here: an episode's text is deflated in a SQLite file, where
            # a LIKE would read its packed bytes (db/packed_text.py).
            contents = [m.content for m in Memory.select(Memory.content).where(kind) if "uses port" in m.content]
            assert len(contents) == len(set(contents)) == i, (episodes, len(contents), len(set(contents)), i)


def _store_location():
    """The store `llmem run` writes: the SQLite file, or on the suite's PostgreSQL run its database."""
    from llmem.config import load_config

    return load_config().store_location


def worker_alive(home) -> bool:
    from llmem.pipeline.events import worker_seen_recently

    location = _store_location()
    if isinstance(location, Path) and not location.exists():
        return False
    with Store.open(location) as store:
        return worker_seen_recently(store)


@pytest.mark.slow  # a real `llmem run`, killed
def test_after_kill_9_of_run_a_hook_takes_the_worker_less_path_at_once(home):
    _, state = home
    runner = start("run", "-w", "1")
    try:
        wait_until(lambda: worker_alive(home), timeout=30)
    finally:
        runner.kill()
        runner.wait()
    session_id = new_session(state, "remember that the cache ttl is ten minutes")
    code, out, err = run_cli("hook", "--type", "idle", "--session-id", session_id, "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert "detached" in result and "event_id" not in result
    wait_until(lambda: [m for m in memories(home) if "ten minutes" in m["content"]], timeout=30)
