"""The secret corpus through every path that sends text out of llmem (issue 20 items 1 and 6).

Every shape of tests/fixtures/secrets/corpus.yaml is planted in every input that reaches the
embedder or the LLM (CLI, MCP and viewer search queries; a session's title and turns for the
context, the created hook and compaction; extraction and introspection; the dream), and then
every request the fake model server (a real HTTP server on 127.0.0.1, standing in for both the
embedder and the LLM) received, and every file llmem wrote, is scanned: 0 leaks.

Redaction must come first, on the original text: a query re-tokenised before it is redacted
(`sk-proj-…` becomes `sk proj …`), a turn cut at 500 characters through a secret, or a
nested YAML value whose lines were joined no longer match their patterns.
"""

from __future__ import annotations

import json
import logging

import pytest
import yaml
from conftest import store_location
from secret_corpus import all_secrets, leaks, load_corpus
from servers import store_rows
from session_writers import copilot_session
from test_extract import PROJECT

from llmem.app import App
from llmem.logconfig import setup_file_logging

PLANTED, _ = load_corpus()
SECRETS = all_secrets(PLANTED)
# The fast suite sends every fourth shape (each family of the corpus: cloud keys, forge tokens,
# headers, config files, private keys, passwords, URLs) and every multi-line one (where a path
# that joins lines breaks a pattern) down the paths that cost a command per shape; the slow
# suite sends all of them. Each shape's redaction itself is tested on the whole corpus in
# test_secret_corpus.py.
SAMPLE = [entry for number, entry in enumerate(PLANTED) if number % 4 == 0 or "\n" in entry.text]
by_corpus = pytest.mark.parametrize(
    "planted", [pytest.param(SAMPLE, id="sample"), pytest.param(PLANTED, id="all", marks=pytest.mark.slow)])
COMMON = "deploy"  # in every seeded memory: semantic_text drops it from the embedded query


def _configure(configure, tmp_path, model_server, extra: str = ""):
    state_dir = tmp_path / "session-state"
    configure(f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"llm:\n  provider: ollama\n  base_url: {model_server.url}\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n" + extra)
    return state_dir


def _seed(cli, count: int = 25) -> None:
    """Enough memories sharing COMMON for the semantic query to leave it out."""
    for number in range(count):
        code, _, err = cli("add", "--content", f"The {COMMON} step {number} runs migrations on host {number}")
        assert code == 0, err


def _straddling(text: str, cut: int) -> str:
    """`text` placed so that the cut at `cut` characters falls inside it."""
    return "x" * max(cut - len(text) // 2, 1) + " " + text


def _sent(model_server) -> str:
    return json.dumps([body for _, body in model_server.requests], ensure_ascii=False)


@by_corpus
def test_search_queries_never_send_a_secret(planted, cli, configure, tmp_path, model_server):
    from llmem.mcp_server import MemoryTools

    _configure(configure, tmp_path, model_server)
    _seed(cli)
    before = len(model_server.embed_requests())
    for entry in planted:
        code, _, err = cli("search", f"{COMMON} {entry.text}")
        assert code == 0, err
    assert len(model_server.embed_requests()) >= before + len(planted)

    # MCP and the viewer take ten shapes a query (one line each): redaction runs on the whole.
    grouped = ["\n".join(e.text for e in planted[start:start + 10]) for start in range(0, len(planted), 10)]
    app = App()
    tools = MemoryTools(app)
    try:
        for text in grouped:
            tools.search(f"{COMMON} {text}")
    finally:
        tools.close()

    from ui.conftest import open_viewer

    app = App()
    try:
        with open_viewer(app) as viewer:
            for text in grouped:
                page = viewer.get("/memories", params={"q": f"{COMMON} {text}"})
                assert page.status_code == 200  # (its search box shows what was typed)
    finally:
        app.close()
    assert len(model_server.embed_requests()) >= before + len(planted) + 2 * len(grouped)
    assert leaks(all_secrets(planted), _sent(model_server)) == []


@by_corpus
def test_session_text_cut_for_the_context_query_is_redacted_first(planted, cli, configure, tmp_path, model_server):
    """Each secret sits across the 500-character cut of a turn, or the 1,200 of the query."""
    # Embedded in the hook's own process too (by default only a resident llmem embeds it).
    state_dir = _configure(configure, tmp_path, model_server, "context:\n  embed_without_resident: true\n")
    _seed(cli, 3)
    sessions = []
    for start in range(0, len(planted), 3):
        group = planted[start:start + 3]
        session = copilot_session(state_dir, f"ses-cut-{start}", cwd=PROJECT)
        title = _straddling(group[0].text, 1200 - 3 * 501)
        (session.folder / "workspace.yaml").write_text(yaml.safe_dump(
            {"id": session.id, "cwd": PROJECT, "git_root": PROJECT, "name": title}))
        for entry in group:
            session.user(_straddling(entry.text, 500))
        sessions.append(session.id)
    for session_id in sessions:
        for args in (("context", "--session-id", session_id),
                     ("context", "--session-id", session_id, "--compacting"),
                     ("hook", "--type", "created", "--session-id", session_id)):
            before = len(model_server.embed_requests())
            code, _, err = cli(*args)
            assert code == 0, err
            assert len(model_server.embed_requests()) > before, f"{args} embedded no query"
    assert leaks(all_secrets(planted), _sent(model_server)) == []


def test_extraction_introspection_and_dream_send_no_secret(cli, configure, tmp_path, model_server,
                                                           llmem_home):
    from llmem.capture.extract import extract_session, extract_text
    from llmem.capture.introspect import introspect_session, introspect_text

    state_dir = _configure(configure, tmp_path, model_server)
    session = copilot_session(state_dir, "ses-corpus", cwd=PROJECT)
    for entry in PLANTED:
        session.user(f"Remember that {entry.text}")
        session.assistant(f"Using it: {entry.text}", [{
            "name": "bash", "arguments": {"command": entry.text},
            "output": f"Traceback (most recent call last):\nValueError: {entry.text}", "success": False}])
    # Unusable replies that carry the secrets back: they are logged, and shown to the model again.
    echo = "\n".join(entry.text for entry in PLANTED)
    model_server.chat_replies = [f"not json {echo}"] * 200
    app = App()
    handlers_before = list(logging.getLogger("llmem").handlers)
    setup_file_logging(app.config, "worker")  # as the worker would
    try:
        extract_session(app, "ses-corpus")
        introspect_session(app, "ses-corpus")
        extract_text(app, "Remember: " + "\n".join(entry.text for entry in PLANTED[:30]))
        introspect_text(app, "I made a mistake and pasted " + "\n".join(e.text for e in PLANTED[30:60]))
    finally:
        app.close()
        for logger in ("llmem", "workers", "huey"):
            for handler in logging.getLogger(logger).handlers:
                if handler not in handlers_before:
                    logging.getLogger(logger).removeHandler(handler)
                    handler.close()
    code, _, err = cli("dream", "--apply")
    assert code == 0, err
    assert {path for path, _ in model_server.requests} >= {"/api/chat", "/api/embed"}
    assert leaks(SECRETS, _sent(model_server)) == []
    logs = "".join(p.read_text(errors="replace") for p in (llmem_home / "logs").glob("*.log*"))
    assert "unusable reply" in logs
    assert leaks(SECRETS, logs) == []
    code, out, _ = cli("logs", "--lines", "500")
    assert leaks(SECRETS, out) == []


@by_corpus
def test_every_stored_and_shown_form_holds_no_secret(planted, cli, configure, tmp_path, model_server, llmem_home):
    """The corpus written by every writer (CLI add and update, MCP remember and correct, the
    viewer's edit form, import, extraction), then every form llmem gives it back in: the store's
    files, export, list and get, MCP search/get/context, the viewer's pages, the dream's report,
    DREAMS.md, MEMORY.md, the diary and the logs."""
    from ui.conftest import open_viewer

    from llmem.mcp_server import MemoryTools

    _configure(configure, tmp_path, model_server)
    shown: list[str] = []
    ids = []
    for entry in planted:
        code, out, err = cli("add", "--content", f"Remember {entry.text}", "--summary", entry.text,
                             "--metadata", json.dumps({"note": entry.text}), "--json")
        assert code == 0, err
        ids.append(json.loads(out)["id"])
        shown.append(out)
    for memory_id, entry in zip(ids[:20], planted[:20], strict=True):
        assert cli("update", memory_id, "--content", f"Now {entry.text}")[0] == 0
    document = {"version": 1, "relations": [], "memories": [
        {"id": f"00000000-0000-4000-8000-{number:012x}", "type": "fact", "content": f"imported {e.text}",
         "metadata": {"api_key": e.secrets[0]}} for number, e in enumerate(planted)]}
    (tmp_path / "import.json").write_text(json.dumps(document))
    assert cli("import", str(tmp_path / "import.json"))[0] == 0

    app = App()
    tools = MemoryTools(app)
    try:
        for entry in planted:
            shown.append(tools.remember(f"The team noted {entry.text}"))
        corrected = tools.remember("The staging host is staging-1.")
        shown.append(tools.correct(corrected.split("[")[1][:8], content=f"The staging host: {planted[0].text}"))
        shown.append(tools.search("remember"))
        shown.append(tools.get(ids[:20], max_tokens=8000))
        shown.append(tools.context(max_tokens=8000))
    finally:
        tools.close()

    app = App()
    try:
        with open_viewer(app) as viewer:
            form = viewer.get(f"/memories/{ids[-1]}/edit").text
            assert viewer.post(f"/memories/{ids[-1]}/edit", content=f"edited {planted[-1].text}",
                               confidence="0.8", summary="", metadata="{}",
                               **_hidden_fields(form)).status_code in (200, 303)
            for path in ("/", "/memories", f"/memories/{ids[0]}", "/dreams", "/queue"):
                shown.append(viewer.get(path).text)
    finally:
        app.close()

    # (one line each: a letters-only password is told from prose only where it ends its line)
    model_server.chat_replies = [f"not json {chr(10).join(e.text for e in planted)}"] * 50
    code, out, err = cli("dream", "--apply", "--report", str(llmem_home / "report.html"))
    assert code == 0, err
    shown += [out, err]
    for args in (("export", "-o", "-"), ("list", "--limit", "500"), ("get", ids[0]),
                 ("search", "remember"), ("dream", "status", "--deep"), ("logs", "-n", "500")):
        code, out, err = cli(*args)
        assert code == 0, (args, err)
        shown += [out, err]

    files = {str(path): path.read_bytes().decode("utf-8", errors="replace")
             for path in llmem_home.rglob("*") if path.is_file()}
    # A store on a server (the suite's PostgreSQL run): every value of every row, as its file.
    files |= {f"store table {table}": "\n".join(str(value) for row in rows for value in row)
              for table, rows in store_rows(store_location()).items()}
    assert any(name.endswith("report.html") for name in files)
    assert any(name.endswith("memory.db") or name == "store table memory" for name in files)
    secrets = all_secrets(planted)
    leaked_files = {name: leaks(secrets, text) for name, text in files.items() if leaks(secrets, text)}
    assert leaked_files == {}
    assert [(i, leaks(secrets, text)) for i, text in enumerate(shown) if leaks(secrets, text)] == []
    assert leaks(secrets, _sent(model_server)) == []


def _hidden_fields(form: str) -> dict:
    """The hidden inputs of the viewer's edit form (its version check, when it has one)."""
    import re

    return {name: value for name, value in re.findall(
        r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form) if name != "csrf"}


def test_the_dreams_excerpts_of_an_older_store_are_redacted_before_they_are_cut(configure, tmp_path):
    """A store written by an older llmem may hold a secret its patterns missed: the dream's
    excerpts (narrative prompt, diary, DREAMS.md, MEMORY.md, the shadow trial's snippet) are
    redacted before they are joined and cut, so no part of it goes out."""
    from llmem.dream.memory_md import cut_snippet
    from llmem.dream.text import one_line

    for entry in PLANTED:
        text = "x" * 40 + " " + entry.text + " and more words after it. " * 3
        for width in range(45, 45 + len(entry.text), 7):
            assert leaks(entry.secrets, one_line(text, width)) == [], (entry.kind, width)
            assert leaks(entry.secrets, cut_snippet(text, width // 4 + 1)) == [], (entry.kind, width)
