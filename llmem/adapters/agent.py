"""What an agent is to llmem: the unit each `adapters/agents/<name>.py` defines, and the
watch of one agent's folders that the watcher drives (pipeline/watcher.py).

An `Agent` holds what makes it that agent: its name and label, the shape of its session
ids, its folder (from config), how to tell it is installed, its reader, its lifecycle
rules and how its folders are watched (`AgentWatch`), the format its hooks answer in and
the context cap that format imposes. `registry.py` lists them; the watcher, resolve,
detect, install, doctor, the CLI's choices and the viewer iterate that list and ask the
unit, so adding an agent is one module and one line in the registry.

Units load no reader at import (a hook pays only for the agent it reads); the heavy
readers (`adapters/<name>.py`) are imported inside the methods that need them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llmem.adapters.agent_call import AgentReply, Invocation
    from llmem.adapters.base import SessionAdapter
    from llmem.adapters.lifecycle import Lifecycle

# A UUID in any version: Copilot's and Claude Code's session ids, older Codex thread ids.
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


@dataclass(frozen=True)
class WatchFolder:
    """One folder an agent's watch needs observed."""

    path: Path
    recursive: bool
    # Look at the sessions already in it when it is attached (not for a folder of process
    # markers such as Claude Code's `sessions/`).
    scan: bool = True


class WatchContext(Protocol):
    """What the watcher offers an agent's watch (pipeline/watcher.py SessionWatcher)."""

    idle_debounce_ms: int
    inactivity_ms: int
    # Activity of an unknown session before this (epoch s) predates the watch: not announced.
    catch_up_from: float

    def horizon(self, now: float) -> float:
        """Sessions written before this (epoch s) are not looked at by a folder scan."""
        ...

    def known(self, agent: str, session_id: str) -> bool:
        """Whether the watcher holds a state for the session."""
        ...

    def seen_compaction_id(self, agent: str, session_id: str) -> str | None:
        """The last compaction the watcher saw of the session (Lifecycle.compaction_id)."""
        ...

    def apply(self, agent: str, session_id: str, lifecycle: Lifecycle, now: float) -> None:
        """Emit what is new in `lifecycle` for the session."""
        ...

    def created(self, agent: str, session_id: str, now: float) -> None:
        """Announce a session that has no transcript yet (once)."""
        ...

    def own_call(self, agent: str, session_id: str) -> bool:
        """Whether llmem's own agent call ran the session (it gets no events)."""
        ...

    def note_directory(self, agent: str, session_id: str, directory: str) -> None:
        """The folder a session ran in, when the watch read it anyway."""
        ...

    def safely(self, what: str, step, *args) -> None:
        """Run one read; a failure is logged and the watcher goes on."""
        ...


class AgentWatch:
    """One agent's folders under watch, for one watcher: which paths belong to which session
    (`key_for`), what to look at when a folder is attached (`scan`) and how to read a
    session and say its moments (`look`, which hands a Lifecycle to `context.apply`).
    Keys are the watch's own strings; `session_key` names the key of a known session."""

    def __init__(self, agent: Agent, config, context: WatchContext):
        self.agent = agent
        self.config = config
        self.context = context

    def folders(self) -> list[WatchFolder]:
        raise NotImplementedError

    @property
    def primary(self) -> Path:
        """The folder that holds the sessions (what `describe` shows)."""
        return self.folders()[0].path

    def key_for(self, path: Path) -> str | None:
        raise NotImplementedError

    def scan(self, folder: Path, now: float, announce: bool) -> None:
        raise NotImplementedError

    def look(self, key: str, now: float) -> None:
        raise NotImplementedError

    def session_key(self, session_id: str) -> str:
        return session_id

    def close(self) -> None:
        """Release what the watch holds open."""


class JsonlWatch(AgentWatch):
    """The watch of an agent that writes one append-only JSONL file per session: each
    session is followed by a tail (base.JsonlTail, through the agent's `follow`), so each
    look parses only the lines written since the last one."""

    recursive = False

    def __init__(self, agent: Agent, config, context: WatchContext):
        super().__init__(agent, config, context)
        self.folder = self.sessions_folder()
        self.tails: dict[str, Any] = {}  # session id → the agent's follower of its file
        self.paths: dict[str, Path] = {}  # session id → its file, from the events that named it

    # ---- what a JSONL agent says ---------------------------------------------------------

    def sessions_folder(self) -> Path:
        raise NotImplementedError

    def session_of(self, path: Path) -> str | None:
        """The session a file under the folder is the transcript of, else None."""
        raise NotImplementedError

    def session_files(self, folder: Path) -> Iterable[Path]:
        """The transcripts in the folder, in a stable order."""
        raise NotImplementedError

    def find_file(self, session_id: str) -> Path | None:
        """The session's transcript when no event named it (None: it is gone)."""
        raise NotImplementedError

    def follow(self, path: Path):
        """A follower of one transcript (a tail over base.JsonlTail)."""
        raise NotImplementedError

    def lifecycle(self, session_id: str, follower, now: float) -> Lifecycle | None:
        """The session's moments from what its follower read; None: it gets no events."""
        raise NotImplementedError

    # ---- the watch -----------------------------------------------------------------------

    def folders(self) -> list[WatchFolder]:
        return [WatchFolder(self.folder, self.recursive)]

    def key_for(self, path: Path) -> str | None:
        session_id = self.session_of(path)
        if session_id is not None:
            self.paths[session_id] = path
        return session_id

    def scan(self, folder: Path, now: float, announce: bool) -> None:
        horizon = self.context.horizon(now)
        for path in self.session_files(folder):
            session_id = self.session_of(path)
            if session_id and (announce or modified_after(path, horizon)):
                self.paths[session_id] = path
                self.context.safely(session_id, self.look, session_id, now)

    def look(self, key: str, now: float) -> None:
        follower = self.tails.get(key)
        if follower is None or not follower.path.is_file():
            path = self.paths.get(key)
            if path is None or not path.is_file():
                path = self.find_file(key)
            if path is None:
                self.gone(key)
                return
            follower = self.tails[key] = self.follow(path)
        lifecycle = self.lifecycle(key, follower, now)
        if lifecycle is not None:
            self.context.apply(self.agent.name, key, lifecycle, now)

    def gone(self, session_id: str) -> None:
        """The session's file was removed (an agent's clean-up): nothing to undo."""
        self.tails.pop(session_id, None)


def modified_after(path: Path, horizon: float) -> bool:
    """Was the file (or folder) written after `horizon` (epoch s)?"""
    try:
        return path.stat().st_mtime > horizon
    except OSError:
        return False


class Agent:
    """One agent llmem reads and installs into. Subclasses set the class attributes and
    implement `store_dir`, `reader` and `watch`."""

    name: str = ""
    label: str = ""  # how the user knows it: "Claude Code"
    # What its folder is to the user, and the config key that places it.
    folder_name: str = "folder"
    config_key: str = ""
    # Session ids only this agent makes (rank 2 in `id_rank`), and ids its own are among
    # though others make them too (rank 1): a UUID is Copilot's, Claude Code's or Codex's.
    own_ids: re.Pattern | None = None
    shared_ids: re.Pattern | None = None
    # The `--format` its hooks answer in (cli/session.py `llmem hook`), and the most
    # characters of context that answer may carry (None: no cap of its own).
    hook_format: str | None = None
    context_cap: int | None = None
    # The folder variables the agent itself obeys (setup/environment.py hands them on).
    folder_variables: tuple[str, ...] = ()
    # Its hook events (Claude Code's schema, which Codex shares) → (llmem moment, timeout s):
    # what `llmem install` writes (setup/agents.py, each agent's recipe).
    hook_events: dict[str, tuple[str, int]] = {}
    # It starts an MCP server without passing its environment through: the entry llmem
    # writes carries the folder variables in `env`.
    mcp_env_filtered: bool = False
    # What `llmem install <name>` does, for its --help; empty: llmem does not install into
    # it (no recipe in setup/agents.py), and it has no install command.
    install_help: str = ""
    # Its non-interactive mode as the chat model of llm.provider: agent (providers/agent_cli.py
    # runs it): llm.agent: auto tries the agents by this rank, lowest first; None: it has none.
    call_rank: int | None = None
    # What to check when a call says it failed.
    sign_in_hint: str = ""
    # It keeps instruction or memory files of its own (`llmem import-native`, adapters/native.py).
    keeps_native_files: bool = False

    def id_rank(self, session_id: str) -> int:
        """How surely a session id is this agent's: 2 only ours, 1 could be, 0 not."""
        if self.own_ids is not None and self.own_ids.fullmatch(session_id):
            return 2
        if self.shared_ids is not None and self.shared_ids.fullmatch(session_id):
            return 1
        return 0

    def store_dir(self, config) -> Path:
        """The folder of the agent's sessions (its store), from config and its variables."""
        raise NotImplementedError

    def present_in(self, store_dir: Path) -> bool:
        """The store exists (what `session.adapter: auto` reads)."""
        return store_dir.is_dir()

    def holds_sessions(self, store_dir: Path) -> bool:
        """The store holds something to read (auto's pick of a single reader)."""
        return self.present_in(store_dir)

    def present(self, config) -> bool:
        return self.present_in(self.store_dir(config))

    def reader(self, config) -> SessionAdapter:
        """The agent's session reader over its store."""
        return self.reader_at(self.store_dir(config), config)

    def reader_at(self, store_dir: Path, config=None) -> SessionAdapter:
        """The reader over a store folder given as it is."""
        raise NotImplementedError

    def watch(self, config, context: WatchContext) -> AgentWatch | None:
        """The watch of the agent's folders (None: its sessions are not watched)."""
        return None

    # ---- its hooks' answers ----------------------------------------------------------------

    def hook_reply(self, kind: str, context: str | None) -> dict | None:
        """The JSON its hook of moment `kind` answers with, given the context block (already
        cut to `context_cap`); None: print nothing. Only for an agent whose `hook_format` is its
        own name (the others answer in `text`)."""
        return None

    # ---- what its hooks send ---------------------------------------------------------------

    def hook_turn_began(self, payload: dict) -> float | None:
        """Just after the turn its hook fires for began (epoch s), when the hook's JSON says;
        None: it does not say (the hook's own arrival stands for it)."""
        return None

    def hook_without_transcript(self, payload: dict, session_id: str, config) -> bool:
        """The hook fires for a session the agent keeps no transcript of: nothing to do."""
        return False

    # ---- its non-interactive mode (call_rank set) ------------------------------------------

    def call_invocation(self, executable: str, system: str, prompt: str, model: str | None) -> Invocation:
        """The non-interactive call answering `prompt` under `system` instructions."""
        raise NotImplementedError

    def read_call_output(self, stdout: str) -> AgentReply:
        """The model's text and usage in the call's output; agent_call.CliSaid when the CLI
        says it failed; AgentReply(None) for output that is not its format at all."""
        raise NotImplementedError

    # ---- its own instruction files (keeps_native_files set) --------------------------------

    def native_home(self, config) -> Path:
        """The folder of the user's own instruction files (for every project)."""
        raise NotImplementedError

    def native_project_paths(self, folder: Path, home: Path, refused: list) -> list[Path]:
        """The project's instruction files the agent would read in `folder` (existing or not);
        entries of a config naming files outside their folder go to `refused`."""
        return []

    def native_user_paths(self, home: Path, refused: list) -> list[Path]:
        """The user's own instruction files under `home` (existing or not)."""
        return []


def session_start_reply(kind: str, context: str | None) -> dict | None:
    """Claude Code's SessionStart answer (Codex reads the same schema): the block as
    `hookSpecificOutput.additionalContext`. Only SessionStart answers: context printed for Stop
    would keep a Claude Code turn going, and Codex rejects JSON its other events' schemas do
    not expect."""
    if kind != "created" or not context:
        return None
    return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": context}}
