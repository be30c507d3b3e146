"""A machine whose store's server goes away (issue 23, offline tolerance): a real `llmem run`
over a PostgreSQL store keeps watching while the server is stopped mid-run, keeps what it saw,
and delivers it when the server is back: every turn written before, during and after the
outage is a memory exactly once, and no event is left undone."""

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
    home, state_dir = tmp_path / "llmem-home", tmp_path / "copilot" / "session-state"
    home.mkdir()
    state_dir.mkdir(parents=True)
    (home / "config.yaml").write_text(
        f"store:\n  url: {url}\nembedding:\n  provider: none\nllm:\n  provider: none\n"
        f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
        "pipeline:\n  workers: 1\n  idle_debounce_seconds: 1\n  ending_inactivity_minutes: 1\n"
        "  running_timeout_minutes: 0.1\n  reconcile_pending_seconds: 3\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env |= {"LLMEM_HOME": str(home), "HOME": str(tmp_path)}
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
