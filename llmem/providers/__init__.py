"""The services llmem calls out to: embedders (built-in, Ollama, OpenAI-compatible, local) and the chat LLM.

`make_embedder` lives here, not beside the Embedder classes: the local embedder subclasses
Embedder, and the factory that imports it would otherwise sit in the module it imports from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UsageError
from ..redact import Redactor
from .embedders import Embedder, NoEmbedder, OllamaEmbedder, OpenAIEmbedder

if TYPE_CHECKING:
    from ..config import EmbeddingSettings


def _default_prefixes(model: str) -> tuple[str, str]:
    # nomic-embed-text was trained with task prefixes and loses recall without them.
    if "nomic" in model.lower():
        return "search_query: ", "search_document: "
    return "", ""


# What `embedding.model: null` means for each provider (the built-in and local embedders
# resolve their own default, so a null reaches them as "").
DEFAULT_MODELS = {"ollama": "nomic-embed-text", "openai": "text-embedding-3-small"}


def embedding_model(section: EmbeddingSettings) -> str:
    """The model an `embedding:` section names, its provider's default when it names none."""
    return section.model or DEFAULT_MODELS.get(section.provider, "")


def make_embedder(cfg) -> Embedder:
    """The embedder described by the `embedding:` section of a config."""
    section = cfg.embedding
    provider = section.provider
    model = embedding_model(section)
    query_prefix, document_prefix = _default_prefixes(model)
    if section.query_prefix is not None:
        query_prefix = section.query_prefix
    if section.document_prefix is not None:
        document_prefix = section.document_prefix
    redactor = Redactor.from_section(cfg.redaction)
    common = dict(query_prefix=query_prefix, document_prefix=document_prefix)
    sent = dict(common, redactor=redactor)
    if provider == "none":
        return NoEmbedder()
    if provider == "builtin":
        # Imported here, not at the top: the module is light, but a hook that never embeds
        # should not even read it. onnxruntime itself loads on the first embedded text.
        from .builtin import BuiltinEmbedder

        return BuiltinEmbedder(model, batch_size=section.batch_size, **sent)
    if provider == "ollama":
        return OllamaEmbedder(model, section.base_url, section.timeout,
                              section.batch_size, **sent)
    if provider == "openai":
        return OpenAIEmbedder(model, section.base_url, section.timeout,
                              section.batch_size, api_key_env=section.api_key_env, **sent)
    if provider == "local":
        try:
            from .local import LocalEmbedder
        except ImportError as exc:
            raise UsageError(f"the local embedder is not available: {exc}",
                             hint="pip install 'llmem[local]'") from None
        local = LocalEmbedder(model, batch_size=section.batch_size, **common)
        local.redactor = redactor
        return local
    raise UsageError(f"unknown embedding provider {provider!r}")
