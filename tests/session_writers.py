"""Write agent sessions the way the agents do, for tests and benches.

CopilotSession appends to `session-state/<id>/events.jsonl` (parentId chain, ISO timestamps),
keeps `workspace.yaml` and the `inuse.<pid>.lock` file. OpenCodeStore owns an `opencode.db` in
the 1.18.33 schema and writes it through its own connection with OpenCode's pragmas, one
transaction per projector step, as the OpenCode process would. ClaudeSession appends to
`projects/<encoded-cwd>/<id>.jsonl` (the shapes of the Claude Code fixture), writes
subagent transcripts beside it and the `sessions/<pid>.json` registry. CodexRollout appends to
`sessions/YYYY/MM/DD/rollout-…-<id>.jsonl` (the shapes of the Codex fixture, both
history modes). Every write method returns the
wall-clock time (epoch seconds) at which the write became visible to a reader.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import sqlite3
import string
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

FIXTURE_SQL = Path(__file__).parent / "fixtures" / "opencode" / "opencode_fixture.sql"
OPENCODE_VERSION = "1.18.33"
COPILOT_VERSION = "1.0.102"


def iso(at: float | None = None) -> str:
    """An ISO-8601 UTC timestamp with milliseconds, as Copilot writes them."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def dead_pid() -> int:
    """The pid of a process that has already exited (a crashed agent's lock)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


# ---- Copilot CLI ------------------------------------------------------------------------------


def copilot_line(kind: str, data: dict, *, parent_id: str | None = None, event_id: str | None = None,
                 at: float | None = None) -> str:
    """One events.jsonl line, keys in Copilot's order."""
    return json.dumps({"type": kind, "data": data, "id": event_id or str(uuid.uuid4()),
                       "timestamp": iso(at), "parentId": parent_id}) + "\n"


def append_lines(path: Path, *lines: str) -> None:
    """Append lines as given, in one write (also what no agent writes: a half line, noise)."""
    with Path(path).open("a", encoding="utf-8") as handle:
        handle.write("".join(lines))


def copilot_events_file(state_dir: Path, *lines: str, cwd: str | None = "/work/acme") -> tuple[str, Path]:
    """A new session folder whose events.jsonl is session.start (with `cwd` as its context, if
    any) then `lines`, in one write: a file a reader first sees whole. Returns its id and path."""
    session_id = str(uuid.uuid4())
    events = Path(state_dir) / session_id / "events.jsonl"
    events.parent.mkdir(parents=True)
    start = {"sessionId": session_id} | ({"context": {"cwd": cwd}} if cwd else {})
    append_lines(events, copilot_line("session.start", start), *lines)
    return session_id, events


def copilot_turn_lines(text: str, reply: str = "done", turn_id: str = "0", *, at: float | None = None) -> list[str]:
    """A finished turn without a parentId chain (for tests that build files line by line),
    stamped `at` (default: now)."""
    return [copilot_line("user.message", {"content": text}, at=at),
            copilot_line("assistant.turn_start", {"turnId": turn_id}, at=at),
            copilot_line("assistant.message", {"messageId": str(uuid.uuid4()), "content": reply,
                                                "toolRequests": []}, at=at),
            copilot_line("assistant.turn_end", {"turnId": turn_id}, at=at)]


class CopilotSession:
    """One Copilot CLI session folder under `state_dir`.

    Copilot writes nothing to events.jsonl before the first prompt: `start()` makes the
    folder, workspace.yaml and the lock, and `session.start` goes out with the first turn.
    """

    def __init__(self, state_dir: Path, session_id: str | None = None, *, cwd: str = "/work/acme",
                 model: str = "claude-sonnet-4.5"):
        self.id = session_id or str(uuid.uuid4())
        self.folder = Path(state_dir) / self.id
        self.cwd = cwd
        self.model = model
        self.lock_pid: int | None = None
        self._parent: str | None = None
        self._pending: list[tuple[str, dict]] = []
        self._turn = itertools.count()
        self._current_turn: str | None = None
        self._checkpoints = 0
        self.created_at = time.time()

    @property
    def events_path(self) -> Path:
        return self.folder / "events.jsonl"

    # -- files besides the transcript

    def _workspace(self) -> None:
        now = iso()
        created = iso(self.created_at)
        (self.folder / "workspace.yaml").write_text(
            f"id: {self.id}\ncwd: {self.cwd}\ngit_root: {self.cwd}\nrepository: acme/{Path(self.cwd).name}\n"
            f"host_type: github\nbranch: main\nsummary_count: {self._checkpoints}\n"
            f"created_at: {created}\nupdated_at: {now}\n")

    def lock(self, pid: int | None = None) -> None:
        """inuse.<pid>.lock: the agent process holding the session (default: this process)."""
        self.unlock()
        self.lock_pid = os.getpid() if pid is None else pid
        (self.folder / f"inuse.{self.lock_pid}.lock").write_text(str(self.lock_pid))

    def unlock(self) -> None:
        if self.lock_pid is not None:
            (self.folder / f"inuse.{self.lock_pid}.lock").unlink(missing_ok=True)
            self.lock_pid = None

    def start(self, *, lock_pid: int | None = None, locked: bool = True) -> float:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._workspace()
        if locked:
            self.lock(lock_pid)
        self._pending.append(("session.start", {
            "sessionId": self.id, "version": 1, "producer": "copilot-agent",
            "copilotVersion": COPILOT_VERSION, "startTime": iso(self.created_at),
            "selectedModel": self.model, "context": {"cwd": self.cwd, "gitRoot": self.cwd,
                                                     "repository": f"acme/{Path(self.cwd).name}",
                                                     "branch": "main"}}))
        return time.time()

    # -- the transcript

    def write(self, *events: tuple[str, dict]) -> float:
        """Append events (with whatever was held back) in one write, chaining parentId."""
        batch = [*self._pending, *events]
        self._pending = []
        lines = []
        for kind, data in batch:
            event_id = str(uuid.uuid4())
            lines.append(copilot_line(kind, data, parent_id=self._parent, event_id=event_id))
            self._parent = event_id
        with self.events_path.open("a") as fh:
            fh.writelines(lines)
        return time.time()

    def user(self, text: str) -> float:
        """The prompt goes out and the agent starts working (busy)."""
        turn = str(next(self._turn))
        self._current_turn = turn
        return self.write(("user.message", {"content": text, "agentMode": "interactive",
                                            "interactionId": str(uuid.uuid4())}),
                          ("assistant.turn_start", {"turnId": turn}))

    def tool_step(self, command: str, output: str) -> float:
        """One model call that runs a shell tool, then the next model call starts."""
        call_id = "toolu_" + secrets.token_hex(8)
        turn = self._current_turn
        next_turn = str(next(self._turn))
        self._current_turn = next_turn
        return self.write(
            ("assistant.message", {"messageId": str(uuid.uuid4()), "content": "",
                                   "toolRequests": [{"toolCallId": call_id, "name": "bash", "type": "function",
                                                     "arguments": {"command": command}}],
                                   "model": self.model, "turnId": turn}),
            ("tool.execution_start", {"toolCallId": call_id, "toolName": "bash",
                                      "arguments": {"command": command}, "turnId": turn}),
            ("tool.execution_complete", {"toolCallId": call_id, "success": True,
                                         "result": {"content": output}, "turnId": turn}),
            ("assistant.turn_end", {"turnId": turn}),
            ("assistant.turn_start", {"turnId": next_turn}))

    def reply(self, text: str) -> float:
        """The final answer of the turn: the agent is idle."""
        turn = self._current_turn
        return self.write(("assistant.message", {"messageId": str(uuid.uuid4()), "content": text,
                                                 "toolRequests": [], "model": self.model, "turnId": turn}),
                          ("assistant.turn_end", {"turnId": turn}))

    def assistant(self, text: str = "", tools: list[dict] | None = None) -> float:
        """An assistant message in the current turn, with its tool calls (each a dict of `name`,
        `arguments`, `output`, `success`) and their results; the turn stays open."""
        turn = self._current_turn
        requests = [{"toolCallId": "toolu_" + secrets.token_hex(8), "name": tool["name"], "type": "function",
                     "arguments": tool.get("arguments", {})} for tool in tools or []]
        events = [("assistant.message", {"messageId": str(uuid.uuid4()), "content": text,
                                         "toolRequests": requests, "model": self.model, "turnId": turn})]
        for request, tool in zip(requests, tools or [], strict=True):
            events.append(("tool.execution_complete", {"toolCallId": request["toolCallId"],
                                                       "success": tool.get("success", True),
                                                       "result": {"content": tool.get("output", "")},
                                                       "turnId": turn}))
        return self.write(*events)

    def turn(self, text: str, reply: str = "Done.", *, flush: bool = True) -> float:
        """A whole turn flushed at once (a quick answer inside Copilot's 100 ms write buffer);
        `flush=False` holds it back for the next write (turns that land together)."""
        self._pending_turn(text, reply)
        return self.write() if flush else time.time()

    def _pending_turn(self, text: str, reply: str) -> None:
        turn = str(next(self._turn))
        self._current_turn = turn
        self._pending += [("user.message", {"content": text, "agentMode": "interactive"}),
                          ("assistant.turn_start", {"turnId": turn}),
                          ("assistant.message", {"messageId": str(uuid.uuid4()), "content": reply,
                                                 "toolRequests": [], "model": self.model, "turnId": turn}),
                          ("assistant.turn_end", {"turnId": turn})]

    def compaction(self, summary: str) -> float:
        """A background compaction that finished, with its checkpoint file."""
        self.write(("session.compaction_start", {"systemTokens": 9000, "conversationTokens": 120000,
                                                 "trigger": "threshold"}))
        self._checkpoints += 1
        checkpoints = self.folder / "checkpoints"
        checkpoints.mkdir(exist_ok=True)
        path = checkpoints / f"{self._checkpoints:03d}-checkpoint.md"
        path.write_text(summary)
        (checkpoints / "index.md").write_text(f"# Checkpoints\n\n- {path.name}\n")
        written = self.write(("session.compaction_complete", {
            "success": True, "preCompactionTokens": 129000, "postCompactionTokens": 9000,
            "summaryContent": summary, "checkpointNumber": self._checkpoints,
            "checkpointPath": str(path)}))
        self._workspace()
        return written

    def shutdown(self, *, unlock: bool = True) -> float:
        """A clean exit: session.shutdown, then the lock goes."""
        written = self.write(("session.shutdown", {
            "shutdownType": "routine", "totalPremiumRequests": 1, "totalApiDurationMs": 4200,
            "sessionStartTime": int(self.created_at * 1000),
            "codeChanges": {"linesAdded": 0, "linesRemoved": 0, "filesModified": []}, "modelMetrics": {}}))
        self._workspace()
        if unlock:
            self.unlock()
        return written


def copilot_session(state_dir: Path, session_id: str | None = None, *, cwd: str = "/work/acme") -> CopilotSession:
    """A session whose folder and session.start are written and that no agent holds: what a
    test appends turns to, or reads, before anything else happens."""
    session = CopilotSession(state_dir, session_id, cwd=cwd)
    session.start(locked=False)
    session.write()
    return session


# ---- OpenCode ---------------------------------------------------------------------------------

_BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


class OpenCodeIds:
    """`<prefix>_` + 12 hex of (ms*4096 + counter) + 14 base62; `ses` ids count down (§1.6)."""

    def __init__(self):
        self._last_ms = 0
        self._counter = 0

    def __call__(self, prefix: str) -> str:
        ms = int(time.time() * 1000)
        if ms != self._last_ms:
            self._last_ms, self._counter = ms, 0
        self._counter += 1
        value = (ms * 4096 + self._counter) & 0xFFFFFFFFFFFF
        if prefix == "ses":
            value = ~value & 0xFFFFFFFFFFFF
        tail = "".join(secrets.choice(_BASE62) for _ in range(14))
        return f"{prefix}_{value:012x}{tail}"


def opencode_schema() -> str:
    """The 1.18.33 DDL and migration rows from the fixture, without its sessions."""
    statements = []
    for statement in FIXTURE_SQL.read_text().split(";\n"):
        body = "\n".join(line for line in statement.splitlines() if not line.startswith("--")).strip()
        if body.startswith(("CREATE", "PRAGMA")) or body.startswith("INSERT INTO `migration`"):
            statements.append(body + ";")
    return "\n".join(statements)


def recorded_opencode_store(data_dir: Path, *, journal_mode: str | None = None) -> Path:
    """opencode.db in `data_dir` loaded from the recorded fixture (its sessions as OpenCode left
    them); `journal_mode` as the real store runs it (WAL) or as a test needs it."""
    path = Path(data_dir) / "opencode.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    if journal_mode:
        conn.execute(f"PRAGMA journal_mode = {journal_mode}")
    conn.executescript(FIXTURE_SQL.read_text(encoding="utf-8"))
    conn.close()
    return path


class OpenCodeStore:
    """opencode.db in `data_dir`, written through one connection like the OpenCode process."""

    def __init__(self, data_dir: Path, *, worktree: str = "/work/acme"):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / "opencode.db"
        fresh = not self.path.exists()
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "busy_timeout = 5000",
                       "cache_size = -64000", "foreign_keys = ON"):
            self.conn.execute(f"PRAGMA {pragma}")
        self.ids = OpenCodeIds()
        self.worktree = worktree
        self.project_id = "4b0ea68d7af9a6031a7ffda7ad66e0cb83315750"
        if fresh:
            self.conn.executescript(opencode_schema())
            now = _ms()
            with self.transaction():
                self.conn.execute(
                    "INSERT INTO project (id, worktree, vcs, name, time_created, time_updated, sandboxes) "
                    "VALUES (?, ?, 'git', ?, ?, ?, '[]')", (self.project_id, worktree, Path(worktree).name, now, now))
        else:  # a store OpenCode already wrote (the recorded fixture, say): its first project
            known = self.conn.execute("SELECT id, worktree FROM project ORDER BY time_created LIMIT 1").fetchone()
            if known:
                self.project_id, self.worktree = known

    def transaction(self):
        return _Transaction(self.conn)

    def close(self) -> None:
        self.conn.close()

    def session(self, *, directory: str | None = None, parent_id: str | None = None) -> OpenCodeSession:
        return OpenCodeSession(self, directory or self.worktree, parent_id)


class _Transaction:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, *exc):
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _ms() -> int:
    return int(time.time() * 1000)


class OpenCodeSession:
    """One OpenCode session; each method writes what the session projector writes for it.

    `user()` and `reply()` are separate transactions (the usual streaming turn); `turn(...,
    whole=True)` writes the user message and the finished reply in one transaction.
    """

    def __init__(self, store: OpenCodeStore, directory: str, parent_id: str | None):
        self.store = store
        self.conn = store.conn
        self.id = store.ids("ses")
        self.directory = directory
        self._last_user: str | None = None
        now = _ms()
        with store.transaction() as conn:
            conn.execute(
                "INSERT INTO session (id, project_id, parent_id, slug, directory, path, title, version, "
                "time_created, time_updated) VALUES (?, ?, ?, ?, ?, '', ?, ?, ?, ?)",
                (self.id, store.project_id, parent_id, "swift-otter", directory,
                 f"New session - {iso(now / 1000)}", OPENCODE_VERSION, now, now))

    # -- rows

    def _touch(self, conn, now: int) -> None:
        conn.execute("UPDATE session SET time_updated = ? WHERE id = ?", (now, self.id))

    def _message(self, conn, message_id: str, data: dict, now: int) -> None:
        conn.execute("INSERT INTO message (id, session_id, time_created, time_updated, data) VALUES (?, ?, ?, ?, ?) "
                     "ON CONFLICT(id) DO UPDATE SET data = excluded.data, time_updated = excluded.time_updated",
                     (message_id, self.id, data["time"]["created"], now, json.dumps(data)))

    def _part(self, conn, part_id: str, message_id: str, data: dict, now: int) -> None:
        conn.execute("INSERT INTO part (id, message_id, session_id, time_created, time_updated, data) "
                     "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET data = excluded.data, "
                     "time_updated = excluded.time_updated",
                     (part_id, message_id, self.id, now, now, json.dumps(data)))

    def _user_rows(self, conn, text: str, *, synthetic: bool = False, compaction: bool = False) -> str:
        now = _ms()
        message_id = self.store.ids("msg")
        self._message(conn, message_id, {"role": "user", "time": {"created": now}, "agent": "build",
                                         "model": {"providerID": "anthropic", "modelID": "claude-sonnet-4-5"}}, now)
        if compaction:
            part = {"type": "compaction", "auto": True}
        else:
            part = {"type": "text", "text": text}
            if synthetic:
                part |= {"synthetic": True, "metadata": {"compaction_continue": True}}
        self._part(conn, self.store.ids("prt"), message_id, part, now)
        self._touch(conn, now)
        self._last_user = message_id
        return message_id

    def _assistant_data(self, parent: str, created: int, *, completed: int | None = None,
                        finish: str | None = None, summary: bool = False) -> dict:
        data = {"role": "assistant", "time": {"created": created}, "parentID": parent,
                "modelID": "claude-sonnet-4-5", "providerID": "anthropic",
                "mode": "compaction" if summary else "build", "agent": "compaction" if summary else "build",
                "path": {"cwd": self.directory, "root": self.store.worktree}, "cost": 0.0021,
                "tokens": {"input": 1200, "output": 80, "reasoning": 0, "cache": {"read": 0, "write": 0}}}
        if summary:
            data["summary"] = True
        if completed is not None:
            data["time"]["completed"] = completed
        if finish is not None:
            data["finish"] = finish
        return data

    def _reply_rows(self, conn, text: str, *, tool: tuple[str, str] | None = None,
                    summary: bool = False) -> str:
        """A finished assistant message: step-start, (tool), text, step-finish, completed."""
        now = _ms()
        message_id = self.store.ids("msg")
        self._message(conn, message_id, self._assistant_data(self._last_user, now, completed=now,
                                                             finish="stop", summary=summary), now)
        self._part(conn, self.store.ids("prt"), message_id, {"type": "step-start"}, now)
        if tool is not None:
            self._part(conn, self.store.ids("prt"), message_id, _bash_part(*tool, now), now)
        self._part(conn, self.store.ids("prt"), message_id,
                   {"type": "text", "text": text, "time": {"start": now, "end": now}}, now)
        self._part(conn, self.store.ids("prt"), message_id, _step_finish(), now)
        self._touch(conn, now)
        return message_id

    # -- what the agent does

    def user(self, text: str) -> float:
        with self.store.transaction() as conn:
            self._user_rows(conn, text)
        return time.time()

    def reply_steps(self, text: str, *, tool: tuple[str, str] | None = None):
        """The reply as OpenCode streams it, one transaction per step: the message row, the
        tool part, the text part, then completion. Yields between steps; returns when done."""
        created = _ms()
        message_id = self.store.ids("msg")
        with self.store.transaction() as conn:
            self._message(conn, message_id, self._assistant_data(self._last_user, created), created)
            self._part(conn, self.store.ids("prt"), message_id, {"type": "step-start"}, created)
            self._touch(conn, created)
        if tool is not None:
            yield
            with self.store.transaction() as conn:
                now = _ms()
                self._part(conn, self.store.ids("prt"), message_id, _bash_part(*tool, now), now)
        yield
        text_part = self.store.ids("prt")
        with self.store.transaction() as conn:
            now = _ms()
            self._part(conn, text_part, message_id, {"type": "text", "text": text, "time": {"start": now}}, now)
        yield
        with self.store.transaction() as conn:
            now = _ms()
            self._part(conn, text_part, message_id,
                       {"type": "text", "text": text, "time": {"start": now, "end": now}}, now)
            self._part(conn, self.store.ids("prt"), message_id, _step_finish(), now)
            self._message(conn, message_id, self._assistant_data(self._last_user, created, completed=now,
                                                                 finish="stop"), now)
            self._touch(conn, now)

    def reply(self, text: str, *, tool: tuple[str, str] | None = None, pause: float = 0.05) -> float:
        for _ in self.reply_steps(text, tool=tool):
            time.sleep(pause)
        return time.time()

    def turn(self, text: str, reply: str = "Done.", *, whole: bool = False,
             tool: tuple[str, str] | None = None) -> float:
        """A user message and its finished reply; `whole`: in one transaction."""
        if not whole:
            self.user(text)
            return self.reply(reply, tool=tool)
        with self.store.transaction() as conn:
            self._user_rows(conn, text)
            self._reply_rows(conn, reply, tool=tool)
        return time.time()

    def compaction_steps(self, summary: str):
        """Automatic compaction: the request; then the summary reply and the synthetic continue
        prompt (the agent's answer to it is a normal `reply`)."""
        with self.store.transaction() as conn:
            self._user_rows(conn, "", compaction=True)
        yield
        with self.store.transaction() as conn:
            self._reply_rows(conn, summary, summary=True)
            self._user_rows(conn, "Continue if you have next steps, or stop and ask for clarification "
                                  "if you are unsure how to proceed.", synthetic=True)

    def compaction(self, summary: str, *, pause: float = 0.3) -> float:
        for _ in self.compaction_steps(summary):
            time.sleep(pause)
        return time.time()

    def archive(self) -> float:
        with self.store.transaction() as conn:
            now = _ms()
            conn.execute("UPDATE session SET time_archived = ?, time_updated = ? WHERE id = ?",
                         (now, now, self.id))
        return time.time()


def _bash_part(command: str, output: str, now: int) -> dict:
    return {"type": "tool", "callID": "toolu_" + secrets.token_hex(8), "tool": "bash",
            "state": {"status": "completed", "input": {"command": command}, "output": output,
                      "title": command, "metadata": {"exit": 0}, "time": {"start": now, "end": now}}}


def _step_finish() -> dict:
    return {"type": "step-finish", "reason": "stop", "cost": 0.0021,
            "tokens": {"input": 1200, "output": 80, "reasoning": 0, "cache": {"read": 0, "write": 0}}}


# ---- Claude Code ------------------------------------------------------------------------------

CLAUDE_VERSION = "2.1.332"
CLAUDE_MODEL = "claude-opus-5-5"


def claude_project_dir_name(cwd: str) -> str:
    """`<encoded-cwd>`: every character outside [A-Za-z0-9] becomes '-'."""
    return "".join(ch if ch.isascii() and ch.isalnum() else "-" for ch in cwd)


def _claude_usage() -> dict:
    return {"input_tokens": 2410, "cache_creation_input_tokens": 640, "cache_read_input_tokens": 18250,
            "output_tokens": 96, "service_tier": "standard"}


class ClaudeSession:
    """One Claude Code session under `config_dir` (the fixture's shapes).

    Claude Code writes no transcript before the first prompt; each method appends what the
    interactive CLI (entrypoint `cli`) writes for that step, in one write, chaining parentUuid.
    `register()` keeps the live-process registry entry `sessions/<pid>.json` of §5.
    """

    def __init__(self, config_dir: Path, session_id: str | None = None, *, cwd: str = "/work/acme",
                 branch: str = "main"):
        self.config_dir = Path(config_dir)
        self.id = session_id or str(uuid.uuid4())
        self.cwd = cwd
        self.branch = branch
        self.folder = self.config_dir / "projects" / claude_project_dir_name(cwd)
        self.path = self.folder / f"{self.id}.jsonl"
        self.parent: str | None = None
        self.prompt_id: str | None = None
        self.pid: int | None = None

    # -- lines

    def envelope(self, kind: str, body: dict, *, at: float | None = None, parent: str | None = ...,
                 **extra) -> dict:
        """A conversational line: body first, then the common envelope in Claude Code's key order."""
        line_id = str(uuid.uuid4())
        line = {"parentUuid": self.parent if parent is ... else parent, "isSidechain": False, **body,
                "type": kind, "uuid": line_id, "timestamp": iso(at), **extra, "userType": "external",
                "entrypoint": "cli", "cwd": self.cwd, "sessionId": self.id, "version": CLAUDE_VERSION,
                "gitBranch": self.branch}
        self.parent = line_id
        return line

    def user_line(self, content, **extra) -> dict:
        body = {"promptId": self.prompt_id} if self.prompt_id else {}
        return self.envelope("user", body | {"message": {"role": "user", "content": content}}, **extra)

    def assistant_line(self, block: dict, message_id: str, stop_reason: str, index: int = 0) -> dict:
        message = {"id": message_id, "type": "message", "role": "assistant", "model": CLAUDE_MODEL,
                   "content": [block], "stop_reason": stop_reason, "stop_sequence": None, "usage": _claude_usage()}
        return self.envelope("assistant", {"message": message, "apiBlockIndex": index,
                                           "requestId": "req_" + secrets.token_hex(12)})

    def system_line(self, subtype: str, **fields) -> dict:
        return self.envelope("system", {"subtype": subtype, **fields}, isMeta=False)

    def write(self, *lines: dict | str) -> float:
        """Append lines (dicts as compact JSON, strings as they are) in one write."""
        self.folder.mkdir(parents=True, exist_ok=True)
        text = "".join(line if isinstance(line, str) else json.dumps(line, separators=(",", ":")) + "\n"
                       for line in lines)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(text)
        return time.time()

    # -- what the session does

    def context_lines(self, block: str, source: str = "startup") -> list[dict]:
        """The attachments a SessionStart hook answering with llmem's block leaves (§3.6)."""
        answer = json.dumps({"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": block}})
        success = self.envelope("attachment", {"attachment": {
            "type": "hook_success", "hookName": f"SessionStart:{source}", "hookEvent": "SessionStart",
            "content": "", "stdout": answer + "\n", "stderr": "", "exitCode": 0,
            "command": "llmem hook --adapter claude --format claude --type created", "durationMs": 180}})
        context = self.envelope("attachment", {"attachment": {
            "type": "hook_additional_context", "content": [block], "hookName": "SessionStart",
            "hookEvent": "SessionStart"}},
            rendered=[{"content": f"<system-reminder>\nSessionStart hook additional context: {block}\n</system-reminder>"}],
            renderedRole="system")
        return [success, context]

    def prompt_lines(self, text: str) -> list[dict]:
        self.prompt_id = str(uuid.uuid4())
        snapshot = {"type": "file-history-snapshot", "messageId": str(uuid.uuid4()),
                    "snapshot": {"messageId": str(uuid.uuid4()), "trackedFileBackups": {}, "timestamp": iso()},
                    "isSnapshotUpdate": False}
        return [snapshot, self.user_line(text, permissionMode="default", origin={"kind": "human"},
                                         promptSource="typed")]

    def reply_lines(self, text: str, *, thinking: str | None = None, turn_done: bool = True) -> list[dict]:
        """The final answer (one line per content block), then the turn-complete rows."""
        message_id = "msg_" + secrets.token_hex(12)
        blocks = ([{"type": "thinking", "thinking": thinking, "signature": "sig"}] if thinking else [])
        blocks.append({"type": "text", "text": text})
        lines = [self.assistant_line(block, message_id, "end_turn", index) for index, block in enumerate(blocks)]
        if turn_done:
            lines += self.turn_done_lines()
        return lines

    def turn_done_lines(self) -> list[dict]:
        return [self.system_line("stop_hook_summary", hookCount=1, hookInfos=[], hookErrors=[],
                                 preventedContinuation=False, stopReason="", hasOutput=False, level="suggestion"),
                self.system_line("turn_duration", durationMs=3100, messageCount=4),
                {"type": "last-prompt", "leafUuid": self.parent, "sessionId": self.id}]

    def tool_lines(self, command: str, output: str, *, name: str = "Bash", text: str = "") -> list[dict]:
        """A model call that runs a tool (text then tool_use lines), and the tool's result."""
        message_id = "msg_" + secrets.token_hex(12)
        call_id = "toolu_" + secrets.token_hex(12)
        lines = [self.assistant_line({"type": "text", "text": text}, message_id, "tool_use")] if text else []
        tool_use = self.assistant_line({"type": "tool_use", "id": call_id, "name": name,
                                        "input": {"command": command}}, message_id, "tool_use", len(lines))
        lines.append(tool_use)
        lines.append(self.user_line([{"tool_use_id": call_id, "type": "tool_result", "content": output,
                                      "is_error": False}],
                                    toolUseResult={"stdout": output, "stderr": "", "interrupted": False},
                                    sourceToolAssistantUUID=tool_use["uuid"]))
        return lines

    def turn(self, text: str, reply: str = "Done.", *, tool: tuple[str, str] | None = None) -> float:
        """A whole interactive turn in one write: prompt, (tool step), answer, turn complete."""
        lines = self.prompt_lines(text)
        if tool is not None:
            lines += self.tool_lines(*tool)
        return self.write(*lines, *self.reply_lines(reply))

    def prompt(self, text: str) -> float:
        return self.write(*self.prompt_lines(text))

    def reply(self, text: str, *, turn_done: bool = True) -> float:
        return self.write(*self.reply_lines(text, turn_done=turn_done))

    def subagent(self, prompt: str, report: str, *, description: str = "Survey") -> float:
        """A background Agent launched, its sidechain transcript, then the task notification
        turn that carries its report back to the parent (§2.4, §2.6)."""
        agent_id = "a" + secrets.token_hex(8)
        message_id = "msg_" + secrets.token_hex(12)
        call_id = "toolu_" + secrets.token_hex(12)
        tool_use = self.assistant_line({"type": "tool_use", "id": call_id, "name": "Agent",
                                        "input": {"description": description, "prompt": prompt,
                                                  "subagent_type": "Explore"}}, message_id, "tool_use")
        launched = self.user_line([{"tool_use_id": call_id, "type": "tool_result", "content": [
            {"type": "text", "text": f"Async agent launched successfully.\nagentId: {agent_id}"}]}],
            toolUseResult={"isAsync": True, "status": "async_launched", "agentId": agent_id,
                           "description": description, "prompt": prompt})
        self.write(tool_use, launched, *self.reply_lines("I'll report back when the survey is done."))
        self.write_sidechain(agent_id, prompt, report, call_id, description)
        notification = (f"<task-notification>\n<task-id>{agent_id}</task-id>\n<tool-use-id>{call_id}</tool-use-id>\n"
                        f"<status>completed</status>\n<summary>Agent \"{description}\" finished</summary>\n"
                        f"<result>{report}</result>\n</task-notification>")
        self.prompt_id = str(uuid.uuid4())
        return self.write({"type": "queue-operation", "operation": "enqueue", "timestamp": iso(),
                           "sessionId": self.id, "content": notification},
                          {"type": "queue-operation", "operation": "dequeue", "timestamp": iso(), "sessionId": self.id},
                          self.user_line(notification, permissionMode="default",
                                         origin={"kind": "task-notification", "producer": "session-task"},
                                         promptSource="system", turnOrigin="task_notification"),
                          *self.reply_lines("The survey is back."))

    def write_sidechain(self, agent_id: str, prompt: str, report: str, call_id: str, description: str) -> Path:
        """`<session>/subagents/agent-<id>.jsonl` (every line isSidechain, the parent's sessionId)
        and its `.meta.json`."""
        folder = self.folder / self.id / "subagents"
        folder.mkdir(parents=True, exist_ok=True)
        first = str(uuid.uuid4())
        common = {"agentId": agent_id, "userType": "external", "entrypoint": "cli", "cwd": self.cwd,
                  "sessionId": self.id, "version": CLAUDE_VERSION, "gitBranch": self.branch}
        lines = [
            {"parentUuid": None, "isSidechain": True, "type": "user",
             "message": {"role": "user", "content": prompt}, "uuid": first, "timestamp": iso(), **common},
            {"parentUuid": first, "isSidechain": True, "type": "assistant",
             "message": {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
                         "model": CLAUDE_MODEL, "content": [{"type": "text", "text": report}],
                         "stop_reason": "end_turn", "stop_sequence": None, "usage": _claude_usage()},
             "uuid": str(uuid.uuid4()), "timestamp": iso(), **common},
        ]
        path = folder / f"agent-{agent_id}.jsonl"
        path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
        (folder / f"agent-{agent_id}.meta.json").write_text(json.dumps(
            {"agentType": "Explore", "description": description, "toolUseId": call_id, "spawnDepth": 1,
             "model": CLAUDE_MODEL, "finished": True}))
        return path

    def compaction(self, summary: str) -> float:
        """A manual /compact: boundary, summary, command echo lines, SessionStart:compact (§2.5)."""
        leaf = self.parent
        boundary = self.envelope("system", {"subtype": "compact_boundary", "content": "Conversation compacted",
                                            "level": "info", "compactMetadata": {"trigger": "manual",
                                                                                 "preTokens": 23870,
                                                                                 "postTokens": 4120}},
                                 parent=None, logicalParentUuid=leaf, isMeta=False)
        self.prompt_id = str(uuid.uuid4())
        summary_line = self.user_line(f"Session continued after compaction. Summary:\n{summary}",
                                      isVisibleInTranscriptOnly=True, isCompactSummary=True)
        caveat = self.user_line("<local-command-caveat>Output of a local slash command follows.</local-command-caveat>",
                                isMeta=True)
        echo = self.user_line("<command-name>/compact</command-name>\n<command-message>compact</command-message>\n"
                              "<command-args></command-args>")
        stdout = self.user_line("<local-command-stdout>Compacted</local-command-stdout>", repeatsCompactSummary=True)
        return self.write(boundary, summary_line, caveat, echo, stdout)

    def exit(self) -> float:
        """A clean exit: the cost ledger row last, and the registry entry goes."""
        written = self.write({"type": "cost-state", "sessionId": self.id, "totalCostUSD": 0.41,
                              "totalDuration": 151300, "modelUsage": {}})
        self.unregister()
        return written

    def register(self, pid: int | None = None) -> None:
        """`sessions/<pid>.json`: the process holding the session (default: this process)."""
        self.unregister()
        self.pid = os.getpid() if pid is None else pid
        registry = self.config_dir / "sessions"
        registry.mkdir(parents=True, exist_ok=True)
        (registry / f"{self.pid}.json").write_text(json.dumps(
            {"pid": self.pid, "sessionId": self.id, "cwd": self.cwd, "startedAt": int(time.time() * 1000),
             "version": CLAUDE_VERSION, "kind": "interactive", "entrypoint": "cli", "status": "idle"}))

    def unregister(self) -> None:
        if self.pid is not None:
            (self.config_dir / "sessions" / f"{self.pid}.json").unlink(missing_ok=True)
            self.pid = None


# ---- Codex CLI --------------------------------------------------------------------------------

CODEX_VERSIONS = {"paginated": "0.171.0", "legacy": "0.144.1"}


def uuid7(at: float | None = None) -> str:
    """A UUID v7 as Codex makes thread and turn ids: 48 bits of epoch ms, then random bits."""
    ms = int((time.time() if at is None else at) * 1000)
    value = (ms << 80) | (0x7 << 76) | (secrets.randbits(12) << 64) | (0b10 << 62) | secrets.randbits(62)
    return str(uuid.UUID(int=value))


def codex_line(item_type: str, payload: dict, *, at: float | None = None, ordinal: int | None = None,
               metadata: dict | None = None) -> str:
    """One rollout line, keys in Codex's order (`ordinal` only in paginated files)."""
    line: dict = {"timestamp": iso(at)}
    if ordinal is not None:
        line["ordinal"] = ordinal
    line |= {"type": item_type, "payload": payload}
    if metadata is not None:
        line["metadata"] = metadata
    return json.dumps(line, separators=(",", ":")) + "\n"


class CodexRollout:
    """One Codex CLI thread under `<home>/sessions/YYYY/MM/DD/`, in the
    fixture's line shapes: `paginated` (0.171.0: prompts as item_completed UserMessage, lines
    with `ordinal`) or `legacy` (0.144.1: user_message / agent_message events).

    Codex creates the file at the first turn: nothing is on disk before `turn()`/`begin()`.
    `subagent` makes a spawned thread's session_meta (thread_source subagent, parent id).
    """

    def __init__(self, home: Path, *, mode: str = "paginated", cwd: str = "/work/acme",
                 thread_id: str | None = None, parent: str | None = None, subagent: bool = False,
                 agents_md: str = "- Run `make test` before committing."):
        self.home = Path(home)
        self.mode = mode
        self.cwd = cwd
        self.created_at = time.time()
        self.id = thread_id or uuid7(self.created_at)
        self.parent = parent
        self.subagent = subagent or parent is not None
        self.agents_md = agents_md
        local = datetime.fromtimestamp(self.created_at)
        self.path = (self.home / "sessions" / f"{local:%Y/%m/%d}"
                     / f"rollout-{local:%Y-%m-%dT%H-%M-%S}-{self.id}.jsonl")
        self._ordinal = itertools.count()
        self._started = False
        self.turn_id: str | None = None

    @property
    def paginated(self) -> bool:
        return self.mode == "paginated"

    def _line(self, item_type: str, payload: dict, metadata: dict | None = None) -> str:
        ordinal = next(self._ordinal) if self.paginated else None
        return codex_line(item_type, payload, ordinal=ordinal,
                          metadata=metadata if self.paginated else None)

    def write(self, *lines: str) -> float:
        """Append lines in one write (Codex flushes per item; tests batch what lands together)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write("".join(lines))
        return time.time()

    def _meta(self) -> str:
        source: object = "cli"
        thread_source = "user"
        if self.subagent:
            thread_source = "subagent"
            source = {"subagent": {"thread_spawn": {"parent_thread_id": self.parent, "depth": 1,
                                                    "agent_path": "/explorer", "agent_nickname": "explorer",
                                                    "agent_role": "explorer"}}} if self.parent else {"subagent": "review"}
        return self._line("session_meta", {
            "session_id": self.id, "id": self.id, "timestamp": iso(self.created_at), "cwd": self.cwd,
            "originator": "codex-tui" if self.paginated else "codex_exec",
            "cli_version": CODEX_VERSIONS[self.mode], "source": source, "thread_source": thread_source,
            "model_provider": "openai", "base_instructions": {"text": "[harness text]"},
            "history_mode": self.mode, "context_window": {"window_id": uuid7()},
            "git": {"commit_hash": "9c41d2e07b5a38f6e1d0c4b7a2f98e3d5c6b1a07", "branch": "main"}})

    def _message(self, role: str, texts: list[str], kinds: list[str] | None = None,
                 metadata: dict | None = None) -> str:
        part = "output_text" if role == "assistant" else "input_text"
        passthrough: dict = {"turn_id": self.turn_id}
        if kinds is not None and self.paginated:
            passthrough["content_item_kinds"] = kinds
        return self._line("response_item", {"type": "message", "id": f"msg_{secrets.token_hex(10)}", "role": role,
                                            "content": [{"type": part, "text": text} for text in texts],
                                            "internal_chat_message_metadata_passthrough": passthrough},
                          metadata or {"history_sequence": 1, "client_authored": False})

    def _event(self, payload: dict) -> str:
        return self._line("event_msg", payload)

    def begin(self, prompt: str, *, hook_context: str | None = None) -> float:
        """A turn starts: task_started, the harness's injected messages, the prompt (busy)."""
        self.turn_id = uuid7()
        lines = [] if self._started else [self._meta()]
        lines.append(self._event({"type": "task_started", "turn_id": self.turn_id,
                                  "started_at": int(time.time()), "model_context_window": 258400,
                                  "collaboration_mode_kind": "default"}))
        lines.append(self._message("developer", ["<permissions instructions>\n[harness text]\n</permissions instructions>"],
                                   ["permissions.instructions"]))
        if not self._started:
            lines.append(self._message("user", [
                f"# AGENTS.md instructions for {self.cwd}\n\n<INSTRUCTIONS>\n{self.agents_md}\n</INSTRUCTIONS>",
                f"<environment_context>\n  <cwd>{self.cwd}</cwd>\n  <shell>zsh</shell>\n</environment_context>"],
                ["agents_md.instructions", "environments.environment_context"]))
            lines.append(self._line("world_state", {"full": True, "state": {
                "agents_md": {"directory": self.cwd, "text": self.agents_md}}}))
        lines.append(self._line("turn_context", {"turn_id": self.turn_id, "cwd": self.cwd,
                                                 "approval_policy": "on-request", "model": "gpt-5.5-codex"}))
        if hook_context is not None:
            lines.append(self._message("developer", [hook_context], ["hooks.additional_context"]))
        lines.append(self._message("user", [prompt], ["user.text"]))
        if self.paginated:
            lines.append(self._event({"type": "item_completed", "thread_id": self.id, "turn_id": self.turn_id,
                                      "item": {"type": "UserMessage", "id": uuid7(),
                                               "content": [{"type": "text", "text": prompt, "text_elements": []}]}}))
        else:
            lines.append(self._event({"type": "user_message", "message": prompt, "images": [],
                                      "local_images": [], "text_elements": []}))
        self._started = True
        return self.write(*lines)

    def tool(self, command: str, output: str) -> float:
        """The model runs a shell command and reads its output (the turn goes on)."""
        call_id = f"call_{secrets.token_hex(10)}"
        passthrough = {"turn_id": self.turn_id}
        return self.write(
            self._line("response_item", {"type": "reasoning", "id": f"rs_{secrets.token_hex(10)}",
                                         "summary": [{"type": "summary_text", "text": f"Run {command}."}],
                                         "content": None, "encrypted_content": "gAAAA",
                                         "internal_chat_message_metadata_passthrough": passthrough}),
            self._line("response_item", {"type": "function_call", "id": f"fc_{secrets.token_hex(10)}",
                                         "name": "exec_command", "arguments": json.dumps({"cmd": command}),
                                         "call_id": call_id, "internal_chat_message_metadata_passthrough": passthrough}),
            self._line("response_item", {"type": "function_call_output", "call_id": call_id,
                                         "output": f"Process exited with code 0\nOutput:\n{output}\n",
                                         "internal_chat_message_metadata_passthrough": passthrough}))

    def finish(self, reply: str) -> float:
        """The answer, then task_complete: the turn is over (idle)."""
        lines = []
        if self.paginated:
            lines.append(self._event({"type": "item_completed", "thread_id": self.id, "turn_id": self.turn_id,
                                      "item": {"type": "AgentMessage", "id": f"msg_{secrets.token_hex(10)}",
                                               "content": [{"type": "Text", "text": reply}]}}))
        else:
            lines.append(self._event({"type": "agent_message", "message": reply, "phase": None,
                                      "memory_citation": None}))
        lines.append(self._message("assistant", [reply]))
        lines.append(self._event({"type": "token_count", "info": None, "rate_limits": None}))
        lines.append(self._event({"type": "task_complete", "turn_id": self.turn_id, "last_agent_message": reply,
                                  "completed_at": int(time.time()), "duration_ms": 1200}))
        return self.write(*lines)

    def turn(self, prompt: str, reply: str = "Done.", *, hook_context: str | None = None) -> float:
        """A whole turn in one write."""
        self.begin(prompt, hook_context=hook_context)
        return self.finish(reply)

    def abort(self) -> float:
        """The user interrupts the running turn."""
        return self.write(self._event({"type": "turn_aborted", "turn_id": self.turn_id, "reason": "interrupted"}))

    def compact(self, summary: str) -> float:
        """A manual /compact: its own turn, the summary, the `compacted` checkpoint."""
        self.turn_id = uuid7()
        lines = [self._event({"type": "task_started", "turn_id": self.turn_id, "started_at": int(time.time()),
                              "model_context_window": 258400, "collaboration_mode_kind": "default"}),
                 self._message("assistant", [summary], metadata={"history_sequence": 9, "compaction_output": True}),
                 self._line("compacted", {"message": f"[compaction preamble]\n{summary}", "replacement_history": [],
                                          "window_number": 1, "window_id": uuid7()})]
        if self.paginated:
            lines.append(self._event({"type": "item_completed", "thread_id": self.id, "turn_id": self.turn_id,
                                      "item": {"type": "ContextCompaction", "id": uuid7()}}))
        else:
            lines.append(self._event({"type": "context_compacted"}))
        lines.append(self._event({"type": "task_complete", "turn_id": self.turn_id, "last_agent_message": None,
                                  "completed_at": int(time.time()), "duration_ms": 6500}))
        return self.write(*lines)
