"""Embedding clients: the base class, Ollama and OpenAI-compatible (httpx), none. (The built-in
ONNX embedder is in builtin.py, the sentence-transformers one in local.py.)

Every embedder returns unit-length float32 vectors; the dimension comes from the model's
answer, never from a constant. Every text is redacted before it is embedded: whatever calls
an embedder (search queries built from a session's title and turns, memory texts), no secret
leaves llmem through one.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from ..errors import EmbedderUnavailable
from ..redact import Redactor
from .http import HttpProvider, bearer, openai_path

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)


class Embedder:
    """Base class: embed documents and queries into unit vectors."""

    provider = "none"

    def __init__(self, model: str = "", query_prefix: str = "", document_prefix: str = "",
                 redactor: Redactor | None = None):
        self.model = model
        self.query_prefix = query_prefix
        self.document_prefix = document_prefix
        self.redactor = redactor or Redactor()
        self.dim: int | None = None

    @property
    def identity(self) -> str:
        """The name vectors are stored under: a different identity means re-embedding."""
        return f"{self.provider}:{self.model}"

    @property
    def available(self) -> bool:
        return True

    def _embed(self, texts: list[str]) -> list[list[float]]:
        raise NotImplementedError

    def _vectors(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        from ..db.vec import normalize

        if not texts:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        raw = self._embed([self.redactor.text(text) for text in texts])
        if len(raw) != len(texts):
            raise EmbedderUnavailable(
                f"{self.provider} returned {len(raw)} vectors for {len(texts)} texts")
        # A reply of ragged, non-numeric or non-finite vectors is the embedder failing, like
        # no reply: callers keep the memory pending and search falls back to FTS, they do not
        # crash on numpy's ValueError after the memory was committed.
        try:
            matrix = np.asarray(raw, dtype=np.float32)
        except (TypeError, ValueError):
            matrix = None
        if matrix is None or matrix.ndim != 2 or matrix.shape[1] == 0 or not np.isfinite(matrix).all():
            raise EmbedderUnavailable(f"{self.provider} returned malformed vectors "
                                      "(ragged, not numbers, or not finite)",
                                      hint="is embedding.model an embedding model?")
        self.dim = int(matrix.shape[1])
        return normalize(matrix)

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Unit vectors for memory texts (with the model's document prefix)."""
        return self._vectors([self.document_prefix + t for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        """The unit vector of a search query (with the model's query prefix)."""
        return self._vectors([self.query_prefix + text])[0]

    def status(self) -> dict:
        """Probe the embedder; never raises."""
        try:
            self.embed_query("ping")
            return {"provider": self.provider, "model": self.model, "status": "ok", "dim": self.dim}
        except Exception as exc:
            return {"provider": self.provider, "model": self.model, "status": "unavailable",
                    "error": getattr(exc, "message", str(exc)), "hint": getattr(exc, "hint", None)}

    def close(self) -> None:
        pass


class NoEmbedder(Embedder):
    """No embedder configured: search is FTS-only."""

    provider = "none"

    @property
    def available(self) -> bool:
        return False

    def _embed(self, texts):
        raise EmbedderUnavailable("no embedder is configured (embedding.provider: none)",
                                  hint="set embedding.provider to builtin (in-process, no server), ollama, openai or local")

    def status(self) -> dict:
        return {"provider": "none", "model": None, "status": "disabled"}


class _HttpEmbedder(HttpProvider, Embedder):
    error = EmbedderUnavailable
    timeout_hint = "is the server overloaded? raise embedding.timeout in config.yaml"

    def __init__(self, model, base_url, timeout, batch_size, **kw):
        super().__init__(model, **kw)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.batch_size = batch_size

    def _post_json(self, path: str, payload: dict, headers: dict | None = None) -> dict:
        response = self._post(path, payload, headers)
        try:
            return response.json()
        except ValueError:
            raise EmbedderUnavailable(f"{self.provider} at {self.base_url} sent a reply that is not JSON") from None

    def _reach_hint(self) -> str:
        return "is the server running? (embedding.base_url in config.yaml)"

    def _embed(self, texts):
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(self._embed_batch(texts[start:start + self.batch_size]))
        return vectors

    def _embed_batch(self, texts):
        raise NotImplementedError


class OllamaEmbedder(_HttpEmbedder):
    """Ollama's /api/embed (batched)."""

    provider = "ollama"

    def _reach_hint(self):
        return "is `ollama serve` running? (embedding.base_url in config.yaml)"

    def _status_hint(self, status):
        if status == 404:
            return f"pull the model: `ollama pull {self.model}`"
        return None

    def _embed_batch(self, texts):
        reply = self._post_json("/api/embed", {"model": self.model, "input": texts})
        vectors = reply.get("embeddings") if isinstance(reply, dict) else None
        if not isinstance(vectors, list):
            raise EmbedderUnavailable(f"ollama at {self.base_url} sent no 'embeddings'")
        return vectors


class OpenAIEmbedder(_HttpEmbedder):
    """Any OpenAI-compatible /v1/embeddings endpoint."""

    provider = "openai"

    def __init__(self, *args, api_key_env: str = "OPENAI_API_KEY", **kw):
        super().__init__(*args, **kw)
        self.api_key = os.environ.get(api_key_env, "")

    def _embed_batch(self, texts):
        reply = self._post_json(openai_path(self.base_url, "embeddings"), {"model": self.model, "input": texts},
                                bearer(self.api_key))
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list):
            raise EmbedderUnavailable(f"openai-compatible server at {self.base_url} sent no 'data'")
        data = sorted(data, key=lambda item: item.get("index", 0))
        return [item.get("embedding") for item in data]
