"""Stand-ins for the agent CLIs on PATH (`claude`, `codex`, `copilot`, `opencode`), for the tests
of llm.provider: agent.

Each is a small Python script written into a temp bin folder under the agent's own name. It
answers the way the real CLI's non-interactive mode does (the shapes the CLIs' own
references document): `claude -p --output-format json` one result object with `usage`,
`codex exec --json` JSONL events ending in `turn.completed` with usage, `copilot -p -s` the bare
answer, `opencode run --format json` JSONL text parts and a `step_finish` with tokens. Like the
real one it fires its hooks (`llmem hook`, with the hook JSON on stdin, the way `llmem install`
wires them) and keeps its session where the real one does, unless told not to
(`--no-session-persistence`, `--ephemeral`; Copilot and OpenCode always keep theirs). It
records its argv, stdin, cwd and environment, and what its hooks printed, for the test to
assert on.

What it answers comes from a behaviour file the test writes: `replies` (the model's text, one
per call, the last one repeated) and `mode`: ok, signed_out (what the CLI says when no one is
logged in), garbage (not the CLI's format), hang (never answers, with a child process).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
AGENT_NAMES = ("claude", "codex", "copilot", "opencode")

SCRIPT = r'''#!{python}
import json, os, subprocess, sys, time, uuid
sys.path.insert(0, {tests!r})
NAME, RECORD, BEHAVIOUR = {name!r}, {record!r}, {behaviour!r}

argv = sys.argv[1:]
stdin = sys.stdin.read()
behaviour = json.load(open(BEHAVIOUR))
calls = open(RECORD).read().count("\n") if os.path.exists(RECORD) else 0
replies = behaviour.get("replies") or ['{{"memories": []}}']
text = replies[min(calls, len(replies) - 1)]
mode = behaviour.get("mode", "ok")
cwd = os.getcwd()
session_id = str(uuid.uuid4())
record = {{"argv": argv, "stdin": stdin, "cwd": cwd, "env": dict(os.environ), "hooks": []}}


def hook(kind, payload, fmt):
    """Fire a hook as the agent does: `llmem hook` with the hook's JSON on stdin, its env."""
    done = subprocess.run([sys.executable, "-m", "llmem", "hook", "--type", kind, "--format", fmt],
                          input=json.dumps(payload), capture_output=True, text=True, timeout=60)
    record["hooks"].append({{"kind": kind, "code": done.returncode, "stdout": done.stdout,
                            "stderr": done.stderr}})


def persist():
    """Keep the session where the real CLI keeps it (unless told not to)."""
    home = os.environ["HOME"]
    if NAME == "claude" and "--no-session-persistence" not in argv:
        from session_writers import ClaudeSession
        session = ClaudeSession(os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(home, ".claude"),
                                session_id, cwd=cwd)
        session.turn(stdin or "prompt", text)
    elif NAME == "codex" and "--ephemeral" not in argv:
        from session_writers import CodexRollout
        rollout = CodexRollout(os.environ.get("CODEX_HOME") or os.path.join(home, ".codex"), cwd=cwd)
        rollout.turn(stdin or "prompt", text)
    elif NAME == "copilot":
        from session_writers import CopilotSession
        session = CopilotSession(os.path.join(os.environ.get("COPILOT_HOME") or os.path.join(home, ".copilot"),
                                              "session-state"), session_id, cwd=cwd)
        session.start(locked=False)
        session.turn(argv[argv.index("-p") + 1] if "-p" in argv else "prompt", text)
        session.shutdown(unlock=False)
    elif NAME == "opencode":
        from session_writers import OpenCodeStore
        store = OpenCodeStore(os.path.join(home, ".local", "share", "opencode"), worktree=cwd)
        store.session(directory=cwd).turn(argv[-1], text, whole=True)
        store.close()


if mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    record["child_pid"] = child.pid
    with open(RECORD, "a") as out:
        out.write(json.dumps(record) + "\n")
    time.sleep(120)

payload = {{"session_id": session_id, "sessionId": session_id, "cwd": cwd,
           "transcript_path": os.path.join(cwd, session_id + ".jsonl"), "hook_event_name": "SessionStart"}}
hook("created", payload, {{"claude": "claude", "codex": "codex", "copilot": "copilot"}}.get(NAME, "text"))
if mode == "ok":
    persist()
hook("ending", dict(payload, hook_event_name="SessionEnd", reason="other"), "text")
with open(RECORD, "a") as out:
    out.write(json.dumps(record) + "\n")

if mode == "garbage":
    print("Welcome! Here is some text that is no format at all.")
    sys.exit(0)
secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
if NAME == "claude":
    if mode == "signed_out":
        print(json.dumps({{"type": "result", "subtype": "success", "is_error": True, "duration_ms": 20,
                          "num_turns": 1, "result": "Invalid API key · Please run /login " + secret,
                          "session_id": session_id, "total_cost_usd": 0}}))
        sys.exit(1)
    print(json.dumps({{"type": "result", "subtype": "success", "is_error": False, "duration_ms": 1500,
                      "duration_api_ms": 1400, "num_turns": 1, "result": text, "session_id": session_id,
                      "total_cost_usd": 0.0123,
                      "usage": {{"input_tokens": 120, "cache_creation_input_tokens": 30,
                                "cache_read_input_tokens": 1000, "output_tokens": 45}}}}))
elif NAME == "codex":
    thread = str(uuid.uuid4())
    print(json.dumps({{"type": "thread.started", "thread_id": thread}}))
    print(json.dumps({{"type": "turn.started"}}))
    if mode == "signed_out":
        message = "unexpected status 401 Unauthorized: token " + secret
        print(json.dumps({{"type": "error", "message": message}}))
        print(json.dumps({{"type": "turn.failed", "error": {{"message": message}}}}))
        sys.exit(1)
    print(json.dumps({{"type": "item.completed", "item": {{"id": "item_0", "type": "reasoning",
                                                         "text": "Reading the conversation."}}}}))
    print(json.dumps({{"type": "item.completed", "item": {{"id": "item_1", "type": "agent_message",
                                                         "text": text}}}}))
    print(json.dumps({{"type": "turn.completed", "usage": {{"input_tokens": 2000, "cached_input_tokens": 1500,
                                                          "output_tokens": 60}}}}))
elif NAME == "copilot":
    if mode == "signed_out":
        print("Error: No authentication information found. " + secret, file=sys.stderr)
        sys.exit(1)
    print(text)
elif NAME == "opencode":
    part = {{"id": "prt_1", "sessionID": "ses_1", "messageID": "msg_1"}}
    if mode == "signed_out":
        print(json.dumps({{"type": "error", "timestamp": 1, "sessionID": "ses_1",
                          "error": {{"name": "ProviderAuthError",
                                    "data": {{"providerID": "anthropic", "message": "no key " + secret}}}}}}))
        sys.exit(1)
    print(json.dumps({{"type": "step_start", "timestamp": 1, "sessionID": "ses_1",
                      "part": dict(part, type="step-start")}}))
    print(json.dumps({{"type": "text", "timestamp": 2, "sessionID": "ses_1",
                      "part": dict(part, type="text", text=text, time={{"start": 1, "end": 2}})}}))
    print(json.dumps({{"type": "step_finish", "timestamp": 3, "sessionID": "ses_1",
                      "part": dict(part, type="step-finish", reason="stop", cost=0,
                                   tokens={{"input": 800, "output": 50, "reasoning": 5,
                                           "cache": {{"read": 200, "write": 0}}}})}}))
'''


class FakeAgent:
    """One stand-in CLI in `bin_dir`: what it answers, and what each call of it saw."""

    def __init__(self, bin_dir: Path, name: str):
        self.name = name
        self.path = bin_dir / name
        self.record = bin_dir / f"{name}.calls.jsonl"
        self.behaviour = bin_dir / f"{name}.behaviour.json"
        self.answer()
        self.path.write_text(SCRIPT.format(python=sys.executable, tests=str(TESTS), name=name,
                                           record=str(self.record), behaviour=str(self.behaviour)))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    def answer(self, *replies: str, mode: str = "ok") -> FakeAgent:
        self.behaviour.write_text(json.dumps({"replies": list(replies), "mode": mode}))
        return self

    @property
    def calls(self) -> list[dict]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]


def install_fake_agents(bin_dir: Path, monkeypatch, *names: str) -> dict[str, FakeAgent]:
    """The named stand-ins (default: all four) first on PATH, and nothing else of the agents'."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    agents = {name: FakeAgent(bin_dir, name) for name in (names or AGENT_NAMES)}
    # Only the fake bin folder and the interpreter's: a real `claude` on this machine stays out.
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    return agents
