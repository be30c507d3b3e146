#!/usr/bin/env python3
"""Pipeline throughput: Copilot sessions written → watcher → queue → worker → memories.

Prints events per second end to end, detect-to-enqueue latency, RSS of the watcher and the
worker, and the watcher's CPU while nothing happens. Example:
    python bench/pipeline.py --sessions 200 --workers 4
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakes import FakeModelServer  # noqa: E402
from session_writers import CopilotSession  # noqa: E402

LLMEM = [sys.executable, "-m", "llmem"]


def write_session(state: Path, i: int) -> str:
    """A Copilot session with one finished turn, written at once (no agent holds it)."""
    session = CopilotSession(state, cwd=f"/work/repo{i % 7}")
    session.start(locked=False)
    session.turn(f"remember that service {i} listens on port {9000 + i}", "noted")
    return session.id


def rss_mb(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="llmem-bench-pipeline-"))
    state = home / "copilot" / "session-state"
    state.mkdir(parents=True)
    server = FakeModelServer().start()
    server.chat_replies = []  # every chat gets "{}" → validated, retried once, heuristics
    (home / "config.yaml").write_text(
        f"embedding:\n  provider: ollama\n  base_url: {server.url}\n"
        f"llm:\n  provider: ollama\n  base_url: {server.url}\n"
        f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n"
        f"  opencode:\n    data_dir: {home / 'none'}\n"
        "pipeline:\n  idle_debounce_seconds: 0.2\n  min_extraction_interval_seconds: 0\n")
    env = {**os.environ, "LLMEM_HOME": str(home)}
    subprocess.run([*LLMEM, "init"], env=env, check=True, capture_output=True)
    watcher = subprocess.Popen([*LLMEM, "watch"], env=env, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*LLMEM, "worker", "-w", str(args.workers)], env=env, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)
        print(f"llmem pipeline benchmark: {args.sessions} Copilot sessions, {args.workers} workers, home {home}")
        print(f"  RSS at rest: watcher {rss_mb(watcher.pid):.0f} MB, worker {rss_mb(worker.pid):.0f} MB")
        written: dict[str, float] = {}
        start = time.time()
        for i in range(args.sessions):
            written[write_session(state, i)] = time.time()
        db = sqlite3.connect(home / "memory.db", timeout=10)
        while True:
            done = db.execute("SELECT COUNT(*) FROM event WHERE kind = 'idle' AND status = 'done'").fetchone()[0]
            if done >= args.sessions or time.time() - start > 600:
                break
            time.sleep(0.2)
        elapsed = time.time() - start
        rows = db.execute("SELECT session_id, MIN(detected_at) FROM event GROUP BY session_id").fetchall()
        latency = [(detected - written[sid]) * 1000 for sid, detected in rows if sid in written]
        finished = db.execute("SELECT MAX(finished_at) FROM event").fetchone()[0]
        memories = db.execute("SELECT COUNT(*) FROM memory").fetchone()[0]
        total_events = db.execute("SELECT COUNT(*) FROM event").fetchone()[0]
        print(f"  {done} idle events done ({total_events} events in all) in {elapsed:.1f} s: "
              f"{total_events / max(finished - start, 1e-9):.1f} events/s end to end, {memories} memories")
        if latency:
            latency.sort()
            print(f"  detect-to-enqueue (file written → event row): p50 {statistics.median(latency):.0f} ms, "
                  f"p95 {latency[int(0.95 * (len(latency) - 1))]:.0f} ms")
        print(f"  RSS after load: watcher {rss_mb(watcher.pid):.0f} MB, worker {rss_mb(worker.pid):.0f} MB")
        before = cpu_seconds(watcher.pid)
        time.sleep(args.idle_seconds)
        used = cpu_seconds(watcher.pid) - before
        print(f"  watcher CPU while idle: {100 * used / args.idle_seconds:.2f} % of one core "
              f"({used:.2f} s over {args.idle_seconds:.0f} s)")
    finally:
        for process in (watcher, worker):
            process.send_signal(signal.SIGINT)
        for process in (watcher, worker):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        server.stop()


if __name__ == "__main__":
    main()
