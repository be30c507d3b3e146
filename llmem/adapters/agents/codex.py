"""Codex CLI: one rollout per thread, `sessions/YYYY/MM/DD/rollout-*-<id>.jsonl` under its
home ($CODEX_HOME), followed by byte offset. Thread ids are UUID v7 (v4 in older releases);
hooks in hooks.json (and `notify`) answering SessionStart like Claude Code's, at most 9,000
characters."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from llmem.adapters.agent import UUID, Agent, JsonlWatch, session_start_reply


class CodexWatch(JsonlWatch):
    """Rollouts followed by CodexTail; a thread Codex spawned for itself gets no events."""

    recursive = True  # rollouts sit in dated folders (YYYY/MM/DD) made as days go by

    def sessions_folder(self) -> Path:
        return self.agent.store_dir(self.config)

    def session_of(self, path: Path) -> str | None:
        from llmem.adapters.codex import rollout_thread_id

        thread_id = rollout_thread_id(path.name)
        try:
            depth = len(path.relative_to(self.folder).parts)
        except ValueError:
            return None
        return thread_id if thread_id is not None and depth == 4 else None

    def session_files(self, folder: Path) -> Iterable[Path]:
        return sorted(folder.glob("*/*/*/rollout-*.jsonl"))

    def find_file(self, session_id: str) -> Path | None:
        # Deleted: None (an archived one is still found, and read where it is now).
        return self.agent.reader(self.config).rollout_path(session_id)

    def follow(self, path: Path):
        from llmem.adapters.codex import CodexTail

        return CodexTail(path)

    def lifecycle(self, session_id: str, follower, now: float):
        from llmem.adapters.lifecycle import codex_lifecycle

        marks = follower.read()
        if follower.subagent:
            return None  # a thread Codex spawned: its result reaches the parent's rollout
        return codex_lifecycle(
            marks, int(now * 1000), mtime_ms=follower.mtime_ms,
            seen_compaction_id=self.context.seen_compaction_id(self.agent.name, session_id),
            idle_debounce_ms=self.context.idle_debounce_ms, inactivity_ms=self.context.inactivity_ms)


class Codex(Agent):
    name = "codex"
    label = "Codex CLI"
    install_help = (
        "Set Codex's notify program and register `llmem mcp` in its config.toml, and add llmem's "
        "hooks to its hooks.json (session.codex.home, $CODEX_HOME).")
    folder_name = "home folder"
    config_key = "session.codex.home"
    own_ids = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
    shared_ids = UUID
    hook_format = "codex"
    # Codex spills a hook's context above ~2,500 tokens into a file the model only sees a
    # preview of: the block stays under this.
    context_cap = 9000
    folder_variables = ("CODEX_HOME",)

    # As Claude Code's; Codex clamps SessionEnd hooks to 3 s, with a warning for a longer timeout.
    hook_events = {"SessionStart": ("created", 30), "PreCompact": ("compacting", 15),
                   "Stop": ("idle", 15), "SessionEnd": ("ending", 3)}
    mcp_env_filtered = True  # Codex passes an allow-list of variables

    def home(self, config) -> Path:
        """$CODEX_HOME when set (Codex itself obeys it), else session.codex.home."""
        from llmem.adapters.detect import codex_home_dir

        return codex_home_dir(config.session.codex.home)  # config: session.codex.home

    def store_dir(self, config) -> Path:
        from llmem.adapters.detect import CODEX_SESSIONS_DIR

        return self.home(config) / CODEX_SESSIONS_DIR

    def reader_at(self, store_dir: Path, config=None):
        from llmem.adapters.codex import CodexAdapter

        return CodexAdapter(store_dir.parent)

    def watch(self, config, context) -> CodexWatch:
        return CodexWatch(self, config, context)

    def hook_reply(self, kind: str, context: str | None) -> dict | None:
        return session_start_reply(kind, context)  # Codex reads Claude Code's schema

    def hook_turn_began(self, payload: dict) -> float | None:
        # The turn id its Stop hook (`turn_id`) and notify (`turn-id`) carry is a UUID v7,
        # whose first 48 bits are its epoch ms.
        import uuid

        turn_id = payload.get("turn_id") or payload.get("turn-id")
        try:
            turn = uuid.UUID(turn_id) if isinstance(turn_id, str) else None
        except ValueError:
            return None
        # After the millisecond it names: an event of that same millisecond may be the turn before's.
        return ((turn.int >> 80) + 1) / 1000 if turn is not None and turn.version == 7 else None

    def hook_without_transcript(self, payload: dict, session_id: str, config) -> bool:
        # A notify of a thread with no rollout: the TUI's title-generation thread.
        return payload.get("type") == "agent-turn-complete" and not self.reader(config).has_session(session_id)

    # ---- `codex exec` as the chat model --------------------------------------------------

    call_rank = 1  # reads its prompt on stdin; --ephemeral keeps no rollout
    sign_in_hint = "is Codex signed in? run `codex login`"

    def call_invocation(self, executable, system, prompt, model):
        from llmem.adapters.agent_call import Invocation, joined

        # exec: non-interactive; --json: JSONL events with the agent message and turn usage;
        # --ephemeral: no rollout under ~/.codex/sessions; read-only sandbox; llmem's folder
        # is no git repository; `-`: the prompt is read from stdin.
        argv = [executable, "exec", "--json", "--ephemeral", "--skip-git-repo-check",
                "--sandbox", "read-only"]
        if model:
            argv += ["-m", model]
        return Invocation([*argv, "-"], stdin=joined(system, prompt))

    def read_call_output(self, stdout):
        from llmem.adapters.agent_call import (
            AgentReply,
            CliSaid,
            json_lines,
            text_or_none,
            token_sum,
        )

        text, prompt, completion = None, None, None
        for event in json_lines(stdout):
            kind = event.get("type")
            item = event.get("item") if isinstance(event.get("item"), dict) else {}
            if kind == "item.completed" and item.get("type") == "agent_message":
                text = text_or_none(item.get("text"))
            elif kind == "turn.completed" and isinstance(event.get("usage"), dict):
                # cached_input_tokens is a part of input_tokens (OpenAI's usage).
                prompt = (prompt or 0) + (token_sum(event["usage"], "input_tokens") or 0)
                completion = (completion or 0) + (token_sum(event["usage"], "output_tokens") or 0)
            elif kind == "turn.failed":
                error = event.get("error") if isinstance(event.get("error"), dict) else {}
                raise CliSaid(str(error.get("message") or "the turn failed"))
            elif kind == "error":
                raise CliSaid(str(event.get("message") or "an error"))
        return AgentReply(text, prompt, completion)

    # ---- AGENTS.md -----------------------------------------------------------------------

    keeps_native_files = True

    def native_home(self, config) -> Path:
        return self.home(config)

    def native_project_paths(self, folder, home, refused):
        return [folder / "AGENTS.override.md", folder / "AGENTS.md"]

    def native_user_paths(self, home, refused):
        return [home / "AGENTS.override.md", home / "AGENTS.md"]


AGENT = Codex()
