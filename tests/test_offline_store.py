"""A machine whose store's server goes away (issue 23, offline tolerance): a real `llmem run`
over a PostgreSQL store keeps watching while the server is stopped mid-run, keeps what it saw,
and delivers it when the server is back: every turn written before, during and after the
outage is a memory exactly once, and no event is left undone. And the same with the watcher
killed during the outage and started again while the server is still away: what it had kept
waits in its spool on disk (pipeline/spool.py), and is delivered once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psycopg
import pytest
from fakes import wait_until
from session_writers import CopilotSession

LLMEM = [sys.executable, "-m", "llmem"]


def machine_on(tmp_path, url):
    """(llmem home, Copilot's session-state folder, the environment) of a machine whose store
    is the server at `url`."""
    home, state_dir = tmp_path / "llmem-home", tmp_path / "copilot" / "session-state"
    home.mkdir()
    state_dir.mkdir(parents=True)
    write_config(home, url, state_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env |= {"LLMEM_HOME": str(home), "HOME": str(tmp_path)}
    return home, state_dir, env


def write_config(home, url, state_dir) -> None:
    (home / "config.yaml").write_text(
        f"store:\n  url: {url}\nembedding:\n  provider: none\nllm:\n  provider: none\n"
        f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
        "pipeline:\n  workers: 1\n  idle_debounce_seconds: 1\n  ending_inactivity_minutes: 1\n"
        "  running_timeout_minutes: 0.1\n  reconcile_pending_seconds: 3\n")


def planted(conn, tokens) -> dict[str, int]:
    """How many valid typed memories (not episodes) hold each token."""
    rows = conn.execute("SELECT lower(content) FROM memory WHERE invalidated_at IS NULL "
                        "AND source <> 'episode'").fetchall()
    return {token: sum(token in content for (content,) in rows) for token in tokens}


@pytest.mark.slow
@pytest.mark.backend
def test_the_store_server_stops_mid_run_and_no_turn_is_lost_or_doubled(tmp_path, servers):
    url = servers.fresh_database()
    server = servers.postgres()
    home, state_dir, env = machine_on(tmp_path, url)
    out = (tmp_path / "run.out").open("w")
    runner = subprocess.Popen([*LLMEM, "run"], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    tokens: list[str] = []

    def turn(session: CopilotSession, number: int) -> None:
        token = f"zq{number:03d}x"
        tokens.append(token)
        session.user(f"Remember that service {token} listens on port {4000 + number}.")
        session.reply("Noted.")

    try:
        wait_until(lambda: "Ctrl-C stops" in (tmp_path / "run.out").read_text(), timeout=60)
        sessions = [CopilotSession(state_dir, cwd=f"/work/repo{i}") for i in range(4)]
        for session in sessions:
            session.start()
        turn(sessions[0], 1)
        turn(sessions[1], 2)
        with psycopg.connect(url) as conn:
            wait_until(lambda: all(planted(conn, tokens).values()), timeout=60)
        server.stop()  # the laptop leaves the network
        try:
            turn(sessions[0], 3)  # a later turn of a session already seen
            turn(sessions[2], 4)  # a session begun while the server is away
            turn(sessions[3], 5)
            # The watcher sees those idles while the server is away, and cannot record them yet.
            wait_until(lambda: "event=idle could not be recorded" in (tmp_path / "run.out").read_text(),
                       timeout=60)
        finally:
            server.start()
        turn(sessions[1], 6)  # and one after it is back
        with psycopg.connect(url) as conn:
            try:
                wait_until(lambda: all(planted(conn, tokens).values()), timeout=120)
            except AssertionError:
                raise AssertionError(f"{planted(conn, tokens)}\n" + (tmp_path / "run.out").read_text()[-4000:]
                                     + "\n".join(p.read_text()[-3000:] for p in (home / "logs").glob("*.log"))) from None
            wait_until(lambda: conn.execute("SELECT count(*) FROM event WHERE status <> 'done'").fetchone()[0] == 0,
                       timeout=120)
            counts = planted(conn, tokens)
        assert counts == {token: 1 for token in tokens}, (tmp_path / "run.out").read_text()[-3000:]
        assert runner.poll() is None  # llmem run lived through it
    finally:
        runner.send_signal(signal.SIGINT)
        try:
            runner.wait(60)
        except subprocess.TimeoutExpired:
            runner.kill()
        out.close()


def stop(process: subprocess.Popen, sig=signal.SIGINT) -> None:
    if process.poll() is None:
        process.send_signal(sig)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@pytest.mark.slow
@pytest.mark.backend
def test_a_watcher_killed_and_restarted_while_the_server_is_away_delivers_its_spool_once(tmp_path, servers):
    url = servers.fresh_database()
    server = servers.postgres()
    home, state_dir, env = machine_on(tmp_path, url)
    spool = home / "spool.jsonl"
    logs = []

    def start(command: str) -> subprocess.Popen:
        out = tmp_path / f"{command}-{len(logs)}.out"
        logs.append(out)
        return subprocess.Popen([*LLMEM, command], env=env, cwd=tmp_path, stdout=out.open("w"),
                                stderr=subprocess.STDOUT)

    def said(text: str, out=None) -> int:
        files = [out] if out else [*logs, *(home / "logs").glob("*.log")]
        return sum(path.read_text(errors="replace").count(text) for path in files if path.exists())

    def evidence() -> str:
        return "\n".join(f"--- {path.name}\n" + path.read_text(errors="replace")[-2500:]
                         for path in [*logs, *(home / "logs").glob("*.log")] if path.exists())

    tokens: list[str] = []

    def turn(session: CopilotSession, number: int) -> None:
        token = f"zq{number:03d}y"
        tokens.append(token)
        session.user(f"Remember that service {token} listens on port {5000 + number}.")
        session.reply("Noted.")

    worker = start("worker")
    watcher = start("watch")
    restarted = None
    try:
        wait_until(lambda: said("Ctrl-C stops", logs[1]), timeout=60)
        sessions = [CopilotSession(state_dir, cwd=f"/work/repo{i}") for i in range(4)]
        for session in sessions[:3]:
            session.start()
        turn(sessions[0], 1)
        turn(sessions[1], 2)
        with psycopg.connect(url) as conn:
            wait_until(lambda: all(planted(conn, tokens).values()), timeout=60)
        server.stop()  # the laptop leaves the network
        try:
            turn(sessions[0], 3)  # a later turn of a session already seen
            turn(sessions[2], 4)  # a session begun while the server is away
            # The watcher sees those idles while the server is away, and keeps them on disk.
            wait_until(lambda: said("event=idle could not be recorded, kept in the spool") >= 2, timeout=60)
            kept = spool.read_text()
            assert oct(spool.stat().st_mode & 0o777) == "0o600"
            watcher.send_signal(signal.SIGKILL)  # killed, its state in memory lost with it
            watcher.wait(30)
            sessions[3].start()
            turn(sessions[3], 5)  # written while no watcher runs
            restarted = start("watch")  # started again while the server is still away
            wait_until(lambda: said("Ctrl-C stops", logs[-1]), timeout=60)
            assert said("waiting for the store", logs[-1]), evidence()
            turn(sessions[1], 6)  # seen only once the store answers: its saved state says what is new
            assert spool.read_text().startswith(kept)  # nothing lost, nothing delivered yet
        finally:
            server.start()
        turn(sessions[2], 7)  # and one after it is back
        with psycopg.connect(url) as conn:
            try:
                wait_until(lambda: all(planted(conn, tokens).values()), timeout=120)
                wait_until(lambda: conn.execute("SELECT count(*) FROM event WHERE status <> 'done'").fetchone()[0] == 0,
                           timeout=120)
            except AssertionError:
                raise AssertionError(f"{planted(conn, tokens)}\n{evidence()}") from None
            counts = planted(conn, tokens)
            idles = dict(conn.execute("SELECT session_id, count(*) FROM event WHERE kind = 'idle' "
                                      "GROUP BY session_id").fetchall())
        assert counts == {token: 1 for token in tokens}, evidence()
        assert said("spool: delivered 2 kept moment(s)"), evidence()
        assert not spool.exists()  # every kept moment delivered, the file gone
        # One idle event per turn at most: the spooled ones were not recorded twice.
        assert idles[sessions[0].id] <= 2 and idles[sessions[2].id] <= 2, idles
        assert worker.poll() is None and restarted.poll() is None  # both lived through it
    finally:
        for process in (restarted, watcher, worker):
            if process is not None:
                stop(process)
