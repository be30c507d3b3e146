"""Watch the agents' stores and turn file changes into session lifecycle events.

A watchdog observer (inotify, or polling) marks paths dirty; one loop thread debounces them,
reads the affected sessions read-only, applies the lifecycle rules (adapters/lifecycle.py)
and calls the injected `emit(adapter, session_id, kind)` on each new moment. It knows
nothing of the queue. While nothing changes it sleeps: no polling of the agents' files.

A session's state changes only after `emit` returned (the event row is committed); when it
raises, the state stays and the session is looked at again shortly, so the moment is emitted
then. Given the store, the per-session state is kept there (table watch_session): a restart
announces no known session twice and emits what was written while no watcher ran.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..db.watch_sessions import last_watch_session_update, save_watch_session, watch_session_rows
from ..paths import expand, is_agent_call_dir

log = logging.getLogger(__name__)

QUIET_SECONDS = 0.3  # a burst of writes settles this long before we read
MAX_WAIT_SECONDS = 2.0  # … but a constant stream is still read this often
TICK_SECONDS = 0.25
DIR_CHECK_SECONDS = 5.0  # how often a missing agent folder is looked for again
RETRY_SECONDS = 1.0  # an event or a state that could not be written is tried again after this
ALIVE_SECONDS = 60.0  # how often a running watcher notes in the store that it is alive
# Sessions active this long before the previous watcher was last known alive are caught up
# too: it may have died with their changes still in its debounce.
CATCH_UP_MARGIN_SECONDS = 60.0


@dataclass
class SessionState:
    """What the watcher has emitted for one session, so each moment is emitted once."""

    idle_reply: str | None = None  # the finished reply idle was emitted for (Lifecycle.reply_id)
    compacting: bool = False
    # Ending was emitted and the session has not moved on since: its newest turn is still
    # `ended_turn` (Lifecycle.last_turn_id then). A newer turn makes it live again.
    ended: bool = False
    ended_turn: str | None = None
    seen_compaction_id: str | None = None

    @classmethod
    def seen(cls, lifecycle) -> SessionState:
        """A session met as it is now, with nothing to emit for what it already did."""
        from ..adapters.lifecycle import Moment

        ended = Moment.ENDING in lifecycle
        return cls(idle_reply=lifecycle.reply_id, compacting=Moment.COMPACTING in lifecycle,
                   ended=ended, ended_turn=lifecycle.last_turn_id if ended else None,
                   seen_compaction_id=lifecycle.compaction_id)


class SavedStates:
    """The watcher's per-session state in the store (table watch_session, migration 0009)."""

    ALIVE_KEY = "watcher_alive_at"

    def __init__(self, store):
        self.db = store.db

    def load(self) -> dict[tuple[str, str], SessionState]:
        return {(adapter, session_id): SessionState(idle_reply, bool(compacting), bool(ended),
                                                    ended_turn, seen_compaction_id)
                for adapter, session_id, idle_reply, compacting, ended, ended_turn, seen_compaction_id
                in watch_session_rows(self.db)}

    def save(self, key: tuple[str, str], state: SessionState, at: float) -> None:
        with self.db.atomic():
            save_watch_session(self.db, *key, idle_reply=state.idle_reply, compacting=state.compacting,
                               ended=state.ended, ended_turn=state.ended_turn,
                               seen_compaction_id=state.seen_compaction_id, at=at)

    def last_alive(self) -> float | None:
        """When a watcher was last known to run (None: never, on this store)."""
        from ..db.settings import get_setting

        noted = get_setting(self.db, self.ALIVE_KEY)
        saved = last_watch_session_update(self.db)
        times = [float(noted)] if noted is not None else []
        times += [saved] if saved is not None else []
        return max(times, default=None)

    def mark_alive(self, at: float) -> None:
        from ..db.settings import set_setting

        with self.db.atomic():
            set_setting(self.db, self.ALIVE_KEY, repr(at))

    def close_thread_connection(self) -> None:
        """Close the calling thread's connection (peewee keeps one per thread)."""
        self.db.close()


class SessionWatcher:
    """Observe OpenCode's data folder, Copilot's session-state, Claude Code's projects folder
    and Codex's sessions folder, emit lifecycle events. Subagents' sessions get none
    (ARCHITECTURE.md, "Subagents are not users")."""

    def __init__(self, config, emit: Callable[[str, str, str], None], *, store=None, clock=time.time):
        session = config.values["session"]
        pipeline = config.values["pipeline"]
        self.opencode_dir = expand(session["opencode"]["data_dir"])
        self.copilot_dir = expand(session["copilot"]["state_dir"])
        from ..adapters.detect import (
            CLAUDE_PROJECTS_DIR,
            CLAUDE_SESSIONS_DIR,
            CODEX_SESSIONS_DIR,
            claude_config_dir,
            codex_home_dir,
        )

        claude_dir = claude_config_dir(expand(session["claude"]["config_dir"]))
        self.claude_dir = claude_dir / CLAUDE_PROJECTS_DIR
        # Claude Code's live-process registry: a file removed there is a session that exited.
        self.claude_registry = claude_dir / CLAUDE_SESSIONS_DIR
        self.codex_dir = codex_home_dir(expand(session["codex"]["home"])) / CODEX_SESSIONS_DIR
        self.adapter_setting = session["adapter"]
        self.emit_callback = emit
        self.clock = clock
        self.use_polling = pipeline["use_polling"]
        self.idle_debounce_ms = int(pipeline["idle_debounce_seconds"] * 1000)
        self.inactivity_ms = int(pipeline["ending_inactivity_minutes"] * 60_000)
        self.states: dict[tuple[str, str], SessionState] = {}
        self.saved = SavedStates(store) if store is not None else None
        self._unsaved: set[tuple[str, str]] = set()
        self._recheck_at: dict[tuple[str, str], float] = {}  # idle debounce, inactivity, retries
        self._dirty: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._observer = None
        self._poller = None  # a polling observer for folders inotify could not take
        self._watched: set[Path] = set()
        self._opencode_changes: dict = {}  # db path → ChangedSessions
        self._thread: threading.Thread | None = None
        self._opencode = None
        self._copilot = None
        self._claude = None
        self._claude_live: set[str] = set()  # Claude sessions last seen held by a running process
        self._claude_tails: dict = {}  # session id → ClaudeTail: each look parses only the new lines
        self._codex_tails: dict = {}  # thread id → CodexTail: each look parses only the new lines
        self._codex_paths: dict = {}  # thread id → rollout file, from the events that named it
        # (adapter, session id) → whether llmem's own agent call ran it (llm.provider: agent).
        self._own_calls: dict[tuple[str, str], bool] = {}
        self.errors = 0
        self.started_at = clock()
        # Activity of an unknown session before this moment predates the watch: remembered,
        # not announced (backfill's job). A restarted watcher moves it back to when the last
        # one was alive, so what was written meanwhile is caught up.
        self.catch_up_from = self.started_at
        self._alive_noted_at = self.started_at

    # ---- lifecycle of the watcher itself -------------------------------------------------

    def _wants(self, adapter: str) -> bool:
        return self.adapter_setting in ("auto", adapter)

    def start(self) -> None:
        from watchdog.observers import Observer
        from watchdog.observers.polling import PollingObserver

        self.started_at = self.catch_up_from = self._alive_noted_at = self.clock()
        self._load_saved_states()
        try:
            self._observer = PollingObserver(timeout=1.0) if self.use_polling else Observer()
            self._observer.start()
        except OSError as exc:  # inotify limits, exotic filesystems
            log.warning("inotify unavailable (%s): polling instead", exc)
            self._observer = PollingObserver(timeout=1.0)
            self._observer.start()
        self._attach_dirs(initial=True)
        self._recheck_known_sessions()
        self._thread = threading.Thread(target=self._loop, name="llmem-watch", daemon=True)
        self._thread.start()

    def _load_saved_states(self) -> None:
        if self.saved is None:
            return
        try:
            self.states.update(self.saved.load())
            alive = self.saved.last_alive()
        except Exception as exc:
            self.errors += 1
            log.warning("watch: could not read the saved session states: %s", exc)
            return
        if alive is not None:
            self.catch_up_from = min(self.started_at, alive - CATCH_UP_MARGIN_SECONDS)
            log.info("watch: %d known sessions; catching up on changes since %s", len(self.states),
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.catch_up_from)))
        self._note_alive()

    def _note_alive(self) -> None:
        self._alive_noted_at = self.clock()
        try:
            self.saved.mark_alive(self._alive_noted_at)
        except Exception as exc:  # a busy store: the next note will do
            log.warning("watch: could not note the watcher alive: %s", exc)

    def _recheck_known_sessions(self) -> None:
        """Look again at known sessions not ended yet: a turn may have finished (or the
        session gone quiet for good) while no watcher ran."""
        folders = {"opencode": self.opencode_dir, "copilot": self.copilot_dir, "claude": self.claude_dir,
                   "codex": self.codex_dir}
        for (adapter, session_id), state in list(self.states.items()):
            folder = folders.get(adapter)
            if not state.ended and self._wants(adapter) and folder in self._watched:
                self._process_key(_process_key_for(adapter, session_id))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for observer in (self._observer, self._poller):
            if observer is not None:
                observer.stop()
                observer.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for changes in self._opencode_changes.values():
            changes.close()
        self._opencode_changes.clear()

    def describe(self) -> str:
        """What is watched, for the start-up line: each agent folder and whether it exists."""
        parts = []
        for adapter, folder in (("opencode", self.opencode_dir), ("copilot", self.copilot_dir),
                                ("claude", self.claude_dir), ("codex", self.codex_dir)):
            if not self._wants(adapter):
                continue
            state = "watching" if folder in self._watched else "not there yet, will attach when it appears"
            parts.append(f"{adapter} {folder} ({state})")
        return "; ".join(parts) or f"nothing (session.adapter is {self.adapter_setting})"

    def _attach_dirs(self, initial: bool = False) -> None:
        """Start watching agent folders that exist now (they may appear after start)."""
        from watchdog.events import FileSystemEventHandler

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.event_type in ("opened", "closed_no_write"):
                    return
                for raw in (event.src_path, getattr(event, "dest_path", "")):
                    if raw:
                        watcher._on_path(Path(raw if isinstance(raw, str) else raw.decode()))

        targets = []
        if self._wants("opencode"):
            targets.append((self.opencode_dir, False))
        if self._wants("copilot"):
            targets.append((self.copilot_dir, True))
        if self._wants("claude"):
            # Recursive: a subagent's transcript sits two levels down, and is ignored by _key_for.
            targets += [(self.claude_dir, True), (self.claude_registry, False)]
        if self._wants("codex"):
            # Recursive: rollouts sit in dated folders (YYYY/MM/DD) made as days go by.
            targets.append((self.codex_dir, True))
        for folder, recursive in targets:
            if folder in self._watched or not folder.is_dir():
                continue
            try:
                self._observer.schedule(Handler(), str(folder), recursive=recursive)
            except OSError as exc:
                # Each watch takes an inotify instance, and their number is capped per user
                # (fs.inotify.max_user_instances, 128 by default): raised here, in the loop, it
                # would end the loop and every session would go unwatched.
                log.warning("inotify unavailable for %s (%s): polling it instead", folder, exc)
                self._polling_observer().schedule(Handler(), str(folder), recursive=recursive)
            self._watched.add(folder)
            log.info("watching %s", folder)
            if folder != self.claude_registry:
                self._scan(folder, announce=not initial)

    def _polling_observer(self):
        if self._poller is None:
            from watchdog.observers.polling import PollingObserver

            self._poller = PollingObserver(timeout=1.0)
            self._poller.start()
        return self._poller

    # ---- change intake -------------------------------------------------------------------

    def _on_path(self, path: Path) -> None:
        key = self._key_for(path)
        if key is None:
            return
        at = self.clock()
        with self._lock:
            first, _ = self._dirty.get(key, (at, at))
            self._dirty[key] = (first, at)
        self._wake.set()

    def _key_for(self, path: Path) -> str | None:
        name = path.name
        if path.parent == self.opencode_dir and name.startswith("opencode"):
            if name.endswith((".db", ".db-wal")):
                return "opencode:" + str(self.opencode_dir / name.removesuffix("-wal"))
            return None
        if path.parent == self.claude_registry:
            return "claude-registry:" if name.endswith(".json") else None
        if path.is_relative_to(self.claude_dir):
            from ..adapters.detect import claude_session_id

            session_id = claude_session_id(path, self.claude_dir)
            return "claude:" + session_id if session_id else None
        if path.is_relative_to(self.codex_dir):
            from ..adapters.codex import rollout_thread_id

            thread_id = rollout_thread_id(name)
            if thread_id is None or len(path.relative_to(self.codex_dir).parts) != 4:
                return None
            self._codex_paths[thread_id] = path
            return "codex:" + thread_id
        try:
            relative = path.relative_to(self.copilot_dir)
        except ValueError:
            return None
        parts = relative.parts
        if len(parts) >= 1 and (len(parts) == 1 or parts[1] in ("events.jsonl", "workspace.yaml")
                                or parts[1].startswith("inuse.")):
            return "copilot:" + parts[0]
        return None

    def _scan(self, folder: Path, announce: bool) -> None:
        """Look at the sessions already there. Those whose activity predates the watch are
        remembered silently; the rest (written while no watcher ran) are caught up."""
        if folder == self.opencode_dir:
            for db in sorted(folder.glob("opencode*.db")):
                self._safely(str(db), self._process_opencode, db)
        elif folder == self.claude_dir:
            from ..adapters.detect import claude_session_id

            horizon = min(self.clock() - self.inactivity_ms / 1000, self.catch_up_from)
            for path in sorted(folder.glob("*/*.jsonl")):
                session_id = claude_session_id(path, folder)
                if session_id and (announce or _modified_after(path, horizon)):
                    self._safely(session_id, self._process_claude, session_id)
        elif folder == self.codex_dir:
            from ..adapters.codex import rollout_thread_id

            horizon = min(self.clock() - self.inactivity_ms / 1000, self.catch_up_from)
            for path in sorted(folder.glob("*/*/*/rollout-*.jsonl")):
                thread_id = rollout_thread_id(path.name)
                if thread_id and (announce or _modified_after(path, horizon)):
                    self._codex_paths[thread_id] = path
                    self._safely(thread_id, self._process_codex, thread_id)
        else:
            horizon = min(self.clock() - self.inactivity_ms / 1000, self.catch_up_from)
            for child in sorted(folder.iterdir()):
                if child.is_dir() and (announce or _modified_after(child, horizon)):
                    self._safely(child.name, self._process_copilot, child.name)

    # ---- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._run_loop()
        finally:
            if self.saved is not None:
                self.saved.close_thread_connection()

    def _run_loop(self) -> None:
        last_dir_check = self.clock()
        while not self._stop.is_set():
            timeout = self._next_timeout()
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stop.is_set():
                return
            at = self.clock()
            ready = []
            with self._lock:
                for key, (first, last) in list(self._dirty.items()):
                    if at - last >= QUIET_SECONDS or at - first >= MAX_WAIT_SECONDS:
                        ready.append(key)
                        del self._dirty[key]
            for key in ready:
                self._process_key(key)
            for session, due in list(self._recheck_at.items()):
                if due <= at and self._recheck_at.get(session) == due:
                    del self._recheck_at[session]
                    self._process_key(_process_key_for(*session))
            for session in list(self._unsaved):
                self._save(session)
            if self.saved is not None and at - self._alive_noted_at >= ALIVE_SECONDS:
                self._note_alive()
            if at - last_dir_check >= DIR_CHECK_SECONDS:
                last_dir_check = at
                self._attach_dirs()

    def _next_timeout(self) -> float:
        at = self.clock()
        waits = [DIR_CHECK_SECONDS]
        with self._lock:
            if self._dirty:
                waits.append(TICK_SECONDS)
        if self._unsaved:
            waits.append(RETRY_SECONDS)
        if self._recheck_at:
            waits.append(max(0.05, min(self._recheck_at.values()) - at))
        return min(waits)

    def _process_key(self, key: str) -> None:
        kind, _, rest = key.partition(":")
        if kind == "opencode":
            self._safely(rest, self._process_opencode, Path(rest))
        elif kind == "opencode-session":
            self._safely(rest, self._evaluate_opencode, rest)
        elif kind == "copilot":
            self._safely(rest, self._process_copilot, rest)
        elif kind == "claude":
            self._safely(rest, self._process_claude, rest)
        elif kind == "claude-registry":
            # A Claude Code process started or exited: its session may have just ended.
            for session_id in sorted(self._claude_live):
                self._safely(session_id, self._process_claude, session_id)
        elif kind == "codex":
            self._safely(rest, self._process_codex, rest)

    def _safely(self, what: str, step, *args, **kwargs) -> None:
        """Run one read; a locked DB or an unknown schema is logged and the watcher goes on."""
        try:
            step(*args, **kwargs)
        except Exception as exc:
            self.errors += 1
            log.warning("watch: could not read %s: %s", what, exc)

    # ---- OpenCode --------------------------------------------------------------------------

    def _opencode_adapter(self):
        if self._opencode is None:
            from ..adapters import OpenCodeAdapter

            self._opencode = OpenCodeAdapter(self.opencode_dir)
        return self._opencode

    def _process_opencode(self, db_path: Path) -> None:
        """Sessions changed since the last look at this DB."""
        if not db_path.exists():
            return
        changes = self._opencode_changes.get(db_path)
        if changes is None:
            from ..adapters.opencode import ChangedSessions

            # Sessions quiet for longer than the inactivity timeout have ended already
            # (unless the watcher was down then): reading every old transcript costs time.
            since_s = min(self.clock() - self.inactivity_ms / 1000, self.catch_up_from)
            changes = ChangedSessions(db_path, int(since_s * 1000))
            self._opencode_changes[db_path] = changes  # kept even if this read fails: one connection per DB
        for session_id in changes.poll():
            self._evaluate_opencode(session_id)

    def _evaluate_opencode(self, session_id: str) -> None:
        from ..adapters import SessionNotFound
        from ..adapters.lifecycle import opencode_lifecycle

        adapter = self._opencode_adapter()
        try:
            transcript = adapter.read_transcript(session_id)
        except SessionNotFound:
            transcript = None
        if transcript is not None and transcript.is_subagent:
            return  # a task tool's child session: its result reaches the parent's transcript
        if transcript is not None and transcript.directory:
            self._own_calls.setdefault(("opencode", session_id), is_agent_call_dir(transcript.directory))
        state = self.states.get(("opencode", session_id))
        lifecycle = opencode_lifecycle(
            transcript, int(self.clock() * 1000),
            seen_compaction_id=state.seen_compaction_id if state else None,
            idle_debounce_ms=self.idle_debounce_ms, inactivity_ms=self.inactivity_ms)
        self._apply("opencode", session_id, lifecycle)

    # ---- Copilot ---------------------------------------------------------------------------

    def _process_copilot(self, session_id: str) -> None:
        from ..adapters import CopilotAdapter
        from ..adapters.base import is_valid_session_id
        from ..adapters.lifecycle import copilot_lifecycle

        if not is_valid_session_id(session_id):
            return
        if self._copilot is None:
            self._copilot = CopilotAdapter(self.copilot_dir)
        key = ("copilot", session_id)
        if self._copilot.events_path(session_id) is None:
            # Copilot writes no events before the first prompt: a new folder is a new session.
            if key not in self.states and _modified_after(self.copilot_dir / session_id, self.catch_up_from) \
                    and not self._llmems_own_call(*key):
                self._created(*key)
            return
        log_ = self._copilot.read_events(session_id)
        state = self.states.get(key)
        lifecycle = copilot_lifecycle(
            log_.event_objects, int(self.clock() * 1000), lock_alive=self._copilot.lock_alive(session_id),
            seen_compaction_id=state.seen_compaction_id if state else None,
            idle_debounce_ms=self.idle_debounce_ms, inactivity_ms=self.inactivity_ms)
        self._apply("copilot", session_id, lifecycle)

    # ---- Claude Code -----------------------------------------------------------------------

    def _process_claude(self, session_id: str) -> None:
        from ..adapters.claude import ClaudeAdapter, ClaudeTail
        from ..adapters.lifecycle import claude_lifecycle

        if self._claude is None:
            self._claude = ClaudeAdapter(self.claude_dir.parent)
        tail = self._claude_tails.get(session_id)
        if tail is None or not tail.path.is_file():
            path = self._claude.transcript_path(session_id)
            if path is None:
                # Removed by Claude Code's cleanup sweep: nothing to undo (CLAUDE-CODE.md §6).
                self._claude_live.discard(session_id)
                self._claude_tails.pop(session_id, None)
                return
            tail = self._claude_tails[session_id] = ClaudeTail(path)
        lines = tail.read()
        alive = self._claude.process_alive(session_id)
        if alive:
            self._claude_live.add(session_id)
        else:
            self._claude_live.discard(session_id)
        state = self.states.get(("claude", session_id))
        lifecycle = claude_lifecycle(
            lines.line_objects, int(self.clock() * 1000), process_alive=alive, mtime_ms=lines.mtime_ms,
            seen_compaction_id=state.seen_compaction_id if state else None,
            idle_debounce_ms=self.idle_debounce_ms, inactivity_ms=self.inactivity_ms)
        self._apply("claude", session_id, lifecycle)

    # ---- Codex CLI -------------------------------------------------------------------------

    def _process_codex(self, thread_id: str) -> None:
        from ..adapters.codex import CodexAdapter, CodexTail
        from ..adapters.lifecycle import codex_lifecycle

        tail = self._codex_tails.get(thread_id)
        if tail is None or not tail.path.is_file():
            path = self._codex_paths.get(thread_id)
            if path is None or not path.is_file():
                path = CodexAdapter(self.codex_dir.parent).rollout_path(thread_id)
            if path is None:
                self._codex_tails.pop(thread_id, None)  # deleted (an archived one is still found)
                return
            tail = self._codex_tails[thread_id] = CodexTail(path)
        marks = tail.read()
        if tail.subagent:
            return  # a thread Codex spawned: its result reaches the parent's rollout
        state = self.states.get(("codex", thread_id))
        lifecycle = codex_lifecycle(
            marks, int(self.clock() * 1000), mtime_ms=tail.mtime_ms,
            seen_compaction_id=state.seen_compaction_id if state else None,
            idle_debounce_ms=self.idle_debounce_ms, inactivity_ms=self.inactivity_ms)
        self._apply("codex", thread_id, lifecycle)


    # ---- llmem's own agent calls -------------------------------------------------------------

    def _llmems_own_call(self, adapter: str, session_id: str) -> bool:
        """Whether the session is one llmem ran itself (llm.provider: agent, in its agent-calls
        folder): never a user's, so it gets no events. Read once per session, when it first
        has something to announce; a session whose folder is not known yet is asked again."""
        key = (adapter, session_id)
        known = self._own_calls.get(key)
        if known is not None:
            return known
        try:
            transcript = self._reader(adapter).read_transcript(session_id)
        except Exception as exc:  # unreadable now: the moment's own read reports it
            log.debug("watch: folder of %s session %s unknown: %s", adapter, session_id, exc)
            return False
        if not transcript.directory:
            if transcript.messages:  # ours say where they ran before their first message
                self._own_calls[key] = False
            return False
        own = self._own_calls[key] = is_agent_call_dir(transcript.directory)
        if own:
            log.debug("watch: %s session %s is llmem's own agent call: no events", adapter, session_id)
        return own

    def _reader(self, adapter: str):
        """The adapter that reads this watcher's `adapter` folder."""
        from ..adapters import CopilotAdapter
        from ..adapters.claude import ClaudeAdapter
        from ..adapters.codex import CodexAdapter

        if adapter == "opencode":
            return self._opencode_adapter()
        if adapter == "copilot":
            return CopilotAdapter(self.copilot_dir)
        if adapter == "claude":
            return ClaudeAdapter(self.claude_dir.parent)
        return CodexAdapter(self.codex_dir.parent)

    # ---- turning moments into events -------------------------------------------------------

    def _created(self, adapter: str, session_id: str) -> SessionState | None:
        """The session's state, announcing it first if it is new; None if that failed."""
        key = (adapter, session_id)
        state = self.states.get(key)
        if state is None:
            if not self._emit(adapter, session_id, "created"):
                self._retry(key)
                return None
            state = self.states[key] = SessionState()
            self._save(key)
        return state

    def _apply(self, adapter: str, session_id: str, lifecycle) -> None:
        key = (adapter, session_id)
        if key not in self.states and (lifecycle.last_activity_ms is None
                                       or lifecycle.last_activity_ms < self.catch_up_from * 1000):
            # Activity from before the watch (backfill's job): remember where it is, emit nothing.
            self.states[key] = SessionState.seen(lifecycle)
            self._save(key)
            self._schedule_recheck(key, lifecycle)
            return
        if self._llmems_own_call(adapter, session_id):
            return
        state = self._created(adapter, session_id)
        if state is None:
            return
        before = replace(state)
        if not self._emit_moments(adapter, session_id, state, lifecycle):
            self._retry(key)
        if state != before:
            self._save(key)
        self._schedule_recheck(key, lifecycle)

    def _emit_moments(self, adapter: str, session_id: str, state: SessionState, lifecycle) -> bool:
        """Emit what is new since `state`, updating it after each emit that went through.
        False when an emit failed (the rest waits for the retry)."""
        from ..adapters.lifecycle import Moment

        if state.ended and lifecycle.last_turn_id != state.ended_turn:
            # The session moved on since it ended (one more turn, reopened): it is live again,
            # whether the look that notices it sees it busy, idle, or its reply finished but
            # still inside the idle debounce. Live, it is looked at again (_schedule_recheck)
            # for its idle and its next ending, and a restarted watcher rechecks it.
            state.ended = False
        compacting = Moment.COMPACTING in lifecycle
        # A compaction that started and finished between two looks still hid a slice to extract.
        compaction_is_new = (compacting or Moment.JUST_COMPACTED in lifecycle) and not state.compacting
        if compaction_is_new and not self._emit(adapter, session_id, "compacting"):
            return False
        state.compacting = compacting
        if Moment.JUST_COMPACTED in lifecycle:
            state.seen_compaction_id = lifecycle.compaction_id

        if Moment.IDLE in lifecycle and lifecycle.reply_id != state.idle_reply:
            # One idle per finished reply, whether or not the session was ever seen busy (a
            # whole turn in one transaction, a short turn between two looks). Every idle is
            # emitted at once: the worker holds the LLM pass to the extraction interval.
            if not self._emit(adapter, session_id, "idle"):
                return False
            state.idle_reply = lifecycle.reply_id

        if Moment.ENDING in lifecycle and not state.ended:
            # Ending extracts what is past the cursor too: the last turn needs no idle of its own.
            if not self._emit(adapter, session_id, "ending"):
                return False
            state.ended, state.ended_turn = True, lifecycle.last_turn_id
        return True

    def _schedule_recheck(self, key: tuple[str, str], lifecycle) -> None:
        """Look again when the idle debounce or the inactivity timeout will have passed."""
        state = self.states.get(key)
        if lifecycle.last_activity_ms is None or state is None or state.ended:
            return
        last = lifecycle.last_activity_ms / 1000
        candidates = [t for t in (last + self.idle_debounce_ms / 1000 + 0.05,
                                  last + self.inactivity_ms / 1000 + 0.05) if t > self.clock()]
        if candidates:
            self._look_again(key, min(candidates))

    def _look_again(self, key: tuple[str, str], at: float) -> None:
        current = self._recheck_at.get(key)
        if current is None or at < current:
            self._recheck_at[key] = at

    def _retry(self, key: tuple[str, str]) -> None:
        self._look_again(key, self.clock() + RETRY_SECONDS)

    def _emit(self, adapter: str, session_id: str, kind: str) -> bool:
        """Record one moment; False (logged) when the callback failed, so the caller keeps
        its state and tries again."""
        try:
            self.emit_callback(adapter, session_id, kind)
        except Exception as exc:
            self.errors += 1
            log.warning("session=%s adapter=%s event=%s could not be recorded, retrying in %.0f s: %s",
                        session_id, adapter, kind, RETRY_SECONDS, exc)
            return False
        log.info("session=%s adapter=%s event=%s detected", session_id, adapter, kind)
        return True

    def _save(self, key: tuple[str, str]) -> None:
        """Keep the session's state in the store; a busy store is retried on the next tick."""
        if self.saved is None:
            return
        try:
            self.saved.save(key, self.states[key], self.clock())
        except Exception as exc:
            self.errors += 1
            if key not in self._unsaved:
                log.warning("session=%s: could not save the watcher's state, retrying: %s", key[1], exc)
            self._unsaved.add(key)
            return
        self._unsaved.discard(key)


def _process_key_for(adapter: str, session_id: str) -> str:
    return f"{adapter}:{session_id}" if adapter in ("copilot", "claude", "codex") else f"opencode-session:{session_id}"


def _modified_after(session_path: Path, horizon: float) -> bool:
    """Was the session's folder or its events file (or its transcript or rollout file) written
    after `horizon` (epoch s)?"""
    for path in (session_path / "events.jsonl", session_path):
        try:
            if path.stat().st_mtime > horizon:
                return True
        except OSError:
            continue
    return False
