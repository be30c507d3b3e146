#!/usr/bin/env python3
"""Ingestion soak: replayed OpenCode and Copilot sessions → `llmem run` → searchable memories.

Writes realistic sessions into a temp home (an opencode.db written by this process as
OpenCode would, Copilot session-state folders with workspace.yaml and lock files) while a
real `llmem run` subprocess watches them, with no LLM (heuristics only) or with a fake LLM on
127.0.0.1 whose replies never list the statements (`--llm fake-empty`: a valid empty list,
`--llm fake-invalid`: JSON that fails validation): either way the explicit statements must
come from the heuristics. Sessions mix one-shot
`copilot -p` runs, quick ends, long idles, compactions, whole-turn transactions, crashed
sessions with a dead lock PID; midway `llmem run` is restarted, later it is killed with
SIGKILL. Every turn plants explicit statements with a unique token. Prints: planted
statements recovered, duplicates, events lost or stuck, detect-to-searchable p50/p95, and
what each scenario lost; and the episodes (capture/episodes.py): each planted token must be in
exactly one valid episode (0 lost, 0 twice), their detect-to-searchable, the store's size
beside the episode text it holds. `--episodes off` runs the same replay without them (the
baseline of their cost). Example:
    python bench/ingest.py --sessions 200 --seed 1
    python bench/ingest.py --sessions 40 --seed 1 --episodes off
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakes import FakeModelServer  # noqa: E402
from session_writers import CopilotSession, OpenCodeStore, dead_pid  # noqa: E402

from llmem.db import packed_text  # noqa: E402

LLMEM = [sys.executable, "-m", "llmem"]

COPILOT_KINDS = ("oneshot", "quick_end", "long_idle", "compaction", "crash")
OPENCODE_KINDS = ("oc_stream", "oc_whole_turn", "oc_compaction", "oc_archived", "oc_long_idle")
KINDS = COPILOT_KINDS + OPENCODE_KINDS
LLM_MODES = ("none", "fake-empty", "fake-invalid")
# What the fake LLM answers to every chat: an extraction that found nothing, or an answer
# that does not fit the schema.
FAKE_REPLIES = {"fake-empty": '{"memories": []}', "fake-invalid": "{}"}

NOUNS = ("session cache", "feature flags", "audit log", "rate limiter", "upload queue", "theme setting",
         "search index", "build cache", "retry policy", "api keys")
PLACES = ("redis", "localStorage", "postgres", "the config repo", "S3", "etcd", "a sidecar", "sqlite")
STYLES = ("small pure functions", "dataclasses over dicts", "pytest fixtures over setup methods",
          "explicit imports", "f-strings", "early returns")
LIBS = ("httpx", "structlog", "pydantic", "tenacity", "orjson", "click")
REGIONS = ("eu-west-1", "us-east-2", "ap-south-1", "eu-central-1")
QUESTIONS = ("Can you look at the failing test in api/handlers.py?", "Why does the build fail on CI?",
             "Could you tidy up the upload module?", "What is left to do for the release?",
             "Can you add a regression test for the parser?", "Is the migration safe to run twice?")
FILLERS = ("The build has been red since this morning.", "Thanks for the quick fix earlier.",
           "The staging deploy is frozen until Friday.", "Keep the diff small please.")
REPLIES = ("I updated the handler and the tests pass now.", "Done: the change is in and CI is green.",
           "I looked into it and fixed the import order.", "The parser now handles empty input; tests added.")


class SameReply(list):
    """FakeModelServer's chat_replies that never run out: every chat gets `reply`."""

    def __init__(self, reply: str):
        super().__init__([reply])
        self.reply = reply

    def pop(self, index: int = -1) -> str:
        return self.reply


@dataclass
class Plant:
    """One planted explicit statement: its unique token, where it was written and when."""

    token: str
    text: str
    session: str
    adapter: str
    kind: str
    tags: set[str] = field(default_factory=set)
    written_at: float | None = None  # the turn holding it was complete (reply written)


class Soak:
    """One soak in a fresh `home`: the agents' stores, `llmem run`, the replay, the figures."""

    def __init__(self, home: Path, *, sessions: int, seed: int, span: float, long_idle: float,
                 down: float, idle_debounce: float, settle: float, workers: int, llm: str = "none",
                 episodes: bool = True, log=print):
        self.home = home
        self.llm = llm
        self.episodes = episodes
        self.model_server: FakeModelServer | None = None
        self.seed = seed
        self.rng = random.Random(seed)
        self.sessions = sessions
        self.span = span
        self.long_idle = long_idle
        self.down = down
        self.settle = settle
        self.workers = workers
        self.idle_debounce = idle_debounce
        self.log = log
        self.state_dir = home / "copilot" / "session-state"
        self.opencode_dir = home / "opencode"
        self.plants: list[Plant] = []
        self.session_kinds: dict[tuple[str, str], str] = {}
        self.counter = itertools.count(1)
        self.runner: subprocess.Popen | None = None
        self.runner_up = threading.Event()
        self.runs = itertools.count(1)
        self.disruptions: list[str] = []
        self.helpers: list[subprocess.Popen] = []
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("LLMEM_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")}
        self.env |= {"LLMEM_HOME": str(home / "llmem-home"), "HOME": str(home / "user-home")}

    # ---- setup and the llmem process ---------------------------------------------------------

    def configure(self) -> None:
        self.state_dir.mkdir(parents=True)
        (self.home / "user-home").mkdir()
        llmem_home = self.home / "llmem-home"
        llmem_home.mkdir()
        llm = "llm:\n  provider: none\n"
        pipeline = ""
        if self.llm != "none":
            self.model_server = FakeModelServer().start()
            self.model_server.chat_replies = SameReply(FAKE_REPLIES[self.llm])
            llm = f"llm:\n  provider: ollama\n  base_url: {self.model_server.url}\n  timeout: 30\n"
            # Every idle may call the LLM: the default 120 s interval would defer the LLM
            # pass of a session's later turns past the end of the soak.
            pipeline = "  min_extraction_interval_seconds: 0\n"
        (llmem_home / "config.yaml").write_text(
            "embedding:\n  provider: none\n" + llm
            + f"session:\n  adapter: auto\n  opencode:\n    data_dir: {self.opencode_dir}\n"
            f"  copilot:\n    state_dir: {self.state_dir}\n"
            f"pipeline:\n  workers: {self.workers}\n  idle_debounce_seconds: {self.idle_debounce}\n"
            "  ending_inactivity_minutes: 1\n  running_timeout_minutes: 0.1\n"
            "  reconcile_pending_seconds: 5\n" + pipeline
            + ("" if self.episodes else "capture:\n  episodes: false\n"))
        self.db_path = llmem_home / "memory.db"

    def start_runner(self) -> None:
        number = next(self.runs)
        self.runner_out = (self.home / f"run-{number}.out").open("w")
        # Run outside the checkout (so the llmem under test is the installed one) and in a
        # folder with no `llmem` entry, which `python -m llmem` would import instead.
        self.runner = subprocess.Popen([*LLMEM, "run"], env=self.env, cwd=self.home, stdout=self.runner_out,
                                       stderr=subprocess.STDOUT)
        self.runner_up.set()

    def stop_runner(self, sig: int = signal.SIGINT, timeout: float = 60) -> int | None:
        runner, self.runner = self.runner, None
        self.runner_up.clear()
        if runner is None:
            return None
        runner.send_signal(sig)
        try:
            return runner.wait(timeout)
        except subprocess.TimeoutExpired:
            runner.kill()
            return runner.wait(10)
        finally:
            self.runner_out.close()

    def disrupt(self, how: str) -> None:
        """Stop `llmem run` (SIGINT or SIGKILL), leave it down a while, start it again."""
        sig = signal.SIGKILL if how == "kill" else signal.SIGINT
        self.disruptions.append(f"{how} at {time.time() - self.t0:.1f} s")
        self.stop_runner(sig)
        time.sleep(self.down)
        self.start_runner()

    # ---- statements ----------------------------------------------------------------------------

    def plant(self, session: str, adapter: str, kind: str, *tags: str) -> Plant:
        number = next(self.counter)
        token = f"{self.rng.choice('bdfgkmpqrtvz')}{self.rng.choice('aeiou')}{number:04d}{self.rng.choice('xyzw')}"
        rng = self.rng
        text = rng.choice((
            f"We decided to keep the {rng.choice(NOUNS)} {token} in {rng.choice(PLACES)}.",
            f"Remember that service {token} listens on port {rng.randint(1025, 65000)}.",
            f"I prefer {rng.choice(STYLES)} in the {token} module.",
            f"Always run make check-{token} before pushing.",
            f"Let's go with {rng.choice(LIBS)} for the {token} client.",
            f"Note: the {token} bucket lives in {rng.choice(REGIONS)}.",
        ))
        plant = Plant(token, text, session, adapter, kind, set(tags))
        self.plants.append(plant)
        return plant

    def prompt(self, *plants: Plant) -> str:
        parts = [self.rng.choice(QUESTIONS)]
        for plant in plants:
            parts.append(plant.text)
            if self.rng.random() < 0.4:
                parts.append(self.rng.choice(FILLERS))
        return " ".join(parts)

    def written(self, plants, at: float) -> None:
        up = self.runner_up.is_set()
        for plant in plants:
            plant.written_at = at
            if not up:
                plant.tags.add("written_while_down")

    def turn_plants(self, session: str, adapter: str, kind: str, last: bool, *tags: str) -> list[Plant]:
        count = 1 if self.rng.random() < 0.7 else 2
        extra = ("last_turn",) if last else ()
        return [self.plant(session, adapter, kind, *tags, *extra) for _ in range(count)]

    def gap(self) -> float:
        return self.rng.uniform(0.5, 3.0)

    # ---- Copilot sessions (generators: each yield is the pause before the next write) -----------

    def copilot(self, kind: str):
        session = CopilotSession(self.state_dir, cwd=f"/work/repo{self.rng.randint(1, 7)}")
        self.session_kinds[("copilot", session.id)] = kind
        turns = 1 if kind == "oneshot" else self.rng.randint(1, 3)
        agent = None
        lock_pid = None
        if kind == "crash":
            if self.rng.random() < 0.5:
                lock_pid = dead_pid()  # the agent is already gone when its last turn lands
            else:
                agent = subprocess.Popen(["sleep", "3600"])  # dies after the last turn
                self.helpers.append(agent)
                lock_pid = agent.pid
        session.start(lock_pid=lock_pid)
        for index in range(turns):
            last = index == turns - 1
            if kind == "long_idle" and last and index:
                yield self.long_idle
            if kind == "compaction" and last and index:
                session.compaction("<overview>Refactoring the upload module.</overview>")
                yield 0.5
            plants = self.turn_plants(session.id, "copilot", kind, last,
                                      *(["after_long_idle"] if kind == "long_idle" and last and index else []))
            if kind == "oneshot":
                session.user(self.prompt(*plants))
                yield 0.3
                session.tool_step("pytest -q", "12 passed")
                yield 0.3
                self.written(plants, session.reply(self.rng.choice(REPLIES)))
                yield 0.2
                session.shutdown()
                return
            session.user(self.prompt(*plants))
            yield self.rng.uniform(0.3, 1.5)
            if self.rng.random() < 0.3:
                session.tool_step("git status", "nothing to commit")
                yield 0.4
            self.written(plants, session.reply(self.rng.choice(REPLIES)))
            if not last:
                yield self.gap()
        if kind in ("quick_end", "compaction"):
            yield 1.0
            session.shutdown()
        elif kind == "crash" and agent is not None:
            yield 1.0
            agent.kill()
            agent.wait()
        # long_idle: the session stays open, its lock held by this (live) process

    # ---- OpenCode sessions ----------------------------------------------------------------------

    def opencode(self, store: OpenCodeStore, kind: str):
        session = store.session(directory=f"/work/repo{self.rng.randint(1, 7)}")
        self.session_kinds[("opencode", session.id)] = kind
        turns = self.rng.randint(1, 3)
        for index in range(turns):
            last = index == turns - 1
            if kind == "oc_long_idle" and last and index:
                yield self.long_idle
            if kind == "oc_compaction" and last and index:
                steps = session.compaction_steps("Summary: the upload module was refactored.")
                for _ in steps:
                    yield 0.4
                for _ in session.reply_steps("Continuing with the remaining steps."):
                    yield 0.1
                yield 0.5
            tags = ["after_long_idle"] if kind == "oc_long_idle" and last and index else []
            plants = self.turn_plants(session.id, "opencode", kind, last, *tags)
            tool = ("pytest -q", "12 passed") if self.rng.random() < 0.3 else None
            if kind == "oc_whole_turn":
                for plant in plants:
                    plant.tags.add("whole_turn")
                self.written(plants, session.turn(self.prompt(*plants), self.rng.choice(REPLIES),
                                                  whole=True, tool=tool))
            else:
                session.user(self.prompt(*plants))
                yield self.rng.uniform(0.3, 1.5)
                for _ in session.reply_steps(self.rng.choice(REPLIES), tool=tool):
                    yield 0.1
                self.written(plants, time.time())
            if not last:
                yield self.gap()
        if kind == "oc_archived":
            yield 1.0
            session.archive()
        # the others stay open: OpenCode never closes a session (inactivity ends them)

    # ---- the replay ----------------------------------------------------------------------------

    def replay(self) -> None:
        kinds = [KINDS[i % len(KINDS)] for i in range(self.sessions)]
        self.rng.shuffle(kinds)
        store = OpenCodeStore(self.opencode_dir)
        heap: list = []
        order = itertools.count()
        plan_rng = self.rng
        # Each session draws from its own generator: the sessions' steps interleave by wall
        # clock, and one shared generator would make the plan depend on the machine's speed.
        session_rngs = {}
        for index, kind in enumerate(kinds):
            start = plan_rng.uniform(0, self.span)
            maker = self.opencode(store, kind) if kind.startswith("oc_") else self.copilot(kind)
            session_rngs[maker] = random.Random(f"{self.seed}-{index}")
            heapq.heappush(heap, (start, next(order), maker))
        disruptions = [(0.35 * self.span, "restart"), (0.65 * self.span, "kill")]
        controller = threading.Thread(target=self._disruptions, args=(disruptions,), daemon=True)
        self.t0 = time.time()
        controller.start()
        while heap:
            due, _, maker = heapq.heappop(heap)
            wait = self.t0 + due - time.time()
            if wait > 0:
                time.sleep(wait)
            self.rng = session_rngs[maker]  # what this session's step draws from
            try:
                pause = next(maker)
            except StopIteration:
                continue
            finally:
                self.rng = plan_rng
            heapq.heappush(heap, (time.time() - self.t0 + pause, next(order), maker))
        controller.join()
        store.close()

    def _disruptions(self, plan) -> None:
        for at, how in plan:
            wait = self.t0 + at - time.time()
            if wait > 0:
                time.sleep(wait)
            self.disrupt(how)

    # ---- reading the store ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        return packed_text.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)

    def _store_made(self) -> bool:
        return self.db_path.exists()

    def progress(self) -> tuple[int, int]:
        """(planted tokens found in valid memories, events not done), read-only."""
        if not self._store_made():
            return 0, 0
        with self._connect() as conn:
            contents = " ".join(r[0].lower() for r in conn.execute(
                "SELECT content FROM memory WHERE invalidated_at IS NULL AND source != 'episode'"))
            open_events = conn.execute("SELECT COUNT(*) FROM event WHERE status != 'done'").fetchone()[0]
        return sum(plant.token in contents for plant in self.plants), open_events

    def wait_settled(self) -> float:
        started = time.time()
        stable = 0
        while time.time() - started < self.settle:
            found, open_events = self.progress()
            stable = stable + 1 if found == len(self.plants) and open_events == 0 else 0
            if stable >= 3:
                break
            time.sleep(1.0)
        return time.time() - started

    def cli_json(self, *args: str):
        done = subprocess.run([*LLMEM, *args, "--json"], env=self.env, cwd=self.home, capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"llmem {' '.join(args)} failed: {done.stderr.strip()}")
        return json.loads(done.stdout)

    def measure(self) -> dict:
        """Figures from the store after `llmem run` stopped: CLI --json plus read-only SQL."""
        memories = self.cli_json("list", "--limit", "1000000")
        with self._connect() as conn:
            rows = conn.execute("SELECT seq, content, created_at, source FROM memory WHERE invalidated_at IS NULL "
                                "AND (valid_until IS NULL OR valid_until > ?)", (time.time(),)).fetchall()
            # The typed memories, and the episodes (the turns themselves), counted apart.
            valid = {seq: (content, created) for seq, content, created, source in rows if source != "episode"}
            episodes = {seq: (content.lower(), created) for seq, content, created, source in rows
                        if source == "episode"}
            searchable: dict[str, set[int]] = {}
            episode_hits: dict[str, set[int]] = {}
            for plant in self.plants:
                found = {r[0] for r in conn.execute("SELECT rowid FROM memory_fts WHERE memory_fts MATCH ?",
                                                    (f'"{plant.token}"',))}
                searchable[plant.token] = found & set(valid)
                episode_hits[plant.token] = found & set(episodes)
            episode_bytes = conn.execute("SELECT COALESCE(SUM(LENGTH(CAST(llmem_text(content) AS BLOB))), 0), COUNT(*) "
                                         "FROM memory WHERE source = 'episode'").fetchone()
            per_session = [n for (n,) in conn.execute(
                "SELECT COUNT(*) FROM memory WHERE source = 'episode' GROUP BY session_id")]
            events = conn.execute("SELECT id, adapter, session_id, kind, status, attempts, last_error "
                                  "FROM event").fetchall()
        store_bytes, without_episodes = self._store_sizes()
        transcript_bytes = sum(path.stat().st_size for path in self.state_dir.rglob("events.jsonl"))
        transcript_bytes += sum(path.stat().st_size for path in self.opencode_dir.glob("opencode*.db*"))
        listed = " ".join(m["content"].lower() for m in memories)
        samples = self.rng.sample(self.plants, min(5, len(self.plants)))
        # The user's view: does `llmem search <token>` put it in its first page?
        cli_top = sum(any(s.token in hit["content"].lower() for hit in self._search_hits(s.token))
                      for s in samples)

        latency, live_latency = [], []
        kind_latency: dict[str, list[float]] = defaultdict(list)
        by_kind: dict[str, Counter] = defaultdict(Counter)
        by_tag: dict[str, Counter] = defaultdict(Counter)
        missing: dict[str, list[str]] = defaultdict(list)
        duplicates = []
        lost_tags: dict[str, Counter] = defaultdict(Counter)
        for plant in self.plants:
            seqs = searchable[plant.token]
            matching = [seq for seq, (content, _) in valid.items() if plant.token in content.lower()]
            ok = bool(seqs) and plant.token in listed
            by_kind[plant.kind]["planted"] += 1
            by_kind[plant.kind]["recovered"] += ok
            for tag in plant.tags or {"-"}:
                by_tag[tag]["planted"] += 1
                by_tag[tag]["recovered"] += ok
            if len(matching) > 1:
                duplicates.append(plant.token)
                by_kind[plant.kind]["duplicates"] += 1
            if not ok:
                missing[plant.kind].append(plant.token)
                lost_tags[plant.kind].update(plant.tags or {"-"})
                continue
            took = min(valid[seq][1] for seq in seqs) - plant.written_at
            latency.append(took)
            kind_latency[plant.kind].append(took)
            if "written_while_down" not in plant.tags:
                live_latency.append(took)

        sessions_with_event = defaultdict(Counter)
        for _, adapter, session_id, kind, _, _, _ in events:
            sessions_with_event[(adapter, session_id)][kind] += 1
        open_events = [{"id": e[0], "adapter": e[1], "session_id": e[2], "kind": e[3], "status": e[4],
                        "attempts": e[5], "error": e[6], "scenario": self.session_kinds.get((e[1], e[2]))}
                       for e in events if e[4] != "done"]
        no_event = [{"session": sid, "scenario": kind} for (adapter, sid), kind in self.session_kinds.items()
                    if not set(sessions_with_event[(adapter, sid)]) - {"created"}]
        created_twice = [sid for (adapter, sid), kinds in sessions_with_event.items() if kinds["created"] > 1]

        episode_lost, episode_twice, episode_latency = [], [], []
        for plant in self.plants:
            holding = [seq for seq, (content, _) in episodes.items() if plant.token in content]
            if not episode_hits[plant.token]:
                episode_lost.append(plant.token)
                continue
            if len(holding) > 1:
                episode_twice.append(plant.token)
            if plant.written_at is not None:
                episode_latency.append(min(episodes[seq][1] for seq in episode_hits[plant.token]) - plant.written_at)

        recovered = sum(c["recovered"] for c in by_kind.values())
        return {
            "episodes_on": self.episodes,
            "episodes": {"stored": episode_bytes[1], "text_bytes": episode_bytes[0],
                         "lost": len(episode_lost), "lost_tokens": episode_lost[:20],
                         "twice": len(episode_twice), "twice_tokens": episode_twice[:20],
                         "latency_s": _percentiles(episode_latency),
                         "per_session": _percentiles(per_session)},
            # Vacuumed copies, so WAL and free pages do not count: the store, and the same store
            # with its episodes deleted (what they cost, in the same run).
            "store_bytes": store_bytes, "store_bytes_without_episodes": without_episodes,
            "transcript_file_bytes": transcript_bytes,
            "sessions": len(self.session_kinds), "planted": len(self.plants), "recovered": recovered,
            "recovered_pct": round(100 * recovered / max(1, len(self.plants)), 1),
            "duplicates": len(duplicates), "duplicate_tokens": duplicates[:20],
            "events": len(events), "events_not_done": len(open_events), "events_not_done_list": open_events[:20],
            "event_statuses": dict(Counter(e[4] for e in events)),
            "sessions_without_event": len(no_event), "sessions_without_event_list": no_event[:20],
            "sessions_created_twice": len(created_twice),
            "latency_s": _percentiles(latency), "latency_live_s": _percentiles(live_latency),
            "by_scenario": {k: dict(v) | {"latency_s": _percentiles(kind_latency[k])}
                            for k, v in sorted(by_kind.items())},
            "by_tag": {k: dict(v) for k, v in sorted(by_tag.items())},
            "missing": {k: v[:10] for k, v in missing.items()},
            "lost_by_scenario_and_tag": {k: dict(v) for k, v in sorted(lost_tags.items())},
            "cli_search_spot_checks": f"{cli_top}/{len(samples)} in the first page",
            "disruptions": self.disruptions, "home": str(self.home),
        }

    def _store_sizes(self) -> tuple[int, int]:
        """(bytes of the vacuumed store, bytes of it vacuumed again without its episodes)."""
        with tempfile.TemporaryDirectory() as scratch:
            copy = Path(scratch) / "copy.db"
            with self._connect() as conn:
                conn.execute("VACUUM INTO ?", (str(copy),))
            full = copy.stat().st_size
            conn = packed_text.connect(copy)  # the FTS delete trigger reads episodes' packed text
            try:
                conn.execute("DELETE FROM memory WHERE source = 'episode'")
                # FTS5 keeps deleted rows' postings until its segments merge: rebuild it as if
                # the episodes had never been indexed.
                conn.execute("INSERT INTO memory_fts(memory_fts) VALUES ('rebuild')")
                conn.commit()
                conn.execute("VACUUM")
            finally:
                conn.close()
            return full, copy.stat().st_size

    def _search_hits(self, token: str) -> list[dict]:
        return self.cli_json("search", token, "--no-track")

    # ---- everything ------------------------------------------------------------------------------

    def run(self) -> dict:
        self.configure()
        self.start_runner()
        time.sleep(2.0)  # the watcher attached and the baseline taken
        try:
            self.replay()
            self.log(f"  replay done in {time.time() - self.t0:.0f} s; waiting up to {self.settle:.0f} s "
                     "for the pipeline to settle")
            settled = self.wait_settled()
        finally:
            self.stop_runner()
            for helper in self.helpers:
                if helper.poll() is None:
                    helper.kill()
                    helper.wait()
            if self.model_server is not None:
                self.model_server.stop()
        figures = self.measure()
        figures["settle_s"] = round(settled, 1)
        figures["llm"] = self.llm
        if self.model_server is not None:
            figures["llm_chats"] = sum(path.endswith("/chat") or path.endswith("/completions")
                                       for path, _ in self.model_server.requests)
        (self.home / "plants.json").write_text(json.dumps(
            [{"token": p.token, "text": p.text, "session": p.session, "adapter": p.adapter, "kind": p.kind,
              "tags": sorted(p.tags), "written_at": p.written_at} for p in self.plants], indent=1))
        return figures


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p95": None}
    values = sorted(values)
    return {"n": len(values), "p50": round(statistics.median(values), 2),
            "p95": round(values[int(0.95 * (len(values) - 1))], 2), "max": round(values[-1], 2)}


def report(figures: dict) -> str:
    lines = [
        f"planted statements recovered: {figures['recovered']}/{figures['planted']} "
        f"({figures['recovered_pct']} %, goal 100 %)",
        f"duplicates: {figures['duplicates']} (goal 0)",
        f"events lost or stuck: {figures['events_not_done']} events not done, "
        f"{figures['sessions_without_event']} sessions with turns but no event beyond created (goal 0); "
        f"statuses {figures['event_statuses']}; {figures['sessions_created_twice']} sessions got `created` twice",
        "detect-to-searchable: p50 {p50} s, p95 {p95} s over {n} (written while llmem ran: p50 {lp50} s, "
        "p95 {lp95} s)".format(lp50=figures["latency_live_s"]["p50"], lp95=figures["latency_live_s"]["p95"],
                               **figures["latency_s"]),
        "by scenario (recovered/planted, duplicates, detect-to-searchable):",
    ]
    for kind, counts in figures["by_scenario"].items():
        took = counts["latency_s"]
        lines.append(f"  {kind:<14} {counts.get('recovered', 0):>4}/{counts['planted']:<4} "
                     f"dup {counts.get('duplicates', 0)}  latency p50 {took['p50']} s, max {took.get('max')} s")
    lines.append("lost, by scenario and tag (a statement may carry several tags):")
    for kind, tags in figures["lost_by_scenario_and_tag"].items():
        lines.append(f"  {kind:<14} " + ", ".join(f"{tag} {n}" for tag, n in sorted(tags.items())))
    lines.append("by tag:")
    for tag, counts in figures["by_tag"].items():
        lines.append(f"  {tag:<20} {counts.get('recovered', 0):>4}/{counts['planted']}")
    for event in figures["events_not_done_list"][:10]:
        lines.append(f"  not done: #{event['id']} {event['kind']} {event['status']} ({event['scenario']}, "
                     f"{event['attempts']} tries) {event['error'] or ''}")
    for session in figures["sessions_without_event_list"][:10]:
        lines.append(f"  no event: {session['scenario']} {session['session']}")
    if figures["episodes_on"]:
        eps = figures["episodes"]
        lines.append(f"episodes: {eps['stored']} stored ({eps['per_session']['p50']} per session p50, max "
                     f"{eps['per_session'].get('max')}); planted tokens lost {eps['lost']}, in two episodes "
                     f"{eps['twice']} (goal 0, 0); detect-to-searchable p50 {eps['latency_s']['p50']} s, "
                     f"p95 {eps['latency_s']['p95']} s")
        grown = figures["store_bytes"] - figures["store_bytes_without_episodes"]
        lines.append(f"store: {figures['store_bytes']} bytes vacuumed, {grown} of them for the episodes, "
                     f"{grown / max(1, eps['text_bytes']):.2f}x the {eps['text_bytes']} bytes of text they hold "
                     f"(goal <= 3x); transcript files {figures['transcript_file_bytes']} bytes")
    else:
        lines.append(f"episodes off (capture.episodes: false); store: {figures['store_bytes']} bytes")
    lines.append(f"`llmem search <token>` spot checks: {figures['cli_search_spot_checks']}; disruptions: "
                 f"{', '.join(figures['disruptions'])}; settle {figures['settle_s']} s; LLM {figures['llm']}"
                 + (f" ({figures['llm_chats']} chats)" if "llm_chats" in figures else "")
                 + f"; home {figures['home']}")
    return "\n".join(lines)


def soak(home: Path, *, sessions: int = 200, seed: int = 1, span: float | None = None,
         long_idle: float = 70.0, down: float = 4.0, idle_debounce: float = 2.0, settle: float = 120.0,
         workers: int = 2, llm: str = "none", episodes: bool = True, log=print) -> dict:
    """Run the soak in `home` (a fresh folder) and return its figures."""
    return Soak(home, sessions=sessions, seed=seed, span=span or max(20.0, sessions * 0.5),
                long_idle=long_idle, down=down, idle_debounce=idle_debounce, settle=settle,
                workers=workers, llm=llm, episodes=episodes, log=log).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--span", type=float, help="Seconds over which sessions start (default: sessions/2).")
    parser.add_argument("--long-idle", type=float, default=70.0,
                        help="Pause before the last turn of long-idle sessions (default past the 1 min inactivity end).")
    parser.add_argument("--down", type=float, default=4.0, help="Seconds llmem run stays down at each disruption.")
    parser.add_argument("--idle-debounce", type=float, default=2.0)
    parser.add_argument("--settle", type=float, default=120.0,
                        help="Longest wait for the pipeline after the replay (a periodic reconcile runs once a minute).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--llm", choices=LLM_MODES, default="none",
                        help="none: heuristics only; fake-empty / fake-invalid: a fake LLM on 127.0.0.1 that "
                             "answers every chat with an empty list / with JSON that fails validation.")
    parser.add_argument("--episodes", choices=("on", "off"), default="on",
                        help="off: capture.episodes false, the baseline of what episodes cost.")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="llmem-bench-ingest-"))
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    log(f"llmem ingestion soak: {args.sessions} sessions, seed {args.seed}, LLM {args.llm}, home {home}")
    figures = soak(home, sessions=args.sessions, seed=args.seed, span=args.span, long_idle=args.long_idle,
                   down=args.down, idle_debounce=args.idle_debounce, settle=args.settle,
                   workers=args.workers, llm=args.llm, episodes=args.episodes == "on", log=log)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(report(figures))


if __name__ == "__main__":
    main()
