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


AGENT = OpenCode()
