#!/usr/bin/env python3
"""The web viewer's page times on a synthetic store, served by the real uvicorn on 127.0.0.1.

Prints figures; it is not a test. Example:
    python bench/ui.py --memories 10000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TYPES = ["fact", "decision", "preference", "event", "project_state", "procedure", "conversation"]
AGENTS = ["copilot", "opencode", "claude", "codex"]


def build_store(store, count: int, rng: random.Random) -> tuple[str, str]:
    """`count` memories over 20 projects and count/20 sessions, with relations, events and
    recalls; returns a memory id with relations and a session id with events."""
    from llmem.times import now

    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
             for _ in range(4000)]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    sessions = [f"ses_{n:05d}" for n in range(max(count // 20, 1))]
    started = now() - 90 * 86400
    rows = []
    for n in range(count):
        text = " ".join(rng.choices(words, weights=weights, k=rng.randint(8, 30)))
        rows.append({"id": str(uuid.uuid4()), "type": rng.choice(TYPES), "content": f"{text} #{n}",
                     "summary": None, "confidence": 0.7, "source": "extraction",
                     "project": f"/work/project-{n % 20}", "session_id": rng.choice(sessions),
                     "metadata": {}, "access_count": 0, "created_at": started + n * 60,
                     "updated_at": started + n * 60})
    ids = [row["id"] for row in rows]
    with store.db.atomic():
        # The import's bulk path: one `store.add` per row took minutes at 100k.
        store.insert_rows(rows)
        Relation = store.models.Relation
        links = {(a, b, rng.choice(["related_to", "supersedes", "depends_on"]))
                 for a, b in (rng.sample(ids, 2) for _ in range(count // 5))}
        for chunk in _chunks([{"source": a, "target": b, "type": t, "created_at": now()} for a, b, t in links]):
            Relation.insert_many(chunk).on_conflict_ignore().execute()
        Event = store.models.Event
        events = []
        for session in sessions:
            for kind in ("created", "idle", "ending"):
                status = "failed" if rng.random() < 0.05 else "done"
                events.append({"adapter": rng.choice(AGENTS), "session_id": session, "kind": kind,
                               "status": status, "attempts": 1,
                               "last_error": "LLM unreachable" if status == "failed" else None,
                               "detected_at": started + rng.random() * 90 * 86400})
        for chunk in _chunks(events):
            Event.insert_many(chunk).execute()
        RecallEvent = store.models.RecallEvent
        # Chunked: one insert of every row passed 600k SQL variables at 100k memories.
        for chunk in _chunks([{"memory": rng.choice(ids), "query_hash": "q", "rank": 1, "score": 0.5,
                               "origin": "search", "created_at": now()} for _ in range(count)]):
            RecallEvent.insert_many(chunk).execute()
    related = store.relations_of([ids[0]])
    anchor = related[0].source_id if related else ids[0]
    return anchor, sessions[0]


def _chunks(rows: list, size: int = 2000):
    for start in range(0, len(rows), size):
        yield rows[start:start + size]


def timed(client, path: str, repeat: int) -> tuple[float, float, float]:
    """(median wall ms, p95 wall ms, median CPU ms) of GET `path`. The CPU time is the
    process's (the server runs in it, so its threads count, and so does the client): on a
    loaded machine the wall time mostly measures waiting for a core."""
    times, cpu = [], []
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        response = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - used) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))], statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--home", type=Path,
                        help="keep the store in this folder and reuse it when it is there (a 100k build takes a minute)")
    args = parser.parse_args()

    import httpx

    with tempfile.TemporaryDirectory() as scratch:
        home = args.home or Path(scratch)
        home.mkdir(parents=True, exist_ok=True)
        os.environ["LLMEM_HOME"] = str(home)
        Path(home, "config.yaml").write_text("embedding:\n  provider: none\nllm:\n  provider: none\n")
        from llmem.app import App
        from llmem.ui.server import ViewerServer, bind, create_app

        app = App()
        built = Path(home, "bench-ui.json")
        if built.is_file() and json.loads(built.read_text())["memories"] == args.memories:
            anchor, session = json.loads(built.read_text())["anchor"]
            print(f"store: {args.memories} memories reused from {home}")
        else:
            started = time.perf_counter()
            anchor, session = build_store(app.store, args.memories, random.Random(7))
            print(f"store: {args.memories} memories built in {time.perf_counter() - started:.1f} s")
            built.write_text(json.dumps({"memories": args.memories, "anchor": [anchor, session]}))
        sock = bind(0)
        port = sock.getsockname()[1]
        server = ViewerServer(create_app(app, port=port, token="bench"), sock).start()
        word = app.store.get(anchor).content.split()[0]
        pages = ["/", "/memories", "/memories?type=decision", "/memories?validity=valid",
                 "/memories?page=100", f"/memories?q={word}", f"/memories?q={word}+zzz&type=fact",
                 f"/memories/{anchor}", f"/memories/{anchor}/edit", "/sessions", "/sessions?agent=codex",
                 f"/sessions/{session}", "/dreams", "/queue"]
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                client.get("/", params={"token": "bench"})
                # The floor: the same server answering with a static file (no store, no template).
                floor, _, floor_cpu = timed(client, "/static/app.css", args.repeat)
                print(f"floor: a static file (/static/app.css) {floor:.1f} ms, {floor_cpu:.1f} ms CPU")
                print(f"{'page':<48} {'median ms':>10} {'p95 ms':>8} {'× floor':>8} {'CPU ms':>8} {'× floor':>8}")
                for path in pages:
                    median, p95, cpu = timed(client, path, args.repeat)
                    print(f"{path[:48]:<48} {median:>10.1f} {p95:>8.1f} {median / floor:>8.1f} "
                          f"{cpu:>8.1f} {cpu / floor_cpu:>8.1f}", flush=True)
        finally:
            server.stop()
            app.close()


if __name__ == "__main__":
    main()
