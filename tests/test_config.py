import stat
from pathlib import Path

import pytest
import yaml

from llmem.config import (
    SCHEMA,
    Config,
    defaults,
    load_config,
    render_example,
    section_type,
    validate_mapping,
)
from llmem.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_example_file_documents_every_key_with_its_default():
    text = (ROOT / "config.example.yaml").read_text()
    assert text == render_example(), "regenerate config.example.yaml from llmem.config.render_example()"
    assert yaml.safe_load(text) == defaults()
    # every key carries a comment line above it
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and not stripped.endswith(":"):
            assert lines[i - 1].strip().startswith("#"), f"undocumented key: {line}"


def test_defaults_without_a_file_and_paths_follow_llmem_home(llmem_home):
    config = load_config()
    assert config.source is None
    assert config.db_path == llmem_home / "memory.db"
    assert config.queue_path == llmem_home / "queue.db"
    assert config.diary_path == llmem_home / "dream-diary.md"
    assert config.search.rrf_k == 60
    assert config.dream.similarity_threshold == 0.92


def test_xdg_defaults_without_llmem_home(monkeypatch, tmp_path):
    monkeypatch.delenv("LLMEM_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    config = load_config()
    assert config.db_path == tmp_path / ".config/llmem/memory.db"
    assert config.queue_path == tmp_path / ".local/share/llmem/queue.db"
    assert config.log_dir == tmp_path / ".local/state/llmem"


def test_unknown_key_warns_and_is_ignored(configure):
    configure("search:\n  limti: 5\nbogus: 1\n")
    config = load_config()
    assert any("search.limti" in w for w in config.warnings)
    assert any("'bogus'" in w for w in config.warnings)
    assert config.search.limit == 10


@pytest.mark.parametrize("text, key, allowed", [
    ("search:\n  limit: many\n", "search.limit", "an integer"),
    ("embedding:\n  provider: magic\n", "embedding.provider", "one of builtin, ollama, openai, local, none"),
    ("dream:\n  similarity_threshold: 1.5\n", "dream.similarity_threshold", "from 0 to 1"),
    ("redaction:\n  enabled: sometimes\n", "redaction.enabled", "true or false"),
    ("search: 3\n", "search", "mapping"),
])
def test_bad_value_names_file_key_and_what_is_allowed(configure, text, key, allowed):
    path = configure(text)
    with pytest.raises(ConfigError) as info:
        load_config()
    message = str(info.value)
    assert str(path) in message and f"'{key}'" in message and allowed in message


def test_invalid_yaml_is_a_config_error(configure):
    configure("search:\n  limit: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config()


def test_seed_layout_with_top_level_copilot_is_accepted():
    values, warnings = validate_mapping({"session": {"adapter": "copilot"},
                                         "copilot": {"state_dir": "/x/state", "share_dir": "."}})
    assert not warnings
    assert values["session"]["copilot"]["state_dir"] == "/x/state"


def test_config_check_and_show(cli, configure):
    configure("search:\n  limit: 7\n")
    code, out, _ = cli("config", "check")
    assert code == 0 and "valid" in out
    code, out, _ = cli("config", "show", "--json")
    assert code == 0 and '"limit": 7' in out
    configure("search:\n  limit: -1\n")
    code, out, err = cli("config", "check")
    assert code == 2 and "search.limit" in err and "Traceback" not in err


@pytest.mark.creates_store  # the new store's file mode is llmem's doing, not a copy's
def test_init_creates_private_files_and_is_idempotent(cli, llmem_home, configure):
    code, out, err = cli("init", "--adapter", "none", "--ollama-url", "http://127.0.0.1:9")
    assert code == 0, err
    config_file = llmem_home / "config.yaml"
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(llmem_home.stat().st_mode) == 0o700
    assert stat.S_IMODE((llmem_home / "memory.db").stat().st_mode) == 0o600
    first = config_file.read_text()
    assert "http://127.0.0.1:9" in first
    db_before = (llmem_home / "memory.db").read_bytes()
    code, out, _ = cli("init", "--adapter", "none", "--ollama-url", "http://127.0.0.1:9")
    assert code == 0 and "unchanged" in out
    assert config_file.read_text() == first
    assert (llmem_home / "memory.db").read_bytes() == db_before


def test_parsed_copy_follows_every_edit(configure, llmem_home):
    for limit in (7, 8, 9):  # same size, written within the same clock tick
        configure(f"search:\n  limit: {limit}\n")
        assert load_config().search.limit == limit
    cache = llmem_home / ".config.yaml.parsed.json"
    assert cache.exists() and stat.S_IMODE(cache.stat().st_mode) == 0o600
    cache.write_text("{broken")
    assert load_config().search.limit == 9


@pytest.mark.parametrize("text, key", [
    ("search:\n  rerank_blend: .nan\n", "search.rerank_blend"),
    ("embedding:\n  timeout: .inf\n", "embedding.timeout"),
    ("llm:\n  timeout: -.inf\n", "llm.timeout"),
    ("dream:\n  auto_link_threshold: .nan\n", "dream.auto_link_threshold"),
    ("search:\n  rrf_k: 99999999999999999999999\n", "search.rrf_k"),
])
def test_non_finite_and_huge_numbers_are_rejected_naming_the_key(configure, text, key):
    configure(text)
    with pytest.raises(ConfigError) as info:
        load_config()
    assert f"'{key}'" in str(info.value)


@pytest.mark.parametrize("url, accepted", [
    ("http://localhost:11434", True),
    ("https://api.example.com/v1", True),
    ("file:///etc/passwd", False),
    ("ftp://localhost:11434", False),
    ("http://", False),
    ("localhost:11434", False),
    ("http://localhost:port", False),
])
def test_base_urls_accept_only_http_and_https(configure, url, accepted):
    configure(f"embedding:\n  base_url: '{url}'\nllm:\n  base_url: '{url}'\n")
    if accepted:
        assert load_config().llm.base_url == url
    else:
        with pytest.raises(ConfigError, match="embedding.base_url"):
            load_config()


def test_init_ollama_url_accepts_only_http_and_https(cli, llmem_home):
    code, _, err = cli("init", "--adapter", "none", "--ollama-url", "file:///etc/passwd")
    assert code == 2 and "--ollama-url" in err and "Traceback" not in err
    assert not (llmem_home / "config.yaml").exists()


def test_stale_procedure_days_defaults_to_the_seed_value():
    assert defaults()["dream"]["stale_procedure_days"] == 30


def test_config_check_json(cli, configure):
    configure("search:\n  limit: 7\n  bogus: 1\n")
    code, out, _ = cli("config", "check", "--json")
    report = yaml.safe_load(out)
    assert code == 0 and report["valid"] and len(report["warnings"]) == 1
    path = configure("search:\n  rerank_blend: .nan\n")
    code, out, _ = cli("config", "check", "--json")
    report = yaml.safe_load(out)
    assert code == 2 and report["valid"] is False and report["file"] == str(path)
    assert "search.rerank_blend" in report["error"]


def test_config_check_leaves_a_shared_folder_as_it_was(cli, tmp_path):
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    config = shared / "c.yaml"
    config.write_text("search:\n  limit: 7\n")
    code, out, err = cli("--config", str(config), "config", "check")
    assert code == 0, err
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert [p.name for p in shared.iterdir()] == ["c.yaml"]  # no parsed copy beside it


def _path_keys(schema=SCHEMA, prefix=""):
    for key, spec in schema.items():
        if isinstance(spec, dict):
            yield from _path_keys(spec, f"{prefix}{key}.")
        elif spec.kind == "path":
            yield f"{prefix}{key}"


def _read(config, dotted):
    value = config
    for name in dotted.split("."):
        value = getattr(value, name)
    return value


def _nested(dotted, value):
    *sections, key = dotted.split(".")
    tree = {key: value}
    for name in reversed(sections):
        tree = {name: tree}
    return tree


@pytest.mark.parametrize("dotted", list(_path_keys()))
def test_every_path_key_expands_home_llmem_home_and_variables(dotted, configure, llmem_home, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv("LLMEM_TEST_DIR", str(tmp_path / "elsewhere"))
    for written, expected in [("$LLMEM_HOME/x", llmem_home / "x"), ("~/x", tmp_path / "user-home" / "x"),
                              ("${LLMEM_TEST_DIR}/x", tmp_path / "elsewhere" / "x")]:
        configure(yaml.safe_dump(_nested(dotted, written)))
        config = load_config()
        assert _read(config, dotted) == expected, (dotted, written)
        shown = config.as_dict()
        for name in dotted.split("."):
            shown = shown[name]
        assert shown == written  # `config show` prints the file's own text


def test_standard_locations_fill_null_paths_and_store_url_names_the_sqlite_file(configure, llmem_home,
                                                                                tmp_path):
    config = load_config()
    assert config.pipeline.queue_path == config.queue_path == llmem_home / "queue.db"
    assert config.logging.dir == config.log_dir == llmem_home / "logs"
    assert config.dream.diary_path == config.diary_path == llmem_home / "dream-diary.md"
    assert config.dream.report_path is None
    configure(f"store:\n  url: sqlite://{tmp_path}/elsewhere.db\ndb_path: $LLMEM_HOME/ignored.db\n")
    config = load_config()
    assert config.db_path == config.store_location == tmp_path / "elsewhere.db"


def test_sections_are_frozen_typed_and_their_defaults_match_the_schema(llmem_home, monkeypatch):
    import dataclasses

    monkeypatch.delenv("LLMEM_STORE_URL", raising=False)  # no store named in the environment either
    config = load_config()
    assert Config() == config  # a section made without a file is the defaults, paths expanded
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dream.report_path = "/tmp/x"  # type: ignore[misc]
    assert section_type("session.claude") is type(config.session.claude)
    assert config.capture.episode_roles == ("user", "assistant")
    assert isinstance(config.session.copilot.share_dir, Path)
    assert section_type("dream")().schedule == SCHEMA["dream"]["schedule"].default
    hints = {f.name: f.type for f in dataclasses.fields(section_type("dream"))}
    assert hints["decay_interval_days"] is int and hints["auto_link_threshold"] == float | None
    changed = dataclasses.replace(config.dream, min_score=0.1)
    assert changed.min_score == 0.1 and changed != config.dream and config.dream.min_score == 0.6
    assert hash(config) == hash(load_config()) and "min_score=0.6" in repr(config.dream)
    with pytest.raises(TypeError, match="no field min_scor"):
        section_type("dream")(min_scor=1)


def test_with_values_validates_like_the_file(configure):
    configure("search:\n  limit: 7\n")
    config = load_config()
    changed = config.with_values({"search": {"rrf_k": 30}, "dream": {"report_path": "$LLMEM_HOME/r.html"}})
    assert (changed.search.limit, changed.search.rrf_k) == (7, 30)
    assert changed.dream.report_path.name == "r.html" and "$" not in str(changed.dream.report_path)
    assert config.search.rrf_k == 60  # the original is untouched
    with pytest.raises(ConfigError, match="'search.limit'"):
        config.with_values({"search": {"limit": 0}})


def test_config_show_prints_the_values_as_written_with_passwords_masked(cli, configure):
    configure("dream:\n  report_path: $LLMEM_HOME/r.html\nqueue:\n  url: redis://:hunter2@127.0.0.1:6379/0\n")
    code, out, err = cli("config", "show", "--json")
    assert code == 0, err
    import json

    shown = json.loads(out)
    assert shown["values"]["dream"]["report_path"] == "$LLMEM_HOME/r.html"
    assert shown["values"]["logging"]["dir"] is None
    assert "hunter2" not in out and shown["values"]["queue"]["url"].startswith("redis://")
    assert yaml.safe_load(render_example(values=shown["values"] | {"queue": {"url": None}}))["dream"] == \
        {**defaults()["dream"], "report_path": "$LLMEM_HOME/r.html"}
    code, out, _ = cli("config", "show")
    assert code == 0 and "report_path: $LLMEM_HOME/r.html" in out


def test_llmem_store_url_points_the_process_at_a_store_and_is_never_written(configure, llmem_home, monkeypatch, cli):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    elsewhere = llmem_home / "elsewhere.db"
    monkeypatch.setenv("LLMEM_STORE_URL", f"sqlite:///{elsewhere}")
    config = load_config()
    assert config.store.url == f"sqlite:///{elsewhere}" and config.db_path == elsewhere
    code, out, err = cli("add", "--content", "the api listens on 8080")
    assert code == 0, err
    assert elsewhere.is_file() and not (llmem_home / "memory.db").exists()
    assert "elsewhere" not in (llmem_home / "config.yaml").read_text()  # the file says what it said
    monkeypatch.setenv("LLMEM_STORE_URL", "mysql://me@db/x")
    with pytest.raises(ConfigError, match="LLMEM_STORE_URL") as caught:
        load_config()
    assert "postgresql://" in caught.value.hint
