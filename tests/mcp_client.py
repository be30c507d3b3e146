"""`llmem mcp` driven by the MCP SDK's own client, from synchronous code (tests, benches).

The SDK's client is async and its streams belong to the task that opened them, so one task on
a loop in a thread of its own holds the session for the server's life; calls are submitted to
that loop and waited for.

`McpClient` talks to a real `llmem mcp` subprocess over stdio. `InProcessMcpClient` serves the
same tools (mcp_server.build_server) in this process and talks to them through the SDK's
in-memory pairing of client and server: the JSON-RPC session, the initialize handshake and the
tools' argument checks are the SDK's, as over stdio, without a process that imports the SDK
again (~1.2 s of CPU). It is for tests about what the tools do; a test about the process, its
stdio or its environment starts the real one.

The SDK is imported when a client is made, not with this module: collecting a test file that
imports it costs no SDK import.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from contextlib import AsyncExitStack
from pathlib import Path

CALL_TIMEOUT = 60.0


class McpClient:
    """One `llmem mcp` subprocess and an initialised ClientSession talking to it."""

    def __init__(self, env: dict[str, str], cwd: str | Path | None = None,
                 args: tuple[str, ...] = ("mcp",), errlog=None):
        from mcp import StdioServerParameters

        self.params = StdioServerParameters(command=sys.executable, args=["-m", "llmem", *args],
                                            env=env, cwd=str(cwd) if cwd else None)
        self.errlog = errlog if errlog is not None else sys.stderr
        self.loop = asyncio.new_event_loop()
        self.session = None
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
        async with AsyncExitStack() as stack:
            self.session = await self._open(stack)
            self._ready.set()
            await self._stop.wait()

    async def _open(self, stack: AsyncExitStack):
        """An initialised session (list_tools, call_tool), closed with `stack`."""
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        read, write = await stack.enter_async_context(stdio_client(self.params, errlog=self.errlog))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        return session

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


class InProcessMcpClient(McpClient):
    """The tools `llmem mcp` serves, built in this process on an App of its environment (the
    test's LLMEM_HOME), scoped to `cwd` as the server started there would be, and run on one
    thread of their own as the server runs them; talked to through the SDK's own client."""

    def __init__(self, cwd: str | Path):
        self.cwd = Path(cwd)
        self.loop = asyncio.new_event_loop()
        self.session = None
        self._ready = threading.Event()
        self._failure = None
        self._stop = None
        self._thread = threading.Thread(target=self._run, name="mcp-client-in-process", daemon=True)

    async def _open(self, stack: AsyncExitStack):
        from concurrent.futures import ThreadPoolExecutor

        from mcp import Client

        from llmem.app import App
        from llmem.mcp_server import MemoryTools, build_server, working_project

        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmem-mcp")
        tools = MemoryTools(App(), default_project=working_project(self.cwd), cwd=self.cwd)

        def close_tools() -> None:  # on the tools' thread, whose connection it is, as serve() does
            executor.submit(tools.close).result()
            executor.shutdown()

        stack.callback(close_tools)
        # "legacy": the initialize handshake and JSON-RPC over the in-memory streams, as the
        # stdio session has them.
        return await stack.enter_async_context(Client(build_server(tools, executor), mode="legacy"))
