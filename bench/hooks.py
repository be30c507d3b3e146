#!/usr/bin/env python3
"""Hook latency: fresh-process `llmem hook --type created` and `llmem context` (Copilot and Claude
Code hook forms), an MCP search round trip (`llmem mcp`: first result from spawn, then warm), and
extraction overhead on a 2,000-message transcript with a stub LLM (time outside the LLM).

Prints figures; it is not a test. Everything lives in a temporary LLMEM_HOME. Example:
    python bench/hooks.py
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


def time_command(args: list[str], runs: int, env: dict, stdin: str | None = None) -> list[float]:
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, timeout=120)
        timings.append((time.perf_counter() - started) * 1000)
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
    args = parser.parse_args()

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
