"""The test doubles, for tests and benches alike: a real HTTP server on 127.0.0.1 playing
Ollama/OpenAI, the same vectors in-process (FakeEmbedder), a chat LLM without HTTP (StubLLM),
and `wait_until` for what another thread or process does."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from llmem.providers.embedders import Embedder

FAKE_DIM = 64


def fake_vector(text: str, dim: int = FAKE_DIM) -> list[float]:
    """A deterministic bag-of-words vector: texts sharing words point the same way."""
    vector = np.zeros(dim, dtype=np.float64)
    for word in re.findall(r"\w+", text.lower()):
        if word in ("search_query", "search_document"):
            continue
        digest = hashlib.sha256(word.encode()).digest()
        vector[digest[0] % dim] += 1.0 if digest[1] % 2 else -1.0
        vector[digest[2] % dim] += 0.5
    if not vector.any():
        vector[0] = 1.0
    return (vector / np.linalg.norm(vector)).tolist()


class FakeEmbedder(Embedder):
    """In-process deterministic embedder: the fake server's vectors without HTTP."""

    provider = "fake"

    def __init__(self, model: str = "words", dim: int = FAKE_DIM):
        super().__init__(model)
        self.fixed_dim = dim

    def _embed(self, texts):
        return [fake_vector(t, self.fixed_dim) for t in texts]


class StubLLM:
    """The chat LLM's `chat_json` without HTTP.

    `reply` is the parsed JSON every call returns, or a function of the call's number (1, 2, …)
    giving it; `error`, when set, is raised instead. `tasks` and `messages` record each call.
    """

    def __init__(self, reply=None, *, error: Exception | None = None):
        self.reply, self.error = reply, error
        self.tasks: list[str] = []
        self.messages: list[list[dict]] = []

    def chat_json(self, messages, schema, task):
        self.tasks.append(task)
        self.messages.append(messages)
        if self.error:
            raise self.error
        return self.reply(len(self.tasks)) if callable(self.reply) else self.reply

    def close(self) -> None:
        pass


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.2):
    """Poll `predicate` until it returns something true, and return that; fail after `timeout` s.

    The polls start 10 ms apart and double up to `interval`: what happens at once is seen at
    once (a fixed 0.2 s cost each wait ~0.1 s for nothing), and a long wait still polls a
    costly predicate (a subprocess, a store opened) only every `interval`."""
    deadline = time.monotonic() + timeout
    pause = min(0.01, interval)
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(pause)
        pause = min(pause * 2, interval)
    raise AssertionError("condition not reached in time")


class FakeModelServer:
    """Ollama (/api/embed, /api/tags, /api/chat) and OpenAI (/v1/embeddings) on loopback.

    `mode` switches behaviour at run time: "ok", "error" (HTTP 500), "slow" (sleeps
    `delay` seconds), "held" (answers once the test calls `release()`: a call kept in flight
    for exactly as long as the test needs, not for a guessed delay), "garbage" (not JSON).
    `requests` records every request body.
    """

    def __init__(self, dim: int = FAKE_DIM):
        self.dim = dim
        self.mode = "ok"
        self.delay = 2.0
        self.released = threading.Event()
        self.requests: list[tuple[str, dict]] = []
        self.chat_replies: list[str] = []  # scripted /api/chat contents, consumed in order
        # Or a function of the request (path, body) giving the chat content: a reply that
        # depends on what was asked, safe under concurrent requests (bench/recall.py).
        self.chat_answer = None
        self.embeddings_reply: list | None = None  # when set, what /api/embed answers as 'embeddings'
        self.chat_status: dict[str, int] = {}  # chat model name -> HTTP error status it answers
        self.models = ["nomic-embed-text:latest", "llama3.1:8b"]
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                if self.path == "/api/tags":
                    self._reply(200, {"models": [{"name": m} for m in server.models]})
                elif self.path == "/v1/models":
                    self._reply(200, {"data": [{"id": m} for m in server.models]})
                else:
                    self._reply(404, {"error": "not found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                server.requests.append((self.path, body))
                if server.mode == "slow":
                    time.sleep(server.delay)
                elif server.mode == "held":
                    server.released.wait(60)
                if server.mode == "error":
                    return self._reply(500, {"error": "model crashed"})
                if server.mode == "garbage":
                    return self._reply(200, b"<html>not json")
                if self.path == "/api/embed":
                    if body.get("model", "").split(":")[0] not in {m.split(":")[0] for m in server.models}:
                        return self._reply(404, {"error": f"model '{body.get('model')}' not found"})
                    if server.embeddings_reply is not None:
                        return self._reply(200, {"model": body["model"], "embeddings": server.embeddings_reply})
                    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    return self._reply(200, {"model": body["model"],
                                             "embeddings": [fake_vector(t, server.dim) for t in inputs]})
                if self.path == "/v1/embeddings":
                    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    return self._reply(200, {"data": [{"index": i, "embedding": fake_vector(t, server.dim)}
                                                      for i, t in enumerate(inputs)]})
                refused = server.chat_status.get(body.get("model", ""))
                if refused and self.path in ("/api/chat", "/v1/chat/completions"):
                    return self._reply(refused, {"error": f"model '{body.get('model')}' answered {refused}"})
                if self.path == "/api/chat":
                    if server.chat_answer is not None:
                        content = server.chat_answer(self.path, body)
                    else:
                        content = server.chat_replies.pop(0) if server.chat_replies else "{}"
                    return self._reply(200, {"message": {"role": "assistant", "content": content},
                                             "prompt_eval_count": 10, "eval_count": 5, "done": True})
                if self.path == "/v1/chat/completions":
                    content = server.chat_replies.pop(0) if server.chat_replies else "{}"
                    return self._reply(200, {"choices": [{"message": {"role": "assistant", "content": content}}],
                                             "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
                self._reply(404, {"error": "not found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # Polled every 10 ms rather than serve_forever's 0.5 s, so that stop() takes ms.
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01},
                                       daemon=True)

    def start(self) -> FakeModelServer:
        self.thread.start()
        return self

    def release(self) -> None:
        """Let the held requests answer (mode "held")."""
        self.released.set()

    def stop(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def embed_requests(self) -> list[dict]:
        return [body for path, body in self.requests if path in ("/api/embed", "/v1/embeddings")]
