import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import store_location

from llmem.cli import cli as cli_group


def add(cli, *args):
    code, out, err = cli("add", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_every_command_has_help(cli):
    import click

    def walk(group, prefix):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            yield [*prefix, name], command
            if isinstance(command, click.Group):
                yield from walk(command, [*prefix, name])

    seen = []
    for path, command in walk(cli_group, []):
        seen.append(" ".join(path))
        assert command.help, f"llmem {' '.join(path)} has no help text"
        code, out, _ = cli(*path, "--help")
        assert code == 0 and "Usage:" in out
    assert {"search", "hook", "install systemd", "dream undo", "queue retry"} <= set(seen)


def test_add_get_list_update_invalidate_delete(cli, fts_config):
    memory = add(cli, "--content", "the api gateway retries three times", "--type", "fact")
    assert memory["confidence"] == 0.9 and memory["source"] == "user"
    short = memory["id"][:6]
    code, out, _ = cli("get", short, "--json")
    assert json.loads(out)["content"] == "the api gateway retries three times"
    code, out, _ = cli("update", short, "--confidence", "0.5", "--metadata", '{"k": "v"}', "--json")
    assert json.loads(out)["confidence"] == 0.5 and json.loads(out)["metadata"] == {"k": "v"}
    code, out, _ = cli("list", "--json")
    assert [m["id"] for m in json.loads(out)] == [memory["id"]]
    code, out, _ = cli("invalidate", short, "--reason", "gateway replaced")
    assert code == 0
    code, out, _ = cli("list", "--json")
    assert json.loads(out) == []
    code, out, _ = cli("list", "--all", "--json")
    assert json.loads(out)[0]["metadata"]["invalidation_reason"] == "gateway replaced"
    code, out, _ = cli("delete", short)
    assert code == 0
    code, out, err = cli("get", short)
    assert code == 1 and "no memory" in err  # not found: exit 1 (README)


def test_usage_errors_exit_2_without_traceback(cli, fts_config):
    cases = [
        ("add", "--content", "x", "--type", "opinion"),
        ("add", "--content", "x", "--confidence", "2"),
        ("add", "--content", "x", "--metadata", "{not json"),
        ("get", "abc"),
        ("search", "x", "--fts-only", "--semantic-only"),
        ("search", "x", "--semantic-only"),
        ("update", "abcd"),
        ("no-such-command",),
    ]
    for args in cases:
        code, out, err = cli(*args)
        assert code == 2, (args, code, err)
        assert "Traceback" not in err and err.strip(), args


def test_ambiguous_prefix_lists_the_matches(cli, fts_config, llmem_home):
    from llmem.store import Store

    cli("stats")
    with Store.open(store_location()) as store:
        for i in range(2):
            store.add(f"memory {i}", memory_id=f"beef{i}000-0000-4000-8000-000000000000")
    code, _, err = cli("get", "beef")
    assert code == 2 and "beef0000-0000-4000-8000-000000000000" in err
    assert "beef1000-0000-4000-8000-000000000000" in err and "more characters" in err


def test_search_json_and_weird_input(cli, fts_config):
    add(cli, "--content", "deploy with make release; never push to main directly", "--type", "procedure")
    code, out, err = cli("search", "release", "--json")
    rows = json.loads(out)
    assert code == 0 and rows[0]["type"] == "procedure"
    assert {"id", "type", "content", "score", "metadata"} <= set(rows[0])
    assert "FTS only" in err
    for text in ['"release', "release -main", "re*", "main:push", "(release", "1; DROP TABLE memory"]:
        code, out, err = cli("search", text, "--json", "--no-track")
        assert code == 0, (text, err)
    code, out, _ = cli("search", "release", "--explain")
    assert "relevance=" in out and "type_priority=" in out


def test_search_no_track_leaves_access_counts(cli, fts_config):
    memory = add(cli, "--content", "the linter config is in pyproject")
    cli("search", "linter", "--no-track")
    code, out, _ = cli("get", memory["id"], "--json")
    assert json.loads(out)["access_count"] == 0
    cli("search", "linter")
    code, out, _ = cli("get", memory["id"], "--json")
    assert json.loads(out)["access_count"] == 1


def test_hybrid_end_to_end_with_ollama(cli, ollama_config):
    add(cli, "--content", "postgres is the billing database", "--type", "decision")
    add(cli, "--content", "the user likes dark themes", "--type", "preference")
    code, out, err = cli("search", "billing database", "--json", "--explain")
    assert code == 0 and err == ""
    rows = json.loads(out)
    assert rows[0]["content"] == "postgres is the billing database"
    assert rows[0]["explain"]["vec_rank"] == 1
    code, out, _ = cli("doctor", "--json")
    report = json.loads(out)
    assert report["sqlite_vec"] == "loaded"
    assert report["embedder"]["status"] == "ok"
    code, out, _ = cli("metrics", "--json")
    assert json.loads(out)["coverage"] == 1.0


def test_embed_pending_after_ollama_comes_back(cli, ollama_config):
    ollama_config.mode = "error"
    code, out, err = cli("add", "--content", "ci runs on github actions")
    assert code == 0 and "embed --pending" in err
    code, out, _ = cli("stats", "--json")
    assert json.loads(out)["pending_embedding"] == 1
    ollama_config.mode = "ok"
    code, out, _ = cli("embed", "--pending", "--json")
    assert json.loads(out)["embedded"] == 1
    code, out, _ = cli("stats", "--json")
    assert json.loads(out)["pending_embedding"] == 0


def test_export_import_round_trip_keeps_ids_and_relations(cli, fts_config, tmp_path, llmem_home, move_home):
    from llmem.store import Store

    a = add(cli, "--content", "use ruff for linting", "--type", "decision")
    b = add(cli, "--content", "use flake8 for linting", "--type", "decision")
    with Store.open(store_location()) as store:
        store.relate(a["id"], b["id"], "supersedes")
    export = tmp_path / "out.json"
    code, out, _ = cli("export", "--output", str(export))
    assert code == 0
    document = json.loads(export.read_text())
    assert document["version"] == 1 and len(document["memories"]) == 2
    assert document["relations"][0]["type"] == "supersedes"

    other_home = move_home(tmp_path / "other")
    (other_home / "config.yaml").write_text("embedding:\n  provider: none\n")
    code, out, _ = cli("import", str(export), "--dry-run", "--json")
    assert json.loads(out) == {"new": 2, "already_present": 0, "duplicates": 0, "relations": 1, "dry_run": True}
    assert json.loads(cli("stats", "--json")[1])["memories"] == 0  # a dry run writes nothing
    code, out, err = cli("import", str(export), "--json")
    assert code == 0 and json.loads(out)["new"] == 2, err
    code, out, _ = cli("get", a["id"], "--json")
    assert json.loads(out)["relations"][0]["target_id"] == b["id"]
    code, out, _ = cli("import", str(export), "--json")  # again: nothing changes
    assert json.loads(out)["new"] == 0 and json.loads(out)["already_present"] == 2


def test_import_is_all_or_nothing(cli, fts_config, tmp_path):
    bad = tmp_path / "bad.json"
    memories = [{"id": f"0000000{i}-0000-4000-8000-000000000000", "type": "fact", "content": f"m{i}"}
                for i in range(5)]
    memories.append({"id": "00000009-0000-4000-8000-000000000000", "type": "nonsense", "content": "x"})
    bad.write_text(json.dumps({"version": 1, "memories": memories, "relations": []}))
    code, out, err = cli("import", str(bad))
    assert code == 2 and "nonsense" in err and "nothing was imported" in err
    code, out, _ = cli("stats", "--json")
    assert json.loads(out)["memories"] == 0
    for text in ("not json", json.dumps({"version": 2, "memories": []}), json.dumps([1, 2])):
        bad.write_text(text)
        code, _, err = cli("import", str(bad))
        assert code == 2 and "Traceback" not in err
    code, _, err = cli("import", str(tmp_path / "missing.json"))
    assert code == 2


@pytest.mark.parametrize("store", ["sqlite:////proc/forbidden/memory.db", "postgresql://llmem@127.0.0.1:{port}/llmem"],
                         ids=["sqlite-unwritable", "postgres-refused"])
def test_verbose_shows_traceback_only_with_v(cli, monkeypatch, store):
    from servers import free_port

    monkeypatch.setenv("LLMEM_STORE_URL", store.format(port=free_port()))  # a store that cannot open
    code, out, err = cli("stats")
    assert code != 0 and "Traceback" not in err
    code, out, err = cli("-v", "stats")
    assert code != 0 and "Traceback" in err


def test_console_script_runs_in_a_fresh_process(llmem_home):
    exe = Path(sys.executable).parent / "llmem"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "llmem"]
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "search" in done.stdout


def test_readme_documents_every_command():
    from llmem.cli import COMMANDS

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    missing = [name for name in COMMANDS if f"`{name}" not in readme and f"llmem {name}" not in readme]
    assert not missing, f"README does not document: {missing}"


def test_doctor_on_a_fresh_home_fails_nothing(cli, configure, tmp_path):
    # as on a new machine: the queue's folder and its parent do not exist yet
    configure(f"embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"pipeline:\n  queue_path: {tmp_path}/share/llmem/queue.db\n")
    code, out, err = cli("doctor", "--json")
    report = json.loads(out)
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert code == 0 and not failed, failed


@pytest.mark.creates_store  # the new store's file mode is llmem's doing, not a copy's
def test_files_made_by_commands_are_private(cli, fts_config, llmem_home, tmp_path):
    import os
    import stat

    cli("add", "--content", "a private memory")
    cli("hook", "--type", "created", "--session-id", "ses_1")
    cli("dream", "--apply", "--report", str(tmp_path / "report.html"))
    made = [p for p in [*llmem_home.rglob("*"), tmp_path / "report.html"]
            if p.is_file() and p.name != "config.yaml"]  # the test wrote config.yaml itself
    assert any(p.name == "hooks.log" for p in made)
    loose = [str(p) for p in made if stat.S_IMODE(os.stat(p).st_mode) & 0o077]
    assert not loose, loose


def test_outputs_go_only_into_existing_folders_and_leave_their_mode(cli, fts_config, tmp_path):
    import os
    import stat

    add(cli, "--content", "a memory to export")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    code, _, err = cli("export", "-o", str(shared / "b.json"))
    assert code == 0, err
    code, _, err = cli("dream", "--apply", "--report", str(shared / "r.html"))
    assert code == 0, err
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert sorted(p.name for p in shared.iterdir()) == ["b.json", "r.html"]  # no temp files left

    missing = tmp_path / "nonexistent" / "dir"
    for args in (["export", "-o", str(missing / "x.json")],
                 ["dream", "--apply", "--report", str(missing / "r.html")]):
        code, _, err = cli(*args)
        assert code == 2 and str(missing) in err and "does not exist" in err, err
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.creates_store  # the new store's file mode is llmem's doing, not a copy's
def test_an_existing_home_keeps_its_mode(cli, configure, llmem_home):
    import os
    import stat

    configure("embedding:\n  provider: none\n")
    os.chmod(llmem_home, 0o750)
    code, _, err = cli("add", "--content", "a memory in a home the user set up")
    assert code == 0, err
    assert stat.S_IMODE(llmem_home.stat().st_mode) == 0o750
    assert stat.S_IMODE((llmem_home / "memory.db").stat().st_mode) == 0o600


def test_list_limit_counts_only_the_memories_it_shows(cli, fts_config):
    from llmem.app import App
    from llmem.times import now

    app = App()
    try:
        valid = app.store.add("The deploy key lives in the vault", "fact").memory.id
        for n in range(3):  # newer than the valid one, already expired
            app.store.add(f"Staging is frozen until release {n}", "fact", valid_until=now() - 60)
    finally:
        app.close()
    code, out, err = cli("list", "--limit", "2", "--json")
    assert code == 0, err
    assert [m["id"] for m in json.loads(out)] == [valid]
    code, out, err = cli("list", "--limit", "2", "--all", "--json")
    assert len(json.loads(out)) == 2


def test_imported_embeddings_are_searchable_in_a_fresh_store(cli, ollama_config, llmem_home, tmp_path,
                                                             move_home):
    memory = add(cli, "--content", "the billing service runs on postgres")
    export = tmp_path / "with-vectors.json"
    code, _, err = cli("export", "--embeddings", "--output", str(export))
    assert code == 0, err
    config = (llmem_home / "config.yaml").read_text()
    (move_home(tmp_path / "fresh") / "config.yaml").write_text(config)
    code, out, err = cli("import", str(export), "--json")
    assert code == 0 and json.loads(out)["new"] == 1, err
    code, out, _ = cli("embed", "--pending", "--json")
    assert json.loads(out)["embedded"] == 0  # the file's vector is current: nothing to embed
    code, out, err = cli("search", "billing postgres", "--semantic-only", "--json")
    assert code == 0, err
    assert [hit["id"] for hit in json.loads(out)] == [memory["id"]]


def test_import_embeds_the_new_memories_while_the_embedder_answers(cli, ollama_config, llmem_home, tmp_path,
                                                                  move_home):
    add(cli, "--content", "the billing service runs on postgres")
    export = tmp_path / "plain.json"
    assert cli("export", "--output", str(export))[0] == 0
    config = (llmem_home / "config.yaml").read_text()
    (move_home(tmp_path / "fresh") / "config.yaml").write_text(config)
    ollama_config.mode = "error"  # down: the import still succeeds, the memory stays pending
    code, out, err = cli("import", str(export))
    assert code == 0 and "embed --pending" in err
    assert json.loads(cli("stats", "--json")[1])["pending_embedding"] == 1
    ollama_config.mode = "ok"
    other = tmp_path / "more.json"
    document = json.loads(export.read_text())
    document["memories"][0].update(id="00000000-0000-4000-8000-00000000abcd",
                                   content="the invoices are generated nightly")
    other.write_text(json.dumps(document))
    code, out, err = cli("import", str(other), "--json")
    assert code == 0 and json.loads(out)["new"] == 1, err
    assert json.loads(cli("stats", "--json")[1])["pending_embedding"] == 0  # both caught up
