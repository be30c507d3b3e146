"""Start-up on the paths someone waits for, in real fresh processes: what a hook, a search or
an MCP server imports before it answers (llmem/__main__.py, the hook path, the built-in
embedder's load)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

LLMEM = [sys.executable, "-m", "llmem"]


def imports_of(argv, stdin="", env=None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime -m llmem argv`: the process and the modules it imported (an
    import refused as absent is listed too, so a package counts by its submodules)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "llmem", *argv], input=stdin,
                          capture_output=True, text=True, env=env, timeout=60)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    return done, imported


def loaded(imported: set[str], package: str) -> bool:
    return any(name.startswith(f"{package}.") for name in imported)


needs_drivers = pytest.mark.skipif(
    importlib.util.find_spec("psycopg") is None or importlib.util.find_spec("redis") is None,
    reason="psycopg and redis are not installed here: nothing to leave out")


@needs_drivers
@pytest.mark.parametrize("argv", [["search", "pagination", "--fts-only", "--no-track"],
                                  ["context", "--project", "/home/dev/acme-api"]])
def test_a_sqlite_store_and_queue_leave_the_server_drivers_unimported(configure, argv):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    done, imported = imports_of(argv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "peewee" in imported and not loaded(imported, "psycopg") and not loaded(imported, "redis")


@needs_drivers
def test_a_server_in_the_config_keeps_its_driver(configure, tmp_path):
    """A Redis queue keeps redis; any other config leaves it out (psycopg is kept out of
    peewee's import by llmem/__init__.py, whatever the store). Asked of skip_unused_drivers
    in a process of its own, as the entry point asks it, so this process's modules stay as
    they are."""
    probe = ("import sys; from llmem.__main__ import skip_unused_drivers; "
             "print(sorted(skip_unused_drivers(sys.argv[1:])))")

    def skipped(*argv):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    configure("queue:\n  url: redis://127.0.0.1:1/0\n")
    assert skipped("search", "x") == "[]"
    configure("store:\n  url: postgresql://llmem@127.0.0.1:1/llmem\n")
    assert skipped("hook", "--type", "idle") == "['redis']"
    assert skipped("-v", "--config", str(tmp_path / "llmem-home" / "config.yaml"), "mcp") == "['redis']"
    # Commands that may name another store (init --store) or none of these: nothing left out.
    assert skipped("init") == "[]" and skipped("--help") == "[]"
    configure("store: [not, a, mapping]\n")  # a broken config: the CLI reports it, nothing changes
    assert skipped("search", "x") == "[]"


# ---- a session's context without a resident llmem: FTS alone ---------------------------------

SESSION = "ses-startup-copilot"
PROJECT = "/home/dev/acme-api"


@pytest.fixture
def embedded_store(tmp_path, configure, model_server):
    """A Copilot session asking about pagination, and memories embedded through a fake Ollama."""
    from session_writers import copilot_session

    from llmem.app import App
    from llmem.vectors import embed_pending

    state = tmp_path / "copilot"
    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n")
    copilot_session(state, SESSION, cwd=PROJECT).user("Why does the orders pagination test fail?")
    app = App()
    try:
        app.store.add("Orders pagination orders by (created_at, id)", "decision", project=PROJECT)
        app.store.add("Prefer small commits", "preference", project=PROJECT)
        assert embed_pending(app.store, app.embedder) == 2
    finally:
        app.close()
    model_server.requests.clear()
    return model_server


def embeds(server) -> int:
    return sum("embed" in path for path, _ in server.requests)


def test_a_fresh_process_builds_the_context_with_fts_alone(embedded_store):
    """No resident: embedding the session's text would cost the hook its whole budget (a model
    load, or an HTTP client and numpy), so the search is lexical, and still finds the decision."""
    argv = ["context", "--session-id", SESSION, "--project", PROJECT]
    done, imported = imports_of(argv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "created_at, id" in done.stdout and "Prefer small commits" in done.stdout
    assert embeds(embedded_store) == 0
    assert not loaded(imported, "httpx") and not loaded(imported, "numpy")


def test_a_resident_still_embeds_the_sessions_text(embedded_store):
    from llmem import hookclient
    from llmem.app import App
    from llmem.cli.resident import Resident

    argv = ["context", "--session-id", SESSION, "--project", PROJECT]
    served = Resident(App()).start()
    assert served is not None
    try:
        assert hookclient.ask_resident(argv, None, reply_timeout=30) is not None  # warmed up by then
        embedded_store.requests.clear()
        reply = hookclient.ask_resident(argv, None, reply_timeout=30)
    finally:
        served.stop()
    assert reply is not None and "created_at, id" in reply["stdout"]
    assert embeds(embedded_store) == 1


# ---- llmem mcp: warmed up while the client initialises -----------------------------------------

def test_the_mcp_warm_up_searches_once_and_records_nothing(embedded_store):
    """serve() runs warm_up on the tools' thread at start: it embeds one query (the model is
    loaded, the HTTP client built, the vector file mapped) and leaves no recall behind."""
    from llmem.app import App
    from llmem.mcp_server import MemoryTools

    tools = MemoryTools(App(), default_project=PROJECT)
    try:
        tools.warm_up()
        assert embeds(embedded_store) == 1
        store = tools.app.store
        assert store.models.RecallEvent.select().count() == 0
        assert {m.access_count for m in store.models.Memory.select()} == {0}
        assert "created_at, id" in tools.search("orders pagination")
        assert embeds(embedded_store) == 2
    finally:
        tools.close()


# ---- llmem search through a resident llmem ----------------------------------------------------

def test_a_search_is_answered_by_the_resident_as_by_the_cli(embedded_store, cli):
    """A fresh `llmem search` would load the model (or an HTTP client and numpy) for one query:
    with a resident alive it forwards its words and prints the reply, the same bytes."""
    from llmem.app import App
    from llmem.cli.resident import Resident

    argv = ["search", "orders", "pagination", "--no-track", "--limit", "3"]
    code, expected, _ = cli(*argv)
    assert code == 0 and "created_at, id" in expected
    served = Resident(App()).start()
    assert served is not None
    try:
        done, imported = imports_of(argv)
        json_done, _ = imports_of([*argv, "--json"])
    finally:
        served.stop()
    assert (done.returncode, done.stdout) == (0, expected)
    assert not imported & {"click", "peewee", "numpy", "httpx"}, imported & {"click", "peewee", "numpy", "httpx"}
    assert json_done.returncode == 0 and "created_at, id" in json.loads(json_done.stdout)[0]["content"]
    # Nothing found: the CLI's line on stderr, through the resident too.
    served = Resident(App()).start()
    try:
        empty, _ = imports_of(["search", "zzzqqq", "--fts-only", "--no-track"])
    finally:
        served.stop()
    assert empty.returncode == 0 and empty.stdout == "" and "Nothing relevant" in empty.stderr


def test_a_search_the_resident_cannot_answer_runs_in_process(embedded_store):
    """A bad command line (the CLI's exit 2 and message) is never the resident's to say."""
    from llmem.app import App
    from llmem.cli.resident import Resident

    served = Resident(App()).start()
    try:
        done, imported = imports_of(["search", "orders", "--limit", "0"])
        both, _ = imports_of(["search", "orders", "--fts-only", "--semantic-only"])
    finally:
        served.stop()
    assert done.returncode == 2 and "click" in imported
    assert both.returncode == 2 and "exclude each other" in both.stderr


def test_a_config_warning_is_said_once(configure):
    """The entry point reads the config to choose the drivers; the CLI says what is wrong in it."""
    configure("embedding:\n  provider: none\nbogus_key: 1\n")
    done, _ = imports_of(["search", "anything", "--fts-only", "--no-track"])
    said = [line for line in done.stderr.splitlines() if "bogus_key" in line]
    assert done.returncode == 0 and len(said) == 1 and said[0].startswith("llmem: WARNING:"), said
