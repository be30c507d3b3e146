"""llm.provider: agent — extraction through an agent CLI the user is signed in to, against
stand-in CLIs on PATH (tests/fake_agents.py) that answer like the real ones, fire llmem's
hooks like the real ones and keep their sessions where the real ones do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_agents import install_fake_agents
from session_writers import copilot_session

from llmem.adapters.registry import get_agent
from llmem.app import App
from llmem.capture.extract import SYSTEM_PROMPT, extract_session
from llmem.config import load_config
from llmem.errors import ConfigError, LLMReplyInvalid, LLMUnavailable
from llmem.paths import AGENT_CALL_ENV, AGENT_CALLS_MARKER, agent_calls_dir
from llmem.processes import process_state
from llmem.providers.agent_cli import AgentCall
from llmem.providers.llm import AgentLLM, make_llm, today
from llmem.tokens import estimate_tokens

SCHEMA = {"type": "object", "properties": {"items": {"type": "array"}}, "required": ["items"]}
MESSAGES = [{"role": "system", "content": "Answer about the items."}, {"role": "user", "content": "List them."}]
SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
PROJECT = "/home/dev/shop"

# What each CLI reports as used by the stand-in's answer (prompt, completion); Copilot reports none.
REPORTED = {"claude": (120 + 30 + 1000, 45), "codex": (2000, 60), "opencode": (800 + 200, 50 + 5)}

# The flags each call must carry, by what they are for (providers/agent_cli.py says why).
FLAGS = {
    "claude": {"non-interactive": ["-p"], "json": ["--output-format", "json"],
               "no tools": ["--tools", "", "--strict-mcp-config"], "no session": ["--no-session-persistence"]},
    "codex": {"non-interactive": ["exec"], "json": ["--json"], "no tools": ["--sandbox", "read-only"],
              "no session": ["--ephemeral"]},
    "copilot": {"non-interactive": ["-p"], "json": ["-s"], "no questions": ["--no-ask-user"],
                "no tools": ["--disable-builtin-mcps", "--deny-tool=shell,write,url,memory"]},
    "opencode": {"non-interactive": ["run"], "json": ["--format", "json"]},
}


@pytest.fixture
def agents(tmp_path, monkeypatch):
    return install_fake_agents(tmp_path / "bin", monkeypatch)


def agent_config(configure, agent: str = "claude", extra: str = "", state_dir: Path | None = None) -> None:
    session = (f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n" if state_dir else "")
    configure(f"embedding:\n  provider: none\nllm:\n  provider: agent\n  agent: {agent}\n{extra}" + session)


@pytest.fixture
def app():
    application = App()
    yield application
    application.close()


def ask(app, messages=MESSAGES, schema=SCHEMA, task="extract"):
    llm = make_llm(app.config, store=app.store)
    try:
        return llm.chat_json(messages, schema, task=task)
    finally:
        llm.close()


def ask_once(agent: str) -> None:
    """One call through a fresh App (the config was just rewritten for `agent`)."""
    application = App()
    try:
        assert application.config.llm.agent == agent
        ask(application)
    finally:
        application.close()


def has_run(argv: list[str], flags: list[str]) -> bool:
    """`flags` appear in argv as one run, in this order."""
    return any(argv[i:i + len(flags)] == flags for i in range(len(argv)))


def usage_rows(app):
    LlmUsage = app.store.models.LlmUsage
    return [(r.task, r.provider, r.model, r.prompt_tokens, r.completion_tokens, r.day)
            for r in LlmUsage.select().order_by(LlmUsage.id)]


# ---- the call ---------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", ["claude", "codex", "copilot", "opencode"])
def test_each_agent_answers_one_call_with_its_flags_and_its_usage_metered(agent, agents, configure, app):
    agents[agent].answer('{"items": [1, 2]}')
    agent_config(configure, agent)

    assert ask(app) == {"items": [1, 2]}

    (call,) = agents[agent].calls
    argv = call["argv"]
    for purpose, flags in FLAGS[agent].items():
        assert has_run(argv, flags), f"{agent}: no {purpose} flags {flags} in {argv}"
    # The prompt carries the instructions, the conversation and the schema.
    prompt = call["stdin"] if agent in ("claude", "codex") else next(a for a in argv if "List them." in a)
    assert "List them." in prompt and '"required": ["items"]' in (prompt + " ".join(argv))
    if agent in ("claude", "codex"):  # on stdin: no other user of the machine sees it in `ps`
        assert not any("List them." in a for a in argv)
    if agent == "claude":  # Claude Code's own long system prompt is replaced, not paid for per call
        assert argv[argv.index("--system-prompt") + 1].startswith("Answer about the items.")
    # Never recursive: the marker llmem's hook honours, and llmem's own folder holding the marker file.
    assert call["env"][AGENT_CALL_ENV] == "1"
    assert Path(call["cwd"]) == agent_calls_dir() and (agent_calls_dir() / AGENT_CALLS_MARKER).is_file()
    assert oct(agent_calls_dir().stat().st_mode & 0o777) == "0o700"
    if agent == "opencode":
        assert json.loads(call["env"]["OPENCODE_CONFIG_CONTENT"])["tools"] == {"*": False}
    # Metered: the usage the CLI reports, else the estimate of what was sent and received.
    (row,) = usage_rows(app)
    if agent in REPORTED:
        tokens = REPORTED[agent]
    else:
        tokens = (estimate_tokens(prompt), estimate_tokens('{"items": [1, 2]}'))
    assert row == ("extract", "agent", agent, *tokens, today())


def test_auto_takes_the_first_agent_installed_and_llm_agent_model_is_passed(tmp_path, monkeypatch, configure, app):
    agents = install_fake_agents(tmp_path / "bin", monkeypatch, "copilot", "opencode")
    agents["copilot"].answer('{"items": []}')
    agent_config(configure, "auto", extra="  agent_model: claude-haiku-4.5\n")

    assert ask(app) == {"items": []}

    assert len(agents["copilot"].calls) == 1 and agents["opencode"].calls == []
    assert has_run(agents["copilot"].calls[0]["argv"], ["--model", "claude-haiku-4.5"])
    assert usage_rows(app)[0][2] == "copilot/claude-haiku-4.5"


def test_llm_model_is_no_agent_model_but_an_explicit_one_is_passed(agents, configure, app):
    """The dream's narrative asks for dream.model, else llm.model (an Ollama name by default):
    the agent is not asked for `llama3.1:8b`."""
    agents["claude"].answer('{"items": []}')
    agent_config(configure, "claude")
    for model in (app.config.llm.model, "haiku"):
        llm = make_llm(app.config, model=model, store=app.store)
        try:
            llm.chat_json(MESSAGES, SCHEMA, task="dream_diary")
        finally:
            llm.close()
    first, second = (call["argv"] for call in agents["claude"].calls)
    assert "--model" not in first and has_run(second, ["--model", "haiku"])


def test_the_agent_is_off_by_default_and_a_wrong_agent_name_is_a_config_error(configure):
    assert load_config().llm.provider != "agent"
    configure("llm:\n  provider: agent\n  agent: gemini\n")
    with pytest.raises(ConfigError, match="llm.agent"):
        load_config()


# ---- failures: LLMUnavailable, heuristics take over, no secret shown --------------------------


def test_a_missing_cli_is_unavailable_and_extraction_keeps_the_users_statements(tmp_path, monkeypatch, configure, app):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    state_dir = tmp_path / "session-state"
    session = copilot_session(state_dir, "ses-nocli", cwd=PROJECT)
    session.user("Remember that the staging database is reset every Monday.")
    agent_config(configure, "claude", state_dir=state_dir)

    with pytest.raises(LLMUnavailable, match="`claude` is not on PATH") as caught:
        ask(app)
    assert "llm.agent" in caught.value.hint

    report = extract_session(app, "ses-nocli")
    assert not report.used_llm and "not on PATH" in report.llm_error
    # (however the heuristics word it: another helper's module)
    assert any("staging database is reset every Monday" in m.content for m in app.store.list(limit=None))
    assert usage_rows(app) == []


@pytest.mark.parametrize("agent,login", [("claude", "/login"), ("codex", "codex login"),
                                         ("copilot", "copilot login"), ("opencode", "opencode auth login")])
def test_a_signed_out_cli_is_unavailable_with_the_sign_in_hint_and_no_secret(agent, login, agents, configure,
                                                                             app, caplog):
    agents[agent].answer(mode="signed_out")
    agent_config(configure, agent)

    with caplog.at_level("DEBUG", logger="llmem"), pytest.raises(LLMUnavailable) as caught:
        ask(app)

    assert login in caught.value.hint
    said = caught.value.message
    assert "[REDACTED" in said and SECRET not in said and SECRET not in caplog.text
    assert len(agents[agent].calls) == 1  # not retried: the next call would fail the same way


def test_output_in_no_known_format_is_unavailable_at_once(agents, configure, app):
    agents["claude"].answer(mode="garbage")
    agent_config(configure, "claude")

    with pytest.raises(LLMUnavailable, match="no format llmem knows"):
        ask(app)
    assert len(agents["claude"].calls) == 1


def test_a_reply_that_is_not_the_schema_is_retried_once_then_invalid_both_metered(agents, configure, app):
    agents["copilot"].answer("Sure! Here are the items you asked for.", "Still prose, sorry.")
    agent_config(configure, "copilot")

    with pytest.raises(LLMReplyInvalid, match="no usable reply"):
        ask(app)

    first, second = agents["copilot"].calls
    retry_prompt = second["argv"][second["argv"].index("-p") + 1]
    assert "Your previous answer:\nSure! Here are the items" in retry_prompt and "cannot be used" in retry_prompt
    assert len(usage_rows(app)) == 2


def test_a_cli_that_does_not_answer_in_time_is_killed_with_its_children(agents, configure, app):
    agents["codex"].answer(mode="hang")
    agent_config(configure, "codex")
    # 1 s: room for the stand-in (a Python process) to start its child and say so under load.
    llm = AgentLLM(AgentCall(get_agent("codex"), str(agents["codex"].path)), timeout=1.0, store=app.store)

    started = time.monotonic()
    with pytest.raises(LLMUnavailable, match="did not answer within 1 s") as caught:
        llm.chat_json(MESSAGES, SCHEMA, task="extract")

    assert time.monotonic() - started < 10 and "llm.timeout" in caught.value.hint
    (call,) = agents["codex"].calls
    deadline = time.monotonic() + 5
    while not gone(call["child_pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(call["child_pid"])


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for a reaper (a container's pid 1 may never reap)."""
    state = process_state(pid)
    return state is None or state[0] == "Z"


# ---- extraction through the agent ---------------------------------------------------------------


def test_extraction_asks_the_agent_once_per_chunk_with_the_slice_redacted(tmp_path, agents, configure, app):
    state_dir = tmp_path / "session-state"
    session = copilot_session(state_dir, "ses-agent", cwd=PROJECT)
    session.user(f"We deploy with the token {SECRET} from the vault.")
    session.reply("Understood; I will use it only from the vault.")
    for i in range(12):
        session.user(f"Note {i}: " + "the payment retries back off exponentially " * 40)
    agents["claude"].answer(json.dumps({"memories": [
        {"type": "procedure", "content": "Deployment reads its token from the vault.", "stated_by_user": True}]}))
    agent_config(configure, "claude", state_dir=state_dir)

    report = extract_session(app, "ses-agent")

    calls = agents["claude"].calls
    assert report.used_llm and report.chunks == len(calls) > 1  # one call per chunk, not per sentence
    for call in calls:
        assert SECRET not in call["stdin"] and SECRET not in " ".join(call["argv"])
        assert SYSTEM_PROMPT.splitlines()[0] in call["argv"][call["argv"].index("--system-prompt") + 1]
    assert "[REDACTED" in calls[0]["stdin"]
    contents = [m.content for m in app.store.list(limit=None)]
    assert contents.count("Deployment reads its token from the vault.") == 1
    assert [row[0] for row in usage_rows(app)] == ["extract"] * len(calls)


def test_a_spent_budget_defers_extraction_without_calling_the_agent(tmp_path, agents, configure, app):
    state_dir = tmp_path / "session-state"
    session = copilot_session(state_dir, "ses-budget", cwd=PROJECT)
    session.user("Remember: never log request bodies.")
    agents["claude"].answer(json.dumps({"memories": []}))
    agent_config(configure, "claude", extra="  daily_token_budget: 1000\n", state_dir=state_dir)

    first = extract_session(app, "ses-budget")  # the call reports 1150 + 45 tokens: over the budget
    assert first.used_llm and len(agents["claude"].calls) == 1
    session.user("Remember: the queue is drained before deploys.")

    later = extract_session(app, "ses-budget")

    assert later.deferred and "budget" in later.llm_error
    assert len(agents["claude"].calls) == 1  # no call once today's budget is spent
    assert any("queue is drained before deploys" in m.content for m in app.store.list(limit=None))


def test_introspection_asks_the_agent_too(agents, configure, cli, app):
    agents["opencode"].answer(json.dumps({"assessments": [
        {"category": "EDGE_CASE", "what_happened": "an empty cart crashed checkout"}]}))
    agent_config(configure, "opencode")

    code, out, err = cli("introspect", "--auto", "--text", "Checkout crashed on an empty cart.", "--json")

    assert code == 0, err
    (memory,) = json.loads(out)
    assert memory["type"] == "self_assessment" and memory["metadata"]["category"] == "EDGE_CASE"
    assert len(agents["opencode"].calls) == 1 and [r[0] for r in usage_rows(app)] == ["introspect"]


# ---- never recursive ------------------------------------------------------------------------------


def hook(kind: str, fmt: str, payload: dict, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmem", "hook", "--type", kind, "--format", fmt],
                          input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=60)


def test_llmem_hook_does_nothing_for_the_agents_own_call(tmp_path, agents, configure, app):
    agents["claude"].answer('{"items": []}')
    agent_config(configure, "claude")

    ask(app)

    (call,) = agents["claude"].calls
    # The stand-in fired SessionStart and SessionEnd like Claude Code, llmem's hooks among them:
    # no context printed, nothing queued, nothing said.
    assert [(h["kind"], h["code"], h["stdout"], h["stderr"]) for h in call["hooks"]] == [
        ("created", 0, "", ""), ("ending", 0, "", "")]
    assert app.store.models.Event.select().count() == 0
    # The same hooks from a user's session do their work: the marker, not luck, made the difference.
    user = {k: v for k, v in os.environ.items() if k != AGENT_CALL_ENV}
    payload = {"session_id": "4f1c8e2a-9b3d-4e6f-a1c2-7d8e9f0a1b2c", "cwd": str(tmp_path),
               "hook_event_name": "SessionStart", "source": "startup"}
    assert "additionalContext" in hook("created", "claude", payload, user).stdout
    # The variable alone is enough (a hook whose JSON names no folder, or another one).
    assert hook("created", "claude", payload, dict(user, **{AGENT_CALL_ENV: "1"})).stdout == ""
    # Without the variable (a hook runner that drops it), llmem's folder alone is enough.
    own = dict(payload, cwd=str(agent_calls_dir()))
    assert hook("created", "claude", own, user).stdout == ""


def test_claude_and_codex_keep_no_session_file_and_the_stand_ins_would_without_the_flag(agents, configure, app):
    home = Path(os.environ["HOME"])
    for agent in ("claude", "codex"):
        agents[agent].answer('{"items": []}')
        agent_config(configure, agent)
        ask_once(agent)
    assert not (home / ".claude" / "projects").exists() and not (home / ".codex" / "sessions").exists()
    # Control: the same stand-ins, run without the no-persistence flag, keep a session file.
    for agent, flag in (("claude", "--no-session-persistence"), ("codex", "--ephemeral")):
        argv = [a for a in agents[agent].calls[0]["argv"] if a != flag]
        subprocess.run([str(agents[agent].path), *argv], input="prompt", capture_output=True, text=True,
                       cwd=agent_calls_dir(), timeout=60, check=True)
    assert list((home / ".claude" / "projects").rglob("*.jsonl")) and list((home / ".codex" / "sessions").rglob("*.jsonl"))


def test_the_watcher_and_backfill_skip_sessions_the_agent_kept_for_llmems_call(tmp_path, agents, configure, cli):
    from llmem.pipeline.watcher import SessionWatcher

    home = Path(os.environ["HOME"])
    state_dir = home / ".copilot" / "session-state"
    configure("embedding:\n  provider: none\nllm:\n  provider: agent\n  agent: copilot\n"
              "session:\n  adapter: auto\n")
    emitted: list[tuple[str, str, str]] = []
    watcher = SessionWatcher(load_config(), lambda *event: emitted.append(event))
    watcher.begin(time.time() - 60)  # driven through poll(now): no observer, no sleeps
    # Copilot and OpenCode keep every session: the stand-ins do too, in llmem's folder.
    for agent in ("copilot", "opencode"):
        agents[agent].answer('{"items": []}')
        configure(f"embedding:\n  provider: none\nllm:\n  provider: agent\n  agent: {agent}\n"
                  "session:\n  adapter: auto\n")
        ask_once(agent)
    (own_copilot,) = [p.name for p in state_dir.iterdir()]
    user = copilot_session(state_dir, "ses-user", cwd=PROJECT)
    user.turn("Remember that invoices are numbered per year.", "Noted.")
    user.shutdown()

    watcher.poll(time.time() + 3600)  # the folders appeared: attached, and every session read
    watcher.poll(time.time() + 7200)  # past the idle debounce and the inactivity timeout

    assert {session for _, session, _ in emitted} == {"ses-user"}
    assert ("copilot", "ses-user", "ending") in emitted

    code, out, err = cli("backfill", "--no-llm", "--json")
    assert code == 0, err
    assert json.loads(out)["sessions_by_adapter"] == {"copilot": 1}


def test_the_watcher_skips_a_claude_or_codex_session_that_ran_in_llmems_folder(configure):
    """Claude Code and Codex keep no session for the call; should a version ignore the flag,
    the folder still tells the watcher it is llmem's own."""
    from session_writers import ClaudeSession, CodexRollout

    from llmem.pipeline.watcher import SessionWatcher
    from llmem.providers.agent_cli import prepare_workdir

    home = Path(os.environ["HOME"])
    configure("embedding:\n  provider: none\nsession:\n  adapter: auto\n")
    emitted: list[tuple[str, str, str]] = []
    watcher = SessionWatcher(load_config(), lambda *event: emitted.append(event))
    watcher.begin(time.time() - 60)  # driven through poll(now): no observer, no sleeps
    own_dir = str(prepare_workdir())
    sessions = {}
    for cwd in (own_dir, PROJECT):
        claude = ClaudeSession(home / ".claude", cwd=cwd)
        claude.turn("Remember that builds run on Fridays.", "Noted.")
        codex = CodexRollout(home / ".codex", cwd=cwd)
        codex.turn("Remember that builds run on Fridays.", "Noted.")
        sessions[cwd] = {("claude", claude.id), ("codex", codex.id)}

    watcher.poll(time.time() + 3600)  # the folders appeared: attached, and every session read
    watcher.poll(time.time() + 7200)  # past the idle debounce and the inactivity timeout

    assert {(adapter, session) for adapter, session, _ in emitted} == sessions[PROJECT]


# ---- llmem doctor ---------------------------------------------------------------------------------


def test_doctor_says_what_the_agent_would_run_and_what_it_cost_today(agents, configure, app, cli):
    agents["codex"].answer('{"items": []}')
    agent_config(configure, "codex", extra="  daily_token_budget: 50000\n")
    ask(app)

    code, out, err = cli("doctor", "--json")

    (check,) = [c for c in json.loads(out)["checks"] if c["name"] == "llm"]
    assert check["status"] == "ok" and check["tokens_today"] == 2060 and check["daily_token_budget"] == 50000
    assert check["command"] == "codex exec --json --ephemeral --skip-git-repo-check --sandbox read-only - < <prompt on stdin>"
    assert str(agents["codex"].path) in check["detail"] and "2060 tokens today of the 50000" in check["detail"]
    assert check["tokens_per_call"] == 2060 and "2060 tokens a call on average over 1 agent calls" in check["detail"]


def test_doctor_warns_when_no_agent_cli_is_on_path(tmp_path, monkeypatch, configure, cli):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    agent_config(configure, "auto")

    code, out, err = cli("doctor", "--json")

    (check,) = [c for c in json.loads(out)["checks"] if c["name"] == "llm"]
    assert check["status"] == "warn"
    assert "none of claude, codex, copilot, opencode is on PATH" in check["detail"]
    assert "heuristics" in check["detail"]
