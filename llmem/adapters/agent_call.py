"""What one non-interactive call of an agent CLI is, and the reading of its output, shared by
the agents' units: each unit builds its own call and reads its own format
(`Agent.call_invocation`, `Agent.read_call_output`); providers/agent_cli.py runs the call.
Pure: nothing here starts a process.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Longer arguments (a prompt, the instructions) are shown by their length.
SHOWN_ARG_CHARS = 40


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


class CliSaid(Exception):
    """The CLI answered in its format that the call failed (not signed in, quota, …)."""


def joined(system: str, prompt: str) -> str:
    """Instructions and prompt as one text, for a CLI that takes no separate instructions."""
    return f"{system}\n\n{prompt}" if system else prompt


def json_lines(text: str):
    """The JSON objects of a JSONL output, skipping what is not one."""
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


def last_json_object(text: str) -> dict | None:
    """The output as one JSON object, else its last JSON line."""
    try:
        value = json.loads(text)
        return value if isinstance(value, dict) else None
    except ValueError:
        objects = list(json_lines(text))
        return objects[-1] if objects else None


def token_sum(values: dict, *keys: str) -> int | None:
    """The sum of the numeric `keys` present (None: none is)."""
    found = [values[k] for k in keys if isinstance(values.get(k), int | float) and not isinstance(values.get(k), bool)]
    return int(sum(found)) if found else None


def text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def inline_config_without_tools(variable: str) -> str:
    """An inline JSON config (the environment variable `variable`) with every tool off, kept
    on top of the user's own inline config."""
    config: dict[str, Any] = {}
    existing = os.environ.get(variable)
    if existing:
        try:
            parsed = json.loads(existing)
            config = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            config = {}
    config["tools"] = {"*": False}
    return json.dumps(config)
