"""A full disk (issue 20 item 17): reading commands still read, and a dream that cannot write
leaves no "running" run and no lock row behind.

The disk is filled for real, by the kernel: a child process whose file-size limit
(RLIMIT_FSIZE) forbids every file to grow, as a full disk does (SIGXFSZ ignored, so a write
fails with EFBIG, which SQLite reports as it does ENOSPC). chmod would not do: root writes
through it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from llmem.store import Store

TESTS = Path(__file__).parent

# Runs argv with no file allowed to grow past `limit` bytes (0: no file grows at all).
FULL_DISK = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
os.execvp(sys.argv[2], sys.argv[2:])
"""


def on_full_disk(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    llmem = [sys.executable, "-m", "llmem", *args]
    return subprocess.run([sys.executable, "-c", FULL_DISK, "0", *llmem], input=stdin,
                          capture_output=True, text=True, timeout=60, env=os.environ.copy())


def test_list_search_context_and_session_start_read_a_store_on_a_full_disk(llmem_home):
    llmem_home.mkdir()
    (llmem_home / "config.yaml").write_text("embedding:\n  provider: none\nllm:\n  provider: none\n")
    with Store.open(llmem_home / "memory.db") as store:
        memory = store.add("the api gateway listens on port 8080", "decision").memory
    before = (llmem_home / "memory.db").read_bytes()

    listed = on_full_disk("list")
    assert listed.returncode == 0, listed.stderr
    assert memory.id[:8] in listed.stdout
    found = on_full_disk("search", "gateway port")
    assert found.returncode == 0, found.stderr
    assert memory.id[:8] in found.stdout and "Traceback" not in found.stderr
    block = on_full_disk("context", "--project", "/work/api")
    assert block.returncode == 0, block.stderr
    assert f"[{memory.id[:8]}]" in block.stdout
    hook = on_full_disk("hook", "--type", "created", "--adapter", "none", "--format", "claude",
                        stdin=json.dumps({"session_id": "s-full-disk", "cwd": "/work/api"}))
    assert hook.returncode == 0
    injected = json.loads(hook.stdout)["hookSpecificOutput"]["additionalContext"]
    assert f"[{memory.id[:8]}] decision: the api gateway listens on port 8080" in injected
    assert (llmem_home / "memory.db").read_bytes() == before  # nothing written
    # With room again, the recalls are recorded as before.
    with Store.open(llmem_home / "memory.db") as store:
        assert store.models.RecallEvent.select().count() == 0


DREAM_ON_A_FILLING_DISK = """
import os, pathlib, resource, signal, sys
sys.path.insert(0, sys.argv[1])
from test_dream_sweep import build
from llmem.dream import sweep
from llmem.store import Store

home = pathlib.Path(os.environ["LLMEM_HOME"])
config = build(home)
store = Store.open(config.store_location)
original = sweep.start_run
wal = pathlib.Path(str(config.db_path) + "-wal")

def start_then_the_disk_fills(*args, **kwargs):
    run = original(*args, **kwargs)  # the lock row and the running run are written ...
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # ... then no file may grow any more
    resource.setrlimit(resource.RLIMIT_FSIZE, (wal.stat().st_size, resource.RLIM_INFINITY))
    return run

sweep.start_run = start_then_the_disk_fills
try:
    sweep.run_dream(store, config, apply=True, use_llm=False)
    print("the first dream finished")
except Exception as exc:
    print("the first dream failed:", type(exc).__name__, flush=True)
sweep.start_run = original
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
# Room again: the same long-lived process (the worker) dreams the next night.
outcome = sweep.run_dream(store, config, apply=True, use_llm=False)
print("the second dream:", outcome.run_id, outcome.notes)
"""


def test_a_dream_on_a_full_disk_leaves_no_running_run_nor_lock(llmem_home):
    child = subprocess.run([sys.executable, "-c", DREAM_ON_A_FILLING_DISK, str(TESTS)],
                           capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert child.returncode == 0, child.stdout + child.stderr
    assert "the first dream failed" in child.stdout
    with Store.open(llmem_home / "memory.db") as store:
        from llmem.dream.lock import read_lock

        runs = {run.id: run for run in store.models.DreamRun.select()}
        assert read_lock(store.db) is None
        assert [run.status for run in runs.values()].count("running") == 0
        assert sorted(run.status for run in runs.values()) == ["done", "failed"]
