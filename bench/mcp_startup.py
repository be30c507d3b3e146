#!/usr/bin/env python3
"""`llmem mcp` start-up and search, through the MCP SDK's own stdio client: spawn → initialised →
first search result, at each store size, beside `python -c pass` measured in the same run (the
start-up floor); then warm search round trips with the tool's options, beside the same search
run in-process on the same store (the warm floor: the Searcher alone, without the protocol).
Both paths: "in-process" (nothing resident: the spawned process serves the session) and
"relayed" (a `llmem worker` is alive: the spawned process relays the session to its resident,
hookclient.relay_mcp); the relayed rows' CPU adds the worker's share to the relay's own.

The store holds `--sizes` memories with vectors under the built-in embedder's identity (random
unit vectors: seeding does not embed 100k texts; the real model embeds every query). Prints
figures; it is not a test. Everything lives in a temporary LLMEM_HOME, or in `--home` (kept:
build once, measure again). Example:
    python bench/mcp_startup.py --sizes 10000,100000 --spawns 5
    python bench/mcp_startup.py --home /tmp/llmem-100k --spawns 9
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from hooks import PROJECT, WORDS, seed_bulk  # noqa: E402
from mcp_client import McpClient  # noqa: E402


def prepare(home: Path, size: int) -> None:
    """A home with `size` memories (kept as it is when it holds a store already)."""
    home.mkdir(parents=True, exist_ok=True)
    os.environ["LLMEM_HOME"] = str(home)
    if (home / "memory.db").exists():
        print(f"store: reusing {home}")
        return
    (home / "config.yaml").write_text("embedding:\n  provider: builtin\nllm:\n  provider: none\n")
    started = time.perf_counter()
    seed_bulk(size, random.Random(size))
    print(f"  built in {time.perf_counter() - started:.0f} s")


def floor_ms() -> tuple[float, float]:
    """(wall ms, CPU ms) of one `python -c pass`."""
    cpu = children_cpu_ms()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - started) * 1000, children_cpu_ms() - cpu


def children_cpu_ms() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (used.ru_utime + used.ru_stime) * 1000


def process_cpu_ms(pid: int | None) -> float:
    """user+sys ms of a running process (0 for None)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def spawn_to_first(query: str, env: dict, host_pid: int | None = None) -> tuple[float, float, float]:
    """(ms to initialised, ms to the first search result, from the spawn; and the CPU ms the
    server used in all, from its start to its exit after that one search, with the host's
    share when a host serves it)."""
    with open(os.devnull, "w") as errlog:
        cpu = children_cpu_ms() + process_cpu_ms(host_pid)
        started = time.perf_counter()
        client = McpClient(env, errlog=errlog).start()
        try:
            initialised = time.perf_counter()
            client.text("search", query=query, project=PROJECT)
            first = time.perf_counter()
        finally:
            client.close()
    return ((initialised - started) * 1000, (first - started) * 1000,
            children_cpu_ms() + process_cpu_ms(host_pid) - cpu)


def warm_searches(queries: list[str], env: dict, tools) -> tuple[list[float], list[float]]:
    """Warm search round trips through the server, each followed by the same search run by
    `tools` in this process (mcp_server.MemoryTools.search: the tool's options and recalls
    without the protocol, the floor a warm MCP search is measured against), interleaved so
    that both meet the same load."""
    with open(os.devnull, "w") as errlog:
        client = McpClient(env, errlog=errlog).start()
        try:
            client.text("search", query="warm up", project=PROJECT)
            tools.search("warm up", project=PROJECT)
            timings, local = [], []
            for query in queries:
                started = time.perf_counter()
                client.text("search", query=query, project=PROJECT)
                timings.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                tools.search(query, project=PROJECT)
                local.append((time.perf_counter() - started) * 1000)
        finally:
            client.close()
    return timings, local


def start_worker(env: dict) -> subprocess.Popen:
    """`llmem worker`, once its resident takes MCP sessions (the SDK imported, the model loaded)."""
    from llmem import hookclient

    worker = subprocess.Popen([sys.executable, "-m", "llmem", "worker"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while hookclient.connect() is None:
        if time.monotonic() > deadline or worker.poll() is not None:
            raise RuntimeError("llmem worker did not start its resident")
        time.sleep(0.05)
    return worker


def path_rows(path: str, queries: list[str], spawns: int, env: dict, host_pid: int | None, tools) -> dict:
    spawn_to_first(queries[0], env, host_pid)  # page cache, .pyc files; the host's SDK import
    floors, floor_cpus, inits, firsts, cpus = [], [], [], [], []
    for n in range(spawns):  # the floor interleaved: the machine's load moves
        wall, cpu = floor_ms()
        floors.append(wall)
        floor_cpus.append(cpu)
        initialised, first, cpu = spawn_to_first(queries[n], env, host_pid)
        inits.append(initialised)
        firsts.append(first)
        cpus.append(cpu)
    warm, local = warm_searches(queries[spawns:], env, tools)
    return {"path": path, "floor": statistics.median(floors), "init": statistics.median(inits),
            "first": statistics.median(firsts), "warm": statistics.median(warm),
            "local": statistics.median(local),
            "cpu": statistics.median(cpus), "floor_cpu": statistics.median(floor_cpus)}


def measure(size: int, spawns: int, searches: int) -> list[dict]:
    env = dict(os.environ)
    rng = random.Random(7)
    queries = [" ".join(rng.choices(WORDS, k=3)) for _ in range(spawns + searches)]
    from llmem.app import App
    from llmem.mcp_server import MemoryTools

    tools = MemoryTools(App(), default_project=PROJECT)
    try:
        rows = [path_rows("in-process", queries, spawns, env, None, tools)]
        worker = start_worker(env)
        try:
            rows.append(path_rows("relayed", queries, spawns, env, worker.pid, tools))
        finally:
            worker.send_signal(signal.SIGINT)
            worker.wait(60)
    finally:
        tools.close()
    for row in rows:
        row["size"] = size
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--home", action="append", default=[],
                        help="an LLMEM_HOME to build in or reuse (one per size, in order)")
    parser.add_argument("--spawns", type=int, default=5)
    parser.add_argument("--searches", type=int, default=30)
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    for name in ("LLMEM_CONFIG", "CLAUDE_CONFIG_DIR", "CODEX_HOME"):
        os.environ.pop(name, None)
    sizes = [int(size) for size in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmem-bench-mcp-") as tmp:
        os.environ.setdefault("PYTHONPYCACHEPREFIX", str(Path(tmp) / "pycache"))
        for index, size in enumerate(sizes):
            home = Path(args.home[index]) if index < len(args.home) else Path(tmp) / f"home-{size}"
            prepare(home, size)
            rows += measure(size, args.spawns, args.searches)
    print(f"\nllmem mcp over stdio (SDK client): p50 of {args.spawns} spawns, {args.searches} warm searches (ms); "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'memories':>9} {'path':>10} {'python -c pass':>15} {'→ initialised':>20} {'→ first result':>20} "
          f"{'warm search':>12} {'in-process':>11} {'warm ×':>7}")
    for row in rows:
        print(f"{row['size']:>9} {row['path']:>10} {row['floor']:>15.1f} {row['init']:>11.1f} ({row['init'] / row['floor']:4.1f}×) "
              f"{row['first']:>11.1f} ({row['first'] / row['floor']:4.1f}×) {row['warm']:>12.1f} "
              f"{row['local']:>11.1f} {row['warm'] / row['local']:>6.2f}×")
    print("\nCPU of the server from its start to its exit after the first result (user+sys ms), "
          "beside `python -c pass`'s")
    for row in rows:
        print(f"{row['size']:>9} {row['path']:>10} {row['floor_cpu']:>15.1f} {row['cpu']:>11.1f} "
              f"({row['cpu'] / row['floor_cpu']:4.1f}×)")


if __name__ == "__main__":
    main()
