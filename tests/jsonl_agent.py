"""A fifth agent that exists only in the tests: "jsonlog", one JSONL file per session in a
folder named by $LLMEM_JSONLOG_DIR. It is one module, as adapters/agent.py asks of an agent,
and it joins llmem with one line: `registry.AGENT_MODULES["jsonlog"] = "jsonl_agent"` (the
`jsonlog_agent` fixture of test_agent_registry.py does it with monkeypatch).

Its format, one JSON object a line:
    {"type": "meta", "cwd": "/work/acme"}                  the session's folder, first
    {"type": "message", "id": "m1", "role": "user", "text": "…", "ts": 1700000000.0}
    {"type": "message", "id": "m2", "role": "assistant", "text": "…", "ts": …, "done": true}
    {"type": "end", "ts": …}                               the session is over
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from llmem.adapters.agent import Agent, JsonlWatch
from llmem.adapters.base import (
    JsonlTail,
    SessionInfo,
    SessionNotFound,
    Transcript,
    TranscriptMessage,
    messages_after,
    mtime_ms,
    validate_session_id,
)
from llmem.adapters.lifecycle import Lifecycle, Moment

NAME = "jsonlog"
FOLDER_VARIABLE = "LLMEM_JSONLOG_DIR"


def parse(raw: bytes, first_index: int = 0) -> list[tuple[int, dict]]:
    """(line number, object) of every complete line that is a JSON object with a type."""
    lines = []
    for index, line in enumerate(raw.split(b"\n")[:-1], first_index):
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("type"), str):
            lines.append((index, item))
    return lines


def transcript_of(session_id: str, lines: list[tuple[int, dict]], path: Path) -> Transcript:
    transcript = Transcript(adapter=NAME, session_id=session_id, source_path=str(path))
    for index, item in lines:
        if item["type"] == "meta":
            transcript.directory = transcript.project_root = item.get("cwd")
        elif item["type"] == "message" and item.get("role") in ("user", "assistant"):
            at = int(item["ts"] * 1000) if isinstance(item.get("ts"), int | float) else None
            transcript.messages.append(TranscriptMessage(
                id=str(item.get("id") or f"line-{index}"), index=index, role=item["role"],
                text=str(item.get("text") or ""), time_ms=at, completed_ms=at if item.get("done") else None))
    return transcript


class JsonlogAdapter:
    """The reader: sessions are `<id>.jsonl` files in the folder."""

    name = NAME

    def __init__(self, folder: Path):
        self.folder = folder

    def path(self, session_id: str) -> Path | None:
        path = self.folder / f"{validate_session_id(session_id)}.jsonl"
        return path if path.is_file() else None

    def has_session(self, session_id: str) -> bool:
        return self.path(session_id) is not None

    def read_transcript(self, session_id: str, after=None) -> Transcript:
        path = self.path(session_id)
        if path is None:
            raise SessionNotFound(f"jsonlog session {session_id} not found in {self.folder}")
        transcript = transcript_of(session_id, parse(path.read_bytes()), path)
        transcript.messages, transcript.cursor_found = messages_after(transcript.messages, after)
        return transcript

    def list_sessions(self) -> list[SessionInfo]:
        return sorted((SessionInfo(path.stem, None, None, mtime_ms(path)) for path in self.folder.glob("*.jsonl")),
                      key=lambda info: info.updated_ms or 0, reverse=True)


class Follower:
    """One session file under the shared tail (base.JsonlTail): what it read so far."""

    def __init__(self, path: Path):
        self.path = path
        self.tail = JsonlTail(path, "jsonlog session")
        self.lines: list[tuple[int, dict]] = []
        self.mtime_ms: int | None = None

    def read(self) -> list[tuple[int, dict]]:
        chunk = self.tail.read()
        if chunk.restarted:
            self.lines = []
        self.lines += parse(chunk.raw, chunk.first_index)
        self.mtime_ms = chunk.mtime_ms
        return self.lines


def lifecycle(lines: list[tuple[int, dict]], now_ms: int, mtime: int | None, *, idle_debounce_ms: int,
              inactivity_ms: int) -> Lifecycle:
    """Idle: the last message is a finished reply, quiet for the debounce; ending: an end
    line, or quiet for the inactivity timeout."""
    stamps = [int(item["ts"] * 1000) for _, item in lines if isinstance(item.get("ts"), int | float)]
    last_activity = max([*stamps, *([mtime] if mtime else [])], default=None)
    quiet = now_ms - last_activity if last_activity is not None else 0
    messages = [(index, item) for index, item in lines if item["type"] == "message"]
    moments: set[Moment] = set()
    last_id = str(messages[-1][1].get("id")) if messages else None
    idle = bool(messages) and messages[-1][1].get("role") == "assistant" and messages[-1][1].get("done") is True
    reason = "shutdown" if any(item["type"] == "end" for _, item in lines) else \
        "inactive" if messages and quiet >= inactivity_ms else None
    if reason:
        moments.add(Moment.ENDING)
    if idle and quiet >= idle_debounce_ms and reason != "shutdown":
        moments.add(Moment.IDLE)
    elif messages and not idle:
        moments.add(Moment.BUSY)
    prompt = next((item for _, item in reversed(messages) if item.get("role") == "user"), None)
    return Lifecycle(frozenset(moments), reason, last_activity, reply_id=last_id if idle else None,
                     last_turn_id=last_id,
                     turn_started_ms=int(prompt["ts"] * 1000) if prompt and "ts" in prompt else None)


class JsonlogWatch(JsonlWatch):
    def sessions_folder(self) -> Path:
        return self.agent.store_dir(self.config)

    def session_of(self, path: Path) -> str | None:
        if path.parent != self.folder or path.suffix != ".jsonl":
            return None
        return path.stem if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", path.stem) else None

    def session_files(self, folder: Path):
        return sorted(folder.glob("*.jsonl"))

    def find_file(self, session_id: str) -> Path | None:
        return JsonlogAdapter(self.folder).path(session_id)

    def follow(self, path: Path) -> Follower:
        return Follower(path)

    def lifecycle(self, session_id: str, follower: Follower, now: float) -> Lifecycle:
        lines = follower.read()
        return lifecycle(lines, int(now * 1000), follower.mtime_ms,
                         idle_debounce_ms=self.context.idle_debounce_ms, inactivity_ms=self.context.inactivity_ms)


class Jsonlog(Agent):
    name = NAME
    label = "JSON Log"
    own_ids = re.compile(r"jl-[0-9a-f]+")
    hook_format = "text"

    def store_dir(self, config) -> Path:
        return Path(os.environ[FOLDER_VARIABLE])

    def reader_at(self, store_dir: Path, config=None) -> JsonlogAdapter:
        return JsonlogAdapter(store_dir)

    def watch(self, config, context) -> JsonlogWatch:
        return JsonlogWatch(self, config, context)


AGENT = Jsonlog()


class JsonlogSession:
    """Writes a jsonlog session the way the agent would."""

    def __init__(self, folder: Path, session_id: str = "jl-0001", cwd: str = "/work/acme"):
        self.id = session_id
        self.path = folder / f"{session_id}.jsonl"
        self.turns = 0
        self._write({"type": "meta", "cwd": cwd})

    def _write(self, item: dict) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(item) + "\n")

    def turn(self, text: str, reply: str = "Noted.", at: float | None = None) -> None:
        import time

        at = time.time() if at is None else at
        self.turns += 1
        self._write({"type": "message", "id": f"u{self.turns}", "role": "user", "text": text, "ts": at})
        self._write({"type": "message", "id": f"a{self.turns}", "role": "assistant", "text": reply, "ts": at,
                     "done": True})

    def end(self, at: float | None = None) -> None:
        import time

        self._write({"type": "end", "ts": time.time() if at is None else at})
