"""Hostile values at the CLI's edges: import documents, integer options, exit codes, messages."""

from __future__ import annotations

import json

import pytest

GOOD = {"id": "00000001-0000-4000-8000-000000000000", "type": "fact", "content": "a good row"}
BAD_ID = "00000002-0000-4000-8000-000000000000"


def document(bad_row: dict | None = None, relations: list | None = None) -> dict:
    memories = [GOOD] + ([{"id": BAD_ID, "type": "fact", "content": "the bad row", **bad_row}]
                         if bad_row is not None else [])
    return {"version": 1, "memories": memories, "relations": relations or []}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# (case, file bytes, what the message must name)
BAD_IMPORTS = [
    ("created_at -1e15", json.dumps(document({"created_at": -1e15})), "memories[1]"),
    ("created_at 1e300", json.dumps(document({"created_at": 1e300})), "memories[1]"),
    ("year 1 at +14:00", json.dumps(document({"created_at": "0001-01-01T00:00:00+14:00"})), "memories[1]"),
    ("valid_until NaN", json.dumps(document({"valid_until": float("nan")})), "memories[1]"),
    ("time 2**70", json.dumps(document({"updated_at": 2**70})), "memories[1]"),
    ("access_count 2**70", json.dumps(document({"access_count": 2**70})), "memories[1]"),
    ("lone surrogate in content", json.dumps(document({"content": "bad \ud800 text"})), "memories[1]"),
    ("lone surrogate in metadata", json.dumps(document({"metadata": {"k": ["\udfff"]}})), "memories[1]"),
    ("huge integer in metadata", json.dumps(document({"metadata": {"n": 2**70}})), "memories[1]"),
    ("deep metadata", json.dumps(document({"metadata": {"k": json.loads(nested(200))}})), "memories[1]"),
    ("100k-deep nesting", '{"version": 1, "memories": ' + nested(100_000) + "}", "too deeply"),
    ("type of the wrong type", json.dumps(document({"type": ["fact"]})), "memories[1]"),
    ("embedding dim infinite", json.dumps(document({"embedding": {"model": "m", "dim": 1e400,
                                                                  "vector": ""}})).replace(
        "Infinity", "1e400"), "memories[1]"),
    ("relation ids of the wrong type", json.dumps(document(relations=[
        {"source_id": ["x"], "target_id": {"y": 1}, "type": "related_to"}])), "relations[0]"),
    ("relation id a number", json.dumps(document(relations=[
        {"source_id": 7, "target_id": GOOD["id"], "type": "related_to"}])), "relations[0]"),
    ("relation type unhashable", json.dumps(document(relations=[
        {"source_id": GOOD["id"], "target_id": GOOD["id"], "type": {"a": 1}}])), "relations[0]"),
]


@pytest.mark.parametrize(("case", "text", "named"), BAD_IMPORTS, ids=[c[0] for c in BAD_IMPORTS])
def test_an_unstorable_import_is_a_usage_error_and_writes_nothing(cli, fts_config, tmp_path,
                                                                   case, text, named):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    code, _, err = cli("import", str(path))
    assert code == 2, err
    assert named in err and "unexpected failure" not in err and "Traceback" not in err
    code, out, _ = cli("list", "--all", "--json")
    assert code == 0 and json.loads(out) == []
    assert cli("export", "--output", "-")[0] == 0


@pytest.mark.parametrize(("encoding", "expected"), [("utf-16", "not UTF-8"), ("latin-1", "not UTF-8")])
def test_a_file_that_is_not_utf8_is_a_usage_error(cli, fts_config, tmp_path, encoding, expected):
    path = tmp_path / "export.json"
    path.write_bytes(json.dumps(document({"content": "café"}), ensure_ascii=False).encode(encoding))
    code, _, err = cli("import", str(path))
    assert code == 2 and expected in err and "unexpected failure" not in err


def test_edge_times_that_can_be_shown_are_kept(cli, fts_config, tmp_path):
    path = tmp_path / "edge.json"
    path.write_text(json.dumps(document({"created_at": "0001-01-01T00:00:00Z",
                                         "valid_until": "9999-12-31T23:59:59Z",
                                         "access_count": 2**63 - 1})))
    code, _, err = cli("import", str(path))
    assert code == 0, err
    code, out, _ = cli("get", BAD_ID, "--json")
    row = json.loads(out)
    assert row["created_at"] == "0001-01-01T00:00:00Z" and row["valid_until"] == "9999-12-31T23:59:59Z"
    assert cli("list", "--all", "--json")[0] == 0 and cli("export", "--output", "-")[0] == 0


def test_add_valid_until_outside_the_calendar_is_a_usage_error(cli, fts_config):
    # Year 1 at +14:00 is still in year 0 in UTC: stored, it could never be shown again.
    code, _, err = cli("add", "--content", "x", "--valid-until", "0001-01-01T00:00:00+14:00")
    assert code == 2 and "--valid-until" in err
    assert json.loads(cli("list", "--all", "--json")[1]) == []


def _every_command():
    import click

    from llmem.cli import cli as group

    def walk(command, path):
        yield path, command
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                yield from walk(command.get_command(ctx, name), [*path, name])

    yield from walk(group, [])


def test_every_integer_option_is_bounded():
    import click

    unbounded = [f"llmem {' '.join(path)} {param.name}" for path, command in _every_command()
                 for param in command.params
                 if isinstance(param.type, click.types.IntParamType)
                 and not (isinstance(param.type, click.IntRange) and param.type.max is not None)]
    assert unbounded == []


@pytest.mark.parametrize("args", [
    ("list", "--limit", "9223372036854775807"),
    ("list", "--limit", "99999999999999999999999"),
    ("search", "webhooks", "--limit", "9223372036854775807"),
    ("context", "--max-tokens", "9223372036854775808"),
    ("promote", "--limit", "9223372036854775807"),
    ("queue", "retry", "9223372036854775808"),
])
def test_a_huge_integer_option_names_its_bound(cli, fts_config, args):
    code, _, err = cli(*args)
    assert code == 2 and "is not in the range" in err and "unexpected failure" not in err


# ---- exit codes and messages (issue 9, rough edges) ----------------------------------------

@pytest.mark.parametrize(("args", "exit_code", "message"), [
    (("get", "0000dead"), 1, "no memory"),
    (("update", "0000dead", "--content", "x"), 1, "no memory"),
    (("invalidate", "0000dead", "--reason", "x"), 1, "no memory"),
    (("delete", "0000dead"), 1, "no memory"),
    (("dream", "undo", "4242"), 1, "no dream run"),
    (("promote-explain", "0000dead"), 1, "no memory matches"),
    (("queue", "retry", "4242"), 1, "no event 4242"),
    (("get", "ab"), 2, "too short"),
    (("queue", "retry"), 2, "--failed"),
    (("enqueue", "idle", "../escape"), 2, "invalid session id"),
])
def test_exit_codes_follow_the_readme(cli, fts_config, args, exit_code, message):
    """Not found exits 1, a bad argument 2, each with its message and no traceback."""
    code, _, err = cli(*args)
    assert (code, message in err) == (exit_code, True), err
    assert "Traceback" not in err


def test_queue_retry_of_an_unknown_id_requeues_nothing(cli, fts_config):
    from llmem.app import App
    from llmem.pipeline.events import record_event

    app = App()
    try:
        event, _ = record_event(app.store, "copilot", "ses-one", "idle")
        app.store.models.Event.update(status="failed").execute()
    finally:
        app.close()
    code, _, err = cli("queue", "retry", str(event.id), "4242")
    assert code == 1 and "no event 4242" in err
    code, out, _ = cli("queue", "--json")
    assert json.loads(out)["events"]["failed"] == 1


def test_invalidating_an_invalidated_memory_says_so_and_keeps_the_first_reason(cli, fts_config):
    code, out, _ = cli("add", "--content", "the staging host is db-3", "--json")
    memory_id = json.loads(out)["id"]
    assert cli("invalidate", memory_id, "--reason", "moved to db-4")[0] == 0
    first = json.loads(cli("get", memory_id, "--json")[1])
    code, out, err = cli("invalidate", memory_id, "--reason", "again")
    assert code == 0 and "Already invalidated" in out and "moved to db-4" in out
    again = json.loads(cli("get", memory_id, "--json")[1])
    assert again == first


def test_metrics_prints_readable_values(cli, ollama_config):
    for text in ("deploys run on tuesdays", "deploys run on fridays", "the cache is redis"):
        assert cli("add", "--content", text)[0] == 0
    assert cli("search", "deploys")[0] == 0
    code, out, _ = cli("metrics")
    assert code == 0
    assert "{" not in out and "None" not in out and "'" not in out, out
    assert "coverage:" in out and "100.0%" in out
    assert "recalls:" in out and "search:" in out and "distinct queries" in out


def test_init_reports_the_llm_as_well_as_the_embedder(cli, ollama_config, configure, tmp_path):
    code, out, _ = cli("init")
    assert code == 0 and "embedder: ollama" in out and "llm:      ollama llama3.1:8b available" in out
    code, out, _ = cli("init", "--json")
    assert json.loads(out)["llm"]["status"] == "ok"
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    code, out, _ = cli("init")
    assert "llm:      none" in out


@pytest.mark.parametrize("args", [
    ("add", "--content", "bad \udcff byte"),  # how a non-UTF-8 byte in argv reaches Python
    ("add", "--content", "fine", "--summary", "\udcff"),
    ("add", "--content", "fine", "--metadata", '{"k": "\\ud800"}'),
    ("search", "x\udcff"),
])
def test_text_that_is_not_utf8_is_a_usage_error(cli, fts_config, args):
    code, _, err = cli(*args)
    assert code == 2 and "not valid UTF-8" in err and "unexpected failure" not in err
    assert json.loads(cli("list", "--all", "--json")[1]) == []


def test_update_and_invalidate_refuse_text_that_is_not_utf8(cli, fts_config):
    memory_id = json.loads(cli("add", "--content", "kept as it was", "--json")[1])["id"]
    for args in (("update", memory_id, "--content", "\udcff"),
                 ("update", memory_id, "--metadata", '{"\\udfff": 1}'),
                 ("invalidate", memory_id, "--reason", "\udcff")):
        code, _, err = cli(*args)
        assert code == 2 and "not valid UTF-8" in err, err
    row = json.loads(cli("get", memory_id, "--json")[1])
    assert row["content"] == "kept as it was" and row["invalidated_at"] is None


@pytest.mark.parametrize("metadata", ['{"a": NaN}', '{"a": 1e999}', '{"a": [-Infinity]}'])
def test_metadata_with_nan_or_infinity_is_a_usage_error(cli, fts_config, tmp_path, metadata):
    code, _, err = cli("add", "--content", "never stored", "--metadata", metadata)
    assert code == 2 and "NaN or infinity" in err
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(document()).replace('"a good row"', f'"a good row", "metadata": {metadata}'))
    code, _, err = cli("import", str(path))
    assert code == 2 and "memories[0]" in err and "not a number JSON can carry" in err
    assert json.loads(cli("list", "--all", "--json")[1]) == []


def test_terminal_escapes_in_a_memory_are_shown_not_obeyed(cli, fts_config):
    """Issue 20 item 14: `\\x1b]0;pwned\\x07` retitles the terminal, `\\x1b[2J` clears it, `\\r`
    and U+202E hide what the line says. list, get and search show them as escapes; --json
    keeps the text as it is (JSON escapes control characters itself)."""
    content = "deploy \x1b]0;pwned\x07 via \x1b[2J make \r ship \u202e \x9b31m done"
    code, out, err = cli("add", "-c", content)
    assert code == 0, err
    memory_id = out.split()[-1]
    for args in (("list",), ("get", memory_id), ("search", "deploy")):
        code, out, err = cli(*args)
        assert code == 0, err
        for raw in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
            assert raw not in out, (args, raw)
        assert "\\x1b]0;pwned\\x07" in out and "\\u202e" in out and "\\x9b" in out, (args, out)
    code, out, _ = cli("get", memory_id, "--json")
    assert json.loads(out)["content"] == content
