"""The queue after faults, with a real consumer process: a worker killed mid-dream does not
stop later dreams, and queue.db does not grow with every task run (issue 14 items 4, 9)."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import store_location
from fakes import wait_until

from llmem.dream.lock import LOCK_KEY, read_lock
from llmem.store import Store

LLMEM = [sys.executable, "-m", "llmem"]
# A worker whose dream hangs once it has taken the lock and written its run row (a slow
# night), so the test can kill it mid-dream.
SLOW_DREAM_WORKER = """
import time
from llmem.dream import sweep

def hang(*args, **kwargs):
    time.sleep(120)

sweep._plan_all = hang
from llmem.cli import main
main(["worker", "-w", "1"])
"""


def dream_runs(llmem_home):
    with Store.open(store_location()) as store:
        DreamRun = store.models.DreamRun
        return [(r.id, r.status, r.error) for r in DreamRun.select().order_by(DreamRun.started_at)]


def stop(worker):
    worker.send_signal(signal.SIGINT)
    try:
        return worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@pytest.fixture
def home(configure, tmp_path):
    return configure("embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: none\n").parent


def test_a_worker_killed_mid_dream_does_not_stop_the_next_dream(cli, home):
    assert cli("enqueue", "dream")[0] == 0  # in-process: the workers are the processes here
    worker = subprocess.Popen([sys.executable, "-c", SLOW_DREAM_WORKER], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: [r for r in dream_runs(home) if r[1] == "running"], timeout=60)
    finally:
        worker.kill()  # kill -9 in the middle of the dream
        worker.wait()
    [(dead_run, _, _)] = dream_runs(home)

    code, out, _ = cli("queue", "--json")
    [lock] = json.loads(out)["locks"]
    assert (lock["stale"], lock["pid"], lock["run_id"]) == (True, worker.pid, dead_run)
    code, out, _ = cli("queue")
    assert "STALE dream lock" in out and "--clear-stale-locks" in out
    code, out, _ = cli("dream", "status", "--json")
    assert json.loads(out)["last_run"]["status"] == "interrupted"
    code, out, _ = cli("doctor", "--json")
    [check] = [c for c in json.loads(out)["checks"] if c["name"] == "locks"]
    assert check["status"] == "warn" and str(worker.pid) in check["detail"]

    assert cli("enqueue", "dream")[0] == 0
    worker = subprocess.Popen([*LLMEM, "worker", "-w", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: [r for r in dream_runs(home) if r[1] == "done"], timeout=60)
    finally:
        assert stop(worker) == 0
    statuses = {run_id: (status, error) for run_id, status, error in dream_runs(home)}
    assert statuses[dead_run] == ("failed", "the process died during the run")
    assert "unable to acquire lock" not in "".join(p.read_text() for p in (home / "logs").glob("*.log"))


def test_clear_stale_locks_removes_a_dead_owners_lock(cli, home):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Store.open(store_location()) as store:
        store.models.DreamRun.create(id="deadrun00001", kind="dream", phases="light", status="running",
                                     started_at=time.time(), summary={})
        store.db.execute_sql("INSERT INTO setting(key, value) VALUES (?, ?)", (LOCK_KEY, json.dumps(
            {"pid": dead.pid, "host": socket.gethostname(), "run_id": "deadrun00001", "what": "dream",
             "started_at": time.time()})))
    code, out, _ = cli("dream", "status", "--json")
    assert json.loads(out)["recent_runs"][0]["status"] == "interrupted"
    code, out, _ = cli("queue", "--clear-stale-locks")
    assert code == 0 and f"cleared stale dream lock: dream run deadrun00001, dead process {dead.pid}" in out
    with Store.open(store_location()) as store:
        assert read_lock(store.db) is None
        run = store.models.DreamRun.get_by_id("deadrun00001")
        assert (run.status, run.error) == ("failed", "the process died during the run")
    code, out, _ = cli("queue", "--json")
    assert json.loads(out)["locks"] == []


def test_a_live_lock_from_a_recycled_pid_is_stale():
    from llmem.dream.lock import lock_is_live

    # A process started after the lock was taken cannot be the one that took it.
    younger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        holder = {"pid": younger.pid, "host": socket.gethostname(), "run_id": "r", "started_at": time.time() - 600}
        assert not lock_is_live(holder)
        assert lock_is_live({**holder, "started_at": time.time() + 5})
    finally:
        younger.kill()
        younger.wait()


def test_a_live_lock_stays_live_across_a_forward_clock_jump(home):
    """Issue 20 item 11: after the wall clock jumps forward, /proc's boot time (and so every
    start time in epoch seconds) moves with it, and a live owner looked as if it started
    after its lock: two dreams ran at once. The lock's boot id and start tick say it is the
    same process whatever the clock did."""
    from llmem.dream import DreamLock, DreamLocked
    from llmem.dream.lock import LOCK_KEY, lock_is_live
    from llmem.processes import process_identity, process_state

    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = process_state(owner.pid)[1]
        # The lock was stamped at `started` by the owner's clock; /proc now says the owner
        # started an hour later: what a one-hour forward jump does to boot time + ticks.
        holder = {"pid": owner.pid, "host": socket.gethostname(), "run_id": "jumped000001", "what": "dream",
                  "started_at": started - 3600, **process_identity(owner.pid)}
        assert lock_is_live(holder)
        with Store.open(store_location()) as store:
            store.db.execute_sql("INSERT INTO setting(key, value) VALUES (?, ?)", (LOCK_KEY, json.dumps(holder)))
            with pytest.raises(DreamLocked, match="jumped000001"):
                DreamLock(store.db, "second000001").acquire()
        # A later process given the same pid has another start tick: not the owner.
        assert not lock_is_live({**holder, "start_ticks": holder["start_ticks"] + 1})
        assert not lock_is_live({**holder, "boot_id": "another-boot"})
    finally:
        owner.kill()
        owner.wait()
    assert not lock_is_live(holder)  # dead


def test_a_lock_from_another_host_is_stale_beyond_its_window_either_way():
    from llmem.dream.lock import STALE_AFTER, lock_is_live

    remote = {"pid": 1, "host": "elsewhere.invalid", "run_id": "r", "started_at": time.time()}
    assert lock_is_live(remote)
    # A clock set back far (or another host's ahead): not trusted for ever.
    assert not lock_is_live({**remote, "started_at": time.time() + STALE_AFTER + 60})
    assert not lock_is_live({**remote, "started_at": time.time() - STALE_AFTER - 60})


def test_queue_db_keeps_no_task_results(cli, home):
    for task in ("embed_pending", "reconcile") * 5 + ("dream",):
        assert cli("enqueue", task)[0] == 0
    worker = subprocess.Popen([*LLMEM, "worker", "-w", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # one worker thread: the dream, queued last, runs last
        wait_until(lambda: [r for r in dream_runs(home) if r[1] == "done"], timeout=60)
    finally:  # a graceful stop waits for the task to return, and so for huey to store its result (if it did)
        assert stop(worker) == 0
    # Every task the test queued ran. A periodic one (the heartbeat, each minute) that the
    # consumer's scheduler queued on a minute turning during the run may still wait: it is
    # the next task, not a result kept.
    assert set(pending_task_names()) <= PERIODIC_TASKS
    with sqlite3.connect(home / "queue.db") as queue:
        assert queue.execute("SELECT count(*) FROM kv").fetchone()[0] == 0


PERIODIC_TASKS = {"heartbeat", "reconcile_periodic", "embed_catch_up", "dream_periodic"}


def pending_task_names() -> list[str]:
    """The names of the tasks waiting in the configured queue."""
    from llmem.config import load_config
    from workers import tasks
    from workers.app import build_huey

    config = load_config()
    huey = build_huey(config)
    tasks.register(huey, config)
    return [task.name for task in huey.pending()]
