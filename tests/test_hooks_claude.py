"""`llmem hook --adapter claude --format claude` with Claude Code's stdin JSON, and a fact said in
a Claude Code session becoming a searchable memory (heuristics, no LLM)."""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import store_location
from fakes import wait_until
from session_writers import ClaudeSession, copilot_session
from test_pipeline import events, run_cli, start, stop, wait_started

from llmem.adapters.registry import get_agent
from llmem.app import App
from llmem.store import Store

CLAUDE_CONTEXT_CHARS = get_agent("claude").context_cap

FIXTURE = Path(__file__).parent / "fixtures" / "claude"
SESSION = "4f1c8e2a-9b3d-4e6f-a1c2-7d8e9f0a1b2c"
PROJECT = "/home/dev/acme-api"
HOOK = ("hook", "--adapter", "claude", "--format", "claude")


@pytest.fixture
def claude_dir(tmp_path, configure):
    claude = tmp_path / "claude"
    shutil.copytree(FIXTURE, claude)
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {tmp_path / 'opencode'}\n"
              f"  copilot:\n    state_dir: {tmp_path / 'copilot'}\n  claude:\n    config_dir: {claude}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return claude


def stdin_json(monkeypatch, claude_dir, event: str, session_id: str = SESSION, **extra) -> None:
    payload = {"session_id": session_id,
               "transcript_path": str(claude_dir / "projects" / "-home-dev-acme-api" / f"{session_id}.jsonl"),
               "cwd": PROJECT, "hook_event_name": event, **extra}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(payload)))


def seed(*memories):
    app = App()
    try:
        return [app.store.add(content, kind, project=project).memory.id for content, kind, project in memories]
    finally:
        app.close()


def event_rows(home: Path) -> list[tuple[str, str]]:
    with Store.open(store_location()) as store:
        Event = store.models.Event
        return [(event.kind, event.session_id) for event in Event.select().order_by(Event.id)]


@pytest.mark.parametrize("source", ["startup", "resume", "compact"])
def test_session_start_answers_with_hook_specific_output(cli, claude_dir, monkeypatch, source):
    [decision] = seed(("Order pages by (created_at, id)", "decision", PROJECT))
    stdin_json(monkeypatch, claude_dir, "SessionStart", source=source)
    code, out, err = cli(*HOOK, "--type", "created")
    assert code == 0 and err == ""
    answer = json.loads(out)
    assert list(answer) == ["hookSpecificOutput"]
    assert answer["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    context = answer["hookSpecificOutput"]["additionalContext"]
    assert context.startswith("<llmem-context>") and context.endswith("</llmem-context>")
    assert decision[:8] in context


def test_a_new_session_without_its_transcript_yet_still_gets_the_projects_block(cli, claude_dir, monkeypatch):
    """Claude Code writes no transcript before the first prompt; SessionStart comes first."""
    [decision] = seed(("Order pages by (created_at, id)", "decision", PROJECT))
    stdin_json(monkeypatch, claude_dir, "SessionStart", session_id="0b6c2f5e-1111-4a2b-8c3d-4e5f60718293",
               source="startup")
    code, out, err = cli(*HOOK, "--type", "created")
    assert code == 0 and err == ""
    assert decision[:8] in json.loads(out)["hookSpecificOutput"]["additionalContext"]


def test_the_block_is_cut_to_claude_codes_cap(cli, claude_dir, monkeypatch, configure, llmem_home):
    text = (llmem_home / "config.yaml").read_text()
    configure(text + "context:\n  max_tokens: 8000\n")
    seed(*[(f"Preference {n}: " + "keep handlers small and name every branch; " * 5, "preference", PROJECT)
           for n in range(120)])
    code, whole, _ = cli("context", "--project", PROJECT)
    assert len(whole) > CLAUDE_CONTEXT_CHARS  # uncut, the block would spill into a file
    stdin_json(monkeypatch, claude_dir, "SessionStart", source="startup")
    code, out, err = cli(*HOOK, "--type", "created")
    assert code == 0 and err == ""
    context = json.loads(out)["hookSpecificOutput"]["additionalContext"]
    assert CLAUDE_CONTEXT_CHARS - 400 < len(context) <= CLAUDE_CONTEXT_CHARS
    assert context.endswith("\n</llmem-context>") and context.count("<llmem-context>") == 1
    assert all(line in whole for line in context.splitlines()[:-1])  # whole lines, nothing mangled


@pytest.mark.parametrize("kind, event", [("created", "SessionStart"), ("idle", "Stop"),
                                         ("compacting", "PreCompact"), ("ending", "SessionEnd")])
def test_a_hook_inside_a_subagent_does_nothing(cli, claude_dir, monkeypatch, llmem_home, kind, event):
    stdin_json(monkeypatch, claude_dir, event, agent_id="a41ab92590637ac82", agent_type="Explore")
    code, out, err = cli(*HOOK, "--type", kind)
    assert (code, out, err) == (0, "", "")
    assert event_rows(llmem_home) == []


@pytest.mark.parametrize("stdin", ["{not json", "[1, 2]", '{"cwd": "/home/dev/acme-api"}',
                                   '{"session_id": "../../etc/passwd"}', "\x00\x01garbage"])
@pytest.mark.parametrize("kind", ["created", "idle"])
def test_garbage_on_stdin_fails_open(cli, claude_dir, monkeypatch, stdin, kind):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code, out, err = cli(*HOOK, "--type", kind)
    assert code == 0 and out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"llmem hook {kind}: "), err


def test_stop_and_precompact_print_nothing_for_claude(cli, claude_dir, monkeypatch, llmem_home):
    """Text on a Stop hook's stdout would be read as "keep going"; the work is queued."""
    from llmem.pipeline.events import worker_heartbeat

    with Store.open(store_location()) as store:
        worker_heartbeat(store)
    for kind, event in (("idle", "Stop"), ("compacting", "PreCompact"), ("ending", "SessionEnd")):
        stdin_json(monkeypatch, claude_dir, event)
        code, out, err = cli(*HOOK, "--type", kind)
        assert code == 0 and out == "", (kind, out)
        assert "queued as event" in err
    assert event_rows(llmem_home) == [("idle", SESSION), ("compacting", SESSION), ("ending", SESSION)]
    with Store.open(store_location()) as store:
        assert {event.adapter for event in store.models.Event.select()} == {"claude"}


@pytest.mark.parametrize("fmt, built", [("claude", False), ("codex", False), ("copilot", False),
                                         ("text", True), ("json", True)])
def test_the_compaction_block_is_built_only_for_a_format_that_prints_it(cli, claude_dir, monkeypatch,
                                                                        llmem_home, fmt, built):
    """PreCompact's output is ignored by Claude Code and Codex (and Copilot's preCompact reads no
    answer): the hook must not spend ~100 ms on a block nobody reads, yet still queue its event.
    OpenCode's plugin reads the block from the text format."""
    import llmem.context
    from llmem.pipeline.events import worker_heartbeat

    with Store.open(store_location()) as store:
        worker_heartbeat(store)
    calls = []

    def counting_build_context(*args, **kwargs):
        calls.append(kwargs.get("compacting"))
        return "<llmem-context>kept</llmem-context>"

    monkeypatch.setattr(llmem.context, "build_context", counting_build_context)
    stdin_json(monkeypatch, claude_dir, "PreCompact", trigger="auto")
    code, out, err = cli("hook", "--adapter", "claude", "--format", fmt, "--type", "compacting")
    assert code == 0 and "queued as event" in err
    assert event_rows(llmem_home) == [("compacting", SESSION)]
    assert calls == ([True] if built else [])
    assert ("kept" in out) is built


def test_a_stop_hook_does_not_import_the_context_assembler(claude_dir, llmem_home):
    """Stop fires after every turn: only SessionStart's answer needs context.py (~10 ms)."""
    from llmem.pipeline.events import worker_heartbeat

    with Store.open(store_location()) as store:
        worker_heartbeat(store)
    payload = json.dumps({"session_id": SESSION, "cwd": PROJECT, "hook_event_name": "Stop"})
    code = ("import sys; from llmem.cli import main\n"
            f"sys.argv = ['llmem', *{list(HOOK)!r}, '--type', 'idle', {payload!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('llmem.context' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "queued as event" in done.stderr, done.stderr
    assert done.stdout.strip() == "False"


# ---- a fact said in a Claude Code session becomes a memory -------------------------------------

def search_ids(cli, query: str) -> list[str]:
    code, out, _ = cli("search", query, "--json", "--no-track")
    return [hit["id"] for hit in json.loads(out)]


def test_a_fact_stated_in_a_claude_session_is_searchable_after_stop(cli, claude_dir, monkeypatch):
    session = ClaudeSession(claude_dir, cwd=PROJECT)
    session.write(*session.context_lines(
        "<llmem-context>\n- Remember that the old cache lives in /var/cache/blueberry.\n</llmem-context>"))
    session.turn("Remember that the staging database is refreshed every Monday at 06:00 UTC.",
                 "Noted: staging refreshes on Mondays at 06:00 UTC.")
    session.subagent("Find who owns the nightly job", "Remember that the nightly job belongs to the raspberry team.")
    session.write(session.user_line("Remember that the loop checks the gooseberry queue.",
                                    origin={"kind": "loop_wakeup"}, promptSource="system"),
                  *session.reply_lines("Checked."))
    stdin_json(monkeypatch, claude_dir, "Stop", session_id=session.id, stop_hook_active=False)
    code, out, err = cli(*HOOK, "--type", "idle", "--sync")
    assert code == 0 and out == "", err
    assert search_ids(cli, "staging database refreshed Monday")
    assert search_ids(cli, "blueberry") == []  # llmem's own block is not learnt back
    assert search_ids(cli, "raspberry") == []  # a subagent's report is not the user's statement
    assert search_ids(cli, "gooseberry") == []  # nor is a prompt the harness wrote
    code, out, _ = cli("list", "--json")
    [memory] = [m for m in json.loads(out) if "staging" in m["content"] and m["source"] != "episode"]
    assert memory["project"] == PROJECT and memory["session_id"] == session.id


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_llmem_run_ingests_a_claude_session(claude_dir, llmem_home):
    runner = start("run", "-w", "2")
    try:
        wait_started(runner)
        session = ClaudeSession(claude_dir, cwd=PROJECT)
        session.turn("Remember that releases are tagged from the trunk branch only.", "Understood.")
        wait_until(lambda: json.loads(run_cli("search", "releases tagged trunk", "--json", "--no-track")[1]),
                   timeout=30)
        kinds = {e["kind"] for e in events(llmem_home) if e["session_id"] == session.id}
        assert {"created", "idle"} <= kinds
    finally:
        assert stop(runner) in (0, -signal.SIGINT)


def test_a_subagents_words_are_never_the_users_corrections(cli, claude_dir):
    """Item 5: introspection learns from what the user corrects; a subagent's report (even one
    phrased as a correction) and its own transcript are not that."""
    correction = "No, use uv instead of pip"
    session = ClaudeSession(claude_dir, cwd=PROJECT)
    session.turn("Install the dependencies", "Running pip install.")
    session.subagent(correction, correction)
    code, out, err = cli("introspect", "--auto", "--session", session.id, "--json")
    assert code == 0, err
    assert json.loads(out) == []
    session.turn(correction, "Switching to uv.")  # the same words from the user are a correction
    code, out, err = cli("introspect", "--auto", "--session", session.id, "--json")
    assert code == 0, err
    assert [m["content"] for m in json.loads(out)] == ["Do: Use uv\nInstead of: pip"]


def test_a_fact_learnt_in_copilot_is_served_to_claude_code_in_the_same_project(cli, claude_dir, tmp_path,
                                                                                monkeypatch):
    """Several agents at once (issue 11 item 7): one project's memory is every agent's."""
    copilot = copilot_session(tmp_path / "copilot", cwd=PROJECT)  # the state_dir claude_dir configured
    copilot.turn("Remember that the orders service reads its config from /etc/acme/orders.toml.", "Noted.")
    code, out, err = cli("hook", "--type", "idle", "--session-id", copilot.id, "--sync")
    assert code == 0, err
    code, out, _ = cli("list", "--json")
    [memory] = [m for m in json.loads(out) if "orders.toml" in m["content"] and m["source"] != "episode"]
    assert memory["project"] == PROJECT
    session = ClaudeSession(claude_dir, cwd=PROJECT)
    session.turn("Where does the orders service read its config?", "Let me check.")
    stdin_json(monkeypatch, claude_dir, "SessionStart", session_id=session.id, source="resume")
    code, out, err = cli(*HOOK, "--type", "created")
    assert code == 0 and err == ""
    assert memory["id"][:8] in json.loads(out)["hookSpecificOutput"]["additionalContext"]


def test_a_session_start_whose_store_cannot_be_reached_gets_the_projects_last_block(
        cli, claude_dir, monkeypatch, configure, llmem_home):
    """A laptop away from its store's server: SessionStart fails open with the block last built
    for the project on this machine, not with nothing (and not for another project)."""
    from servers import free_port

    [decision] = seed(("Order pages by (created_at, id)", "decision", PROJECT))
    stdin_json(monkeypatch, claude_dir, "SessionStart", source="startup")
    code, out, err = cli(*HOOK, "--type", "created")
    assert code == 0 and decision[:8] in out
    built = json.loads(out)["hookSpecificOutput"]["additionalContext"]
    # Nothing listens there. The environment's URL wins over the file's store.url (and over the
    # one the suite's PostgreSQL run sets there).
    monkeypatch.setenv("LLMEM_STORE_URL", f"postgresql://llmem@127.0.0.1:{free_port()}/llmem")
    stdin_json(monkeypatch, claude_dir, "SessionStart", source="startup")
    code, out, err = cli(*HOOK, "--type", "created")
    assert code == 0 and "no PostgreSQL server answers" in err and "last one kept" in err
    assert json.loads(out)["hookSpecificOutput"]["additionalContext"] == built
    # Another project has no block kept: nothing, as before.
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"session_id": SESSION, "cwd": "/elsewhere",
                                                             "hook_event_name": "SessionStart"})))
    code, out, _ = cli(*HOOK, "--type", "created")
    assert code == 0 and out == ""
