"""The HTTP side of the providers: a JSON POST to Ollama or an OpenAI-compatible server.

Embedders and the chat LLM ask different things and raise different errors, but a request
fails the same ways for both (too slow, unreachable, an error status), and each way is said
in the user's terms with the provider's own hint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import LlmemError

if TYPE_CHECKING:
    import httpx


def openai_path(base_url: str, endpoint: str) -> str:
    """`/v1/<endpoint>`, or `/<endpoint>` when base_url already ends with /v1."""
    return f"/{endpoint}" if base_url.endswith("/v1") else f"/v1/{endpoint}"


def bearer(api_key: str) -> dict | None:
    """The Authorization header of an OpenAI-compatible server (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else None


class HttpProvider:
    """A provider behind an HTTP server. A subclass sets `provider`, `base_url`, `timeout`,
    the error it raises and the hint for a timeout, and may refine the other two hints."""

    provider: str
    base_url: str
    timeout: float
    error: type[LlmemError]
    timeout_hint: str
    _client = None

    def _http(self):
        if self._client is None:
            import httpx

            # A plain http:// server (Ollama on loopback, the default) needs no TLS: building the
            # verified SSL context, certificates loaded, costs a fresh process 40-250 ms. The
            # client talks to base_url only and follows no redirect, so it never meets https.
            plain = self.base_url.lower().startswith("http://")
            self._client = httpx.Client(timeout=self.timeout, trust_env=False, **({"verify": False} if plain else {}))
        return self._client

    def _post(self, path: str, payload: dict, headers: dict | None = None) -> httpx.Response:
        """POST `payload`; the response of a 2xx/3xx status, else `self.error` saying why."""
        import httpx

        url = self.base_url + path
        try:
            response = self._http().post(url, json=payload, headers=headers)
        except httpx.TimeoutException:
            raise self.error(
                f"{self.provider} at {self.base_url} did not answer within {self.timeout:g} s",
                hint=self.timeout_hint) from None
        except httpx.HTTPError as exc:
            raise self.error(
                f"could not reach {self.provider} at {self.base_url} ({exc.__class__.__name__})",
                hint=self._reach_hint()) from None
        if response.status_code >= 400:
            error = self.error(
                f"{self.provider} at {self.base_url} answered {response.status_code}: "
                f"{response.text[:200].strip()}",
                hint=self._status_hint(response.status_code))
            # Callers tell a refusal (401/403: not retried) from a missing model (404) by it.
            error.status = response.status_code
            raise error
        return response

    def _reach_hint(self) -> str:
        raise NotImplementedError

    def _status_hint(self, status: int) -> str | None:
        return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
