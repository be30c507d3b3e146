"""Claude Code: one transcript per session, `projects/<encoded-cwd>/<id>.jsonl` under its
config folder ($CLAUDE_CONFIG_DIR), followed by byte offset; `sessions/` lists the live
processes. UUID ids; hooks in settings.json answering SessionStart with
`hookSpecificOutput.additionalContext`, at most 9,500 characters of it (Claude Code cuts a
longer one to a file reference the model never reads)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from llmem.adapters.agent import UUID, Agent, JsonlWatch, WatchFolder, session_start_reply

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

    def hook_reply(self, kind: str, context: str | None) -> dict | None:
        return session_start_reply(kind, context)

    # ---- `claude -p` as the chat model ---------------------------------------------------

    call_rank = 0  # reads its prompt on stdin and can be told to keep no transcript
    sign_in_hint = "is Claude Code signed in? run `claude` once and /login (or set ANTHROPIC_API_KEY)"

    def call_invocation(self, executable, system, prompt, model):
        from llmem.adapters.agent_call import Invocation

        # -p: print mode; --output-format json: one result object with `result` and `usage`;
        # --no-session-persistence: no transcript under ~/.claude/projects; --tools "": no
        # tools; --strict-mcp-config without --mcp-config: no MCP servers (llmem's included);
        # --system-prompt replaces Claude Code's own long one, which would be billed per call.
        argv = [executable, "-p", "--output-format", "json", "--no-session-persistence",
                "--tools", "", "--strict-mcp-config", "--system-prompt", system]
        if model:
            argv += ["--model", model]
        return Invocation(argv, stdin=prompt)

    def read_call_output(self, stdout):
        from llmem.adapters.agent_call import (
            AgentReply,
            CliSaid,
            last_json_object,
            text_or_none,
            token_sum,
        )

        result = last_json_object(stdout)
        if result is None or result.get("type") != "result":
            return AgentReply(None)
        if result.get("is_error") or result.get("subtype") not in (None, "success"):
            raise CliSaid(str(result.get("result") or result.get("subtype") or "an error"))
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
        prompt = token_sum(usage, "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        return AgentReply(text_or_none(result.get("result")), prompt, token_sum(usage, "output_tokens"))

    # ---- CLAUDE.md, rules and the auto-memory folder -------------------------------------

    keeps_native_files = True

    def native_home(self, config) -> Path:
        return self.config_home(config)

    def native_project_paths(self, folder, home, refused):
        from llmem.adapters.detect import CLAUDE_PROJECTS_DIR
        from llmem.adapters.native import files_under

        memory = home / CLAUDE_PROJECTS_DIR / encode_claude_project(str(folder)) / "memory"
        return [folder / "CLAUDE.md", folder / ".claude" / "CLAUDE.md", folder / "CLAUDE.local.md",
                *files_under(folder / ".claude" / "rules", "**/*.md"), *files_under(memory, "*.md")]

    def native_user_paths(self, home, refused):
        from llmem.adapters.native import files_under

        return [home / "CLAUDE.md", *files_under(home / "rules", "**/*.md")]


def encode_claude_project(cwd: str) -> str:
    """Claude Code's folder name for a project: every character outside
    [A-Za-z0-9] becomes '-'; a name past 200 characters is cut and given a hash of the path."""
    name = re.sub(r"[^A-Za-z0-9]", "-", cwd)
    if len(name) <= 200:
        return name
    data = cwd.encode("utf-16-be")  # Java's String.hashCode runs over UTF-16 code units
    value = 0
    for i in range(0, len(data), 2):
        value = (value * 31 + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    value = abs(value - (1 << 32) if value >= 1 << 31 else value)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        value, rest = divmod(value, 36)
        text = digits[rest] + text
        if not value:
            break
    return f"{name[:200]}-{text}"


AGENT = Claude()
