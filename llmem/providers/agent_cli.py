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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import LLMUnavailable
from ..paths import (
    AGENT_CALL_ENV,
    AGENT_CALLS_MARKER,
    agent_calls_dir,
    ensure_private_dir,
    write_private_text,
)
from ..tokens import estimate_tokens

if TYPE_CHECKING:
    from ..config import LlmSettings

log = logging.getLogger(__name__)

# llm.agent: auto picks the first of these on PATH.
AGENTS = ("claude", "codex", "copilot", "opencode")

# What a failing call shows of the CLI's own words (redacted first).
ERROR_CHARS = 300
# Longer arguments (a prompt, the instructions) are shown by their length.
SHOWN_ARG_CHARS = 40
# Copilot and OpenCode take the prompt as an argument; Linux refuses one over 128 KiB.
ARGV_PROMPT_CHARS = 120_000

SIGN_IN_HINTS = {
    "claude": "is Claude Code signed in? run `claude` once and /login (or set ANTHROPIC_API_KEY)",
    "codex": "is Codex signed in? run `codex login`",
    "copilot": "is Copilot CLI signed in? run `copilot login`",
    "opencode": "does OpenCode have a provider? run `opencode auth login`",
}

MARKER_TEXT = ("llmem runs its agent-CLI calls (llm.provider: agent) in this folder. Sessions an agent\n"
               "keeps for a folder holding this file are llmem's own: its watcher and backfill skip them.\n")


@dataclass
class Invocation:
    """One call of an agent CLI: what runs, what it reads on stdin, what it adds to the env."""

    argv: list[str]
    stdin: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # Which argv element is the prompt, when the CLI takes it as an argument.
    prompt_index: int | None = None

    def shown(self) -> str:
        """The command as a log line or `llmem doctor` shows it: a prompt or instructions by
        their length only, never their text."""
        parts = [Path(self.argv[0]).name] + [f"<{len(a)} chars>" if len(a) > SHOWN_ARG_CHARS else a
                                             for a in self.argv[1:]]
        text = " ".join(part if part and " " not in part else json.dumps(part) for part in parts)
        return text + (" < <prompt on stdin>" if self.stdin is not None else "")


@dataclass
class AgentReply:
    """What the CLI answered: the model's text and the tokens it says it used (None: unsaid)."""

    text: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


# ---- how each agent is called ----------------------------------------------------------------


def invocation(agent: str, executable: str, system: str, prompt: str, model: str | None) -> Invocation:
    """The non-interactive call of `agent` answering `prompt` under `system` instructions."""
    if agent == "claude":
        # -p: print mode; --output-format json: one result object with `result` and `usage`;
        # --no-session-persistence: no transcript under ~/.claude/projects; --tools "": no
        # tools; --strict-mcp-config without --mcp-config: no MCP servers (llmem's included);
        # --system-prompt replaces Claude Code's own long one, which would be billed per call.
        argv = [executable, "-p", "--output-format", "json", "--no-session-persistence",
                "--tools", "", "--strict-mcp-config", "--system-prompt", system]
        if model:
            argv += ["--model", model]
        return Invocation(argv, stdin=prompt)
    if agent == "codex":
        # exec: non-interactive; --json: JSONL events with the agent message and turn usage;
        # --ephemeral: no rollout under ~/.codex/sessions; read-only sandbox; llmem's folder
        # is no git repository; `-`: the prompt is read from stdin.
        argv = [executable, "exec", "--json", "--ephemeral", "--skip-git-repo-check",
                "--sandbox", "read-only"]
        if model:
            argv += ["-m", model]
        return Invocation([*argv, "-"], stdin=_joined(system, prompt))
    if agent == "copilot":
        # -p: non-interactive, the prompt as its argument (it reads no stdin then); -s: only
        # the agent's answer on stdout; no questions back, no custom instructions, no
        # built-in MCP servers, and every tool kind denied.
        text = _joined(system, prompt)
        argv = [executable, "-p", text, "-s", "--no-ask-user", "--no-custom-instructions",
                "--disable-builtin-mcps", "--deny-tool=shell,write,url,memory"]
        if model:
            argv += ["--model", model]
        return Invocation(argv, prompt_index=2)
    if agent == "opencode":
        # run: non-interactive; --format json: JSONL events (text parts, step tokens); the
        # message is the last argument. OpenCode has no flag for tools: the inline config
        # (merged after every file) switches them all off.
        argv = [executable, "run", "--format", "json"]
        if model:
            argv += ["--model", model]
        argv.append(_joined(system, prompt))
        return Invocation(argv, env={"OPENCODE_CONFIG_CONTENT": _opencode_config()},
                          prompt_index=len(argv) - 1)
    raise ValueError(f"unknown agent {agent!r}")


def _joined(system: str, prompt: str) -> str:
    return f"{system}\n\n{prompt}" if system else prompt


def _opencode_config() -> str:
    """OPENCODE_CONFIG_CONTENT with every tool off, kept on top of the user's own inline config."""
    config: dict[str, Any] = {}
    existing = os.environ.get("OPENCODE_CONFIG_CONTENT")
    if existing:
        try:
            parsed = json.loads(existing)
            config = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            config = {}
    config["tools"] = {"*": False}
    return json.dumps(config)


# ---- what each agent answers -----------------------------------------------------------------


def parse_output(agent: str, stdout: str) -> AgentReply:
    """The model's text and usage in the CLI's output; LLMUnavailable when the CLI says it failed.

    Output that is not the CLI's format at all gives AgentReply(None): no usable reply."""
    if agent == "claude":
        result = _last_json_object(stdout)
        if result is None or result.get("type") != "result":
            return AgentReply(None)
        if result.get("is_error") or result.get("subtype") not in (None, "success"):
            raise _CliSaid(str(result.get("result") or result.get("subtype") or "an error"))
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
        prompt = _sum(usage, "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        return AgentReply(_str(result.get("result")), prompt, _sum(usage, "output_tokens"))
    if agent == "codex":
        text, prompt, completion = None, None, None
        for event in _json_lines(stdout):
            kind = event.get("type")
            item = event.get("item") if isinstance(event.get("item"), dict) else {}
            if kind == "item.completed" and item.get("type") == "agent_message":
                text = _str(item.get("text"))
            elif kind == "turn.completed" and isinstance(event.get("usage"), dict):
                # cached_input_tokens is a part of input_tokens (OpenAI's usage).
                prompt = (prompt or 0) + (_sum(event["usage"], "input_tokens") or 0)
                completion = (completion or 0) + (_sum(event["usage"], "output_tokens") or 0)
            elif kind == "turn.failed":
                error = event.get("error") if isinstance(event.get("error"), dict) else {}
                raise _CliSaid(str(error.get("message") or "the turn failed"))
            elif kind == "error":
                raise _CliSaid(str(event.get("message") or "an error"))
        return AgentReply(text, prompt, completion)
    if agent == "copilot":
        text = stdout.strip()
        return AgentReply(text or None)
    if agent == "opencode":
        texts: list[str] = []
        prompt, completion = None, None
        for event in _json_lines(stdout):
            kind = event.get("type")
            part = event.get("part") if isinstance(event.get("part"), dict) else {}
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "step_finish" and isinstance(part.get("tokens"), dict):
                tokens = part["tokens"]
                cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
                prompt = (prompt or 0) + (_sum(tokens, "input") or 0) + (_sum(cache, "read", "write") or 0)
                completion = (completion or 0) + (_sum(tokens, "output", "reasoning") or 0)
            elif kind == "error":
                error = event.get("error") if isinstance(event.get("error"), dict) else {}
                data = error.get("data") if isinstance(error.get("data"), dict) else {}
                raise _CliSaid(str(data.get("message") or error.get("message") or error.get("name") or "an error"))
        return AgentReply("".join(texts) or None, prompt, completion)
    raise ValueError(f"unknown agent {agent!r}")


class _CliSaid(Exception):
    """The CLI answered in its format that the call failed (not signed in, quota, …)."""


def _json_lines(text: str):
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def _last_json_object(text: str) -> dict | None:
    try:
        value = json.loads(text)
        return value if isinstance(value, dict) else None
    except ValueError:
        objects = list(_json_lines(text))
        return objects[-1] if objects else None


def _sum(values: dict, *keys: str) -> int | None:
    found = [values[k] for k in keys if isinstance(values.get(k), int | float) and not isinstance(values.get(k), bool)]
    return int(sum(found)) if found else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# ---- the client --------------------------------------------------------------------------------


def find_agent(choice: str) -> tuple[str, str | None]:
    """(agent, its executable on PATH or None) for llm.agent: auto takes the first one installed."""
    if choice != "auto":
        return choice, shutil.which(choice)
    for agent in AGENTS:
        path = shutil.which(agent)
        if path:
            return agent, path
    return AGENTS[0], None


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

    def __init__(self, agent: str, executable: str | None, model: str | None = None):
        self.agent, self.executable, self.model = agent, executable, model

    @property
    def label(self) -> str:
        """What LlmUsage.model records: the agent, and the model when one was asked for."""
        return f"{self.agent}/{self.model}" if self.model else self.agent

    def command(self, system: str = "<instructions>", prompt: str = "<prompt>") -> Invocation:
        """The call that would run (`llmem doctor` shows it)."""
        return invocation(self.agent, self.executable or self.agent, system, prompt, self.model)

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
                                 hint="pick an agent that reads its prompt on stdin (claude, codex) in llm.agent")
        shown = _Shown(redactor)
        stdout = self._run(call, timeout, shown)
        try:
            reply = parse_output(self.agent, stdout)
        except _CliSaid as said:
            raise LLMUnavailable(f"{self.agent} answered with an error: {shown(str(said))}",
                                 hint=SIGN_IN_HINTS[self.agent]) from None
        if reply.text is None:
            # Not the CLI's format at all (another program of that name, a changed CLI): a
            # retry would cost a second call for the same garbage.
            raise LLMUnavailable(f"{self.agent} answered in no format llmem knows: {shown(stdout) or '(nothing)'}",
                                 hint=f"check `{call.shown()}` by hand; `llmem doctor` shows the command")
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None \
            else estimate_tokens(_joined(system, prompt))
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
                parse_output(self.agent, stdout)  # a JSON error result says more than the exit status
            except _CliSaid as said:
                raise LLMUnavailable(f"{self.agent} answered with an error: {shown(str(said))}",
                                     hint=SIGN_IN_HINTS[self.agent]) from None
            words = shown(stderr) or shown(stdout) or "no output"
            raise LLMUnavailable(f"{self.agent} exited with status {process.returncode}: {words}",
                                 hint=SIGN_IN_HINTS[self.agent])
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
                           else "none of " + ", ".join(AGENTS) + " is on PATH")
    return status
