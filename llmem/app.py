"""What a command or a task works with: the config, the store and the embedder, opened lazily."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from .config import Config, load_config

if TYPE_CHECKING:
    from .search import SearchOptions


class App:
    """Lazily opened resources of one llmem process (CLI invocation or worker)."""

    def __init__(self, config: Config | None = None, config_path: str | None = None):
        self._config = config
        self._config_path = config_path
        # A command that only reads, or writes only what it may skip (recalls): a store that
        # cannot be opened for writing (a full disk, a read-only file system) is opened
        # read-only instead of failing (db/connection.py open_read_only).
        self.reading = False
        # Whether this process's searches embed their query. A hook answered in a process of
        # its own (no resident llmem) turns it off: loading the model (or importing an HTTP
        # client) and the vector scan's numpy cost a fresh process 10-30x `python -c pass`,
        # several times a hook's whole budget, so its context searches with FTS alone.
        self.query_embeddings = True
        # An agent's hook in a process of its own: a server store gets the hook's short connect
        # timeout (store.hook_connect_timeout_seconds), so an unreachable one fails it open in time.
        self.in_hook = False

    def reads_only(self) -> None:
        """Say, before the store is opened, that this command reads (see `reading`)."""
        self.reading = True

    @cached_property
    def config(self) -> Config:
        return self._config or load_config(self._config_path)

    @cached_property
    def store(self):
        from .errors import StoreError
        from .redact import Redactor
        from .store import Store

        redactor = Redactor.from_section(self.config.redaction)
        timeouts = self.config.store
        timeout = timeouts.hook_connect_timeout_seconds if self.in_hook else timeouts.connect_timeout_seconds
        try:
            return Store.open(self.config.store_location, redactor=redactor, connect_timeout=timeout)
        except StoreError as exc:
            if not self.reading or self.config.store_location != self.config.db_path or not self.config.db_path.exists():
                raise
            try:
                store = Store.open(self.config.db_path, redactor=redactor, read_only=True)
            except StoreError:
                raise exc from None
            import logging

            logging.getLogger(__name__).warning("%s; reading the store read-only, recording nothing", exc.message)
            return store

    @cached_property
    def embedder(self):
        from .providers import make_embedder

        return make_embedder(self.config)

    @cached_property
    def memories(self):
        """The memory service (llmem/memories.py): every front-end's add, update, invalidate,
        correct and delete."""
        from .memories import MemoryService

        return MemoryService(self.store, self.embedder)

    def searcher(self):
        from .search import Searcher

        return Searcher(self.store, self.embedder if self.query_embeddings else None)

    def search_options(self, **chosen) -> SearchOptions:
        """The config's `search:` settings with the caller's choices on top: the one place the
        config's names map onto SearchOptions. A choice of None means the caller made none
        (an unset `--limit` takes search.limit)."""
        from .search import SearchOptions

        section = self.config.search
        configured = {"limit": section.limit, "rrf_k": section.rrf_k,
                      "candidate_multiplier": section.candidate_multiplier,
                      "blend": section.rerank_blend, "min_relevance": section.min_relevance}
        return SearchOptions(**configured | {k: v for k, v in chosen.items() if v is not None})

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.close()
        if "embedder" in self.__dict__:
            self.embedder.close()
