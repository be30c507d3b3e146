"""Codex CLI: one rollout per thread, `sessions/YYYY/MM/DD/rollout-*-<id>.jsonl` under its
home ($CODEX_HOME), followed by byte offset. Thread ids are UUID v7 (v4 in older releases);
hooks in hooks.json (and `notify`) answering SessionStart like Claude Code's, at most 9,000
characters."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from llmem.adapters.agent import UUID, Agent, JsonlWatch


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


AGENT = Codex()
