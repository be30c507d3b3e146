"""`llmem mcp` driven by the MCP SDK's own stdio client, from synchronous code (tests, benches).

The SDK's client is async and its streams belong to the task that opened them, so one task on
a loop in a thread of its own holds the session for the server's life; calls are submitted to
that loop and waited for.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CALL_TIMEOUT = 60.0


class McpClient:
    """One `llmem mcp` subprocess and an initialised ClientSession talking to it."""

    def __init__(self, env: dict[str, str], cwd: str | Path | None = None,
                 args: tuple[str, ...] = ("mcp",), errlog=None):
        self.params = StdioServerParameters(command=sys.executable, args=["-m", "llmem", *args],
                                            env=env, cwd=str(cwd) if cwd else None)
        self.errlog = errlog if errlog is not None else sys.stderr
        self.loop = asyncio.new_event_loop()
        self.session: ClientSession | None = None
        self.server_pid: int | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="mcp-client", daemon=True)

    def start(self, timeout: float = CALL_TIMEOUT) -> McpClient:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("llmem mcp did not initialise in time")
        if self._failure is not None:
            raise self._failure
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._hold())
        except BaseException as exc:  # reported to start() or to the next call
            self._failure = exc
            self._ready.set()

    async def _hold(self) -> None:
        self._stop = asyncio.Event()
        async with (stdio_client(self.params, errlog=self.errlog) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            self.session = session
            self._ready.set()
            await self._stop.wait()

    def _call(self, coroutine):
        if self._failure is not None:
            raise self._failure
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(CALL_TIMEOUT)

    def list_tools(self):
        return self._call(self.session.list_tools())

    def call(self, name: str, **arguments):
        """The CallToolResult of one tool call."""
        return self._call(self.session.call_tool(name, arguments))

    def text(self, name: str, **arguments) -> str:
        """The reply's text of a call that must succeed."""
        result = self.call(name, **arguments)
        text = "\n".join(part.text for part in result.content)
        if result.is_error:
            raise AssertionError(f"{name} failed: {text}")
        return text

    def close(self) -> None:
        if self._stop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
