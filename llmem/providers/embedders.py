"""Embedding clients (httpx): Ollama, OpenAI-compatible, local sentence-transformers, none.

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
        matrix = np.asarray(raw, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] == 0:
            raise EmbedderUnavailable(f"{self.provider} returned malformed vectors")
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
                    "error": getattr(exc, "message", str(exc))}

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
                                  hint="set embedding.provider to ollama, openai or local")

    def status(self) -> dict:
        return {"provider": "none", "model": None, "status": "disabled"}


class _HttpEmbedder(Embedder):
    def __init__(self, model, base_url, timeout, batch_size, **kw):
        super().__init__(model, **kw)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.batch_size = batch_size
        self._client = None

    def _http(self):
        if self._client is None:
            import httpx

            self._client = httpx.Client(timeout=self.timeout, trust_env=False)
        return self._client

    def _post(self, path: str, payload: dict, headers: dict | None = None) -> dict:
        import httpx

        url = self.base_url + path
        try:
            response = self._http().post(url, json=payload, headers=headers)
        except httpx.TimeoutException:
            raise EmbedderUnavailable(
                f"{self.provider} at {self.base_url} did not answer within {self.timeout:g} s",
                hint="is the server overloaded? raise embedding.timeout in config.yaml") from None
        except httpx.HTTPError as exc:
            raise EmbedderUnavailable(
                f"could not reach {self.provider} at {self.base_url} ({exc.__class__.__name__})",
                hint=self._reach_hint()) from None
        if response.status_code >= 400:
            detail = response.text[:200].strip()
            raise EmbedderUnavailable(
                f"{self.provider} at {self.base_url} answered {response.status_code}: {detail}",
                hint=self._status_hint(response.status_code))
        try:
            return response.json()
        except ValueError:
            raise EmbedderUnavailable(f"{self.provider} at {self.base_url} sent a reply that is not JSON") from None

    def _reach_hint(self) -> str:
        return "is the server running? (embedding.base_url in config.yaml)"

    def _status_hint(self, status: int) -> str | None:
        return None

    def _embed(self, texts):
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(self._embed_batch(texts[start:start + self.batch_size]))
        return vectors

    def _embed_batch(self, texts):
        raise NotImplementedError

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


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
        reply = self._post("/api/embed", {"model": self.model, "input": texts})
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
        path = "/embeddings" if self.base_url.endswith("/v1") else "/v1/embeddings"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        reply = self._post(path, {"model": self.model, "input": texts}, headers)
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list):
            raise EmbedderUnavailable(f"openai-compatible server at {self.base_url} sent no 'data'")
        data = sorted(data, key=lambda item: item.get("index", 0))
        return [item.get("embedding") for item in data]
