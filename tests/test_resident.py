"""A resident llmem answers hooks (cli/resident.py) through the stdlib-only client
(hookclient.py): the same bytes as the in-process path for every agent's format, several hooks
at once, and the in-process path whenever the resident cannot answer (none, a stale socket, a
foreign one, one that hangs or dies mid-hook)."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import store_location
from session_writers import copilot_session

from llmem import hookclient
from llmem.app import App
from llmem.cli.resident import Resident
from llmem.paths import AGENT_CALL_ENV, default_paths

FIXTURE = Path(__file__).parent / "fixtures" / "claude"
CLAUDE_SESSION = "4f1c8e2a-9b3d-4e6f-a1c2-7d8e9f0a1b2c"
COPILOT_SESSION = "ses-resident-copilot"
PROJECT = "/home/dev/acme-api"
LLMEM = [sys.executable, "-m", "llmem"]
HEAVY = ("click", "peewee", "numpy", "httpx", "onnxruntime")


@pytest.fixture
def agents(tmp_path, configure):
    """A Claude Code and a Copilot session, both in PROJECT, and three memories to find."""
    claude = tmp_path / "claude"
    shutil.copytree(FIXTURE, claude)
    state = tmp_path / "copilot"
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {tmp_path / 'opencode'}\n"
              f"  copilot:\n    state_dir: {state}\n  claude:\n    config_dir: {claude}\n"
              f"  codex:\n    home: {tmp_path / 'codex'}\n")
    writer = copilot_session(state, COPILOT_SESSION, cwd=PROJECT)
    writer.user("Why does the orders pagination test fail? The cursor ordering looks wrong.")
    app = App()
    try:
        for text, kind in (("Order pages by (created_at, id)", "decision"),
                           ("The orders API paginates with a keyset cursor", "fact"),
                           ("Prefer small commits with a message saying why", "preference")):
            app.store.add(text, kind, project=PROJECT)
    finally:
        app.close()
    return {"claude": claude}


def claude_payload(agents, event: str, session_id: str = CLAUDE_SESSION, **extra) -> str:
    transcript = agents["claude"] / "projects" / "-home-dev-acme-api" / f"{session_id}.jsonl"
    return json.dumps({"session_id": session_id, "transcript_path": str(transcript), "cwd": PROJECT,
                       "hook_event_name": event, **extra})


# Each agent's per-turn hooks as `llmem install` writes them (setup/agents.py, integrations.py),
# with what the agent gives on stdin.
def hook_cases(agents, *, json_report=False) -> dict[str, tuple[list[str], str | None]]:
    copilot_start = json.dumps({"sessionId": COPILOT_SESSION, "cwd": PROJECT, "source": "new"})
    report = {"json": (["hook", "--type", "created", "--session-id", COPILOT_SESSION, "--format", "json"],
                       None)} if json_report else {}
    return report | {
        "claude SessionStart": (["hook", "--adapter", "claude", "--format", "claude", "--type", "created"],
                                claude_payload(agents, "SessionStart", source="startup")),
        "codex SessionStart": (["hook", "--adapter", "codex", "--format", "codex", "--type", "created"],
                               json.dumps({"session_id": COPILOT_SESSION, "cwd": PROJECT,
                                           "hook_event_name": "SessionStart", "source": "startup"})),
        "copilot sessionStart": (["hook", "--type", "created", "--adapter", "copilot", "--format", "copilot"],
                                 copilot_start),
        "opencode context": (["context", "--session-id", COPILOT_SESSION, "--adapter", "copilot",
                              "--project", PROJECT], None),
        "opencode compacting": (["hook", "--type", "compacting", "--session-id", COPILOT_SESSION,
                                 "--adapter", "copilot", "--project", PROJECT], None),
    }


@pytest.fixture
def resident(agents):
    served = Resident(App()).start()
    assert served is not None
    yield served
    served.stop()


def in_process(cli, monkeypatch, argv, stdin):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin or ""))
    return cli(*argv)


def run_llmem(argv, stdin=None, env=None, importtime=False):
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "llmem", *argv]
    done = subprocess.run(command, input=stdin or "", capture_output=True, text=True, env=env, timeout=60)
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    stderr = "".join(line + "\n" for line in done.stderr.splitlines() if not line.startswith("import time:"))
    return done.returncode, done.stdout, stderr, imported


def test_the_socket_is_in_llmems_home_as_paths_says():
    assert Path(hookclient.socket_path()) == default_paths().config_dir / hookclient.SOCKET_NAME
    assert hookclient.AGENT_CALL_ENV == AGENT_CALL_ENV


@pytest.mark.parametrize("case", ["claude SessionStart", "codex SessionStart", "copilot sessionStart",
                                  "opencode context", "opencode compacting", "json"])
def test_the_resident_answers_each_agent_byte_for_byte_as_the_hook_process(agents, resident, cli, monkeypatch,
                                                                             case):
    argv, stdin = hook_cases(agents, json_report=True)[case]
    code, expected, _ = in_process(cli, monkeypatch, argv, stdin)
    assert code == 0 and "<llmem-context>" in expected
    reply = hookclient.ask_resident(argv, stdin)
    assert reply is not None
    if case == "json":  # the report says how long each step took: all else is the same
        assert without_timings(json.loads(reply["stdout"])) == without_timings(json.loads(expected))
    else:
        assert reply["stdout"] == expected


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "seconds"}
    return [without_timings(v) for v in value] if isinstance(value, list) else value


def test_a_served_hook_imports_nothing_heavy_and_prints_the_same(agents, resident, cli, monkeypatch):
    argv, stdin = hook_cases(agents)["claude SessionStart"]
    _, expected, _ = in_process(cli, monkeypatch, argv, stdin)
    code, out, err, imported = run_llmem(argv, stdin, importtime=True)
    assert (code, out, err) == (0, expected, "")
    assert imported.isdisjoint(HEAVY), imported & set(HEAVY)
    # Without the resident the same hook process pays for the CLI, and prints the same.
    resident.stop()
    code, out, err, imported = run_llmem(argv, stdin, importtime=True)
    assert (code, out, err) == (0, expected, "") and "click" in imported


def test_idle_hooks_are_queued_by_the_resident_as_by_the_hook_process(agents, resident):
    from llmem.pipeline.events import worker_heartbeat
    from llmem.store import Store

    with Store.open(store_location()) as store:
        worker_heartbeat(store)  # a worker is alive: Stop only records and enqueues
    argv = ["hook", "--adapter", "claude", "--format", "claude", "--type", "idle"]
    reply = hookclient.ask_resident(argv, claude_payload(agents, "Stop", stop_hook_active=False))
    assert reply is not None and reply["stdout"] == ""
    assert reply["stderr"].startswith("llmem hook idle: queued as event ")
    with Store.open(store_location()) as store:
        Event = store.models.Event
        assert [(e.kind, e.session_id) for e in Event.select()] == [("idle", CLAUDE_SESSION)]


def test_several_hooks_at_once_each_get_their_own_answer(agents, resident, cli, monkeypatch):
    cases = hook_cases(agents)
    expected = {name: in_process(cli, monkeypatch, *cases[name])[1] for name in cases}
    answers, threads = {}, []

    def ask(name, n):
        answers[name, n] = hookclient.ask_resident(*cases[name], reply_timeout=30)

    for n in range(3):
        threads += [threading.Thread(target=ask, args=(name, n)) for name in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {key: (reply or {}).get("stdout") for key, reply in answers.items()} \
        == {(name, n): expected[name] for name in cases for n in range(3)}


def test_agent_call_hooks_do_nothing_on_the_fast_path_too(agents, resident):
    argv, stdin = hook_cases(agents)["claude SessionStart"]
    code, out, err, imported = run_llmem(argv, stdin, env={**os.environ, AGENT_CALL_ENV: "1"}, importtime=True)
    assert (code, out, err) == (0, "", "") and imported.isdisjoint(HEAVY)


def test_a_resident_of_another_environment_declines(agents, resident, cli, monkeypatch):
    argv, stdin = hook_cases(agents)["claude SessionStart"]
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", "/elsewhere")  # the hook would read other sessions
    assert hookclient.ask_resident(argv, stdin) is None


def test_what_only_the_hook_process_may_run_is_not_sent(agents, resident):
    for argv in (["hook", "--type", "idle", "--session-id", "s", "--sync"],
                 ["hook", "--type", "idle", "--session-id", "s", "--run-lock-fd", "5"],
                 ["hook", "--help"], ["search", "x", "--help"], ["search", "--", "-x"], ["stats"]):
        assert hookclient._reads_stdin(argv) is None
    assert hookclient._reads_stdin(["search", "two", "words", "--limit", "3", "--json"]) is False
    assert hookclient._reads_stdin(["hook", "--type", "idle"]) is True
    assert hookclient._reads_stdin(["hook", "--type", "idle", "--session-id", "s"]) is False
    assert hookclient._reads_stdin(["hook", "--type", "idle", '{"thread-id": "t"}']) is False


def test_a_bad_command_line_is_left_to_the_cli(agents, resident, cli, monkeypatch):
    argv = ["hook", "--type", "no-such-moment", "--session-id", "s"]
    assert hookclient.ask_resident(argv, None) is None  # the CLI says what is wrong, exit 0
    code, out, err, _ = run_llmem(argv)
    assert code == 0 and out == "" and "bad command line" in err


# ---- when the resident cannot answer ------------------------------------------------------

def test_a_stale_socket_falls_back_and_is_replaced_by_the_next_resident(agents, cli, monkeypatch):
    path = hookclient.socket_path()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    os.chmod(path, 0o600)
    stale.close()  # the file stays, nobody listens: a worker killed with SIGKILL
    argv, stdin = hook_cases(agents)["copilot sessionStart"]
    assert hookclient.ask_resident(argv, stdin) is None
    _, expected, _ = in_process(cli, monkeypatch, argv, stdin)
    code, out, err, imported = run_llmem(argv, stdin, importtime=True)
    assert (code, out, err) == (0, expected, "") and "click" in imported
    served = Resident(App()).start()
    try:
        assert served is not None and hookclient.ask_resident(argv, stdin)["stdout"] == expected
    finally:
        served.stop()
    assert not os.path.exists(path)  # removed at stop: it was this resident's


def test_a_second_resident_leaves_the_first_serving(agents, resident):
    assert Resident(App()).start() is None
    assert hookclient.ask_resident(["hook", "--type", "created", "--session-id", COPILOT_SESSION], None)


def test_a_stop_wakes_the_accept_loop_instead_of_waiting_for_its_poll(agents, monkeypatch):
    """`llmem mcp` and the worker stop their resident on the way out: the stop must not wait
    out the accept loop's poll (0.5 s each stop, and a whole poll here, where it is 30 s)."""
    from llmem.cli import resident as module

    monkeypatch.setattr(module, "ACCEPT_POLL_SECONDS", 30.0)
    served = Resident(App()).start()
    assert served is not None
    assert hookclient.ask_resident(["hook", "--type", "created", "--session-id", COPILOT_SESSION], None)
    thread = served._thread
    began = time.monotonic()
    served.stop()
    assert not thread.is_alive() and time.monotonic() - began < 10
    assert not os.path.exists(served.path)


def test_a_socket_that_is_not_private_is_not_used(agents, resident):
    os.chmod(resident.path, 0o666)
    assert hookclient.ask_resident(["hook", "--type", "created", "--session-id", COPILOT_SESSION], None) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner takes root")
def test_a_socket_owned_by_someone_else_is_neither_used_nor_taken_over(agents, resident, cli, monkeypatch):
    os.chown(resident.path, 4242, 4242)
    argv, stdin = hook_cases(agents)["claude SessionStart"]
    assert hookclient.ask_resident(argv, stdin) is None
    _, expected, _ = in_process(cli, monkeypatch, argv, stdin)
    assert run_llmem(argv, stdin)[:3] == (0, expected, "")
    assert Resident(App()).start() is None  # refused, and left where it is
    assert os.stat(resident.path).st_uid == 4242


class FakeResident:
    """A socket in llmem's home that misbehaves: `hang` reads the request and never answers,
    `die` reads it and closes without a reply (a worker killed mid-hook)."""

    def __init__(self, how: str):
        self.how = how
        self.path = hookclient.socket_path()
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(8)
        self.done = threading.Event()
        self.requests = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
            self.requests.append(json.loads(b"".join(chunks)))
            if self.how == "die":
                conn.close()
            else:
                self.done.wait()
                conn.close()

    def close(self):
        self.done.set()
        self.listener.close()
        os.unlink(self.path)


@pytest.mark.parametrize("how", ["hang", "die"])
def test_a_resident_that_hangs_or_dies_mid_hook_costs_a_timeout_at_most(agents, how):
    fake = FakeResident(how)
    try:
        argv, stdin = hook_cases(agents)["claude SessionStart"]
        started = time.monotonic()
        assert hookclient.ask_resident(argv, stdin, reply_timeout=0.3) is None
        took = time.monotonic() - started
        assert took < (2.0 if how == "hang" else 0.3)
        assert fake.requests and fake.requests[0]["stdin"] == stdin
    finally:
        fake.close()


@pytest.mark.slow  # waits out the client's whole reply timeout, then runs the hook in-process
@pytest.mark.parametrize("how", ["hang", "die"])
def test_a_hook_process_answers_in_process_after_a_hung_or_dead_resident(agents, cli, monkeypatch, how):
    argv, stdin = hook_cases(agents)["claude SessionStart"]
    _, expected, _ = in_process(cli, monkeypatch, argv, stdin)
    fake = FakeResident(how)
    try:
        started = time.monotonic()
        code, out, err, _ = run_llmem(argv, stdin)
        assert (code, out, err) == (0, expected, "")  # stdin reached the in-process path intact
        assert time.monotonic() - started < hookclient.REPLY_TIMEOUT + 10
    finally:
        fake.close()


@pytest.mark.slow  # a real worker, killed and started again: 3-6 s
def test_a_worker_serves_hooks_and_a_killed_one_leaves_the_in_process_path(agents, cli, monkeypatch):
    import signal

    from fakes import wait_until

    argv, stdin = hook_cases(agents)["claude SessionStart"]
    _, expected, _ = in_process(cli, monkeypatch, argv, stdin)
    path = hookclient.socket_path()

    def start_worker():
        log = Path(os.environ["LLMEM_HOME"]).parent / "worker.out"
        with log.open("a") as sink:
            worker = subprocess.Popen([*LLMEM, "worker"], stdout=sink, stderr=subprocess.STDOUT)
        wait_until(lambda: hookclient.ask_resident(argv, stdin) is not None, timeout=30)
        return worker

    worker = start_worker()
    try:
        code, out, err, imported = run_llmem(argv, stdin, importtime=True)
        assert (code, out, err) == (0, expected, "") and imported.isdisjoint(HEAVY)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        assert os.path.exists(path)  # left behind: stale
        code, out, err, imported = run_llmem(argv, stdin, importtime=True)
        assert (code, out, err) == (0, expected, "") and "click" in imported
        worker = start_worker()  # takes the stale socket over
        assert run_llmem(argv, stdin)[:3] == (0, expected, "")
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(20)
    assert not os.path.exists(path)


# ---- the lean in-process path -------------------------------------------------------------

def test_an_http_embedder_builds_no_tls_context_for_a_plain_http_url(model_server, monkeypatch):
    """Loading the CA bundle for a verified SSL context cost a fresh hook 40-250 ms, for a
    loopback http:// server that never speaks TLS."""
    import certifi

    from llmem.providers.embedders import OllamaEmbedder

    def no_ca_bundle():
        raise AssertionError("a TLS context was built for an http:// URL")

    monkeypatch.setattr(certifi, "where", no_ca_bundle)
    embedder = OllamaEmbedder("nomic-embed-text", model_server.url, 5.0, 16)
    assert len(embedder.embed_query("pagination")) > 0
    secure = OllamaEmbedder("nomic-embed-text", "https://127.0.0.1:9", 5.0, 16)
    with pytest.raises(AssertionError, match="TLS context"):
        secure._http()  # https keeps its verified context
