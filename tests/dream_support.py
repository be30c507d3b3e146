"""Helpers for the dream tests: a store in LLMEM_HOME, time travel, the CLI in-process."""

from __future__ import annotations

from pathlib import Path

from llmem.config import load_config
from llmem.db.models import Memory
from llmem.providers.embedders import Embedder
from llmem.store import Store
from llmem.times import now
from llmem.vectors import store_vectors

DAY = 86400.0


def open_store(home: Path, config_text: str = "", store_url: str | None = None) -> tuple[Store, object]:
    """The store of the home's config (on `store_url` when given: conftest.py's fixture of
    that name runs a test on each backend)."""
    home.mkdir(parents=True, exist_ok=True)
    where = f"store:\n  url: {store_url}\n" if store_url else ""
    (home / "config.yaml").write_text("embedding:\n  provider: none\nllm:\n  provider: none\n" + where + config_text)
    config = load_config()
    return Store.open(config.store_location), config


def add(store: Store, content: str, memory_type: str = "fact", *, embedder: Embedder | None = None,
        age_days: float = 0.0, **kw) -> Memory:
    Memory = store.models.Memory
    created = now() - age_days * DAY
    memory = store.add(content, memory_type, created_at=created, **kw).memory
    if age_days:
        Memory.update(updated_at=created).where(Memory.id == memory.id).execute()
        memory = Memory.get(Memory.id == memory.id)
    if embedder is not None:
        store_vectors(store, embedder, [memory], embedder.embed_documents([memory.content]),
                      [memory.content])
    return memory


def recall(store, memory: Memory, queries: list[str], *, origin: str = "search", score: float = 0.9,
           days_ago: list[float] | None = None) -> None:
    """Record recalls as the search would (one per query)."""
    Memory, RecallEvent = store.models.Memory, store.models.RecallEvent
    days_ago = days_ago or [0.0] * len(queries)
    at = now()
    for i, (query, ago) in enumerate(zip(queries, days_ago, strict=True)):
        RecallEvent.create(memory=memory.id, query_hash=f"q{hash(query) & 0xffffff:x}", rank=1,
                           score=score, origin=origin, created_at=at - ago * DAY - i)
    Memory.update(access_count=Memory.access_count + len(queries), accessed_at=at).where(
        Memory.id == memory.id).execute()


def snapshot(home: Path) -> dict[str, bytes]:
    """Every file under the home, by relative path, with its bytes."""
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


def run_cli(*args: str) -> tuple[int, str, str]:
    """The real `llmem` entry point in-process, with its output captured."""
    import contextlib
    import io

    from llmem.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()
