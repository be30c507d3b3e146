"""OpenCode: sessions in its SQLite store (`opencode*.db` in its data folder), ids `ses_…`,
answered through the plugin llmem writes (text format)."""

from __future__ import annotations

import re
from pathlib import Path

from llmem.adapters.agent import Agent, AgentWatch, WatchFolder


class OpenCodeWatch(AgentWatch):
    """A write to an `opencode*.db` (or its -wal) is looked at as the sessions changed since
    the last look at that database (`ChangedSessions`); a known session is looked at alone."""

    DB = "db:"
    SESSION = "session:"

    def __init__(self, agent, config, context):
        super().__init__(agent, config, context)
        self.folder = agent.store_dir(config)
        self.changes: dict[Path, object] = {}  # db path → ChangedSessions
        self._reader = None

    def folders(self) -> list[WatchFolder]:
        return [WatchFolder(self.folder, recursive=False)]

    def key_for(self, path: Path) -> str | None:
        name = path.name
        if path.parent == self.folder and name.startswith("opencode") and name.endswith((".db", ".db-wal")):
            return self.DB + str(self.folder / name.removesuffix("-wal"))
        return None

    def session_key(self, session_id: str) -> str:
        return self.SESSION + session_id

    def scan(self, folder: Path, now: float, announce: bool) -> None:
        for db in sorted(folder.glob("opencode*.db")):
            self.context.safely(str(db), self.look, self.DB + str(db), now)

    def look(self, key: str, now: float) -> None:
        if key.startswith(self.SESSION):
            self._evaluate(key.removeprefix(self.SESSION), now)
            return
        db_path = Path(key.removeprefix(self.DB))
        if not db_path.exists():
            return
        changes = self.changes.get(db_path)
        if changes is None:
            from llmem.adapters.opencode import ChangedSessions

            # Sessions quiet for longer than the inactivity timeout have ended already
            # (unless the watcher was down then): reading every old transcript costs time.
            changes = ChangedSessions(db_path, int(self.context.horizon(now) * 1000))
            self.changes[db_path] = changes  # kept even if this read fails: one connection per DB
        for session_id in changes.poll():
            self._evaluate(session_id, now)

    def _evaluate(self, session_id: str, now: float) -> None:
        from llmem.adapters.base import SessionNotFound
        from llmem.adapters.lifecycle import opencode_lifecycle

        if self._reader is None:
            self._reader = self.agent.reader(self.config)
        try:
            transcript = self._reader.read_transcript(session_id)
        except SessionNotFound:
            transcript = None
        if transcript is not None and transcript.is_subagent:
            return  # a task tool's child session: its result reaches the parent's transcript
        if transcript is not None and transcript.directory:
            self.context.note_directory(self.agent.name, session_id, transcript.directory)
        lifecycle = opencode_lifecycle(
            transcript, int(now * 1000),
            seen_compaction_id=self.context.seen_compaction_id(self.agent.name, session_id),
            idle_debounce_ms=self.context.idle_debounce_ms, inactivity_ms=self.context.inactivity_ms)
        self.context.apply(self.agent.name, session_id, lifecycle, now)

    def close(self) -> None:
        for changes in self.changes.values():
            changes.close()
        self.changes.clear()


class OpenCode(Agent):
    name = "opencode"
    label = "OpenCode"
    install_help = (
        "Write the OpenCode plugin (session.opencode.plugins_dir) and register `llmem mcp` in "
        "OpenCode's opencode.json(c) (session.opencode.config_dir).")
    folder_name = "data folder"
    config_key = "session.opencode.data_dir"
    own_ids = re.compile(r"ses_[0-9A-Za-z]+")
    hook_format = "text"  # the plugin reads the block from stdout

    def store_dir(self, config) -> Path:
        return config.session.opencode.data_dir  # config: session.opencode.data_dir

    def present_in(self, store_dir: Path) -> bool:
        from llmem.adapters.detect import has_opencode_data

        return has_opencode_data(store_dir)

    def reader_at(self, store_dir: Path, config=None):
        from llmem.adapters.opencode import OpenCodeAdapter

        return OpenCodeAdapter(store_dir)

    def watch(self, config, context) -> OpenCodeWatch:
        return OpenCodeWatch(self, config, context)

    # ---- `opencode run` as the chat model ------------------------------------------------

    call_rank = 3  # takes its prompt as an argument, and keeps every session
    sign_in_hint = "does OpenCode have a provider? run `opencode auth login`"

    def call_invocation(self, executable, system, prompt, model):
        from llmem.adapters.agent_call import Invocation, inline_config_without_tools, joined

        # run: non-interactive; --format json: JSONL events (text parts, step tokens); the
        # message is the last argument. OpenCode has no flag for tools: the inline config
        # (merged after every file) switches them all off.
        argv = [executable, "run", "--format", "json"]
        if model:
            argv += ["--model", model]
        argv.append(joined(system, prompt))
        return Invocation(argv, env={"OPENCODE_CONFIG_CONTENT": inline_config_without_tools("OPENCODE_CONFIG_CONTENT")},
                          prompt_index=len(argv) - 1)

    def read_call_output(self, stdout):
        from llmem.adapters.agent_call import AgentReply, CliSaid, json_lines, token_sum

        texts: list[str] = []
        prompt, completion = None, None
        for event in json_lines(stdout):
            kind = event.get("type")
            part = event.get("part") if isinstance(event.get("part"), dict) else {}
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "step_finish" and isinstance(part.get("tokens"), dict):
                tokens = part["tokens"]
                cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
                prompt = (prompt or 0) + (token_sum(tokens, "input") or 0) + (token_sum(cache, "read", "write") or 0)
                completion = (completion or 0) + (token_sum(tokens, "output", "reasoning") or 0)
            elif kind == "error":
                error = event.get("error") if isinstance(event.get("error"), dict) else {}
                data = error.get("data") if isinstance(error.get("data"), dict) else {}
                raise CliSaid(str(data.get("message") or error.get("message") or error.get("name") or "an error"))
        return AgentReply("".join(texts) or None, prompt, completion)

    # ---- AGENTS.md and the files opencode.json names -------------------------------------

    keeps_native_files = True

    def native_home(self, config) -> Path:
        return config.session.opencode.config_dir  # config: session.opencode.config_dir

    def native_project_paths(self, folder, home, refused):
        return [folder / "AGENTS.md", *opencode_instructions(folder, refused)]

    def native_user_paths(self, home, refused):
        return [home / "AGENTS.md", *opencode_instructions(home, refused)]


def opencode_instructions(config_dir: Path, refused: list) -> list[Path]:
    """The local files an opencode.json(c) lists under `instructions` (globs allowed; URLs skipped).

    Only files inside `config_dir` (the project, or OpenCode's own config folder) are read: a
    cloned repository's opencode.json naming `~/.aws/credentials`, `../outside/x` or `/abs/*`
    would otherwise have llmem store those files as memories. Each such entry is added to
    `refused` instead (an entry whose glob matches a file outside, or a symlink pointing
    out, as well)."""
    import json5

    from llmem.adapters.native import RefusedPath, inside

    out = []
    for name in ("opencode.json", "opencode.jsonc"):
        path = config_dir / name
        try:
            data = json5.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        entries = data.get("instructions") if isinstance(data, dict) else None
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, str) or "://" in entry:
                continue
            expanded = Path(entry).expanduser()
            if expanded.is_absolute() or ".." in expanded.parts:
                refused.append(RefusedPath(entry, path, config_dir))
                continue
            base = config_dir / expanded
            matches = sorted(config_dir.glob(str(expanded))) if any(ch in entry for ch in "*?[") else [base]
            kept = [match for match in matches if inside(match, config_dir)]
            if len(kept) < len(matches):
                refused.append(RefusedPath(entry, path, config_dir))
            out.extend(kept)
    return out


AGENT = OpenCode()
