"""`llmem mcp` at the protocol's edges (issue 20 item 13): a lone surrogate in the arguments,
a memory too large to keep, a client that goes away mid-call.

The size cap goes through the SDK's own client, to the server's tools in this process (the cap is
the tools', not the process's). The other two cannot: the SDK's client refuses
to encode a lone surrogate (pydantic will not write one), and it terminates the server when it
closes, hiding its exit code; so those speak JSON-RPC over the server's stdio by hand, as a
client in another language does.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time

import pytest
from conftest import write_config
from fakes import FakeModelServer
from mcp_client import InProcessMcpClient
from test_mcp import error_of, server_env

from llmem.mcp_server import MAX_TEXT_CHARS


class RawClient:
    """`llmem mcp` in a subprocess and JSON-RPC lines written and read by hand."""

    def __init__(self, env: dict, cwd):
        self.proc = subprocess.Popen([sys.executable, "-m", "llmem", "mcp"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
        self.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}))
        assert self.receive()["id"] == 0
        self.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    def send(self, line: str) -> None:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 30) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        return json.loads(line) if line else None

    def call_line(self, request_id: int, name: str, arguments_json: str) -> str:
        return (f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call",'
                f'"params":{{"name":"{name}","arguments":{arguments_json}}}}}')

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        code = self.proc.wait(timeout)
        return code, self.proc.stderr.read().decode(errors="replace")


@pytest.fixture
def raw_env(tmp_path):
    home = tmp_path / "llmem-home"
    write_config(home, "embedding:\n  provider: none\nllm:\n  provider: none\n")
    return server_env(home, tmp_path / "user-home")


def _text(reply: dict) -> str:
    return "\n".join(part["text"] for part in reply["result"]["content"])


def test_a_lone_surrogate_gets_a_tool_error_and_the_server_goes_on(raw_env, tmp_path):
    client = RawClient(raw_env, tmp_path)
    try:
        client.send(client.call_line(1, "remember", '{"content": "the port is \\ud800 8080"}'))
        reply = client.receive()
        assert reply is not None, "no reply at all"
        assert reply["id"] == 1 and reply["result"]["isError"] is True
        assert "surrogate" in _text(reply)
        # A proper pair is text (U+1F600), and an escaped backslash before `ud800` is no escape.
        client.send(client.call_line(2, "remember", '{"content": "deploys are \\ud83d\\ude00 on Fridays"}'))
        reply = client.receive()
        assert reply["id"] == 2 and reply["result"]["isError"] is False, reply
        client.send(client.call_line(3, "remember", '{"content": "the path is C:\\\\ud800 on Windows"}'))
        reply = client.receive()
        assert reply["id"] == 3 and reply["result"]["isError"] is False, reply
        client.send(client.call_line(4, "search", '{"query": "deploys"}'))
        assert "\U0001f600" in _text(client.receive())
    finally:
        code, stderr = client.finish()
    assert code == 0 and "Traceback" not in stderr


def test_a_client_gone_mid_call_ends_the_server_cleanly(tmp_path):
    model_server = FakeModelServer().start()
    model_server.mode = "held"  # the search's embedding is answered only once the client is gone
    try:
        home = tmp_path / "llmem-home"
        write_config(home, f"embedding:\n  provider: ollama\n  base_url: {model_server.url}\n"
                           "llm:\n  provider: none\n")
        client = RawClient(server_env(home, tmp_path / "user-home"), tmp_path)
        client.send(client.call_line(1, "search", '{"query": "where is the deploy script"}'))
        deadline = time.monotonic() + 30
        while not any(path == "/api/embed" for path, _ in model_server.requests):  # the call is in flight
            assert time.monotonic() < deadline, "the search never reached the embedder"
            time.sleep(0.01)
        client.proc.stdin.close()
        client.proc.stdout.close()  # the client is gone: the reply has nowhere to go
        model_server.release()
        code, stderr = client.finish()
    finally:
        model_server.stop()
    assert code == 0, stderr
    assert "ExceptionGroup" not in stderr and "Traceback" not in stderr


def test_memory_content_is_capped_at_a_documented_size(tmp_path, configure):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    client = InProcessMcpClient(cwd=tmp_path).start()
    try:
        huge = "the release checklist says " + "x" * MAX_TEXT_CHARS
        for name, arguments in (("remember", {"content": huge}), ("search", {"query": huge}),
                                ("learn", {"wrong": huge, "right": "keep it short"})):
            error = error_of(client.call(name, **arguments))
            assert f"at most {MAX_TEXT_CHARS:,}" in error, error
            assert len(error) < 2000  # the text itself is not echoed back
        fits = "the release checklist says " + "y" * (MAX_TEXT_CHARS - 40)
        assert not client.call("remember", content=fits).is_error
    finally:
        client.close()
    from llmem.app import App

    app = App()
    try:
        assert [len(m.content) for m in app.store.list()] == [len(fits)]
    finally:
        app.close()
