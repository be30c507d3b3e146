"""Several agents at once (issue 11 item 7): OpenCode, Copilot CLI, Claude Code and Codex CLI
all present under one home, one real `llmem run` (session.adapter auto, heuristics, no LLM)
ingests a session of each; what one agent learnt is served to another in the same project, and
no agent's store is written."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess

import pytest
from fakes import wait_until
from session_writers import ClaudeSession, CodexRollout, OpenCodeStore, copilot_session
from test_pipeline import LLMEM, events, run_cli, start, stop, wait_started

PROJECT = "/home/dev/acme-api"
# One fact per agent, each with a word no other fact has, to search for.
FACTS = {
    "opencode": ("Remember that the invoices table is partitioned by month.", "invoices partitioned month"),
    "copilot": ("Remember that the orders service reads its config from /etc/acme/orders.toml.",
                "orders service config orders.toml"),
    "claude": ("Remember that releases are tagged from the trunk branch only.", "releases tagged trunk"),
    "codex": ("Remember that the payments worker retries a charge three times.", "payments worker retries charge"),
}


@pytest.fixture
def agent_homes(tmp_path, configure):
    homes = {"opencode": tmp_path / "opencode", "copilot": tmp_path / "copilot",
             "claude": tmp_path / "claude", "codex": tmp_path / "codex"}
    for folder in homes.values():
        folder.mkdir()
    (homes["claude"] / "projects").mkdir()
    (homes["codex"] / "sessions").mkdir()
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: auto\n  opencode:\n    data_dir: {homes['opencode']}\n"
              f"  copilot:\n    state_dir: {homes['copilot']}\n  claude:\n    config_dir: {homes['claude']}\n"
              f"  codex:\n    home: {homes['codex']}\n"
              "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    return homes


def snapshot(folders) -> dict[str, tuple[str, int]]:
    """Every file under the agents' folders: its content hash and mtime. Not opencode.db-shm:
    SQLite's shared-memory lock index, where every WAL reader (a `mode=ro` one too, as
    OpenCode's store is read) takes its read mark."""
    return {str(path): (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
            for folder in folders for path in sorted(folder.rglob("*"))
            if path.is_file() and not path.name.endswith("-shm")}


def search(query: str) -> list[dict]:
    code, out, err = run_cli("search", query, "--json", "--no-track")
    assert code == 0, err
    return json.loads(out)


def write_sessions(homes, store: OpenCodeStore) -> dict[str, str]:
    """A finished session in each agent, all in PROJECT; returns agent → session id."""
    opencode = store.session(directory=PROJECT)
    opencode.turn(FACTS["opencode"][0], "Noted.", whole=True)
    copilot = copilot_session(homes["copilot"], cwd=PROJECT)
    copilot.turn(FACTS["copilot"][0], "Noted.")
    claude = ClaudeSession(homes["claude"], cwd=PROJECT)
    claude.turn(FACTS["claude"][0], "Understood.")
    codex = CodexRollout(homes["codex"], cwd=PROJECT)
    codex.turn(FACTS["codex"][0], "Got it.")
    return {"opencode": opencode.id, "copilot": copilot.id, "claude": claude.id, "codex": codex.id}


@pytest.mark.slow
def test_llmem_run_learns_from_four_agents_and_serves_one_agents_fact_to_another(agent_homes, llmem_home):
    # OpenCode stays open, as while it runs: its -wal is there, and is OpenCode's alone.
    store = OpenCodeStore(agent_homes["opencode"], worktree=PROJECT)
    runner = start("run", "-w", "2")
    try:
        wait_started(runner)
        sessions = write_sessions(agent_homes, store)
        before = snapshot(agent_homes.values())
        found = {}
        for agent, (_, query) in FACTS.items():
            found[agent] = wait_until(lambda query=query: search(query), timeout=60)
        # Each memory is the fact its own agent's session stated, tagged with that session, and
        # the session's events were recorded under the agent that owns it.
        adapters = {(event["session_id"], event["adapter"]) for event in events(llmem_home)}
        for agent, hits in found.items():
            # The fact, and beside it the turn that stated it (an episode, capture/episodes.py).
            [hit] = [hit for hit in hits if hit["session_id"] == sessions[agent] and hit["source"] != "episode"]
            [episode] = [hit for hit in hits if hit["session_id"] == sessions[agent] and hit["source"] == "episode"]
            assert FACTS[agent][0] in episode["content"], (agent, episode["content"])
            assert hit["project"] == PROJECT
            assert (sessions[agent], agent) in adapters, (agent, adapters)
        # A Claude Code session of the project, resumed, is given what Copilot learnt. (A brand-new
        # session has no text to search on yet: it gets core memories and the latest decisions
        # and project state, not every fact.)
        claude = ClaudeSession(agent_homes["claude"], cwd=PROJECT)
        assert snapshot(agent_homes.values()) == before  # read-only inputs, byte for byte
        claude.turn("Where does the orders service read its config?", "Let me check.")
        before = snapshot(agent_homes.values())
        hook_input = {"session_id": claude.id, "transcript_path": str(claude.path), "cwd": PROJECT,
                      "hook_event_name": "SessionStart", "source": "resume"}
        done = _hook(hook_input)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        block = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
        copilot_memory = next(hit for hit in found["copilot"]
                              if hit["session_id"] == sessions["copilot"] and hit["source"] != "episode")
        assert copilot_memory["id"][:8] in block and "orders.toml" in block
    finally:
        assert stop(runner) in (0, -signal.SIGINT)
    try:
        assert snapshot(agent_homes.values()) == before
    finally:
        store.close()


def _hook(hook_input: dict):
    return subprocess.run([*LLMEM, "hook", "--adapter", "claude", "--format", "claude", "--type", "created"],
                          input=json.dumps(hook_input), capture_output=True, text=True, timeout=60)

