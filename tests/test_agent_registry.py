"""The agent registry (issue 21 item 2): an agent is one module and one line in
adapters/registry.py. A fifth agent that exists only in the tests (jsonl_agent.py) is
watched, ingested end to end and offered by the CLI without an edit to the watcher; every
JSONL agent, Copilot included, is followed by the one tail in adapters/base.py."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from jsonl_agent import JsonlogSession
from session_writers import append_lines, copilot_events_file, copilot_line, copilot_turn_lines
from test_ingestion import Pipeline
from watch_driver import DrivenWatcher, Recorder

from llmem.adapters import registry
from llmem.adapters.base import JsonlTail
from llmem.config import load_config
from llmem.errors import ConfigError
from llmem.pipeline.watcher import SessionWatcher

LLMEM = Path(__file__).resolve().parent.parent / "llmem"


@pytest.fixture
def jsonlog_agent(monkeypatch, tmp_path, configure):
    """The fifth agent joined with one line, its folder under tmp; the four real agents'
    folders are absent."""
    folder = tmp_path / "jsonlog"
    folder.mkdir()
    monkeypatch.setenv("LLMEM_JSONLOG_DIR", str(folder))
    monkeypatch.setitem(registry.AGENT_MODULES, "jsonlog", "jsonl_agent")
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {tmp_path / 'none-oc'}\n"
              f"  copilot:\n    state_dir: {tmp_path / 'none-cp'}\n  claude:\n    config_dir: {tmp_path / 'none-cl'}\n"
              f"  codex:\n    home: {tmp_path / 'none-cx'}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return folder


def test_a_fifth_agent_is_watched_and_ingested_end_to_end(jsonlog_agent):
    pipeline = Pipeline().start()
    try:
        session = JsonlogSession(jsonlog_agent)
        session.turn("Remember that the nightly export runs at 02:00 UTC.")
        pipeline.run(2.0)
        assert pipeline.kinds(session.id) == ["created", "idle"]
        session.turn("Remember that the export bucket is acme-exports.")
        pipeline.run(2.0)
        session.end()
        pipeline.run(2.0)
        assert pipeline.kinds(session.id) == ["created", "idle", "idle", "ending"]
        assert {adapter for adapter, *_ in pipeline.recorded} == {"jsonlog"}
        pipeline.run_recorded()
        assert pipeline.found("nightly") == ["The nightly export runs at 02:00 UTC."]
        assert pipeline.found("bucket") == ["The export bucket is acme-exports."]
        pipeline.run_recorded()  # every event once more: nothing new
        assert pipeline.memory_count() == 2
    finally:
        pipeline.close()


def test_a_fifth_agent_owns_its_ids_and_is_offered_by_the_cli(jsonlog_agent, cli):
    from llmem.adapters import id_shape, present_agents, resolve_adapter

    session = JsonlogSession(jsonlog_agent, "jl-00ab")
    session.turn("hello")
    config = load_config()
    assert present_agents(config) == ["jsonlog"]
    assert id_shape("jl-00ab") == "jsonlog"
    assert resolve_adapter(config, "jl-00ab").name == "jsonlog"
    for command in (["backfill", "--help"], ["init", "--help"], ["enqueue", "--help"]):
        code, out, err = cli(*command)
        assert code == 0, err
        assert "jsonlog" in out, command
    # Not a usage error: the choice takes the new name (and still refuses an unknown one).
    code, out, err = cli("backfill", "--adapter", "jsonlog", "--no-llm", "--json")
    assert code == 0, err
    code, out, err = cli("backfill", "--adapter", "nosuch")
    assert code == 2 and "jsonlog" in err
    # Doctor finds it (it is the agent present here) and, with no install recipe for it,
    # checks the hooks of the four it installs into.
    code, out, err = cli("doctor", "--json")
    report = json.loads(out)
    assert report["adapter"] == "jsonlog"
    assert {check["name"] for check in report["checks"]} >= {"opencode", "copilot", "claude", "codex"}
    assert "jsonlog" not in {check["name"] for check in report["checks"]}


@pytest.mark.parametrize("module", ["pipeline/watcher.py", "providers/agent_cli.py", "adapters/native.py",
                                    "cli/choices.py", "cli/exchange.py", "cli/session.py"])
def test_what_is_done_per_agent_names_no_agent(module):
    # What these do per agent they ask the agent's unit (the watch, the non-interactive call,
    # the instruction files, the choices): adding one needs no edit here.
    words = code_words((LLMEM / module).read_text())
    assert [name for name in registry.agent_names() if any(re.search(name, word, re.IGNORECASE) for word in words)] == []


def code_words(source: str) -> list[str]:
    """The identifiers and string literals of a module, its docstrings and comments left out
    (prose may name the agents it speaks of; code may not)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.alias):
            words.append(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.append(node.value)
    return words


def test_a_fifth_agent_is_a_value_of_the_config_keys_that_name_an_agent(jsonlog_agent, configure):
    configure("embedding:\n  provider: none\nsession:\n  adapter: jsonlog\nllm:\n  provider: agent\n  agent: jsonlog\n")
    config = load_config()
    assert (config.session.adapter, config.llm.agent) == ("jsonlog", "jsonlog")
    configure("session:\n  adapter: nosuch\n")
    with pytest.raises(ConfigError, match="jsonlog"):  # the message lists the registry's names
        load_config()


def test_an_agent_without_a_non_interactive_mode_is_refused_as_the_llm(jsonlog_agent):
    from llmem.providers.agent_cli import callable_agents, find_agent

    assert [agent.name for agent in callable_agents()] == ["claude", "codex", "copilot", "opencode"]
    with pytest.raises(ConfigError, match="llm.agent"):
        find_agent("jsonlog")


def test_each_agent_answers_its_hooks_in_its_own_format():
    block = "## Project memory\n- We deploy with make release."
    claude, codex, copilot, opencode = (registry.get_agent(name) for name in ("claude", "codex", "copilot", "opencode"))
    for unit in (claude, codex):
        assert unit.hook_reply("created", block) == {
            "hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": block}}
        assert unit.hook_reply("idle", block) is None  # Stop must print nothing
    assert copilot.hook_reply("created", block) == {"additionalContext": block}
    assert copilot.hook_reply("idle", block) is None  # agentStop would read it as "keep going"
    assert opencode.hook_format == "text" and opencode.hook_reply("created", block) is None


# ---- the one JSONL tail ------------------------------------------------------------------


def test_the_tail_holds_back_a_partial_line_and_starts_over_on_truncation_or_replacement(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": ')
    tail = JsonlTail(path)
    first = tail.read()
    assert (first.raw, first.start, first.first_index, first.restarted) == (b'{"a": 1}\n', 0, 0, True)
    with path.open("ab") as handle:
        handle.write(b'2}\n')
    second = tail.read()
    assert (second.raw, second.start, second.first_index, second.restarted) == (b'{"b": 2}\n', 9, 1, False)
    assert tail.read().raw == b""
    path.write_bytes(b'{"c": 3}\n')  # truncated and rewritten shorter, same inode
    third = tail.read()
    assert (third.raw, third.first_index, third.restarted) == (b'{"c": 3}\n', 0, True)
    replaced = tmp_path / "new.jsonl"
    replaced.write_bytes(b'{"c": 3}\n{"d": 4}\n')
    replaced.replace(path)  # rotated: another inode, though longer
    fourth = tail.read()
    assert (fourth.raw, fourth.restarted) == (b'{"c": 3}\n{"d": 4}\n', True)


def _rchar() -> int:
    """Bytes this process has read through read(2) and friends (/proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_the_copilot_watcher_reads_only_what_was_appended(tmp_path, configure):
    state = tmp_path / "session-state"
    state.mkdir()
    configure(f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n")
    # A long session: ~400 KB of earlier turns, then one more turn at a time.
    filler = "x" * 2000
    lines = [line for n in range(200) for line in copilot_turn_lines(f"turn {n} {filler}", turn_id=str(n))]
    session_id, events = copilot_events_file(state, *lines)
    recorder = Recorder()
    watcher = SessionWatcher(load_config(), recorder)
    driven = DrivenWatcher(watcher)
    driven.run(1.0)
    idles = recorder.kinds(session_id).count("idle")
    size = events.stat().st_size
    assert size > 400_000
    read_per_turn = []
    for n in range(200, 203):
        before = _rchar()
        append_lines(events, *copilot_turn_lines(f"turn {n}", turn_id=str(n)))
        driven.run(1.0)
        read_per_turn.append(_rchar() - before)
    assert recorder.kinds(session_id).count("idle") == idles + 3
    tail = watcher.watches["copilot"].tails[session_id].tail
    assert tail.offset == events.stat().st_size
    # Each look read the new turn (~1 KB) and some bookkeeping, never the 400 KB again.
    assert max(read_per_turn) < size / 10, read_per_turn
    append_lines(events, copilot_line("session.shutdown", {"shutdownType": "routine"}))
    driven.run(2.0)
    assert recorder.kinds(session_id)[-1] == "ending"
    driven.close()
