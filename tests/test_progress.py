"""Progress in the terminal (issue 13 item 5): long commands draw a bar on stderr when it is a
terminal and print no progress when it is piped. Both run the entry point in-process
(tests/inproc.py): on a terminal with stderr on a real pseudo-TTY, piped with stderr a stream
that is no terminal, as a pipe is."""

from __future__ import annotations

import os
import pty
import threading

import pytest
from inproc import Ran, run_llmem
from session_writers import recorded_opencode_store

from llmem.config import load_config
from llmem.store import Store

MEMORIES = 450  # more than one 200-row import chunk and several 64-memory embedding batches


def fill_store(count: int = MEMORIES) -> None:
    with Store.open(load_config().store_location) as store, store.db.atomic():
        store.add_many([(f"memory number {i} about the build cache on host {i % 7}", {}, "user")
                        for i in range(count)], "fact", confidence=1.0, source="user",
                       project=None, session_id=None)


def run_piped(*args: str) -> Ran:
    return run_llmem(list(args))


def run_on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-TTY (stdout piped), in-process: (exit code, stdout, what the
    TTY got). What the commands check is `sys.stderr.isatty()`, true of a stream on the TTY's
    end as of a process's stderr there; a thread drains the TTY while the command writes (its
    buffer is a few KB)."""
    leader, follower = pty.openpty()
    seen = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: no writer is left on the follower
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        done = run_llmem(list(args), stderr_fd=follower)
    finally:
        os.close(follower)
        reader.join(timeout=60)
        os.close(leader)
    return done.returncode, done.stdout, seen.decode(errors="replace")


@pytest.mark.parametrize("command", [("embed", "--all"), ("dream", "--apply")])
def test_piped_there_is_no_progress(ollama_config, command):
    fill_store()
    done = run_piped(*command)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and "\r" not in done.stdout


def test_on_a_terminal_embedding_draws_a_bar(ollama_config):
    fill_store()
    code, out, terminal = run_on_a_terminal("embed", "--all")
    assert code == 0 and f"Embedded {MEMORIES} memories" in out
    assert "Embedding" in terminal and f"{MEMORIES}/{MEMORIES}" in terminal and "\r" in terminal
    assert "#" in terminal  # the bar itself
    code, out, terminal = run_on_a_terminal("embed", "--all", "--json")
    assert code == 0 and "Embedding" not in terminal  # --json: data only


def test_import_draws_a_bar_on_a_terminal_and_nothing_when_piped(fts_config, tmp_path, move_home):
    fill_store()
    export = tmp_path / "export.json"
    assert run_piped("export", "--output", str(export)).returncode == 0
    for name in ("terminal", "piped"):
        home = move_home(tmp_path / name)
        (home / "config.yaml").write_text("embedding:\n  provider: none\nllm:\n  provider: none\n")
        if name == "terminal":
            code, out, terminal = run_on_a_terminal("import", str(export))
            assert code == 0 and f"Imported {MEMORIES} memories" in out
            assert "Importing" in terminal and f"{MEMORIES}/{MEMORIES}" in terminal
        else:
            done = run_piped("import", str(export))
            assert done.returncode == 0 and "Importing" not in done.stderr and "\r" not in done.stderr


def test_backfill_draws_a_bar_on_a_terminal_and_nothing_when_piped(configure, tmp_path):
    """click.progressbar, which backfill used before, wrote its label into a pipe."""
    data_dir = tmp_path / "opencode"
    recorded_opencode_store(data_dir)
    configure("embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: opencode\n"
              f"  opencode:\n    data_dir: {data_dir}\n")
    done = run_piped("backfill", "--no-llm")
    assert done.returncode == 0 and "Backfill " in done.stdout, done.stderr
    assert "Backfilling" not in done.stderr and "\r" not in done.stderr
    code, out, terminal = run_on_a_terminal("backfill", "--no-llm")
    assert code == 0 and "Backfill " in out
    # The fixture's main session; its task child is a subagent's, no session of its own.
    assert "Backfilling opencode sessions" in terminal and "1/1" in terminal


def test_dream_apply_counts_its_phases_on_a_terminal(fts_config):
    fill_store(30)
    code, out, terminal = run_on_a_terminal("dream", "--apply")
    assert code == 0 and "Dream run" in out
    assert "Dreaming" in terminal and "3/3" in terminal
