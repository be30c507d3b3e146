#!/usr/bin/env python3
"""Hook latency: fresh-process `llmem hook --type created` and `llmem context` (Copilot and Claude
Code hook forms), an MCP search round trip (`llmem mcp`: first result from spawn, then warm), and
extraction overhead on a 2,000-message transcript with a stub LLM (time outside the LLM).

`--table` measures instead every per-turn hook of every agent, as `llmem install` writes
them, at each `--sizes` (built-in embedder, seeded vectors), with and without a resident llmem
(cli/resident.py), each as a ratio to `python -c pass` measured in the same run.

Prints figures; it is not a test. Everything lives in a temporary LLMEM_HOME. Example:
    python bench/hooks.py
    python bench/hooks.py --table --sizes 3000,30000 --runs 9
    python bench/hooks.py --memories 5000 --runs 30 --fake-embedder
    python bench/hooks.py --memories 1000 --builtin-embedder
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fakes import StubLLM  # noqa: E402
from session_writers import ClaudeSession, copilot_session  # noqa: E402

PROJECT = "/home/dev/acme-api"
SESSION = "ses-bench-start"
BIG_SESSION = "ses-bench-big"
TYPES = ["fact", "decision", "preference", "event", "project_state", "procedure", "conversation",
         "self_assessment"]
CATEGORIES = ["NULL_SAFETY", "ERROR_HANDLING", "EDGE_CASE", "DESIGN", "PERFORMANCE"]
WORDS = [
    "pagination", "cursor", "keyset", "orders", "flaky", "test", "ordering", "created_at", "id",
    "api", "handler", "retry", "timeout", "cache", "index", "migration", "schema", "token",
    "budget", "embedding", "search", "rerank", "fts", "vector", "queue", "worker", "watcher",
    "hook", "plugin", "compaction", "session", "transcript", "redact", "secret", "deploy",
    "docker", "ci", "lint", "ruff", "pytest", "typing", "dataclass", "peewee", "sqlite", "wal",
    "busy", "lock",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def seed_store(count: int, rng: random.Random) -> None:
    from llmem.app import App

    app = App()
    store = app.store
    with store.db.atomic():
        for i in range(count):
            kind = TYPES[i % len(TYPES)]
            text = f"{kind} {i}: " + " ".join(rng.choices(WORDS, k=rng.randint(8, 40)))
            meta = {}
            if kind == "self_assessment":
                meta = {"category": rng.choice(CATEGORIES), "recurring": "no",
                        "proposed_update": "Check " + " ".join(rng.choices(WORDS, k=8))}
            project = rng.choice([PROJECT, None, "/home/dev/other", "/home/dev/third"])
            store.add(text, kind, project=project, metadata=meta, source="import")
    embedded = 0
    if app.embedder.available:
        from llmem.vectors import embed_pending

        embedded = embed_pending(store, app.embedder)
    app.close()
    print(f"store: {count} memories ({embedded} embedded)")


def time_command(args: list[str], runs: int, env: dict, stdin: str | None = None,
                 cpu: list[float] | None = None) -> list[float]:
    """Wall ms of each run; with `cpu`, also the process's user+sys ms appended to it (on a
    shared machine the CPU a hook costs moves less with the load than its wall time)."""
    import resource

    timings = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, timeout=120)
        timings.append((time.perf_counter() - started) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
        # A hook always exits 0 (fail open) and says in one stderr line what it did; more
        # than that line is a failure worth stopping for.
        if proc.returncode != 0 or ("hook" in args and len(proc.stderr.splitlines()) > 1):
            raise SystemExit(f"{' '.join(args)} failed: {proc.returncode} {proc.stderr}")
    return timings


def claude_payload(session: ClaudeSession, event: str, **extra) -> str:
    """The JSON Claude Code gives a hook on stdin."""
    return json.dumps({"session_id": session.id, "transcript_path": str(session.path), "cwd": session.cwd,
                       "hook_event_name": event, **extra})


CLAUDE_HOOK = ["hook", "--adapter", "claude", "--format", "claude", "--type"]


def bench_processes(runs: int, env: dict, claude: ClaudeSession) -> None:
    llmem = [sys.executable, "-m", "llmem"]
    start_payload = json.dumps({"sessionId": SESSION, "cwd": PROJECT, "source": "new"})
    claude_start = claude_payload(claude, "SessionStart", source="startup")
    cases = [
        ("python -c pass (interpreter floor)", [sys.executable, "-c", "pass"], None),
        ("llmem --help", [*llmem, "--help"], None),
        ("hook --type created (session known)", [*llmem, "hook", "--type", "created", "--session-id", SESSION], None),
        ("hook --type created (unknown session)", [*llmem, "hook", "--type", "created", "--session-id", "ses-nope"], None),
        ("hook created, Copilot JSON on stdin", [*llmem, "hook", "--type", "created", "--format", "copilot"], start_payload),
        ("Claude SessionStart → created", [*llmem, *CLAUDE_HOOK, "created"], claude_start),
        ("Claude Stop → idle (no worker: detach)", [*llmem, *CLAUDE_HOOK, "idle"],
         claude_payload(claude, "Stop", stop_hook_active=False)),
        ("context --session-id (known)", [*llmem, "context", "--session-id", SESSION], None),
        ("context --compacting", [*llmem, "context", "--session-id", SESSION, "--compacting"], None),
        ("hook --type idle --detach (returns)", [*llmem, "hook", "--type", "idle", "--session-id", SESSION, "--detach"], None),
    ]
    print(f"\nfresh-process latency, {runs} runs each (ms)")
    print(f"{'command':<42} {'p50':>7} {'p95':>7} {'min':>7}")
    for label, args, stdin in cases:
        time_command(args, 1, env, stdin)  # warm the page cache and .pyc files
        timings = time_command(args, runs, env, stdin)
        print(f"{label:<42} {statistics.median(timings):7.1f} {percentile(timings, 0.95):7.1f} {min(timings):7.1f}")
    time.sleep(1.0)  # let detached idle runs finish before the store is measured again
    # With a worker alive (its heartbeat in the store), idle hooks only record and enqueue.
    subprocess.run([*llmem[:-2], "-c", "from llmem.app import App; from llmem.pipeline.events import worker_heartbeat; "
                    "a = App(); worker_heartbeat(a.store); a.close()"], env=env, check=True)
    timings = []
    for i in range(runs + 1):  # a new session each time, so every run records and enqueues
        started = time.perf_counter()
        subprocess.run([*llmem, "hook", "--type", "idle", "--session-id", f"ses_bench{i}"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        timings.append((time.perf_counter() - started) * 1000)
    timings = timings[1:]  # the first run warms the page cache
    label = "hook --type idle (worker alive: enqueue)"
    print(f"{label:<42} {statistics.median(timings):7.1f} {percentile(timings, 0.95):7.1f} {min(timings):7.1f}")
    timings = []
    for _ in range(runs + 1):  # a new session id each time: every Stop records and enqueues
        claude.id = str(uuid.uuid4())
        payload = claude_payload(claude, "Stop", stop_hook_active=False)
        started = time.perf_counter()
        subprocess.run([*llmem, *CLAUDE_HOOK, "idle"], input=payload, text=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        timings.append((time.perf_counter() - started) * 1000)
    timings = timings[1:]
    label = "Claude Stop → idle (worker alive: enqueue)"
    print(f"{label:<42} {statistics.median(timings):7.1f} {percentile(timings, 0.95):7.1f} {min(timings):7.1f}")
    # PreCompact in a session with a transcript: Claude Code ignores the answer, so only the
    # event is recorded; the text format (OpenCode's plugin) also builds the compaction block.
    compacted = ClaudeSession(claude.config_dir, cwd=PROJECT)
    compacted.turn("Why does test_list_orders_paginates fail intermittently? The cursor ordering "
                   "looks wrong when created_at ties.", "The sort key is not unique.")
    payload = claude_payload(compacted, "PreCompact", trigger="auto")
    for label, fmt in (("Claude PreCompact → compacting (enqueue)", "claude"),
                       ("same, --format text (+ compaction block)", "text")):
        timings = []
        for _ in range(runs + 1):
            started = time.perf_counter()
            subprocess.run([*llmem, "hook", "--adapter", "claude", "--format", fmt, "--type", "compacting"],
                           input=payload, text=True, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            timings.append((time.perf_counter() - started) * 1000)
        timings = timings[1:]
        print(f"{label:<42} {statistics.median(timings):7.1f} {percentile(timings, 0.95):7.1f} {min(timings):7.1f}")


def bench_mcp(searches: int, env: dict) -> None:
    """`llmem mcp` through the SDK's own client: spawn to the first search result, then warm
    round trips (the store, embedder and vectors stay open in the server)."""
    from mcp_client import McpClient

    queries = [" ".join(random.Random(i).choices(WORDS, k=3)) for i in range(searches + 1)]
    timings = []
    with open(os.devnull, "w") as errlog:
        started = time.perf_counter()
        client = McpClient(env, errlog=errlog).start()
        try:
            initialised = time.perf_counter()
            client.text("search", query=queries[0], project=PROJECT)
            first = time.perf_counter()
            for query in queries[1:]:
                call_started = time.perf_counter()
                client.text("search", query=query, project=PROJECT)
                timings.append((time.perf_counter() - call_started) * 1000)
        finally:
            client.close()
    print(f"\nMCP search round trip (llmem mcp over stdio, SDK client), {searches} warm searches (ms)")
    print(f"  spawn → initialised {(initialised - started) * 1000:7.1f}; → first search result "
          f"{(first - started) * 1000:7.1f} (the call itself {(first - initialised) * 1000:.1f})")
    print(f"  warm search: p50 {statistics.median(timings):.1f}, p95 {percentile(timings, 0.95):.1f}, "
          f"min {min(timings):.1f}")


def bench_extraction(messages: int, state_dir: Path) -> None:
    from llmem.app import App

    try:
        from llmem.capture.extract import extract_session
    except ImportError:
        print("\nllmem.extract is not there yet: extraction overhead not measured")
        return
    writer = copilot_session(state_dir, BIG_SESSION, cwd=PROJECT)
    rng = random.Random(7)
    for i in range(messages // 2):
        writer.user(f"Step {i}: please look at module_{i}.py; " + " ".join(rng.choices(WORDS, k=20)))
        tools = [{"name": "bash", "arguments": {"command": f"pytest tests/test_{i}.py"},
                  "output": "12 passed in 0.4s"}] if i % 3 == 0 else []
        writer.assistant(f"Looked at module_{i}.py. " + " ".join(rng.choices(WORDS, k=30)), tools)

    def stub_llm() -> StubLLM:
        return StubLLM(lambda n: {"memories": [{"type": "fact", "content": f"Chunk {n} covers modules and tests."}]})

    app = App()
    _ = app.store  # open and migrate outside the timing
    started = time.perf_counter()
    report = extract_session(app, BIG_SESSION, llm=stub_llm())
    outside = time.perf_counter() - started  # the stub answers at once: all of it is outside the LLM
    print(f"\nextraction, {report.messages_read} messages, {report.chunks} chunks, stub LLM "
          f"({report.memories_added} added)")
    print(f"  outside the LLM: {outside * 1000:.0f} ms total, "
          f"{outside * 1e6 / max(report.messages_read, 1):.0f} µs per message")
    started = time.perf_counter()
    again = extract_session(app, BIG_SESSION, llm=stub_llm())
    print(f"  second run (cursor at the end, {again.messages_read} new): "
          f"{(time.perf_counter() - started) * 1000:.0f} ms")
    try:
        from llmem.capture.introspect import introspect_session

        started = time.perf_counter()
        found = introspect_session(app, BIG_SESSION, use_llm=False)
        print(f"  introspection (heuristics, no LLM): {(time.perf_counter() - started) * 1000:.0f} ms, "
              f"{len(found)} self_assessments")
    except ImportError:
        pass
    app.close()


# ---- --table: every agent's per-turn hooks, with and without a resident llmem ----------------

def seed_bulk(count: int, rng: random.Random) -> None:
    """`count` memories in bulk (Store.add_many), with vectors under the built-in embedder's
    identity: random unit vectors, so seeding 30k does not take the model 30k embeddings."""
    import numpy as np

    from llmem.app import App
    from llmem.vectors import embed_pending

    app = App()
    store = app.store
    groups: dict[tuple[str, str | None], list] = {}
    for i in range(count):
        kind = TYPES[i % len(TYPES)]
        text = f"{kind} {i}: " + " ".join(rng.choices(WORDS, k=rng.randint(8, 40)))
        project = rng.choice([PROJECT, None, "/home/dev/other", "/home/dev/third"])
        meta = {"category": rng.choice(CATEGORIES), "recurring": "no"} if kind == "self_assessment" else {}
        groups.setdefault((kind, project), []).append((text, meta, "user"))
    with store.db.atomic():
        for (kind, project), items in groups.items():
            store.add_many(items, kind, confidence=0.8, source="import", project=project, session_id=None)
    embedder = app.embedder
    vectors = np.random.default_rng(1)

    def random_vectors(texts):
        return vectors.standard_normal((len(texts), 384)).astype(np.float32).tolist()

    embedder._embed = random_vectors  # the real model answers the hooks' queries, not the seeding
    embedded = embed_pending(store, embedder, batch=512)
    app.close()
    print(f"store: {count} memories ({embedded} vectors under {embedder.identity})")


def agent_hooks(claude: ClaudeSession, codex_session: str) -> list[tuple[str, list[str], str | None]]:
    """(label, argv after `llmem`, stdin) of each agent's per-turn hooks (setup/agents.py,
    setup/integrations.py), SessionStart first."""
    def claude_json(event, **extra):
        return claude_payload(claude, event, **extra)

    def codex_json(event, **extra):
        return json.dumps({"session_id": codex_session, "cwd": PROJECT, "hook_event_name": event, **extra})

    copilot_json = json.dumps({"sessionId": SESSION, "cwd": PROJECT, "source": "new"})
    claude_hook = ["hook", "--adapter", "claude", "--format", "claude", "--type"]
    codex_hook = ["hook", "--adapter", "codex", "--format", "codex", "--type"]
    copilot_hook = ["--adapter", "copilot", "--format", "copilot"]
    notify = json.dumps({"type": "agent-turn-complete", "thread-id": codex_session, "turn-id": "t1",
                         "cwd": PROJECT, "input-messages": ["hi"], "last-assistant-message": "done"})
    return [
        ("Claude SessionStart", [*claude_hook, "created"], claude_json("SessionStart", source="startup")),
        ("Claude Stop", [*claude_hook, "idle"], claude_json("Stop", stop_hook_active=False)),
        ("Claude PreCompact", [*claude_hook, "compacting"], claude_json("PreCompact", trigger="auto")),
        ("Codex SessionStart", [*codex_hook, "created"], codex_json("SessionStart", source="startup")),
        ("Codex Stop", [*codex_hook, "idle"], codex_json("Stop", stop_hook_active=False)),
        ("Codex PreCompact", [*codex_hook, "compacting"], codex_json("PreCompact", trigger="auto")),
        ("Codex notify", ["hook", "--adapter", "codex", "--type", "idle", notify], None),
        ("Copilot sessionStart", ["hook", "--type", "created", *copilot_hook], copilot_json),
        ("Copilot agentStop", ["hook", "--type", "idle", *copilot_hook], copilot_json),
        ("Copilot preCompact", ["hook", "--type", "compacting", *copilot_hook], copilot_json),
        # OpenCode's plugin (integrations.py): the context once per session, idle per turn, the
        # compaction block read from the text format. Its session is read from a Copilot store here.
        ("OpenCode context (session start)", ["context", "--session-id", SESSION, "--adapter", "copilot",
                                              "--project", PROJECT], None),
        ("OpenCode session.idle", ["hook", "--type", "idle", "--session-id", SESSION, "--adapter", "copilot"],
         None),
        ("OpenCode compacting (+ block)", ["hook", "--type", "compacting", "--session-id", SESSION,
                                           "--adapter", "copilot", "--project", PROJECT], None),
    ]


def bench_table(sizes: list[int], runs: int) -> None:
    from llmem.app import App
    from llmem.cli.resident import Resident
    from llmem.pipeline.events import worker_heartbeat

    llmem = [str(Path(sys.executable).with_name("llmem"))]  # the console script the hooks run
    table: dict[tuple[str, int, str], float] = {}
    floors: dict[tuple[int, str], float] = {}
    cpu_table: dict[tuple[str, int, str], float] = {}
    cpu_floors: dict[tuple[int, str], float] = {}
    labels: list[str] = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="llmem-bench-table-") as tmp:
            home = Path(tmp) / "home"
            home.mkdir()
            state_dir = Path(tmp) / "session-state"
            claude_dir = Path(tmp) / "claude"
            os.environ["LLMEM_HOME"] = str(home)
            (home / "config.yaml").write_text(
                "embedding:\n  provider: builtin\nllm:\n  provider: none\n"
                f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
                f"  claude:\n    config_dir: {claude_dir}\n  codex:\n    home: {Path(tmp) / 'codex'}\n")
            start = copilot_session(state_dir, SESSION, cwd=PROJECT)
            start.user("Why does test_list_orders_paginates fail intermittently? The cursor ordering "
                       "looks wrong when created_at ties.")
            claude = ClaudeSession(claude_dir, cwd=PROJECT)
            claude.turn("Why does test_list_orders_paginates fail intermittently? The cursor ordering "
                        "looks wrong when created_at ties.", "The sort key is not unique.")
            seed_bulk(size, random.Random(size))
            env = dict(os.environ)
            cases = agent_hooks(claude, str(uuid.uuid4()))
            labels = [label for label, _, _ in cases]
            host = App()
            worker_heartbeat(host.store)  # a worker is alive: Stop only records and enqueues
            for mode in ("without", "with"):
                resident = Resident(host).start() if mode == "with" else None
                if mode == "with":
                    assert resident is not None
                    time.sleep(2.0)  # it opens the store and loads the model before it answers
                floor = [sys.executable, "-c", "pass"]
                time_command(floor, 2, env)
                floor_times, floor_cpu = [], []
                for label, args, stdin in cases:
                    time_command([*llmem, *args], 1, env, stdin)  # warm the page cache and .pyc files
                    timings, cpu = [], []
                    for _ in range(runs):  # the floor interleaved: the machine's load moves
                        floor_times += time_command(floor, 1, env, cpu=floor_cpu)
                        timings += time_command([*llmem, *args], 1, env, stdin, cpu=cpu)
                    table[label, size, mode] = statistics.median(timings)
                    cpu_table[label, size, mode] = statistics.median(cpu)
                floors[size, mode] = statistics.median(floor_times)
                cpu_floors[size, mode] = statistics.median(floor_cpu)
                if resident is not None:
                    resident.stop()
            host.close()
    print(f"\nper-turn hooks, p50 of {runs} fresh processes (ms, and × `python -c pass` of the same run)")
    header = f"{'hook':<34}" + "".join(f" {f'{size // 1000}k {mode}':>17}" for size in sizes
                                       for mode in ("without", "with"))
    print(header)
    for label in labels:
        cells = "".join(f" {table[label, size, mode]:7.1f} ({table[label, size, mode] / floors[size, mode]:4.1f}×)"
                        for size in sizes for mode in ("without", "with"))
        print(f"{label:<34}{cells}")
    print(f"{'python -c pass (floor)':<34}" + "".join(f" {floors[size, mode]:7.1f} (1.0×)   "
                                                       for size in sizes for mode in ("without", "with")))
    print("\nthe same runs' CPU (user+sys ms of the hook process, and × that of `python -c pass`)")
    print(header)
    for label in labels:
        cells = "".join(f" {cpu_table[label, size, mode]:7.1f} ({cpu_table[label, size, mode] / cpu_floors[size, mode]:4.1f}×)"
                        for size in sizes for mode in ("without", "with"))
        print(f"{label:<34}{cells}")
    print(f"{'python -c pass (floor)':<34}" + "".join(f" {cpu_floors[size, mode]:7.1f} (1.0×)   "
                                                       for size in sizes for mode in ("without", "with")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--mcp-searches", type=int, default=50)
    parser.add_argument("--fake-embedder", action="store_true",
                        help="embed through the fake Ollama on 127.0.0.1 (hybrid search path)")
    parser.add_argument("--builtin-embedder", action="store_true",
                        help="embed in-process with the built-in ONNX model (the default install)")
    parser.add_argument("--table", action="store_true",
                        help="every agent's per-turn hooks at --sizes, with and without a resident llmem")
    parser.add_argument("--sizes", default="3000,30000", help="store sizes for --table")
    args = parser.parse_args()
    if args.table:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ.pop("LLMEM_CONFIG", None)
        os.environ.pop("CLAUDE_CONFIG_DIR", None)
        os.environ.pop("CODEX_HOME", None)
        with tempfile.TemporaryDirectory(prefix="llmem-bench-pycache-") as cache:
            os.environ["PYTHONPYCACHEPREFIX"] = cache
            bench_table([int(size) for size in args.sizes.split(",")], args.runs)
        return

    with tempfile.TemporaryDirectory(prefix="llmem-bench-hooks-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        state_dir = Path(tmp) / "session-state"
        os.environ["LLMEM_HOME"] = str(home)
        # Fresh processes should load cached bytecode as an installed llmem does; keep the
        # cache out of the source tree.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        os.environ.pop("LLMEM_CONFIG", None)
        os.environ.pop("CLAUDE_CONFIG_DIR", None)  # the sessions measured are the ones written here
        server = None
        embedding = "embedding:\n  provider: none\n"
        if args.builtin_embedder:
            embedding = "embedding:\n  provider: builtin\n"
        if args.fake_embedder:
            from fakes import FakeModelServer

            server = FakeModelServer().start()
            embedding = f"embedding:\n  provider: ollama\n  base_url: {server.url}\n"
        claude_dir = Path(tmp) / "claude"
        (home / "config.yaml").write_text(
            embedding + "llm:\n  provider: none\n"
            f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
            f"  claude:\n    config_dir: {claude_dir}\n")
        start = copilot_session(state_dir, SESSION, cwd=PROJECT)
        start.user("Why does test_list_orders_paginates fail intermittently? The cursor ordering "
                   "looks wrong when created_at ties.")
        try:
            seed_store(args.memories, random.Random(1))
            claude = ClaudeSession(claude_dir, cwd=PROJECT)
            claude.turn("Why does test_list_orders_paginates fail intermittently? The cursor ordering "
                        "looks wrong when created_at ties.", "The sort key is not unique.")
            bench_processes(args.runs, dict(os.environ), claude)
            bench_mcp(args.mcp_searches, dict(os.environ))
            bench_extraction(args.messages, state_dir)
        finally:
            if server:
                server.stop()


if __name__ == "__main__":
    main()
