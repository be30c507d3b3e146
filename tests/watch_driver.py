"""A SessionWatcher driven through poll(now), for tests: no observer thread and no sleeps.

The agents' files carry wall-clock times (their lines' stamps, their mtimes), so the driven
`now` starts at the wall clock and never falls behind it; from there the test moves it on as
far as it likes (a 30-minute inactivity timeout costs nothing), and each step the watcher
takes is one that was due at that `now`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Recorder:
    """The emit callback: every (adapter, session id, kind) in order. Thread-safe, so the
    slow tests on a real observer can wait on it."""

    def __init__(self):
        self.events: list[tuple[str, str, str]] = []
        self.changed = threading.Condition()

    def __call__(self, adapter, session_id, kind):
        with self.changed:
            self.events.append((adapter, session_id, kind))
            self.changed.notify_all()

    def kinds(self, session_id):
        return [k for _, s, k in self.events if s == session_id]

    def wait_for(self, wanted: tuple, timeout: float = 8.0) -> None:
        """Real-observer tests only: until `wanted` was emitted."""
        self.wait_until(lambda: wanted in self.events, timeout, f"{wanted} not emitted")

    def wait_count(self, session_id: str, kind: str, count: int, timeout: float = 8.0) -> int:
        """Real-observer tests only: until `kind` was emitted `count` times for the session
        (or the time is up); how many times it was."""
        try:
            self.wait_until(lambda: self.kinds(session_id).count(kind) >= count, timeout, "")
        except AssertionError:
            pass
        return self.kinds(session_id).count(kind)

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{what}; got {self.events}")
                self.changed.wait(min(left, 0.05))  # woken by an emit, or looks again


class DrivenWatcher:
    """Runs `watcher` step by step at a `now` the test moves on."""

    def __init__(self, watcher, now: float | None = None):
        self.watcher = watcher
        self.now = time.time() if now is None else now
        self.steps = 0
        watcher.begin(self.now)

    def run(self, seconds: float = 1.0) -> float:
        """Every step due within the next `seconds` (the first at once, which also notices
        what was written since the last one); returns the `now` reached."""
        self.now = max(self.now, time.time())  # what was just written is never in the future
        end = self.now + seconds
        while True:
            due = self.watcher.poll(self.now)
            self.steps += 1
            if self.now >= end:
                return self.now
            self.now = min(due, end)

    def close(self) -> None:
        self.watcher.stop()
