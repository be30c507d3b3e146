"""The chat LLM through an agent CLI the user is already signed in to (llm.provider: agent).

Claude Code, Codex CLI, Copilot CLI and OpenCode each answer one prompt non-interactively
(`claude -p`, `codex exec`, `copilot -p`, `opencode run`). llmem sends such a call exactly
what it would send Ollama, through LLM.chat_json: redacted, schema-checked with one retry,
one call per extraction chunk, metered against llm.daily_token_budget (the usage the CLI
reports; an estimate from the text sent and received when it reports none).

The call is a session of the agent's own, and must never come back as a user's session:
- it runs with AGENT_CALL_ENV set: the agent fires its hooks for it too, llmem's among
  them, and `llmem hook` does nothing under that variable;
- it runs in agent_calls_dir(), which holds AGENT_CALLS_MARKER: the watcher and backfill
  skip a session that ran in a folder holding it (Copilot and OpenCode keep every session);
- where the CLI can be told not to keep the session at all, it is
  (`claude --no-session-persistence`, `codex exec --ephemeral`).
Tools are switched off wherever the CLI allows it: the call reads a slice of a transcript
(someone else's words, which may ask for anything) and must only answer with JSON.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..adapters.agent_call import CliSaid, Invocation, joined
from ..errors import ConfigError, LLMUnavailable
from ..paths import (
    AGENT_CALL_ENV,
    AGENT_CALLS_MARKER,
    agent_calls_dir,
    ensure_private_dir,
    write_private_text,
)
from ..tokens import estimate_tokens

if TYPE_CHECKING:
    from ..adapters.agent import Agent
    from ..config import LlmSettings

log = logging.getLogger(__name__)

# What a failing call shows of the CLI's own words (redacted first).
ERROR_CHARS = 300
# Some agents take the prompt as an argument; Linux refuses one over 128 KiB.
ARGV_PROMPT_CHARS = 120_000

MARKER_TEXT = ("llmem runs its agent-CLI calls (llm.provider: agent) in this folder. Sessions an agent\n"
               "keeps for a folder holding this file are llmem's own: its watcher and backfill skip them.\n")


def callable_agents() -> list[Agent]:
    """The agents with a non-interactive mode, in the order llm.agent: auto tries them."""
    from ..adapters.registry import all_agents

    return sorted((agent for agent in all_agents() if agent.call_rank is not None), key=lambda agent: agent.call_rank)


def stdin_readers() -> list[str]:
    """The agents whose call reads its prompt on stdin (no argument length limit)."""
    return [agent.name for agent in callable_agents() if agent.call_invocation(agent.name, "", "", None).stdin is not None]


# ---- the client --------------------------------------------------------------------------------


def find_agent(choice: str) -> tuple[Agent, str | None]:
    """(agent, its executable on PATH or None) for llm.agent: auto takes the first one installed."""
    from ..adapters.registry import get_agent

    if choice != "auto":
        agent = get_agent(choice)
        if agent.call_rank is None:
            names = ", ".join(agent.name for agent in callable_agents())
            raise ConfigError(f"llm.agent: {choice} has no non-interactive mode llmem can call",
                              hint=f"set llm.agent to auto or one of {names}, or pick another llm.provider")
        return agent, shutil.which(choice)
    candidates = callable_agents()
    for agent in candidates:
        path = shutil.which(agent.name)
        if path:
            return agent, path
    return candidates[0], None


def prepare_workdir() -> Path:
    """agent_calls_dir(), made private, with the marker that tells llmem's own sessions apart."""
    folder = ensure_private_dir(agent_calls_dir())
    marker = folder / AGENT_CALLS_MARKER
    if not marker.is_file():
        write_private_text(marker, MARKER_TEXT)
    return folder


class AgentCall:
    """One agent CLI as a chat model: which agent, its executable, the model it is asked for.
    providers/llm.py's AgentLLM wraps it, so chat_json's redaction, retry and metering apply."""

    timeout_hint = "agent CLIs start slowly and think long: raise llm.timeout in config.yaml"

    def __init__(self, unit: Agent, executable: str | None, model: str | None = None):
        self.unit, self.executable, self.model = unit, executable, model
        self.agent = unit.name

    @property
    def label(self) -> str:
        """What LlmUsage.model records: the agent, and the model when one was asked for."""
        return f"{self.agent}/{self.model}" if self.model else self.agent

    def command(self, system: str = "<instructions>", prompt: str = "<prompt>") -> Invocation:
        """The call that would run (`llmem doctor` shows it)."""
        return self.unit.call_invocation(self.executable or self.agent, system, prompt, self.model)

    def ask(self, messages: list[dict], schema: dict, *, timeout: float,
            redactor) -> tuple[str, int, int, str]:
        """(reply text, prompt tokens, completion tokens, raw output) of one call;
        LLMUnavailable when the CLI is missing, fails, times out or answers in no known format."""
        if not self.executable:
            raise LLMUnavailable(
                f"the agent CLI `{self.agent}` is not on PATH",
                hint="install it, pick another with llm.agent (`llmem doctor` says which are found), "
                     "or set llm.provider: none")
        system, prompt = render_prompt(messages, schema)
        call = self.command(system, prompt)
        if call.prompt_index is not None and len(call.argv[call.prompt_index]) > ARGV_PROMPT_CHARS:
            raise LLMUnavailable(f"the prompt is too long for `{self.agent}` ({len(prompt)} characters)",
                                 hint=f"pick an agent that reads its prompt on stdin ({', '.join(stdin_readers())}) in llm.agent")
        shown = _Shown(redactor)
        stdout = self._run(call, timeout, shown)
        try:
            reply = self.unit.read_call_output(stdout)
        except CliSaid as said:
            raise LLMUnavailable(f"{self.agent} answered with an error: {shown(str(said))}",
                                 hint=self.unit.sign_in_hint) from None
        if reply.text is None:
            # Not the CLI's format at all (another program of that name, a changed CLI): a
            # retry would cost a second call for the same garbage.
            raise LLMUnavailable(f"{self.agent} answered in no format llmem knows: {shown(stdout) or '(nothing)'}",
                                 hint=f"check `{call.shown()}` by hand; `llmem doctor` shows the command")
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None \
            else estimate_tokens(joined(system, prompt))
        completion_tokens = reply.completion_tokens if reply.completion_tokens is not None \
            else estimate_tokens(reply.text)
        return reply.text, prompt_tokens, completion_tokens, stdout

    def _run(self, call: Invocation, timeout: float, shown) -> str:
        """Run the call in llmem's agent-calls folder under the no-capture marker; its stdout."""
        workdir = prepare_workdir()
        env = {**os.environ, **call.env, AGENT_CALL_ENV: "1"}
        log.debug("agent call: %s (in %s)", call.shown(), workdir)
        try:
            # A session of its own: the agent's children (node, MCP servers) go with it on a timeout.
            process = subprocess.Popen(
                call.argv, cwd=workdir, env=env, text=True, encoding="utf-8", errors="replace",
                stdin=subprocess.PIPE if call.stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise LLMUnavailable(f"could not start `{self.agent}` ({exc.strerror or exc})",
                                 hint=f"check that {self.executable} runs") from None
        try:
            stdout, stderr = process.communicate(call.stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise LLMUnavailable(f"{self.agent} did not answer within {timeout:g} s",
                                 hint=self.timeout_hint) from None
        if process.returncode != 0:
            try:
                self.unit.read_call_output(stdout)  # a JSON error result says more than the exit status
            except CliSaid as said:
                raise LLMUnavailable(f"{self.agent} answered with an error: {shown(str(said))}",
                                     hint=self.unit.sign_in_hint) from None
            words = shown(stderr) or shown(stdout) or "no output"
            raise LLMUnavailable(f"{self.agent} exited with status {process.returncode}: {words}",
                                 hint=self.unit.sign_in_hint)
        return stdout


class _Shown:
    """The CLI's words fit for an error message and the log: redacted, on one line, cut."""

    def __init__(self, redactor):
        self.redactor = redactor

    def __call__(self, text: str) -> str:
        text = " ".join(self.redactor.text(text or "").split())
        return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "…"


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass
    process.communicate()


def render_prompt(messages: list[dict], schema: dict) -> tuple[str, str]:
    """(instructions, prompt): the system messages, and the conversation as one text with the
    answer's JSON schema, the way a one-shot CLI prompt carries a chat."""
    system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system" and isinstance(m.get("content"), str))
    system = (system + "\n\n" if system else "") + (
        "Use no tools and read no files: everything you need is in the prompt. Answer with a single "
        "JSON object matching this JSON schema, and nothing else (no prose, no code fence):\n"
        + json.dumps(schema))
    turns = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role == "system" or not isinstance(content, str):
            continue
        turns.append(f"Your previous answer:\n{content}" if role == "assistant" else content)
    return system, "\n\n".join(turns)


def agent_call(section: LlmSettings, model: str | None = None) -> AgentCall:
    """The `llm:` section's agent; `model` (a hook's --model, dream.model) wins over
    llm.agent_model, unless it is just llm.model: that names the Ollama or OpenAI model
    (the dream's narrative falls back to it), which no agent CLI knows."""
    agent, executable = find_agent(section.agent)
    chosen = model if model and model != section.model else section.agent_model
    return AgentCall(agent, executable, chosen)


def agent_status(config, tokens_today: int | None = None) -> dict[str, Any]:
    """What llm.provider: agent would run and what it has cost today (for `llmem doctor`).

    Makes no call: one would cost tokens, and signing in is the agent's own business."""
    section = config.llm
    call = agent_call(section)
    status = {"provider": "agent", "model": call.label, "agent": call.agent,
              "executable": call.executable, "command": call.command().shown(),
              "daily_token_budget": section.daily_token_budget, "tokens_today": tokens_today,
              "status": "ok" if call.executable else "unavailable"}
    if not call.executable:
        status["error"] = (f"`{call.agent}` is not on PATH" if section.agent != "auto"
                           else "none of " + ", ".join(agent.name for agent in callable_agents()) + " is on PATH")
    return status
