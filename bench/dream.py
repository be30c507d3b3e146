#!/usr/bin/env python3
"""Dream phases at scale: time and peak memory of light, REM and deep.

Prints figures; it is not a test. Builds a store of N memories with D-dimensional unit
vectors (random, so unrelated) of which the last M are "new" since the previous run; one in
ten new memories is a near-duplicate of an old one, so light has pairs to find and deep has
merges to make. Old memories are spread over the last 200 days (most are idle, so deep
decays them), some carry user recalls (promotion candidates) and a few hundred are
self_assessments (REM insights). Example:
    python bench/dream.py --memories 100000 --new 1000
    python bench/dream.py --memories 100000 --new 1000 --apply   # also time the applied sweep
    python bench/dream.py --memories 1000000 --apply --store /tmp/dream-1m.db   # built once, then reused
    python bench/dream.py --memories 100000 --apply --no-trace --repeat 3   # p50 of 3 applied rounds

A store built with --store is kept there and reused by the next run with the same --store (a
1M build takes ~10 minutes): each run works on a copy of it, so every run finds the same store.
The build also writes the store's vector file, as `llmem embed` leaves it.

Each phase is timed once without tracing (the time figure) and once under tracemalloc (the
peak figure: Python objects and numpy buffers allocated during the phase).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llmem  # noqa: E402,F401 - first, as in llmem's own processes: it sets numpy's BLAS threads

# isort: split
import numpy as np  # noqa: E402

from llmem.config import Config  # noqa: E402
from llmem.db import packed_text, vector_file  # noqa: E402
from llmem.db.derived import text_hash  # noqa: E402
from llmem.db.fts import identifier_hints  # noqa: E402
from llmem.db.settings import set_setting  # noqa: E402
from llmem.dream.deep import plan_deep  # noqa: E402
from llmem.dream.journal import undo_run  # noqa: E402
from llmem.dream.light import find_candidates  # noqa: E402
from llmem.dream.rem import plan_rem  # noqa: E402
from llmem.dream.sweep import run_dream  # noqa: E402
from llmem.paths import default_paths  # noqa: E402
from llmem.store import Store, content_hash  # noqa: E402

DAY = 86400.0
MODEL = "bench:random"
WORDS = ["deploy", "release", "cache", "index", "vector", "query", "schema", "migration", "token", "session", "worker", "queue", "lock", "journal", "report", "config", "embed", "search", "merge", "promote", "decay", "boost", "project", "module", "test", "handler", "request", "response", "parser", "adapter", "transcript", "memory", "store", "sqlite", "numpy"]
CATEGORIES = ("NULL_SAFETY", "ERROR_HANDLING", "EDGE_CASE", "MISSING_VERIFICATION", "PERFORMANCE")


def build(path: Path, n: int, new: int, dim: int, seed: int = 7) -> float:
    """Write the synthetic store; return the time of the 'previous run' (the light watermark)."""
    rng = np.random.default_rng(seed)
    rnd = random.Random(seed)
    store = Store.open(path, vec_enabled=False)
    db = store.db
    at = time.time()
    watermark = at - 3600
    old = n - new
    types = ["self_assessment" if i % 300 == 0 else rnd.choice(("fact", "decision", "procedure", "event"))
             for i in range(n)]
    old_facts = [i for i in range(old) if types[i] == "fact"]
    vectors = rng.standard_normal((n, dim), dtype=np.float32)
    for i in range(old, old + new // 10):  # near-duplicates of old facts (same type and scope)
        types[i] = "fact"
        vectors[i] = vectors[rnd.choice(old_facts)] + 0.15 * rng.standard_normal(dim, dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    memory_rows, embedding_rows = [], []
    for i in range(n):
        is_new = i >= old
        created = watermark + 60 + i - old if is_new else at - rnd.uniform(1, 200) * DAY
        mtype = types[i]
        words = " ".join(rnd.choice(WORDS) for _ in range(12))
        if mtype == "self_assessment":
            content = f"Category: {rnd.choice(CATEGORIES)}\nWhat_happened: {words} #{i}\nIteration_count: {rnd.randint(1, 4)}"
            created = at - rnd.uniform(0, 25) * DAY if not is_new else created
        else:
            content = f"{words} #{i}"
        memory_id = str(uuid.uuid4())
        # No summary, no metadata: the embedded text is the content.
        memory_rows.append((i + 1, memory_id, mtype, content, identifier_hints(content), 0.7, "extraction",
                            None, "{}", content_hash(content), text_hash(content), created, created, 0, 1, "agent",
                            "private"))
        embedding_rows.append((memory_id, MODEL, dim, vectors[i].tobytes(), text_hash(content),
                               created if not is_new else watermark + 60))
    with db.atomic():
        db.cursor().executemany(
            "INSERT INTO memory(seq, id, type, content, hints, confidence, source, project, metadata,"
            " content_hash, embed_hash, created_at, updated_at, access_count, version, trust, visibility)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            memory_rows)
        db.cursor().executemany(
            "INSERT INTO embedding(memory_id, model, dim, vector, content_hash, created_at) VALUES (?,?,?,?,?,?)",
            embedding_rows)
        set_setting(db, "vec_model", MODEL)
        set_setting(db, "vec_dim", str(dim))
        set_setting(db, "vec_dirty", "1")
        # Recalls for promotion: 2 000 memories, 1–8 user recalls each over a few days.
        recalls = []
        for _ in range(2000):
            memory_id = memory_rows[rnd.randrange(old)][1]
            for k in range(rnd.randint(1, 8)):
                recalls.append((memory_id, f"q{rnd.randrange(50)}", 1, rnd.uniform(0.3, 1.0),
                                rnd.choice(("search", "search", "context")), at - rnd.uniform(0, 10) * DAY - k))
        db.cursor().executemany(
            "INSERT INTO recall_event(memory_id, query_hash, rank, score, origin, created_at) VALUES (?,?,?,?,?,?)",
            recalls)
        db.execute_sql("INSERT INTO dream_run(id, kind, phases, status, started_at, finished_at, summary) "
                       "VALUES ('benchprevious', 'dream', 'light,rem,deep', 'done', ?, ?, '{}')",
                       (watermark, watermark + 1))
    vector_file.index_for(db, MODEL, dim)  # the file `llmem embed` leaves beside the store
    store.close()
    return watermark


def reuse(built: Path, path: Path, n: int, dim: int) -> float:
    """Copy a store built by an earlier run (with its vector file) to `path`; return its
    watermark. Refuses a store built with other sizes (--new is not checked: it is the store's)."""
    store = Store.open(built, vec_enabled=False)
    count = store.db.execute_sql("SELECT COUNT(*) FROM memory").fetchone()[0]
    held = store.db.execute_sql("SELECT dim FROM embedding LIMIT 1").fetchone()[0]
    watermark = store.db.execute_sql("SELECT started_at FROM dream_run WHERE id = 'benchprevious'").fetchone()[0]
    store.close()
    if (count, held) != (n, dim):
        sys.exit(f"{built} holds {count} memories of dim {held}: not --memories {n} --dim {dim}; "
                 "give another --store")
    shutil.copy(built, path)
    shutil.copy(built.with_suffix(vector_file.SUFFIX), path.with_suffix(vector_file.SUFFIX))
    return watermark


DERIVED = ("hints", "embed_hash", "content_hash", "version")


def journaled_floor(applied_db, floor_path: Path, run_id: str) -> dict[str, tuple[float, float]]:
    """The run's memory updates done the fastest way SQLite can, on a copy of the store taken
    before the run, as (wall, CPU) seconds, plus "rows":
      apply        one executemany UPDATE per shape of the changed (non-derived) columns plus
                   one executemany INSERT of journal rows holding the old and new values, in
                   one transaction, every value precomputed;
      apply_read   reading the old values those journal rows hold (SELECT … WHERE id IN (…),
                   500 ids a query): a journaled change cannot be made without them;
      undo         the old values put back the same way, precomputed;
      undo_read    reading the run's before-images from the journal, where undo finds them.
    The honest floor of a journaled apply is apply + apply_read, of an undo undo + undo_read;
    the bare ones (without the reads) are printed beside them.
    Plain sqlite3, so it measures the same work whatever llmem version is under test."""

    updates = [(memory_id, {k: v for k, v in json.loads(after).items() if k not in DERIVED})
               for memory_id, after in applied_db.execute_sql(
                   "SELECT memory_id, after FROM dream_action WHERE run_id = ? AND op = 'update' ORDER BY id",
                   (run_id,))]
    conn = packed_text.connect(floor_path, isolation_level=None)  # its triggers call llmem_text
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA synchronous=normal")
    figures: dict[str, tuple[float, float]] = {}

    def clock(name, started, used):
        figures[name] = (time.perf_counter() - started, time.process_time() - used)

    # The old values of every column the run changed (one shape: a memory may have several updates).
    columns = sorted({name for _, after in updates for name in after})
    ids = list(dict.fromkeys(memory_id for memory_id, _ in updates))
    started, used = time.perf_counter(), time.process_time()
    old: dict[str, tuple] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        for row in conn.execute(f"SELECT id, {', '.join(columns)} FROM memory WHERE id IN ({', '.join('?' * len(chunk))})",
                                chunk):
            old[row[0]] = row[1:]
    clock("apply_read", started, used)
    shapes: dict[tuple, list] = {}
    journal, undo = [], {}
    for memory_id, after in updates:
        names = tuple(sorted(after))
        row = dict(zip(columns, old[memory_id], strict=True)) if memory_id in old else {}
        before = {n: row.get(n) for n in names}
        values = [json.dumps(after[n], sort_keys=True) if isinstance(after[n], dict) else after[n] for n in names]
        shapes.setdefault(names, []).append([*values, memory_id])
        undo.setdefault(names, []).append([*before.values(), memory_id])
        journal.append((run_id, "deep", "decay", "update", memory_id, json.dumps(before, sort_keys=True),
                        json.dumps(after, sort_keys=True), time.time()))
    started, used = time.perf_counter(), time.process_time()
    conn.execute("BEGIN IMMEDIATE")
    for names, rows in shapes.items():
        sets = ", ".join(f"{n} = ?" for n in names)
        conn.executemany(f"UPDATE memory SET {sets}, version = version + 1 WHERE id = ?", rows)
    conn.executemany("INSERT INTO dream_action(run_id, phase, kind, op, memory_id, before, after, created_at) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", journal)
    conn.execute("COMMIT")
    clock("apply", started, used)
    started, used = time.perf_counter(), time.process_time()
    conn.execute("SELECT memory_id, before FROM dream_action WHERE run_id = ? ORDER BY id DESC", (run_id,)).fetchall()
    clock("undo_read", started, used)
    started, used = time.perf_counter(), time.process_time()
    conn.execute("BEGIN IMMEDIATE")
    for names, rows in undo.items():
        sets = ", ".join(f"{n} = ?" for n in names)
        conn.executemany(f"UPDATE memory SET {sets}, version = version + 1 WHERE id = ?", rows)
    conn.execute("COMMIT")
    clock("undo", started, used)
    conn.close()
    figures["rows"] = (len(updates), len(updates))
    return figures


def make_config(home: Path) -> Config:
    paths = default_paths()
    paths = type(paths)(**{**vars(paths), "proposed_changes_path": home / "proposed-changes.md",
                           "memory_md_path": home / "MEMORY.md", "diary_path": home / "dream-diary.md"})
    return Config(paths=paths).with_values({"dream": {"auto_link_threshold": 0.85}})


CPU: dict[str, float] = {}  # label → CPU seconds of the untraced pass


def measure(label: str, fn, trace: bool):
    started, used = time.perf_counter(), time.process_time()
    result = fn()
    seconds = time.perf_counter() - started
    CPU[label] = time.process_time() - used
    peak = None
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
        fn()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    print(f"  {label:<28} {seconds:8.2f} s   CPU {CPU[label]:6.2f} s" + (f"   peak {peak:8.1f} MiB" if peak is not None else ""), flush=True)
    return result, seconds, peak


def applied_round(tmp: Path, pristine: Path, index: int, built_here: bool) -> dict[str, float]:
    """One applied sweep, its undo and their floors, on a copy of `pristine` (with its vector
    file) in a home of its own; prints them and returns the ratios to the floors."""
    db_path = tmp / f"round{index}.db"
    for source, target in ((pristine, db_path), (pristine, tmp / "floor.db")):
        shutil.copy(source, target)
        shutil.copy(source.with_suffix(vector_file.SUFFIX), target.with_suffix(vector_file.SUFFIX))
    config = make_config(tmp / f"home{index}")
    (tmp / f"home{index}").mkdir()
    store = Store.open(db_path)
    print(f"  round {index + 1} (load {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    started, used = time.perf_counter(), time.process_time()
    outcome = run_dream(store, config, apply=True, use_llm=False)
    total, total_cpu = time.perf_counter() - started, time.process_time() - used
    print(f"  applied sweep (journaled)    {total:8.2f} s   CPU {total_cpu:.2f} s   phases {json.dumps(outcome.phase_seconds)}")
    print(f"    actions {sum(sum(c.values()) for c in outcome.action_counts().values())}")
    print(f"  max RSS so far (the phases and the applied sweep{', and the build' if built_here else ''}) "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:8.0f} MiB", flush=True)
    started, used = time.perf_counter(), time.process_time()
    undone = undo_run(store, outcome.run_id)
    undo_seconds, undo_cpu = time.perf_counter() - started, time.process_time() - used
    print(f"  undo of that run             {undo_seconds:8.2f} s   CPU {undo_cpu:.2f} s   "
          f"({undone.restored} rows restored, {undone.deleted} removed)")
    floor = journaled_floor(store.db, tmp / "floor.db", outcome.run_id)
    store.close()
    rows = floor["rows"][0]
    apply_floor = tuple(a + b for a, b in zip(floor["apply"], floor["apply_read"], strict=True))
    undo_floor = tuple(a + b for a, b in zip(floor["undo"], floor["undo_read"], strict=True))
    print(f"  floor: {rows} journaled updates in {floor['apply'][0]:.2f} s (CPU {floor['apply'][1]:.2f} s) "
          f"+ reading their old values {floor['apply_read'][0]:.2f} s (CPU {floor['apply_read'][1]:.2f} s); "
          f"put back in {floor['undo'][0]:.2f} s (CPU {floor['undo'][1]:.2f} s) "
          f"+ reading the journal {floor['undo_read'][0]:.2f} s (CPU {floor['undo_read'][1]:.2f} s)")
    deep = outcome.phase_seconds.get("deep", 0.0)
    print(f"  deep phase (plan + apply)    {deep:8.2f} s   {deep / apply_floor[0]:6.2f}× the floor")
    print(f"  applied sweep, all phases    {total:8.2f} s   {total / apply_floor[0]:6.2f}× the floor, "
          f"CPU {total_cpu / apply_floor[1]:6.2f}× the floor's ({total_cpu / floor['apply'][1]:.2f}× the bare one's)")
    light_cpu = CPU.get("light (incremental)", 0.0)
    print(f"  sweep CPU but light's vector compare (a read: {light_cpu:.2f} s CPU planned alone) "
          f"{total_cpu - light_cpu:.2f} s   {(total_cpu - light_cpu) / apply_floor[1]:6.2f}× the floor's")
    print(f"  undo                         {undo_seconds:8.2f} s   {undo_seconds / undo_floor[0]:6.2f}× the floor, "
          f"CPU {undo_cpu / undo_floor[1]:6.2f}× the floor's ({undo_cpu / floor['undo'][1]:.2f}× the bare one's)")
    for path in (db_path, tmp / "floor.db"):  # a 1M store is gigabytes: one round's copies at a time
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), path.with_suffix(vector_file.SUFFIX)):
            leftover.unlink(missing_ok=True)
    return {"sweep": total / apply_floor[0], "sweep_cpu": total_cpu / apply_floor[1],
            "sweep_but_light_cpu": (total_cpu - light_cpu) / apply_floor[1],
            "undo": undo_seconds / undo_floor[0], "undo_cpu": undo_cpu / undo_floor[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--new", type=int, default=1_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--apply", action="store_true", help="also time an applied sweep (journaled)")
    parser.add_argument("--no-trace", action="store_true", help="skip the tracemalloc pass")
    parser.add_argument("--repeat", type=int, default=1,
                        help="with --apply: applied sweeps (each with its undo and floors, on a fresh copy of the "
                             "store); more than one prints the p50 of each ratio")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--store", type=Path, help="build the store here once and reuse it in later runs")
    parser.add_argument("--sweep-only", action="store_true",
                        help="only the applied sweep, for its own peak RSS (the phases timed alone hold their "
                             "results beside it)")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="llmem-bench-dream-"))
    db_path = tmp / "memory.db"
    print(f"dream benchmark: {args.memories} memories ({args.new} new), dim {args.dim}, store {db_path}")
    started = time.perf_counter()
    built_here = args.store is None or not args.store.exists()
    if not built_here:
        watermark = reuse(args.store, db_path, args.memories, args.dim)
        print(f"  copied {args.store}          {time.perf_counter() - started:8.2f} s")
    else:
        built = args.store or db_path
        watermark = build(built, args.memories, args.new, args.dim)
        print(f"  build                        {time.perf_counter() - started:8.2f} s "
              f"({built.stat().st_size / 2**20:.0f} MiB)")
        if args.store is not None:
            reuse(args.store, db_path, args.memories, args.dim)
    config = make_config(tmp)
    cfg = config.dream
    store = Store.open(db_path)
    if args.sweep_only:
        started, used = time.perf_counter(), time.process_time()
        outcome = run_dream(store, config, apply=True, use_llm=False)
        print(f"  applied sweep (journaled)    {time.perf_counter() - started:8.2f} s   "
              f"CPU {time.process_time() - used:.2f} s   phases {json.dumps(outcome.phase_seconds)}")
        print(f"  max RSS of the process       {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:8.0f} MiB"
              f"{' (the build included)' if built_here else ''}")
        store.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    trace = not args.no_trace
    figures = {}

    light, figures["light"], peak_light = measure(
        "light (incremental)",
        lambda: find_candidates(store, similarity_threshold=cfg.similarity_threshold,
                                auto_link_threshold=cfg.auto_link_threshold, since=watermark), trace)
    print(f"    changed {light.changed}, compared with {light.compared_with}: "
          f"{len(light.near_duplicates)} near-duplicate pairs, {len(light.auto_links)} auto-links, "
          f"{len(light.exact_duplicates)} exact groups")
    pairs = light.near_duplicates + light.auto_links
    rem, figures["rem"], peak_rem = measure(
        "rem (plan)", lambda: plan_rem(store, cfg, pairs=pairs, proposed_path=tmp / "proposed-changes.md"), trace)
    print(f"    categories {json.dumps({k: v['count'] for k, v in rem.categories.items()})}, "
          f"{len(rem.actions)} actions")
    deep, figures["deep"], peak_deep = measure(
        "deep (plan)",
        lambda: plan_deep(store, cfg, near_duplicates=light.near_duplicates,
                          exact_duplicates=light.exact_duplicates, auto_links=light.auto_links,
                          stale_ids=set(rem.stale_procedures), phase_hits={}), trace)
    print(f"    {json.dumps(deep.counts())}")
    if args.apply:
        store.close()  # each repeat works on its own copy of the store as the run finds it
        rounds = [applied_round(tmp, db_path, i, built_here) for i in range(args.repeat)]
        if args.repeat > 1:
            print(f"  p50 of {args.repeat} rounds (the ratio of each round's figure to its own floor):")
            for name in ("sweep", "sweep_cpu", "sweep_but_light_cpu", "undo", "undo_cpu"):
                print(f"    {name:<22} {statistics.median(r[name] for r in rounds):6.2f}×   "
                      f"(rounds: {', '.join(f'{r[name]:.2f}' for r in rounds)})")
        store = Store.open(db_path)
    print(f"  max RSS of the process       {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:8.0f} MiB")
    store.close()
    if args.keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
