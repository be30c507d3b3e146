"""Copilot CLI: one folder per session under `session-state/` (its `events.jsonl`, followed
by byte offset, and `inuse.<pid>.lock` while a process holds it), UUID ids, hooks answering
sessionStart with `{additionalContext}`."""

from __future__ import annotations

import os
from pathlib import Path

from llmem.adapters.agent import UUID, Agent, AgentWatch, WatchFolder, modified_after


class CopilotWatch(AgentWatch):
    """A session folder's events file followed by a CopilotTail; a new folder without events
    is a new session (Copilot writes none before the first prompt)."""

    def __init__(self, agent, config, context):
        super().__init__(agent, config, context)
        self.folder = agent.store_dir(config)
        self.tails: dict[str, object] = {}  # session id → CopilotTail
        self._reader = None

    def folders(self) -> list[WatchFolder]:
        return [WatchFolder(self.folder, recursive=True)]

    def key_for(self, path: Path) -> str | None:
        try:
            parts = path.relative_to(self.folder).parts
        except ValueError:
            return None
        if len(parts) >= 1 and (len(parts) == 1 or parts[1] in ("events.jsonl", "workspace.yaml")
                                or parts[1].startswith("inuse.")):
            return parts[0]
        return None

    def scan(self, folder: Path, now: float, announce: bool) -> None:
        horizon = self.context.horizon(now)
        for child in sorted(folder.iterdir()):
            if child.is_dir() and (announce or _session_written_after(child, horizon)):
                self.context.safely(child.name, self.look, child.name, now)

    def look(self, session_id: str, now: float) -> None:
        from llmem.adapters.base import is_valid_session_id
        from llmem.adapters.copilot import CopilotTail
        from llmem.adapters.lifecycle import copilot_lifecycle

        if not is_valid_session_id(session_id):
            return
        if self._reader is None:
            self._reader = self.agent.reader(self.config)
        name = self.agent.name
        path = self._reader.events_path(session_id)
        if path is None:
            # Copilot writes no events before the first prompt: a new folder is a new session.
            self.tails.pop(session_id, None)
            if not self.context.known(name, session_id) \
                    and _session_written_after(self.folder / session_id, self.context.catch_up_from) \
                    and not self.context.own_call(name, session_id):
                self.context.created(name, session_id, now)
            return
        tail = self.tails.get(session_id)
        if tail is None or tail.path != path:
            tail = self.tails[session_id] = CopilotTail(path)
        events = tail.read()
        lifecycle = copilot_lifecycle(
            events.event_objects, int(now * 1000), lock_alive=self._reader.lock_alive(session_id),
            seen_compaction_id=self.context.seen_compaction_id(name, session_id),
            idle_debounce_ms=self.context.idle_debounce_ms, inactivity_ms=self.context.inactivity_ms)
        self.context.apply(name, session_id, lifecycle, now)


def _session_written_after(session_dir: Path, horizon: float) -> bool:
    """Was the session's folder or its events file written after `horizon` (epoch s)?"""
    return modified_after(session_dir / "events.jsonl", horizon) or modified_after(session_dir, horizon)


class Copilot(Agent):
    name = "copilot"
    label = "Copilot CLI"
    install_help = (
        "Write the Copilot CLI hooks file (session.copilot.hooks_dir) and register `llmem mcp` in "
        "its mcp-config.json (session.copilot.home).")
    folder_name = "session-state folder"
    config_key = "session.copilot.state_dir"
    shared_ids = UUID
    hook_format = "copilot"
    folder_variables = ("COPILOT_HOME",)

    mcp_env_filtered = True  # Copilot's docs promise only PATH

    def store_dir(self, config) -> Path:
        return config.session.copilot.state_dir  # config: session.copilot.state_dir

    def holds_sessions(self, store_dir: Path) -> bool:
        from llmem.adapters.detect import has_sessions

        return has_sessions(store_dir)

    def reader_at(self, store_dir: Path, config=None):
        from llmem.adapters.copilot import CopilotAdapter

        share_dir = None
        if config is not None:
            share_dir = config.session.copilot.share_dir  # config: session.copilot.share_dir
        return CopilotAdapter(store_dir, share_dir)

    def watch(self, config, context) -> CopilotWatch:
        return CopilotWatch(self, config, context)

    def home(self, config) -> Path:
        """$COPILOT_HOME when set (Copilot itself obeys it), else session.copilot.home."""
        from llmem.paths import expand

        return expand(os.environ.get("COPILOT_HOME") or config.session.copilot.home)  # config: session.copilot.home

    def hook_reply(self, kind: str, context: str | None) -> dict | None:
        # Only sessionStart reads an answer; agentStop would read one as "keep going".
        return {"additionalContext": context} if kind == "created" and context else None

    # ---- `copilot -p` as the chat model --------------------------------------------------

    call_rank = 2  # takes its prompt as an argument, and keeps every session
    sign_in_hint = "is Copilot CLI signed in? run `copilot login`"

    def call_invocation(self, executable, system, prompt, model):
        from llmem.adapters.agent_call import Invocation, joined

        # -p: non-interactive, the prompt as its argument (it reads no stdin then); -s: only
        # the agent's answer on stdout; no questions back, no custom instructions, no
        # built-in MCP servers, and every tool kind denied.
        argv = [executable, "-p", joined(system, prompt), "-s", "--no-ask-user", "--no-custom-instructions",
                "--disable-builtin-mcps", "--deny-tool=shell,write,url,memory"]
        if model:
            argv += ["--model", model]
        return Invocation(argv, prompt_index=2)

    def read_call_output(self, stdout):
        from llmem.adapters.agent_call import AgentReply

        return AgentReply(stdout.strip() or None)

    # ---- copilot-instructions.md and instructions/ ---------------------------------------

    keeps_native_files = True

    def native_home(self, config) -> Path:
        return self.home(config)

    def native_project_paths(self, folder, home, refused):
        from llmem.adapters.native import files_under

        return [folder / ".github" / "copilot-instructions.md",
                *files_under(folder / ".github" / "instructions", "**/*.instructions.md")]

    def native_user_paths(self, home, refused):
        from llmem.adapters.native import files_under

        return [home / "copilot-instructions.md", *files_under(home / "instructions", "**/*.instructions.md")]


AGENT = Copilot()
