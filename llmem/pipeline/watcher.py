"""Watch the agents' stores and turn file changes into session lifecycle events.

A watchdog observer (inotify, or polling) marks paths dirty; one loop thread debounces them,
reads the affected sessions read-only, applies the lifecycle rules (adapters/lifecycle.py)
and calls the injected `emit(adapter, session_id, kind)` on each new moment. It knows
nothing of the queue. While nothing changes it sleeps: no polling of the agents' files.

All of that is one step, `SessionWatcher.poll(now)`, run at an explicit time: the loop
thread runs it with the wall clock whenever something is due. A watcher that was only
`begin(now)`-ed has no observer and no thread: each `poll(now)` compares the watched folders
with their previous snapshot instead, and the caller says what time it is, as huey's
`execute_next(timestamp=)` does (the tests drive the watcher this way, without sleeping).

A session's state changes only after `emit` returned (the event row is committed); when it
raises, the state stays and the session is looked at again shortly, so the moment is emitted
then. Given the store, the per-session state is kept there (table watch_session): a restart
announces no known session twice and emits what was written while no watcher ran.

Given a spool (pipeline/spool.py), a moment that could not be recorded (the store's server is
away) is kept on disk instead and counts as emitted; the spool is delivered, in order, as soon
as the store answers. A watcher that starts while the store cannot be read waits for it before
it looks at any session (it would take every session for new, or for old), delivers the spool
first, then catches up on what was written meanwhile, as any restart does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..db.watch_sessions import last_watch_session_update, save_watch_session, watch_session_rows
from ..paths import is_agent_call_dir

log = logging.getLogger(__name__)

QUIET_SECONDS = 0.3  # a burst of writes settles this long before we read
MAX_WAIT_SECONDS = 2.0  # … but a constant stream is still read this often
MIN_STEP_SECONDS = 0.05  # the loop never spins faster than this
DIR_CHECK_SECONDS = 5.0  # how often a missing agent folder is looked for again
RETRY_SECONDS = 1.0  # an event or a state that could not be written is tried again after this
ALIVE_SECONDS = 60.0  # how often a running watcher notes in the store that it is alive
# Sessions active this long before the previous watcher was last known alive are caught up
# too: it may have died with their changes still in its debounce.
CATCH_UP_MARGIN_SECONDS = 60.0
# … and this long before the watch began: a file's mtime comes from the kernel's coarse clock
# (a tick behind time.time()), so a session written as the watch began can look older.
START_SLACK_SECONDS = 1.0


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
        # A Store, or what opens it (it raises while the store cannot be opened: the server away).
        self._store = None if callable(store) else store
        self._open = store if callable(store) else None

    @property
    def store(self):
        if self._store is None:
            self._store = self._open()
        return self._store

    @property
    def db(self):
        return self.store.db

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

    def recorded_since(self, adapter: str, session_id: str, kind: str, since: float) -> bool:
        """Whether the store holds a `kind` event of the session recorded at or after `since`."""
        from .events import recorded_since

        return recorded_since(self.store, adapter, session_id, kind, since) is not None

    def close_thread_connection(self) -> None:
        """Close the calling thread's connection (peewee keeps one per thread)."""
        if self._store is not None:
            self._store.db.close()


class _ChangedPaths:
    """A watchdog event handler that reports each path an event names (a move names two)."""

    def __init__(self, changed: Callable[[Path], None]):
        self.changed = changed

    def dispatch(self, event) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if raw:
                self.changed(Path(raw if isinstance(raw, str) else raw.decode()))


class FolderSnapshots:
    """What a watcher with no observer sees change: each look compares the watched folders
    with their previous snapshot (watchdog's DirectorySnapshot, as its PollingObserver does:
    created, deleted, moved, or a new size or mtime)."""

    def __init__(self):
        self._folders: dict[Path, tuple[bool, object]] = {}

    def watch(self, folder: Path, recursive: bool) -> None:
        self._folders[folder] = (recursive, self._snapshot(folder, recursive))

    @staticmethod
    def _snapshot(folder: Path, recursive: bool):
        from watchdog.utils.dirsnapshot import DirectorySnapshot, EmptyDirectorySnapshot

        try:
            return DirectorySnapshot(str(folder), recursive=recursive)
        except OSError:  # the folder went away: everything in it is deleted
            return EmptyDirectorySnapshot()

    def changes(self) -> list[Path]:
        """The paths changed since the last look, in a stable order."""
        from watchdog.utils.dirsnapshot import DirectorySnapshotDiff

        changed: set[str] = set()
        for folder, (recursive, before) in list(self._folders.items()):
            after = self._snapshot(folder, recursive)
            diff = DirectorySnapshotDiff(before, after)
            self._folders[folder] = (recursive, after)
            for paths in (diff.files_created, diff.files_deleted, diff.files_modified, diff.dirs_created,
                          diff.dirs_deleted, diff.dirs_modified):
                changed.update(str(path) for path in paths)
            for moved in (diff.files_moved, diff.dirs_moved):
                changed.update(str(path) for pair in moved for path in pair)
        return [Path(path) for path in sorted(changed)]


class SessionWatcher:
    """Observe each registered agent's folders (adapters/registry.py; how, each agent's
    `AgentWatch` says) and emit lifecycle events. Subagents' sessions get none
    (ARCHITECTURE.md, "Subagents are not users")."""

    def __init__(self, config, emit: Callable[[str, str, str], None], *, store=None, spool=None,
                 clock=time.time):
        session = config.session
        pipeline = config.pipeline
        self.config = config
        self.adapter_setting = session.adapter
        self.emit_callback = emit
        self.clock = clock
        self.use_polling = pipeline.use_polling
        self.idle_debounce_ms = int(pipeline.idle_debounce_seconds * 1000)
        self.inactivity_ms = int(pipeline.ending_inactivity_minutes * 60_000)
        self.states: dict[tuple[str, str], SessionState] = {}
        self.saved = SavedStates(store) if store is not None else None
        self.spool = spool  # pipeline/spool.py Spool: where moments wait while the store is away
        self._spool_due = 0.0  # when the next delivery of the spool may be tried
        self._waiting_for_store = False  # begin() could not read the saved states yet
        self._unsaved: set[tuple[str, str]] = set()
        self._recheck_at: dict[tuple[str, str], float] = {}  # idle debounce, inactivity, retries
        self._dirty: dict[tuple[str, str], tuple[float, float]] = {}  # (agent, watch key) → first, last
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._observer = None
        self._poller = None  # a polling observer for folders inotify could not take
        self._snapshots: FolderSnapshots | None = None  # begin() without start(): no observer
        self._watched: set[Path] = set()
        self._scan_again: dict[Path, bool] = {}  # polled folder → announce, at the next folder check
        self._thread: threading.Thread | None = None
        # agent name → its watch (adapters/agent.py AgentWatch), for the agents session.adapter wants.
        self.watches = self._agent_watches()
        self._readers: dict[str, object] = {}  # agent name → its reader, for _llmems_own_call
        # (adapter, session id) → whether llmem's own agent call ran it (llm.provider: agent).
        self._own_calls: dict[tuple[str, str], bool] = {}
        self.errors = 0
        self.errors_while_waiting = 0
        self.started_at = clock()
        # Activity of an unknown session before this moment predates the watch: remembered,
        # not announced (backfill's job). A restarted watcher moves it back to when the last
        # one was alive, so what was written meanwhile is caught up.
        self.catch_up_from = self.started_at
        self._alive_noted_at = self._dirs_checked_at = self.started_at

    # ---- lifecycle of the watcher itself -------------------------------------------------

    def _wants(self, adapter: str) -> bool:
        return self.adapter_setting in ("auto", adapter)

    def _agent_watches(self) -> dict:
        from ..adapters import registry

        watches = {}
        for agent in registry.all_agents():
            if self._wants(agent.name):
                watch = agent.watch(self.config, self)
                if watch is not None:
                    watches[agent.name] = watch
        return watches

    def folder(self, agent: str) -> Path:
        """The folder of the agent's sessions, as watched."""
        return self.watches[agent].primary

    def start(self) -> None:
        """Watch on the wall clock: a watchdog observer marks paths dirty as they change and a
        loop thread runs poll(clock()) whenever something is due."""
        from watchdog.observers import Observer
        from watchdog.observers.polling import PollingObserver

        try:
            self._observer = PollingObserver(timeout=1.0) if self.use_polling else Observer()
            self._observer.start()
        except OSError as exc:  # inotify limits, exotic filesystems
            log.warning("inotify unavailable (%s): polling instead", exc)
            self._observer = PollingObserver(timeout=1.0)
            self._observer.start()
        self.begin(self.clock())
        self._thread = threading.Thread(target=self._loop, name="llmem-watch", daemon=True)
        self._thread.start()

    def begin(self, now: float) -> None:
        """Start watching at `now`: load the saved states, attach the agent folders there are
        and look again at the known sessions not ended yet. Without start() (no observer),
        each poll(now) finds the changes by comparing the folders with their last snapshot."""
        self.started_at = self._alive_noted_at = self._dirs_checked_at = now
        self.catch_up_from = now - START_SLACK_SECONDS
        if self._observer is None:
            self._snapshots = FolderSnapshots()
        self._waiting_for_store = True
        self._begin_watching(now)

    def _begin_watching(self, now: float) -> None:
        """Load the saved states, attach the folders, recheck the known sessions; when the
        states cannot be read, wait (poll tries again): no session is looked at before."""
        self._deliver_spool(now)
        if not self._load_saved_states(now):
            return
        self._waiting_for_store = False
        self._attach_dirs(now, initial=True)
        self._recheck_known_sessions(now)

    def _load_saved_states(self, now: float) -> bool:
        if self.saved is None:
            return True
        try:
            self.states.update(self.saved.load())
            alive = self.saved.last_alive()
        except Exception as exc:
            self.errors += 1
            if not self._waiting_for_store or not self.errors_while_waiting:
                log.warning("watch: could not read the saved session states, waiting for the store "
                            "(retrying every %.0f s): %s", RETRY_SECONDS, exc)
            self.errors_while_waiting += 1
            return False
        if alive is not None:
            self.catch_up_from = min(self.catch_up_from, alive - CATCH_UP_MARGIN_SECONDS)
            log.info("watch: %d known sessions; catching up on changes since %s", len(self.states),
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.catch_up_from)))
        self._note_alive(now)
        return True

    def _note_alive(self, now: float) -> None:
        self._alive_noted_at = now
        try:
            self.saved.mark_alive(self._alive_noted_at)
        except Exception as exc:  # a busy store: the next note will do
            log.warning("watch: could not note the watcher alive: %s", exc)

    def _recheck_known_sessions(self, now: float) -> None:
        """Look again at known sessions not ended yet: a turn may have finished (or the
        session gone quiet for good) while no watcher ran."""
        for (adapter, session_id), state in list(self.states.items()):
            watch = self.watches.get(adapter)
            if not state.ended and watch is not None and watch.primary in self._watched:
                self._process_session(adapter, session_id, now)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for observer in (self._observer, self._poller):
            if observer is not None:
                observer.stop()
                observer.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for watch in self.watches.values():
            watch.close()

    def describe(self) -> str:
        """What is watched, for the start-up line: each agent folder and whether it exists."""
        if self._waiting_for_store:
            return "nothing yet: waiting for the store to answer (its saved states say what is new)"
        parts = []
        for adapter, watch in self.watches.items():
            folder = watch.primary
            state = "watching" if folder in self._watched else "not there yet, will attach when it appears"
            parts.append(f"{adapter} {folder} ({state})")
        return "; ".join(parts) or f"nothing (session.adapter is {self.adapter_setting})"

    def _attach_dirs(self, now: float, initial: bool = False) -> None:
        """Start watching agent folders that exist now (they may appear after start)."""
        # A polling observer takes its first snapshot in its own thread, some time after
        # schedule(): a session written between our scan and that snapshot would go unseen
        # until its next write. Its folders are scanned once more, a folder check later.
        for folder, announce in self._scan_again.items():
            self._scan(folder, now, announce=announce)
        self._scan_again.clear()
        for watch in self.watches.values():
            for target in watch.folders():
                folder = target.path
                if folder in self._watched or not folder.is_dir():
                    continue
                polled = self._watch_folder(folder, target.recursive)
                self._watched.add(folder)
                log.info("watching %s", folder)
                if target.scan:
                    self._scan(folder, now, announce=not initial)
                    if polled:
                        self._scan_again[folder] = not initial

    def _watch_folder(self, folder: Path, recursive: bool) -> bool:
        """Watch `folder`; True when a watchdog polling observer watches it."""
        from watchdog.observers.polling import PollingObserver

        if self._snapshots is not None:
            self._snapshots.watch(folder, recursive)
            return False
        handler = _ChangedPaths(lambda path: self._on_path(path, self.clock()))
        try:
            self._observer.schedule(handler, str(folder), recursive=recursive)
            return isinstance(self._observer, PollingObserver)
        except OSError as exc:
            # Each watch takes an inotify instance, and their number is capped per user
            # (fs.inotify.max_user_instances, 128 by default): raised here, in the loop, it
            # would end the loop and every session would go unwatched.
            log.warning("inotify unavailable for %s (%s): polling it instead", folder, exc)
            self._polling_observer().schedule(handler, str(folder), recursive=recursive)
            return True

    def _polling_observer(self):
        if self._poller is None:
            from watchdog.observers.polling import PollingObserver

            self._poller = PollingObserver(timeout=1.0)
            self._poller.start()
        return self._poller

    # ---- change intake -------------------------------------------------------------------

    def _on_path(self, path: Path, at: float) -> None:
        """`path` changed at `at`: its session is read once the writes settle."""
        key = self._key_for(path)
        if key is None:
            return
        with self._lock:
            first, _ = self._dirty.get(key, (at, at))
            self._dirty[key] = (first, at)
        self._wake.set()

    def _key_for(self, path: Path) -> tuple[str, str] | None:
        """(agent, the key its watch gives the path), None for a path no watch wants."""
        for name, watch in self.watches.items():
            key = watch.key_for(path)
            if key is not None:
                return name, key
        return None

    def _scan(self, folder: Path, now: float, announce: bool) -> None:
        """Look at the sessions already there. Those whose activity predates the watch are
        remembered silently; the rest (written while no watcher ran) are caught up."""
        for watch in self.watches.values():
            if any(target.path == folder and target.scan for target in watch.folders()):
                watch.scan(folder, now, announce)

    # ---- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._run_loop()
        finally:
            if self.saved is not None:
                self.saved.close_thread_connection()

    def _run_loop(self) -> None:
        while True:
            due = self.poll(self.clock())
            # A path marked dirty meanwhile sets _wake: the wait ends at once.
            self._wake.wait(max(0.0, due - self.clock()))
            self._wake.clear()
            if self._stop.is_set():
                return

    def poll(self, now: float) -> float:
        """One step of the watcher at `now` (epoch s): read the sessions whose writes settled,
        look again at those whose idle debounce, inactivity timeout or retry is due, save
        what could not be saved, note the watcher alive, and look for agent folders that
        appeared. Every rule reads `now`, never the clock. Returns when the next step is due.

        Without an observer (begin() alone), the watched folders are first compared with
        their snapshot of the previous step: what changed counts as changed at `now`."""
        if self._waiting_for_store:
            if now >= self._spool_due:
                self._spool_due = now + RETRY_SECONDS
                self._begin_watching(now)
            if self._waiting_for_store:
                return now + RETRY_SECONDS
        if self.spool is not None and now >= self._spool_due and self.spool.waiting():
            self._deliver_spool(now)
        if self._snapshots is not None:
            for path in self._snapshots.changes():
                self._on_path(path, now)
        ready = []
        with self._lock:
            for key, (first, last) in list(self._dirty.items()):
                if now - last >= QUIET_SECONDS or now - first >= MAX_WAIT_SECONDS:
                    ready.append(key)
                    del self._dirty[key]
        for key in ready:
            self._process_key(key, now)
        for session, due in list(self._recheck_at.items()):
            if due <= now and self._recheck_at.get(session) == due:
                del self._recheck_at[session]
                self._process_session(*session, now)
        for session in list(self._unsaved):
            self._save(session, now)
        if self.saved is not None and now - self._alive_noted_at >= ALIVE_SECONDS:
            self._note_alive(now)
        if now - self._dirs_checked_at >= DIR_CHECK_SECONDS:
            self._dirs_checked_at = now
            self._attach_dirs(now)
        return self._next_due(now)

    def _next_due(self, now: float) -> float:
        due = [self._dirs_checked_at + DIR_CHECK_SECONDS]
        with self._lock:
            due += [min(last + QUIET_SECONDS, first + MAX_WAIT_SECONDS) for first, last in self._dirty.values()]
        if self._unsaved or (self.spool is not None and self.spool.waiting()):
            due.append(now + RETRY_SECONDS)
        if self._recheck_at:
            due.append(min(self._recheck_at.values()))
        if self.saved is not None:
            due.append(self._alive_noted_at + ALIVE_SECONDS)
        return max(min(due), now + MIN_STEP_SECONDS)

    def _process_key(self, key: tuple[str, str], now: float) -> None:
        agent, local = key
        watch = self.watches.get(agent)
        if watch is not None:
            self._safely(local, watch.look, local, now)

    def _process_session(self, agent: str, session_id: str, now: float) -> None:
        watch = self.watches.get(agent)
        if watch is not None:
            self._process_key((agent, watch.session_key(session_id)), now)

    def _safely(self, what: str, step, *args, **kwargs) -> None:
        """Run one read; a locked DB or an unknown schema is logged and the watcher goes on."""
        try:
            step(*args, **kwargs)
        except Exception as exc:
            self.errors += 1
            log.warning("watch: could not read %s: %s", what, exc)

    # ---- what an agent's watch asks (adapters/agent.py WatchContext) ----------------------

    def safely(self, what: str, step, *args) -> None:
        self._safely(what, step, *args)

    def horizon(self, now: float) -> float:
        """Sessions quiet for longer than the inactivity timeout have ended already (unless
        the watcher was down then): a folder scan leaves them, reading them costs time."""
        return min(now - self.inactivity_ms / 1000, self.catch_up_from)

    def known(self, agent: str, session_id: str) -> bool:
        return (agent, session_id) in self.states

    def seen_compaction_id(self, agent: str, session_id: str) -> str | None:
        state = self.states.get((agent, session_id))
        return state.seen_compaction_id if state else None

    def apply(self, agent: str, session_id: str, lifecycle, now: float) -> None:
        self._apply(agent, session_id, lifecycle, now)

    def created(self, agent: str, session_id: str, now: float) -> None:
        self._created(agent, session_id, now)

    def own_call(self, agent: str, session_id: str) -> bool:
        return self._llmems_own_call(agent, session_id)

    def note_directory(self, agent: str, session_id: str, directory: str) -> None:
        self._own_calls.setdefault((agent, session_id), is_agent_call_dir(directory))

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
        """The reader of this watcher's `adapter` folder."""
        reader = self._readers.get(adapter)
        if reader is None:
            reader = self._readers[adapter] = self.watches[adapter].agent.reader(self.config)
        return reader

    # ---- turning moments into events -------------------------------------------------------

    def _created(self, adapter: str, session_id: str, now: float) -> SessionState | None:
        """The session's state, announcing it first if it is new; None if that failed."""
        key = (adapter, session_id)
        state = self.states.get(key)
        if state is None:
            if not self._emit(adapter, session_id, "created"):
                self._retry(key, now)
                return None
            state = self.states[key] = SessionState()
            self._save(key, now)
        return state

    def _apply(self, adapter: str, session_id: str, lifecycle, now: float) -> None:
        key = (adapter, session_id)
        if key not in self.states and (lifecycle.last_activity_ms is None
                                       or lifecycle.last_activity_ms < self.catch_up_from * 1000):
            # Activity from before the watch (backfill's job): remember where it is, emit nothing.
            self.states[key] = SessionState.seen(lifecycle)
            self._save(key, now)
            self._schedule_recheck(key, lifecycle, now)
            return
        if self._llmems_own_call(adapter, session_id):
            return
        state = self._created(adapter, session_id, now)
        if state is None:
            return
        before = replace(state)
        if not self._emit_moments(adapter, session_id, state, lifecycle):
            self._retry(key, now)
        if state != before:
            self._save(key, now)
        self._schedule_recheck(key, lifecycle, now)

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

        if Moment.IDLE in lifecycle and lifecycle.reply_id != state.idle_reply and not state.ended:
            # One idle per finished reply, whether or not the session was ever seen busy (a
            # whole turn in one transaction, a short turn between two looks). Every idle is
            # emitted at once: the worker holds the LLM pass to the extraction interval.
            # An ended session has none: its ending covered the reply (a session archived
            # inside the idle debounce, looked at again after a restart).
            if not self._emit_unless_hooked(adapter, session_id, "idle", lifecycle):
                return False
            state.idle_reply = lifecycle.reply_id

        if Moment.ENDING in lifecycle and not state.ended:
            # Ending extracts what is past the cursor too: the last turn needs no idle of its own.
            if not self._emit_unless_hooked(adapter, session_id, "ending", lifecycle):
                return False
            state.ended, state.ended_turn = True, lifecycle.last_turn_id
            state.idle_reply = lifecycle.reply_id or state.idle_reply
        return True

    def _schedule_recheck(self, key: tuple[str, str], lifecycle, now: float) -> None:
        """Look again when the idle debounce or the inactivity timeout will have passed."""
        state = self.states.get(key)
        if lifecycle.last_activity_ms is None or state is None or state.ended:
            return
        last = lifecycle.last_activity_ms / 1000
        candidates = [t for t in (last + self.idle_debounce_ms / 1000 + 0.05,
                                  last + self.inactivity_ms / 1000 + 0.05) if t > now]
        if candidates:
            self._look_again(key, min(candidates))

    def _look_again(self, key: tuple[str, str], at: float) -> None:
        current = self._recheck_at.get(key)
        if current is None or at < current:
            self._recheck_at[key] = at

    def _retry(self, key: tuple[str, str], now: float) -> None:
        self._look_again(key, now + RETRY_SECONDS)

    def _emit_unless_hooked(self, adapter: str, session_id: str, kind: str, lifecycle) -> bool:
        """Emit an idle or ending, unless the agent's hook (Stop, SessionEnd, agentStop,
        sessionEnd) recorded it already for this turn: an event of that kind recorded after the
        turn began. Either way the moment counts as emitted."""
        if self.saved is not None and lifecycle.turn_started_ms is not None:
            # The agents stamp to the millisecond: an event from that same millisecond may be
            # the previous turn's, so only a later one is the hook's for this turn.
            since = (lifecycle.turn_started_ms + 1) / 1000
            try:
                hooked = self.saved.recorded_since(adapter, session_id, kind, since)
            except Exception as exc:  # a busy store: emit, a duplicate costs less than a miss
                log.warning("watch: could not look for the hook's %s of %s: %s", kind, session_id, exc)
                hooked = False
            if hooked:
                log.info("session=%s adapter=%s event=%s already recorded by its hook", session_id, adapter, kind)
                return True
            return self._emit(adapter, session_id, kind, since=since)
        return self._emit(adapter, session_id, kind)

    def _emit(self, adapter: str, session_id: str, kind: str, since: float | None = None) -> bool:
        """Record one moment; False (logged) when the callback failed, so the caller keeps
        its state and tries again. With a spool, a moment that cannot be recorded is kept
        there instead (True); and while the spool holds moments, the new ones join them in
        order, the store not asked again before the next delivery."""
        at = self.clock()
        if self.spool is not None and self.spool.waiting():
            return self._keep(adapter, session_id, kind, since if since is not None else at, at, None)
        try:
            self.emit_callback(adapter, session_id, kind)
        except Exception as exc:
            self.errors += 1
            if self.spool is not None:
                return self._keep(adapter, session_id, kind, since if since is not None else at, at, exc)
            log.warning("session=%s adapter=%s event=%s could not be recorded, retrying in %.0f s: %s",
                        session_id, adapter, kind, RETRY_SECONDS, exc)
            return False
        log.info("session=%s adapter=%s event=%s detected", session_id, adapter, kind)
        return True

    def _keep(self, adapter: str, session_id: str, kind: str, since: float, at: float, exc) -> bool:
        why = f": {exc}" if exc is not None else " (the store is away)"
        if not self.spool.keep(adapter, session_id, kind, since=since, now=at):
            log.warning("session=%s adapter=%s event=%s could not be recorded, retrying in %.0f s%s",
                        session_id, adapter, kind, RETRY_SECONDS, why)
            return False
        log.warning("session=%s adapter=%s event=%s could not be recorded, kept in the spool%s",
                    session_id, adapter, kind, why)
        if self._spool_due <= at:  # the first moment kept: delivery is tried a retry later
            self._spool_due = at + RETRY_SECONDS
        return True

    def _deliver_spool(self, now: float) -> None:
        """Deliver the kept moments to the store, in order; the rest waits a retry."""
        if self.spool is None or not self.spool.waiting():
            return
        self._spool_due = now + RETRY_SECONDS
        try:
            self.spool.deliver()
        except Exception as exc:
            log.debug("watch: the spool waits for the store (%d moments): %s", self.spool.waiting(), exc)

    def _save(self, key: tuple[str, str], now: float) -> None:
        """Keep the session's state in the store; a busy store is retried on the next step."""
        if self.saved is None:
            return
        try:
            self.saved.save(key, self.states[key], now)
        except Exception as exc:
            self.errors += 1
            if key not in self._unsaved:
                log.warning("session=%s: could not save the watcher's state, retrying: %s", key[1], exc)
            self._unsaved.add(key)
            return
        self._unsaved.discard(key)
