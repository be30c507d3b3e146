"""Start-up on the paths someone waits for, in real fresh processes: what a hook, a search or
an MCP server imports before it answers (llmem/__main__.py, the hook path, the built-in
embedder's load)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

LLMEM = [sys.executable, "-m", "llmem"]


def imports_of(argv, stdin="", env=None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime -m llmem argv`: the process and the modules it imported (an
    import refused as absent is listed too, so a package counts by its submodules)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "llmem", *argv], input=stdin,
                          capture_output=True, text=True, env=env, timeout=60)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    return done, imported


def loaded(imported: set[str], package: str) -> bool:
    return any(name.startswith(f"{package}.") for name in imported)


needs_drivers = pytest.mark.skipif(
    importlib.util.find_spec("psycopg") is None or importlib.util.find_spec("redis") is None,
    reason="psycopg and redis are not installed here: nothing to leave out")


@needs_drivers
@pytest.mark.parametrize("argv", [["search", "pagination", "--fts-only", "--no-track"],
                                  ["context", "--project", "/home/dev/acme-api"]])
def test_a_sqlite_store_and_queue_leave_the_server_drivers_unimported(configure, argv):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    done, imported = imports_of(argv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "peewee" in imported and not loaded(imported, "psycopg") and not loaded(imported, "redis")


@needs_drivers
def test_a_server_in_the_config_keeps_its_driver(configure, tmp_path):
    """A Redis queue keeps redis (and the SQLite store still leaves psycopg out); a Postgres
    store keeps psycopg. Asked of skip_unused_drivers in a process of its own, as the entry
    point asks it, so this process's modules stay as they are."""
    probe = ("import sys; from llmem.__main__ import skip_unused_drivers; "
             "print(sorted(skip_unused_drivers(sys.argv[1:])))")

    def skipped(*argv):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    configure("queue:\n  url: redis://127.0.0.1:1/0\n")
    assert skipped("search", "x") == "['psycopg', 'psycopg2', 'psycopg2cffi']"
    configure("store:\n  url: postgresql://llmem@127.0.0.1:1/llmem\n")
    assert skipped("hook", "--type", "idle") == "['redis']"
    assert skipped("-v", "--config", str(tmp_path / "llmem-home" / "config.yaml"), "mcp") == "['redis']"
    # Commands that may name another store (init --store) or none of these: nothing left out.
    assert skipped("init") == "[]" and skipped("--help") == "[]"
    configure("store: [not, a, mapping]\n")  # a broken config: the CLI reports it, nothing changes
    assert skipped("search", "x") == "[]"
