"""Watch the agents' stores and turn file changes into session lifecycle events.

A watchdog observer (inotify, or polling) marks paths dirty; one loop thread debounces them,
reads the affected sessions read-only, applies the lifecycle rules (lifecycle.py) and calls
the injected `emit(adapter, session_id, kind)` on each new moment. It knows nothing of the
queue. While nothing changes it sleeps: no polling of the agents' files.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .paths import expand

log = logging.getLogger(__name__)

QUIET_SECONDS = 0.3  # a burst of writes settles this long before we read
MAX_WAIT_SECONDS = 2.0  # … but a constant stream is still read this often
TICK_SECONDS = 0.25
DIR_CHECK_SECONDS = 5.0  # how often a missing agent folder is looked for again


@dataclass
class SessionState:
    """What the watcher last saw of one session, so each moment is emitted once."""

    idle: bool = False
    compacting: bool = False
    ended: bool = False
    seen_compaction_id: str | None = None
    recheck_at: float | None = None  # idle debounce, inactivity


class SessionWatcher:
    """Observe OpenCode's data folder and Copilot's session-state, emit lifecycle events."""

    def __init__(self, config, emit: Callable[[str, str, str], None], *, clock=time.time):
        session = config.values["session"]
        pipeline = config.values["pipeline"]
        self.opencode_dir = expand(session["opencode"]["data_dir"])
        self.copilot_dir = expand(session["copilot"]["state_dir"])
        self.adapter_setting = session["adapter"]
        self.emit_callback = emit
        self.clock = clock
        self.use_polling = pipeline["use_polling"]
        self.idle_debounce_ms = int(pipeline["idle_debounce_seconds"] * 1000)
        self.inactivity_ms = int(pipeline["ending_inactivity_minutes"] * 60_000)
        self.states: dict[tuple[str, str], SessionState] = {}
        self._dirty: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._observer = None
        self._watched: set[Path] = set()
        self._db_versions: dict[Path, tuple[sqlite3.Connection, int, int]] = {}
        self._thread: threading.Thread | None = None
        self._opencode = None
        self._copilot = None
        self.errors = 0
        self.started_at = clock()

    # ---- lifecycle of the watcher itself -------------------------------------------------

    def _wants(self, adapter: str) -> bool:
        return self.adapter_setting in ("auto", adapter)

    def start(self) -> None:
        from watchdog.observers import Observer
        from watchdog.observers.polling import PollingObserver

        self.started_at = self.clock()
        try:
            self._observer = PollingObserver(timeout=1.0) if self.use_polling else Observer()
            self._observer.start()
        except OSError as exc:  # inotify limits, exotic filesystems
            log.warning("inotify unavailable (%s): polling instead", exc)
            self._observer = PollingObserver(timeout=1.0)
            self._observer.start()
        self._attach_dirs(initial=True)
        self._thread = threading.Thread(target=self._loop, name="llmem-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for conn, _, _ in self._db_versions.values():
            conn.close()
        self._db_versions.clear()

    def describe(self) -> str:
        """What is watched, for the start-up line: each agent folder and whether it exists."""
        parts = []
        for adapter, folder in (("opencode", self.opencode_dir), ("copilot", self.copilot_dir)):
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
        for folder, recursive in targets:
            if folder in self._watched or not folder.is_dir():
                continue
            self._observer.schedule(Handler(), str(folder), recursive=recursive)
            self._watched.add(folder)
            log.info("watching %s", folder)
            self._scan(folder, announce=not initial)

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
        """Register the sessions already there; `announce` emits created for each."""
        if folder == self.opencode_dir:
            for db in sorted(folder.glob("opencode*.db")):
                self._safely(str(db), self._process_opencode, db, baseline=not announce)
        else:
            horizon = self.clock() - self.inactivity_ms / 1000
            for child in sorted(folder.iterdir()):
                if child.is_dir() and (announce or _modified_after(child, horizon)):
                    self._safely(child.name, self._process_copilot, child.name, baseline=not announce)

    # ---- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
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
            for (adapter, session_id), state in list(self.states.items()):
                if state.recheck_at is not None and state.recheck_at <= at:
                    state.recheck_at = None
                    self._process_key(f"{adapter}:{session_id}" if adapter == "copilot"
                                      else f"opencode-session:{session_id}")
            if at - last_dir_check >= DIR_CHECK_SECONDS:
                last_dir_check = at
                self._attach_dirs()

    def _next_timeout(self) -> float:
        at = self.clock()
        waits = [DIR_CHECK_SECONDS]
        with self._lock:
            if self._dirty:
                waits.append(TICK_SECONDS)
        rechecks = [s.recheck_at for s in self.states.values() if s.recheck_at is not None]
        if rechecks:
            waits.append(max(0.05, min(rechecks) - at))
        return min(waits)

    def _process_key(self, key: str) -> None:
        kind, _, rest = key.partition(":")
        if kind == "opencode":
            self._safely(rest, self._process_opencode, Path(rest))
        elif kind == "opencode-session":
            self._safely(rest, self._evaluate_opencode, rest)
        elif kind == "copilot":
            self._safely(rest, self._process_copilot, rest)

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
            from .adapters import OpenCodeAdapter

            self._opencode = OpenCodeAdapter(self.opencode_dir)
        return self._opencode

    def _process_opencode(self, db_path: Path, baseline: bool = False) -> None:
        """Sessions changed since the last look at this DB, confirmed by PRAGMA data_version."""
        if not db_path.exists():
            return
        entry = self._db_versions.get(db_path)
        if entry is None:
            conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=2.0,
                                   check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
            # Sessions quiet for longer than the inactivity timeout have ended already:
            # reading every old transcript at start would only cost time.
            entry = (conn, -1, int(self.clock() * 1000) - self.inactivity_ms)
            self._db_versions[db_path] = entry  # kept even if this read fails: one connection per DB
        conn, version, since_ms = entry
        current = conn.execute("PRAGMA data_version").fetchone()[0]
        if current == version:
            return
        rows = conn.execute(
            "SELECT session_id, MAX(time_updated) FROM message WHERE time_updated > ? GROUP BY session_id "
            "UNION SELECT id, time_updated FROM session WHERE time_updated > ?", (since_ms, since_ms)).fetchall()
        newest = max([since_ms, *[r[1] or 0 for r in rows]])
        self._db_versions[db_path] = (conn, current, newest)
        for session_id in dict.fromkeys(r[0] for r in rows):
            self._evaluate_opencode(session_id, baseline=baseline)

    def _evaluate_opencode(self, session_id: str, baseline: bool = False) -> None:
        from .adapters import SessionNotFound
        from .lifecycle import opencode_lifecycle

        adapter = self._opencode_adapter()
        try:
            transcript = adapter.read_transcript(session_id)
        except SessionNotFound:
            transcript = None
        parent = None
        if transcript is not None and transcript.parent_session_id:
            try:
                parent = adapter.read_transcript(transcript.parent_session_id)
            except SessionNotFound:
                parent = None
        state = self.states.get(("opencode", session_id))
        lifecycle = opencode_lifecycle(
            transcript, int(self.clock() * 1000), parent=parent,
            seen_compaction_id=state.seen_compaction_id if state else None,
            idle_debounce_ms=self.idle_debounce_ms, inactivity_ms=self.inactivity_ms)
        self._apply("opencode", session_id, lifecycle, baseline)

    # ---- Copilot ---------------------------------------------------------------------------

    def _process_copilot(self, session_id: str, baseline: bool = False) -> None:
        from .adapters import CopilotAdapter
        from .adapters.base import is_valid_session_id
        from .lifecycle import copilot_lifecycle

        if not is_valid_session_id(session_id):
            return
        if self._copilot is None:
            self._copilot = CopilotAdapter(self.copilot_dir)
        if self._copilot.events_path(session_id) is None and ("copilot", session_id) not in self.states:
            if not baseline:  # a new folder: Copilot writes no events before the first prompt
                self._apply_created("copilot", session_id)
            return
        log_ = self._copilot.read_events(session_id)
        state = self.states.get(("copilot", session_id))
        lifecycle = copilot_lifecycle(
            log_.event_objects, int(self.clock() * 1000), lock_alive=self._copilot.lock_alive(session_id),
            seen_compaction_id=state.seen_compaction_id if state else None,
            idle_debounce_ms=self.idle_debounce_ms, inactivity_ms=self.inactivity_ms)
        self._apply("copilot", session_id, lifecycle, baseline)

    # ---- turning moments into events -------------------------------------------------------

    def _apply_created(self, adapter: str, session_id: str) -> SessionState:
        state = self.states.get((adapter, session_id))
        if state is None:
            state = self.states[(adapter, session_id)] = SessionState()
            self._emit(adapter, session_id, "created")
        return state

    def _apply(self, adapter: str, session_id: str, lifecycle, baseline: bool) -> None:
        from .lifecycle import Moment

        key = (adapter, session_id)
        history = (lifecycle.last_activity_ms is not None
                   and lifecycle.last_activity_ms < self.started_at * 1000)
        if (baseline or history) and key not in self.states:
            # Sessions whose activity predates the watcher (backfill's job): remember where
            # they are, emit nothing.
            self.states[key] = SessionState(idle=Moment.IDLE in lifecycle,
                                            compacting=Moment.COMPACTING in lifecycle,
                                            ended=Moment.ENDING in lifecycle,
                                            seen_compaction_id=lifecycle.compaction_id)
            self._schedule_recheck(self.states[key], lifecycle)
            return
        state = self._apply_created(adapter, session_id)
        compacting = Moment.COMPACTING in lifecycle
        if compacting and not state.compacting:
            self._emit(adapter, session_id, "compacting")
        elif Moment.JUST_COMPACTED in lifecycle and not state.compacting:
            # The compaction started and finished between two looks: still extract what it hid.
            self._emit(adapter, session_id, "compacting")
        state.compacting = compacting
        if Moment.JUST_COMPACTED in lifecycle:
            state.seen_compaction_id = lifecycle.compaction_id

        idle = Moment.IDLE in lifecycle
        if idle and not state.idle:
            # Every idle is emitted at once: the worker runs what costs no LLM call now and
            # holds the LLM pass to pipeline.min_extraction_interval_seconds per session.
            state.idle = True
            self._emit(adapter, session_id, "idle")
        elif not idle and Moment.BUSY in lifecycle:
            state.idle = False
            state.ended = False  # a resumed session can end again

        if Moment.ENDING in lifecycle and not state.ended:
            state.ended = True
            self._emit(adapter, session_id, "ending")
        self._schedule_recheck(state, lifecycle)

    def _schedule_recheck(self, state: SessionState, lifecycle) -> None:
        """Look again when the idle debounce or the inactivity timeout will have passed."""
        if lifecycle.last_activity_ms is None or state.ended:
            return
        last = lifecycle.last_activity_ms / 1000
        candidates = [t for t in (last + self.idle_debounce_ms / 1000 + 0.05,
                                  last + self.inactivity_ms / 1000 + 0.05) if t > self.clock()]
        if candidates:
            soonest = min(candidates)
            if state.recheck_at is None or soonest < state.recheck_at:
                state.recheck_at = soonest

    def _emit(self, adapter: str, session_id: str, kind: str) -> None:
        log.info("session=%s adapter=%s event=%s detected", session_id, adapter, kind)
        try:
            self.emit_callback(adapter, session_id, kind)
        except Exception as exc:
            self.errors += 1
            log.warning("session=%s event=%s could not be recorded: %s", session_id, kind, exc)


def _modified_after(session_dir: Path, horizon: float) -> bool:
    """Was the session's folder or its events file written after `horizon` (epoch s)?"""
    for path in (session_dir / "events.jsonl", session_dir):
        try:
            if path.stat().st_mtime > horizon:
                return True
        except OSError:
            continue
    return False
