"""Claude Code: one transcript per session, `projects/<encoded-cwd>/<id>.jsonl` under its
config folder ($CLAUDE_CONFIG_DIR), followed by byte offset; `sessions/` lists the live
processes. UUID ids; hooks in settings.json answering SessionStart with
`hookSpecificOutput.additionalContext`, at most 9,500 characters of it (Claude Code cuts a
longer one to a file reference the model never reads)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from llmem.adapters.agent import UUID, Agent, JsonlWatch, WatchFolder

REGISTRY_KEY = "registry:"


class ClaudeWatch(JsonlWatch):
    """Transcripts followed by ClaudeTail; a file added or removed in the process registry
    (a Claude Code process started or exited) is a reason to look again at the sessions last
    seen held by a running process, since one may have just ended."""

    recursive = True  # a subagent's transcript sits two levels down, and is no session

    def __init__(self, agent, config, context):
        super().__init__(agent, config, context)
        home = agent.config_home(config)
        self.registry = home / "sessions"
        self.live: set[str] = set()  # sessions last seen held by a running process
        self._reader = None

    def sessions_folder(self) -> Path:
        return self.agent.store_dir(self.config)

    def folders(self) -> list[WatchFolder]:
        return [*super().folders(), WatchFolder(self.registry, recursive=False, scan=False)]

    def key_for(self, path: Path) -> str | None:
        if path.parent == self.registry:
            return REGISTRY_KEY if path.name.endswith(".json") else None
        return super().key_for(path)

    def session_of(self, path: Path) -> str | None:
        from llmem.adapters.detect import claude_session_id

        return claude_session_id(path, self.folder)

    def session_files(self, folder: Path) -> Iterable[Path]:
        return sorted(folder.glob("*/*.jsonl"))

    def claude(self):
        if self._reader is None:
            self._reader = self.agent.reader(self.config)
        return self._reader

    def find_file(self, session_id: str) -> Path | None:
        return self.claude().transcript_path(session_id)

    def gone(self, session_id: str) -> None:
        super().gone(session_id)  # removed by Claude Code's clean-up sweep
        self.live.discard(session_id)

    def follow(self, path: Path):
        from llmem.adapters.claude import ClaudeTail

        return ClaudeTail(path)

    def look(self, key: str, now: float) -> None:
        if key == REGISTRY_KEY:
            for session_id in sorted(self.live):
                self.context.safely(session_id, self.look, session_id, now)
            return
        super().look(key, now)

    def lifecycle(self, session_id: str, follower, now: float):
        from llmem.adapters.lifecycle import claude_lifecycle

        lines = follower.read()
        alive = self.claude().process_alive(session_id)
        if alive:
            self.live.add(session_id)
        else:
            self.live.discard(session_id)
        return claude_lifecycle(
            lines.line_objects, int(now * 1000), process_alive=alive, mtime_ms=lines.mtime_ms,
            seen_compaction_id=self.context.seen_compaction_id(self.agent.name, session_id),
            idle_debounce_ms=self.context.idle_debounce_ms, inactivity_ms=self.context.inactivity_ms)


class Claude(Agent):
    name = "claude"
    label = "Claude Code"
    install_help = (
        "Add llmem's hooks to Claude Code's settings.json and register `llmem mcp` in "
        "~/.claude.json (session.claude.config_dir, $CLAUDE_CONFIG_DIR).")
    folder_name = "config folder"
    config_key = "session.claude.config_dir"
    shared_ids = UUID
    hook_format = "claude"
    # Claude Code spills injected context above 10,000 characters into a file the model only
    # sees a preview of: the block stays under this.
    context_cap = 9500
    folder_variables = ("CLAUDE_CONFIG_DIR",)

    # SessionStart answers with the context block; the others queue their work and return.
    hook_events = {"SessionStart": ("created", 30), "PreCompact": ("compacting", 15),
                   "Stop": ("idle", 15), "SessionEnd": ("ending", 15)}

    def config_home(self, config) -> Path:
        """$CLAUDE_CONFIG_DIR when set (Claude Code itself obeys it), else session.claude.config_dir."""
        from llmem.adapters.detect import claude_config_dir

        return claude_config_dir(config.session.claude.config_dir)  # config: session.claude.config_dir

    def store_dir(self, config) -> Path:
        from llmem.adapters.detect import CLAUDE_PROJECTS_DIR

        return self.config_home(config) / CLAUDE_PROJECTS_DIR

    def reader_at(self, store_dir: Path, config=None):
        from llmem.adapters.claude import ClaudeAdapter

        return ClaudeAdapter(store_dir.parent)

    def watch(self, config, context) -> ClaudeWatch:
        return ClaudeWatch(self, config, context)


AGENT = Claude()
