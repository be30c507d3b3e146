"""`llmem ui` and `llmem run --ui` as the user runs them: a real process, a real server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
from fakes import wait_until

URL_LINE = re.compile(r"http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]{20,})\n")


def start(*args, stdout_path):
    with stdout_path.open("w") as sink:
        return subprocess.Popen([sys.executable, "-m", "llmem", *args], stdout=sink,
                                stderr=subprocess.PIPE, text=True, env=os.environ.copy())


def printed_url(process, stdout_path, timeout=20.0, poll=0.05) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = stdout_path.read_text()
        if text.endswith("\n"):
            return text
        assert process.poll() is None, process.stderr.read()
        time.sleep(poll)
    raise AssertionError("no URL printed")


def stop(process) -> int:
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(15)
    finally:
        if process.poll() is None:
            process.kill()


def test_ui_prints_one_url_line_with_a_free_loopback_port_and_serves_it(fts_config, tmp_path):
    out = tmp_path / "ui.out"
    process = start("ui", "--no-browser", "--port", "0", stdout_path=out)
    try:
        text = printed_url(process, out)
        match = URL_LINE.fullmatch(text)
        assert match, text
        port, token = match.groups()
        assert int(port) > 0
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if listening.returncode == 0:  # on 127.0.0.1 only
            assert listening.stdout.split()[3] == f"127.0.0.1:{port}"
        page = httpx.get(text.strip(), timeout=10)
        assert page.status_code == 200 and "Memories" in page.text
        assert httpx.get(f"http://127.0.0.1:{port}/memories", timeout=10).status_code == 403
        assert httpx.get(f"http://127.0.0.1:{port}/memories", timeout=10,
                         cookies={f"llmem_token_{port}": token}).status_code == 200
    finally:
        assert stop(process) == 0
    assert out.read_text() == text  # nothing else on stdout, ever


def test_a_ctrl_c_the_moment_the_url_is_printed_stops_the_viewer_cleanly(fts_config, tmp_path):
    """The URL is printed once the server serves and Ctrl-C stops it cleanly (exit 0). Printed
    before, a Ctrl-C in the next ~80 ms was a KeyboardInterrupt in the start-up code: exit 1
    ("Aborted."), or, when it landed in a weakref callback that Python runs and whose
    exceptions it drops, a viewer that went on serving after the Ctrl-C."""
    out = tmp_path / "ui.out"
    process = start("ui", "--no-browser", stdout_path=out)
    try:
        assert URL_LINE.fullmatch(printed_url(process, out, poll=0.002))
    finally:
        code = stop(process)
    assert code == 0, process.stderr.read()


def test_ui_on_a_port_in_use_is_a_usage_error(fts_config, tmp_path, cli):
    from llmem.ui.server import bind

    taken = bind(0)
    try:
        code, out, err = cli("ui", "--no-browser", "--port", str(taken.getsockname()[1]))
    finally:
        taken.close()
    assert code == 2
    assert out == ""
    assert "cannot listen on 127.0.0.1" in err and "--port 0" in err


def test_run_with_ui_serves_the_viewer_beside_the_worker(fts_config, tmp_path):
    out = tmp_path / "run.out"
    process = start("run", "--ui", "--no-browser", "-w", "1", stdout_path=out)
    try:
        text = printed_url(process, out)
        assert URL_LINE.fullmatch(text), text
        assert httpx.get(text.strip(), timeout=10).status_code == 200
    finally:
        assert stop(process) in (0, -signal.SIGINT)


def test_help_does_not_import_the_web_stack():
    probe = ("import sys; from llmem.cli import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('starlette', 'uvicorn', 'jinja2') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_keep_alive_responses_are_not_held_back_by_nagle(live_viewer):
    """Each response after the first on a connection waited ~40 ms (the server's socket had no
    TCP_NODELAY), which made every page of a browser's keep-alive connection slow."""
    import socket
    import statistics

    from .conftest import TOKEN

    host = live_viewer.url.removeprefix("http://")
    request = f"GET /static/icon.svg?token={TOKEN} HTTP/1.1\r\nHost: {host}\r\n\r\n"
    times = []
    with socket.create_connection(("127.0.0.1", int(host.split(":")[1]))) as conn:
        for _ in range(6):
            started = time.perf_counter()
            conn.sendall(request.encode())
            reply = b""
            while b"</svg>" not in reply:
                reply += conn.recv(65536)
            times.append(time.perf_counter() - started)
    assert statistics.median(times[1:]) < 0.030, times


def test_ui_opens_the_browser_on_the_printed_url_unless_told_not_to(llmem_app, monkeypatch, capsys):
    import webbrowser

    from llmem.cli.ui import prepare_viewer

    opened = []
    monkeypatch.setattr(webbrowser, "open", opened.append)  # never a real browser in tests
    printed = []
    for open_browser in (True, False):
        server = prepare_viewer(llmem_app, 0, open_browser=open_browser)
        assert capsys.readouterr().out == ""  # nothing until it serves
        server.start()
        said = []

        def printed_a_line(said=said):
            said.append(capsys.readouterr().out)
            return "".join(said).endswith("\n")

        wait_until(printed_a_line, timeout=10, interval=0.01)  # once the server thread serves
        server.stop()
        printed.append("".join(said).removesuffix("\n"))
    first, second = printed
    wait_until(lambda: opened, timeout=5, interval=0.01)
    assert opened == [first]
    assert URL_LINE.fullmatch(second + "\n")


def test_the_queue_the_cli_hands_the_viewer_enqueues_on_the_real_queue(llmem_app):
    from llmem.cli.queueing import open_queue, viewer_queue
    from llmem.pipeline.events import record_event

    event, _ = record_event(llmem_app.store, "copilot", "ses_one", "idle")
    queue = viewer_queue(llmem_app)
    assert queue.counts() == {"pending": 0, "scheduled": 0}
    queue.enqueue_event(event.id)
    huey, _ = open_queue(llmem_app.config)
    assert huey.pending_count() == 1
    assert queue.counts() == {"pending": 1, "scheduled": 0}
    assert huey.pending()[0].args == (event.id,)
