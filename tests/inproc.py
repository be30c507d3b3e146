"""Run the real `llmem` entry point in the test's own process, as a subprocess would run it.

A fresh interpreter costs ~150 ms of CPU before llmem does anything (`python -c pass` ~30 ms
plus click, peewee and the store's modules); most tests that ran `llmem …` as a subprocess did
so only to read its exit code, output and files, which the same entry point proves in-process:
`llmem.__main__.main(argv)` is what the console script calls, with the environment, working
folder, stdin and stdout/stderr set up here as the process would have them. Tests whose subject
is the process itself (a hook's exit code under os._exit, signals, a killed worker, the console
script) keep real subprocesses.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Ran:
    """What a finished `llmem` run left: as subprocess.CompletedProcess, text already decoded."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def forget_stderr_logging() -> None:
    """Drop the stderr handler an earlier in-process run added to the `llmem` logger: it holds
    that run's sys.stderr (the CLI adds it once per process), so this run's warnings would go
    to a stream nobody reads any more. The CLI adds a new one on the current stderr."""
    root = logging.getLogger("llmem")
    for handler in [h for h in root.handlers if getattr(h, "_llmem_stderr", False)]:
        root.removeHandler(handler)


def close_queues() -> None:
    """Close the queues cli/queueing.py keeps open for the rest of the process."""
    queueing = sys.modules.get("llmem.cli.queueing")
    if queueing is None:
        return
    for huey, _ in queueing._queues.values():
        huey.storage.close()
    queueing._queues.clear()


def run_llmem(args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
              stdin: bytes | None = None, drop_env: tuple[str, ...] = (),
              collect_garbage: bool = False, stderr_fd: int | None = None) -> Ran:
    """`llmem args` through the console script's own main(), in this process.

    env: variables set for the run; drop_env: prefixes of variables removed (as a test that
    builds a subprocess's environment from os.environ without them); cwd: the working folder;
    stdin: the bytes on standard input (none: an empty pipe, never a terminal). stdout and
    stderr are UTF-8, strict, like a process run with PYTHONIOENCODING=utf-8 into a pipe.
    Everything is put back afterwards, and what a process would close at its exit is closed:
    the queues the CLI keeps open for the process (cli/queueing.py), and with collect_garbage
    whatever only a garbage collection frees (a connection to a damaged file held by the
    traceback of the error that reported it: SQLite removes its -wal/-shm once it is closed).
    A full collection costs ~0.1 s in a worker that imported everything, so only on request.
    stderr_fd: a descriptor standard error writes to instead (a pseudo-TTY's end, read by the
    caller), as a process's stderr on it would; the Ran then holds no stderr.
    """
    from llmem.__main__ import main

    out, err = io.BytesIO(), io.BytesIO()
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if drop_env and name.startswith(drop_env)]:
            patch.delenv(name)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        if cwd is not None:
            patch.chdir(cwd)
        patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8"))
        patch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8", write_through=True))
        errors = err if stderr_fd is None else open(stderr_fd, "wb", buffering=0, closefd=False)  # noqa: SIM115
        patch.setattr(sys, "stderr", io.TextIOWrapper(errors, encoding="utf-8", write_through=True))
        forget_stderr_logging()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:  # sys.exit("message"): said on stderr, exit 1, as the interpreter does
                print(exc.code, file=sys.stderr)
                code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            forget_stderr_logging()
            close_queues()
            if collect_garbage:
                gc.collect()
            # Read now: the wrappers close their buffers when they are dropped.
            said = [buffer.getvalue().decode("utf-8", errors="replace") for buffer in (out, err)]
    return Ran(list(args), code, *said)
