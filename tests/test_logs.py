"""Log files: one timestamp format, `logs` keeps tracebacks whole, logging never fails a
process (full disk), llmem's own files are not followed through planted symlinks."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmem.config import load_config
from llmem.errors import EmbedderUnavailable, LlmemError
from llmem.logconfig import file_handler, setup_file_logging

ISO_HEAD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


@pytest.fixture
def isolated_loggers():
    """Undo the handlers and levels a test gives the llmem, workers and huey loggers."""
    saved = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level)
             for name in ("llmem", "workers", "huey")}
    yield
    for name, (handlers, level) in saved.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers[:]:
            if handler not in handlers:
                logger.removeHandler(handler)
                handler.close()
        logger.setLevel(level)


def test_every_log_file_uses_one_timestamp_format(cli, fts_config, llmem_home, isolated_loggers):
    cli("hook", "--type", "idle", "--session-id", "../../etc/passwd")  # logs its failure
    run_log = setup_file_logging(load_config(), "run")
    logging.getLogger("llmem.test").warning("a line in run.log")
    hooks_log = llmem_home / "logs" / "hooks.log"
    for path in (run_log, hooks_log):
        lines = path.read_text().splitlines()
        assert lines and all(ISO_HEAD.match(line) for line in lines), (path.name, lines)


def _write_mixed_log(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.log").write_text(textwrap.dedent("""\
        2026-11-30T10:00:00 INFO llmem.pipeline.watcher[7]: watching
        2026-11-30T10:00:02 ERROR huey[7]: Unhandled exception in task abc.
        Traceback (most recent call last):
          File "x.py", line 1, in <module>
        ValueError: boom
        2026-11-30T10:00:03 DEBUG llmem.search[7]: chatty
        Traceback (most recent call last):
        KeyError: 'debug detail'
        """))
    # hooks.log as an older llmem wrote it: space-separated date and time, milliseconds, pid
    (folder / "hooks.log").write_text(
        "2026-11-30 10:00:01,123 42 WARNING llmem.hooks: hook idle ses_1 failed: no store\n")


def test_logs_level_keeps_a_traceback_with_its_header(cli, fts_config, llmem_home):
    _write_mixed_log(llmem_home / "logs")
    code, out, err = cli("logs", "--level", "WARNING")
    assert code == 0, err
    assert out.splitlines() == [
        "2026-11-30 10:00:01,123 42 WARNING llmem.hooks: hook idle ses_1 failed: no store",
        "2026-11-30T10:00:02 ERROR huey[7]: Unhandled exception in task abc.",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: boom",
    ]
    code, out, _ = cli("logs", "-n", "1")
    assert out.splitlines()[-1] == "KeyError: 'debug detail'" and "chatty" in out and "boom" not in out


def test_logs_json(cli, fts_config, llmem_home):
    _write_mixed_log(llmem_home / "logs")
    code, out, _ = cli("logs", "--level", "ERROR", "--json")
    assert code == 0
    assert json.loads(out) == [{"time": "2026-11-30T10:00:02", "level": "ERROR", "file": "run.log",
                                "text": "2026-11-30T10:00:02 ERROR huey[7]: Unhandled exception in task abc.\n"
                                        "Traceback (most recent call last):\n"
                                        '  File "x.py", line 1, in <module>\nValueError: boom'}]


def test_an_expected_failure_logs_one_line_an_unexpected_one_its_traceback(tmp_path, isolated_loggers):
    handler = file_handler(tmp_path / "run.log", "INFO")
    logger = logging.getLogger("huey.consumer")
    logger.addHandler(handler)
    for exc in (EmbedderUnavailable("the embedder at http://127.0.0.1:9 does not answer"), ValueError("a bug")):
        try:
            raise exc
        except Exception:
            logger.exception("Unhandled exception in task %s.", "t1")
    handler.close()
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert lines[0].endswith("Unhandled exception in task t1.: EmbedderUnavailable: "
                             "the embedder at http://127.0.0.1:9 does not answer")
    assert ISO_HEAD.match(lines[1]) and lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: a bug"


def test_a_log_write_that_fails_costs_the_line_not_the_process(tmp_path, capfd, isolated_loggers):
    handler = file_handler(tmp_path / "hooks.log", "INFO")
    handler.stream.close()
    handler.stream = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115 - every write: ENOSPC
    logger = logging.Logger("alone")  # no parents: only this handler writes
    logger.addHandler(handler)
    logger.error("this line cannot be written")
    handler.close()  # its last flush fails too
    assert handler.failed
    assert capfd.readouterr().err == ""


def test_own_files_are_not_followed_through_a_planted_symlink(cli, fts_config, llmem_home, tmp_path,
                                                              isolated_loggers):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.chmod(victim, 0o644)
    logs = llmem_home / "logs"
    logs.mkdir()
    (logs / "hooks.log").symlink_to(victim)
    (logs / "run.log").symlink_to(victim)

    code, _, err = cli("hook", "--type", "created", "--session-id", "ses_1")
    assert code == 0 and "Traceback" not in err
    assert "hooks.log is a symlink" in err
    with pytest.raises(LlmemError, match="symlink"):
        setup_file_logging(load_config(), "run")
    from llmem.paths import private_file

    private_file(logs / "run.log")
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644


# ---- a really full disk: a small tmpfs in a user and mount namespace -------------------------

FULL_DISK_SETUP = """
set -e
mount -t tmpfs -o size=2m tmpfs "$DISK"
export LLMEM_HOME="$DISK/home"
mkdir "$LLMEM_HOME"
printf 'embedding:\\n  provider: none\\nllm:\\n  provider: none\\nsession:\\n  adapter: none\\n' > "$LLMEM_HOME/config.yaml"
"$PY" -m llmem add -c "a memory written before the disk filled up" > /dev/null
"""


def _on_a_full_disk(tmp_path, script: str) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs tmpfs {disk}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("user namespaces with mounts are not allowed here")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMEM_", "XDG_"))}
    env.update(DISK=str(disk), OUT=str(tmp_path), PY=sys.executable)
    return subprocess.run(["unshare", "-rm", "bash", "-c", FULL_DISK_SETUP + script],
                          env=env, capture_output=True, text=True, timeout=120)


def test_hooks_fail_open_on_a_full_disk(tmp_path):
    # A session with a turn to extract, so the hooks try to write to the store and to their log.
    shutil.copytree(Path(__file__).parent / "hostile" / "transcript" / "copilot", tmp_path / "copilot")
    done = _on_a_full_disk(tmp_path, """
set +e
printf 'embedding:\\n  provider: none\\nllm:\\n  provider: none\\nsession:\\n  adapter: copilot\\n  copilot:\\n    state_dir: %s\\n' "$OUT/copilot" > "$LLMEM_HOME/config.yaml"
# Another process holds the store open (as `llmem run` does), so it opens and the writes fail.
"$PY" -c "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); c.execute('select 1 from memory').fetchall(); time.sleep(30)" "$LLMEM_HOME/memory.db" &
holder=$!
sleep 0.5
dd if=/dev/zero of="$DISK/filler" bs=1k 2> /dev/null
for kind in idle compacting ending; do
  "$PY" -m llmem hook --type $kind --session-id 5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9 --sync > /dev/null 2> "$OUT/$kind.err"
  echo "$kind exit=$? stderr_lines=$(wc -l < "$OUT/$kind.err")"
  cat "$OUT/$kind.err" >&2
done
kill $holder
""")
    assert "Traceback" not in done.stderr and "Logging error" not in done.stderr, done.stderr
    for kind in ("idle", "compacting", "ending"):
        assert f"{kind} exit=0 stderr_lines=1" in done.stdout, (done.stdout, done.stderr)
    assert "is full" in done.stderr and "rollback" not in done.stderr, done.stderr


def test_add_on_a_full_disk_says_the_disk_is_full(tmp_path):
    done = _on_a_full_disk(tmp_path, """
set +e
# Another process holds the store open (as `llmem run` does), so its WAL files exist.
"$PY" -c "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); c.execute('select 1 from memory').fetchall(); time.sleep(30)" "$LLMEM_HOME/memory.db" &
holder=$!
sleep 0.5
dd if=/dev/zero of="$DISK/filler" bs=4k 2> /dev/null
"$PY" -m llmem add -c "$(head -c 30000 /dev/zero | tr '\\0' x)"
echo "exit=$?"
kill $holder
""")
    assert "exit=1" in done.stdout, (done.stdout, done.stderr)
    assert "is full" in done.stderr and "rollback" not in done.stderr and "Traceback" not in done.stderr


def test_an_export_that_fills_the_disk_leaves_the_earlier_file_whole(tmp_path):
    done = _on_a_full_disk(tmp_path, """
set +e
"$PY" -m llmem export -o "$DISK/export.json" > /dev/null
"$PY" -c "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); c.execute('select 1 from memory').fetchall(); time.sleep(30)" "$LLMEM_HOME/memory.db" &
holder=$!
sleep 0.5
"$PY" -m llmem add -c "one more, so the next export differs" > /dev/null
cp "$DISK/export.json" "$OUT/before.json"
dd if=/dev/zero of="$DISK/filler" bs=1k 2> /dev/null
"$PY" -m llmem export -o "$DISK/export.json"
echo "exit=$?"
cmp "$DISK/export.json" "$OUT/before.json" && echo "earlier export intact"
ls -A "$DISK"
kill $holder
""")
    assert "exit=1" in done.stdout and "earlier export intact" in done.stdout, (done.stdout, done.stderr)
    assert "No space left" in done.stderr and "Traceback" not in done.stderr
    assert sorted(done.stdout.split("earlier export intact\n")[1].split()) == ["export.json", "filler", "home"]


def test_no_secret_is_written_to_a_log_or_shown_by_llmem_logs(cli, fts_config, llmem_home, tmp_path,
                                                               isolated_loggers):
    """Any record (a raw LLM reply, a failed request's body, a traceback) is redacted before it
    is written; a log an older llmem wrote is redacted when `llmem logs` shows it (issue 20.6)."""
    from secret_corpus import all_secrets, leaks, load_corpus

    planted, _ = load_corpus()
    secrets = all_secrets(planted)
    handler = file_handler(tmp_path / "run.log", "INFO")
    logger = logging.getLogger("llmem.test")
    logger.addHandler(handler)
    for entry in planted:
        logger.warning("raw reply: %s", entry.text)
        try:
            raise ValueError(entry.text)
        except ValueError:
            logger.exception("failed with %s", entry.text)
    handler.close()
    written = (tmp_path / "run.log").read_text()
    assert "[REDACTED:" in written and leaks(secrets, written) == []

    old = llmem_home / "logs"
    old.mkdir(parents=True, exist_ok=True)
    (old / "worker.log").write_text("".join(
        f"2026-11-30T10:00:00 WARNING llmem.providers.llm[7]: raw reply: {' '.join(e.text.split())}\n"
        for e in planted if "\n" not in e.text))
    code, out, err = cli("logs", "-n", "500")
    assert code == 0, err
    assert "raw reply" in out and leaks(secrets, out) == []
