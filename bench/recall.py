#!/usr/bin/env python3
"""Recall through the real ingestion path: transcripts → `llmem backfill` / `llmem run` → search.

Two corpora, each written as agent transcripts into a fresh temp home (every path from
LLMEM_HOME, CLAUDE_CONFIG_DIR, CODEX_HOME, COPILOT_HOME and config.yaml; the real home is
never read):
- coding: the sessions of bench/data/coding/*.yaml (a user and a coding agent choosing
  frameworks, fixing errors, setting values, stating preferences, with tool calls between),
  rendered as Claude Code transcripts (some as Codex or Copilot CLI ones), and the questions a
  developer asks a week later, each labelled with its session and answer turn(s); a third is
  held out (`held_out: true`: nobody tunes on them), and some have nothing stored to answer.
- locomo: the LoCoMo dev split (read by path, never copied): each of a conversation's
  sessions is one Claude Code session (speaker A the user, speaker B the assistant, one message
  per dialogue turn, its dia_id kept), the conversation's sessions under one project folder;
  its questions are searched within that project (`--project`), category 5 left out.

Ingestion, per mode: `llmem backfill --json` over the written transcripts, and a running
`llmem run` (the real watcher and worker) that picks the sessions up as they are written; the
bench waits for the queue to drain by polling the store's event rows (a timeout says so).
Modes: (a) no LLM, no embedder; (b) the built-in embedder (`--builtin`); (c) a fake LLM, a real
HTTP server on 127.0.0.1 answering like Ollama's /api/chat, whose extraction restates the
transcript's own sentences (never the labels), with (b)'s embedder when there is one.

Searching: the in-process Searcher the CLI uses (App.searcher() with the config's search
options, access tracking off), and `llmem search --json --no-track` on a sample of questions
(`--cli-check N`) to show the two agree.

Scoring: a hit's session is the memory's session_id. Its turns: the transcript messages its
metadata names (any metadata value that is a message id the bench wrote: the heuristics'
`message_id`, an episode's ids; a list of them, an episode's first and last, stands for every
turn between), plus the turns of that session whose text the memory contains (>= 80 % of the
turn's words, or a short turn's whole text) or, when it contains none, the one turn that contains the memory (>= 80 % of the
memory's words: a sentence an extraction kept or restated). A memory that carries only the
session counts for the session-level figures and as a miss at turn level. Session level:
Hit@5, Hit@20 (any of the top k in a gold session), MRR (first such rank, of 20). Turn level:
R@5 (share of the gold turns among the top 5's turns) and MRR, beside t/top5, how many turns
the top 5 stand for (a chunk of several turns credits each of them). AUROC: how well the top
result's score separates answerable from unanswerable questions (1.0: always higher for the
answerable ones; 0.5: no separation).
Store growth: the store's files (memory.db, its WAL, the vector file memory.vectors) over a
freshly created store's, per byte of transcript text written (text, tool commands and their
output), and where it went: per table and index from SQLite's dbstat, the FTS index's shadow
tables together.
Baselines, in the same run over the same messages (user and assistant text; tool output left
out): BM25 over turns and over whole sessions, and dense over turns and sessions with (b)'s
embedder when there is one. Example:
    python bench/recall.py                     # both corpora, every mode, both ingestions
    python bench/recall.py --quick             # one LoCoMo conversation
    python bench/recall.py --corpus coding --modes a --ingest backfill
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakes import FakeModelServer  # noqa: E402
from session_writers import ClaudeSession, CodexRollout, CopilotSession  # noqa: E402

from llmem.db import packed_text  # noqa: E402

LLMEM = [sys.executable, "-m", "llmem"]
DATA_DIR = ROOT / "bench" / "data" / "coding"
LOCOMO_DEFAULT = ROOT.parent.parent / "shared" / "data" / "locomo-dev.json"
LOCOMO_FALLBACKS = (ROOT.parent / "shared" / "data" / "locomo-dev.json",)
DEPTH = 20  # results asked of every search: Hit@20 and MRR over the first 20
ADVERSARIAL = 5
MODES = {"a": "no LLM, no embedder", "b": "built-in embedder", "c": "fake LLM"}
KNOWN_PROVIDERS = ("ollama", "openai", "local", "none")
_WORDS = re.compile(r"\w+")


# ---- the corpora --------------------------------------------------------------------------


@dataclass
class Turn:
    key: str  # "3" (a coding turn, 1-based) or "D3:13" (a LoCoMo dialogue turn)
    messages: list[tuple[str, str]]  # (role, text): the user's prompt and/or the agent's answer
    tools: list[tuple[str, str]] = field(default_factory=list)  # (command, output), before the answer

    @property
    def text(self) -> str:
        return "\n".join(text for _, text in self.messages)


@dataclass
class Session:
    key: str
    agent: str  # claude | codex | copilot
    cwd: str
    turns: list[Turn]
    scope: str | None = None  # the project its questions are searched in (None: the whole store)
    id: str = ""  # the agent's session id, once written

    @property
    def text(self) -> str:
        return "\n".join(turn.text for turn in self.turns)


@dataclass
class Question:
    text: str
    sessions: set[str]  # gold session keys (empty: unanswerable)
    turns: set[tuple[str, str]]  # gold (session key, turn key)
    scope: str | None = None
    tags: set[str] = field(default_factory=set)

    @property
    def answerable(self) -> bool:
        return bool(self.sessions)


@dataclass
class Corpus:
    name: str
    sessions: list[Session]
    questions: list[Question]

    def describe(self) -> str:
        agents = Counter(s.agent for s in self.sessions)
        answerable = [q for q in self.questions if q.answerable]
        held = sum("held_out" in q.tags for q in answerable)
        para = sum("paraphrase" in q.tags for q in answerable)
        return (f"{len(self.sessions)} sessions ({', '.join(f'{a} {n}' for a, n in agents.most_common())}), "
                f"{sum(len(s.turns) for s in self.sessions)} turns, {len(answerable)} answerable questions "
                f"({held} held out, {para} paraphrased), "
                f"{len(self.questions) - len(answerable)} unanswerable")


def load_coding(folder: Path = DATA_DIR, only: set[str] | None = None) -> Corpus:
    """The coding sessions and their questions from every YAML file in `folder`.

    `only`: keep these session keys (and the questions about them; unanswerable ones stay).
    """
    sessions: list[Session] = []
    questions: list[Question] = []
    for path in sorted(folder.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            raise SystemExit(f"{path}: expected a mapping with sessions and questions")
        for raw in doc.get("sessions") or []:
            turns = []
            for number, step in enumerate(raw["turns"], start=1):
                messages = [("user", step["user"].strip())]
                if step.get("assistant"):
                    messages.append(("assistant", step["assistant"].strip()))
                tools = [(str(t[0]), str(t[1])) for t in step.get("tools") or []]
                turns.append(Turn(str(number), messages, tools))
            sessions.append(Session(raw["key"], raw.get("agent", "claude"),
                                    raw.get("cwd") or doc["cwd"], turns))
        for raw in doc.get("questions") or []:
            tags = {tag for tag in ("paraphrase", "held_out") if raw.get(tag)}
            tags.add("paraphrase" if raw.get("paraphrase") else "literal")
            key = raw["session"]
            questions.append(Question(raw["ask"], {key}, {(key, str(t)) for t in raw["turns"]}, tags=tags))
        for raw in doc.get("unanswerable") or []:
            text = raw["ask"] if isinstance(raw, dict) else raw
            tags = {"unanswerable"} | ({"held_out"} if isinstance(raw, dict) and raw.get("held_out") else set())
            questions.append(Question(text, set(), set(), tags=tags))
    known = {s.key for s in sessions}
    if len(known) != len(sessions):
        raise SystemExit(f"{folder}: two sessions share a key")
    for question in questions:
        missing = question.sessions - known
        if missing:
            raise SystemExit(f"{folder}: question {question.text!r} names unknown session {missing}")
        for skey, tkey in question.turns:
            session = next(s for s in sessions if s.key == skey)
            if not 1 <= int(tkey) <= len(session.turns):
                raise SystemExit(f"{folder}: question {question.text!r}: {skey} has no turn {tkey}")
    if only is not None:
        sessions = [s for s in sessions if s.key in only]
        questions = [q for q in questions if not q.answerable or q.sessions <= only]
    return Corpus("coding", sessions, questions)


def load_locomo(path: Path, conversations: int = 0) -> Corpus:
    """LoCoMo's sessions as agent sessions, its non-adversarial questions with their evidence."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if conversations:
        data = data[:conversations]
    sessions: list[Session] = []
    questions: list[Question] = []
    for sample in data:
        conversation = sample["conversation"]
        scope = f"/home/dev/locomo/{sample['sample_id']}"
        speaker_a = conversation["speaker_a"]
        where: dict[str, str] = {}  # dia_id -> session key
        keys = sorted((k for k in conversation if re.fullmatch(r"session_\d+", k)),
                      key=lambda k: int(k.split("_")[1]))
        for key in keys:
            skey = f"{sample['sample_id']}/{key}"
            turns = []
            for dia in conversation[key]:
                role = "user" if dia["speaker"] == speaker_a else "assistant"
                turns.append(Turn(dia["dia_id"], [(role, dia["text"])]))
                where[dia["dia_id"]] = skey
            sessions.append(Session(skey, "claude", scope, turns, scope=scope))
        for qa in sample["qa"]:
            if qa.get("category") == ADVERSARIAL:
                continue
            evidence = set()
            for item in qa.get("evidence") or []:
                evidence.update(d for d in re.findall(r"D\d+:\d+", str(item).replace("D:", "D")) if d in where)
            if not evidence:
                continue
            questions.append(Question(qa["question"], {where[d] for d in evidence},
                                      {(where[d], d) for d in evidence}, scope=scope,
                                      tags={f"category {qa['category']}"}))
    return Corpus("locomo", sessions, questions)


# ---- writing the transcripts --------------------------------------------------------------


@dataclass
class Written:
    """What the bench wrote: where each message id came from, and when each session was last written."""

    line_turn: dict[str, tuple[str, str]] = field(default_factory=dict)  # message id -> (session, turn)
    by_id: dict[str, Session] = field(default_factory=dict)  # agent session id -> session
    last_write: dict[str, float] = field(default_factory=dict)  # agent session id -> epoch s
    text_bytes: int = 0


class Writer:
    """Writes sessions into a home's agent folders, one write per turn, as the agents do."""

    def __init__(self, home: Path):
        self.claude_dir = home / "claude"
        self.codex_home = home / "codex"
        self.copilot_dir = home / "copilot" / "session-state"
        self.written = Written()

    def write(self, session: Session) -> None:
        {"claude": self._claude, "codex": self._codex, "copilot": self._copilot}[session.agent](session)
        self.written.by_id[session.id] = session
        self.written.text_bytes += sum(len(t.text.encode()) + sum(len(c) + len(o) for c, o in t.tools)
                                       for t in session.turns)

    def _claude(self, session: Session) -> None:
        session.id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"llmem-recall/{session.key}"))
        agent = ClaudeSession(self.claude_dir, session.id, cwd=session.cwd)
        for turn in session.turns:
            lines: list[dict] = []
            for role, text in turn.messages:
                if role == "user":
                    lines += agent.prompt_lines(text)
                    for command, output in turn.tools:
                        lines += agent.tool_lines(command, output)
                else:
                    lines += agent.reply_lines(text)
            for line in lines:
                if isinstance(line, dict) and line.get("uuid"):
                    self.written.line_turn[line["uuid"]] = (session.key, turn.key)
            self.written.last_write[session.id] = agent.write(*lines)
        # The user quits (a clean exit's cost-state row): the session ends, also when a LoCoMo
        # session ends on speaker A's message, which leaves its last turn busy to the watcher.
        self.written.last_write[session.id] = agent.exit()

    def _codex(self, session: Session) -> None:
        rollout = CodexRollout(self.codex_home, cwd=session.cwd)
        session.id = rollout.id
        for turn in session.turns:
            texts = dict(turn.messages)
            rollout.begin(texts["user"])
            for command, output in turn.tools:
                rollout.tool(command, output)
            self.written.last_write[session.id] = rollout.finish(texts.get("assistant", "Done."))

    def _copilot(self, session: Session) -> None:
        agent = CopilotSession(self.copilot_dir, cwd=session.cwd)
        session.id = agent.id
        agent.start(locked=False)
        for turn in session.turns:
            texts = dict(turn.messages)
            agent.user(texts["user"])
            for command, output in turn.tools:
                agent.tool_step(command, output)
            agent.reply(texts.get("assistant", "Done."))
        self.written.last_write[session.id] = agent.shutdown(unlock=False)


# ---- a home, its config, the fake LLM -----------------------------------------------------


def fake_extraction(_path: str, body: dict) -> str:
    """What the fake LLM answers: for an extraction, the transcript's own sentences restated as
    memories (the agent's answers as decisions, facts and procedures; the user's stated likes as
    preferences), typed by their words; for any other task, an empty answer of its schema."""
    schema = body.get("format") if isinstance(body.get("format"), dict) else {}
    required = schema.get("required") or []
    if "memories" not in required:
        props = schema.get("properties") or {}
        return json.dumps({key: [] if props.get(key, {}).get("type") == "array" else "" for key in required})
    prompt = next((m.get("content", "") for m in body.get("messages") or []
                   if m.get("role") == "user" and "\nConversation:\n" in m.get("content", "")), "")
    conversation = prompt.split("\nConversation:\n", 1)[-1]
    memories = []
    for role, text in re.findall(r"^(user|assistant): (.*?)(?=^(?:user|assistant|synthetic|summary):|\Z)",
                                 conversation, flags=re.M | re.S):
        text = "\n".join(line for line in text.splitlines() if not line.startswith("  ["))
        text = re.sub(r"```.*?```", " ", text, flags=re.S)
        for sentence in re.split(r"(?<=[.!?])\s+|\n+", text):
            sentence = " ".join(sentence.split())
            words = len(sentence.split())
            if not 5 <= words <= 60:
                continue
            if role == "user":
                if re.search(r"\b(I prefer|I like|I don't like|I do not like|I want|always|never|we're using|"
                             r"we are using|please don't)\b", sentence, re.I):
                    memories.append({"type": "preference", "content": sentence, "stated_by_user": True})
                continue
            if re.search(r"\b(we'll|we will|let's|go with|chose|picked|switch(ed)? to|decided|settled on|instead of)\b",
                         sentence, re.I):
                kind = "decision"
            elif re.search(r"\b(run|command|script|make|deploy|migrate)\b", sentence, re.I):
                kind = "procedure"
            else:
                kind = "fact"
            memories.append({"type": kind, "content": sentence, "stated_by_user": False})
    return json.dumps({"memories": memories[:25]})


def builtin_embedding(choice: str) -> tuple[dict | None, str]:
    """The `embedding:` section of mode (b) and a line saying what it is (or why it is skipped).

    auto: the schema's default provider when it is no longer a server (the built-in embedder
    became the default), else a provider the schema knows beyond ollama/openai/local/none, else
    `local` when sentence-transformers is installed."""
    from llmem.config import SCHEMA

    setting = SCHEMA["embedding"]["provider"]
    choices = tuple(getattr(setting, "choices", ()) or ())
    if choice != "auto":
        provider, _, model = choice.partition(":")
        section = {"provider": provider} | ({"model": model} if model else {})
        return section, f"embedder: {provider}{':' + model if model else ''} (--builtin)"
    if setting.default not in ("ollama", "openai", "none"):
        return {"provider": setting.default}, f"embedder: {setting.default} (the built-in, the default)"
    extra = [c for c in choices if c not in KNOWN_PROVIDERS]
    if extra:
        return {"provider": extra[0]}, f"embedder: {extra[0]} (the built-in)"
    if importlib.util.find_spec("sentence_transformers") is not None:
        return {"provider": "local"}, "embedder: local (sentence-transformers; no built-in embedder on this branch)"
    return None, ("mode b skipped: no built-in embedder on this branch and sentence-transformers is not "
                  "installed (pip install 'llmem[local]'), so the dense baselines are skipped too")


def probe_embedder(section: dict):
    """The embedder of `section`, made as llmem makes it and asked once, or an error line."""
    from llmem.config import Config
    from llmem.paths import default_paths
    from llmem.providers import make_embedder

    try:
        config = Config(paths=default_paths()).with_values({"embedding": section, "llm": {"provider": "none"}})
        embedder = make_embedder(config)
        started = time.perf_counter()
        embedder.embed_query("warm up")
        return embedder, (time.perf_counter() - started) * 1000
    except Exception as exc:  # any failure to load is a reason to skip the mode, said aloud
        return None, f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"


class Home:
    """One fresh temp home: the agents' folders, config.yaml, and the llmem subprocess env."""

    def __init__(self, root: Path, embedding: dict, llm_url: str | None, *, debounce: float = 1.0):
        self.root = root
        self.llmem_home = root / "llmem-home"
        self.llmem_home.mkdir(parents=True)
        (root / "user-home").mkdir()
        self.writer = Writer(root)
        self.db_path = self.llmem_home / "memory.db"
        llm = ({"provider": "ollama", "base_url": llm_url, "model": "llama3.1:8b", "timeout": 60}
               if llm_url else {"provider": "none"})
        config = {
            "db_path": str(self.db_path),
            "embedding": embedding,
            "llm": llm,
            "session": {"adapter": "auto",
                        "claude": {"config_dir": str(self.writer.claude_dir)},
                        "codex": {"home": str(self.writer.codex_home)},
                        "copilot": {"state_dir": str(self.writer.copilot_dir),
                                    "home": str(root / "copilot")},
                        "opencode": {"data_dir": str(root / "opencode")}},
            "pipeline": {"workers": 2, "idle_debounce_seconds": debounce, "ending_inactivity_minutes": 1,
                         "min_extraction_interval_seconds": 0, "reconcile_pending_seconds": 5},
            "logging": {"dir": str(self.llmem_home / "logs")},
            "dream": {"enabled": False},
        }
        self.config_path = self.llmem_home / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("LLMEM_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")}
        self.env |= {"LLMEM_HOME": str(self.llmem_home), "HOME": str(root / "user-home"),
                     "CLAUDE_CONFIG_DIR": str(self.writer.claude_dir), "CODEX_HOME": str(self.writer.codex_home),
                     "COPILOT_HOME": str(root / "copilot"), "HF_HUB_OFFLINE": "1"}

    def llmem(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        # Run outside the checkout, in a folder with no `llmem` entry `python -m` would import.
        return subprocess.run([*LLMEM, *args], env=self.env, cwd=self.root, capture_output=True,
                              text=True, timeout=timeout)

    def connect(self) -> sqlite3.Connection:
        return packed_text.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)


# ---- ingestion ----------------------------------------------------------------------------


@dataclass
class Ingestion:
    how: str
    seconds: float
    note: str = ""


def ingest_backfill(home: Home, corpus: Corpus) -> Ingestion:
    for session in corpus.sessions:
        home.writer.write(session)
    started = time.perf_counter()
    done = home.llmem("backfill", "--json")
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"llmem backfill failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    outcome = json.loads(done.stdout)
    note = f"{outcome.get('sessions')} sessions read, {outcome.get('added')} added"
    if outcome.get("errors"):
        note += f", {len(outcome['errors'])} sessions failed: {outcome['errors'][:2]}"
    return Ingestion("backfill", seconds, note)


def ingest_run(home: Home, corpus: Corpus, *, timeout: float, attach: float = 3.0) -> Ingestion:
    """Write the sessions while `llmem run` watches; wait until every session's last write has
    an idle or ending event after it and no event is pending or running."""
    log = (home.root / "run.out").open("w")
    runner = subprocess.Popen([*LLMEM, "run"], env=home.env, cwd=home.root, stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(attach)  # the watcher attaches and takes its baseline before anything is written
        if runner.poll() is not None:
            raise SystemExit(f"llmem run exited at once ({runner.returncode}): "
                             f"{(home.root / 'run.out').read_text()[-2000:]}")
        started = time.perf_counter()
        for session in corpus.sessions:
            home.writer.write(session)
        note = "drained"
        while True:
            waiting = _not_drained(home)
            if not waiting:
                break
            if time.perf_counter() - started > timeout:
                note = f"TIMEOUT after {timeout:.0f} s: {waiting}"
                break
            time.sleep(0.5)
        seconds = time.perf_counter() - started
    finally:
        runner.send_signal(signal.SIGINT)
        try:
            runner.wait(60)
        except subprocess.TimeoutExpired:
            runner.kill()
            runner.wait(10)
        log.close()
    return Ingestion("run", seconds, note)


def _not_drained(home: Home) -> str:
    """'' when drained, else what is still waited for."""
    if not home.db_path.exists():
        return "no store yet"
    try:
        with home.connect() as conn:
            rows = conn.execute("SELECT session_id, kind, status, detected_at FROM event").fetchall()
    except sqlite3.OperationalError as exc:  # the store is being created
        return str(exc)
    busy = sum(status in ("pending", "running") for _, _, status, _ in rows)
    seen: dict[str, float] = {}
    for session_id, kind, status, detected in rows:
        if kind in ("idle", "ending") and status in ("done", "failed"):
            seen[session_id] = max(seen.get(session_id, 0.0), detected)
    # An event detected after the last write read everything written (the watcher waits for
    # the writes to settle before it reads).
    behind = [sid for sid, at in home.writer.written.last_write.items() if seen.get(sid, 0.0) < at]
    if busy or behind:
        return f"{busy} events pending or running, {len(behind)} sessions without a later idle/ending event"
    return ""


# ---- what was kept ------------------------------------------------------------------------


@dataclass
class Kept:
    total: int
    by_type: Counter
    by_rule: Counter
    store_bytes: int
    by_part: dict = field(default_factory=dict)  # structure -> bytes (dbstat), plus the vector file
    vectors: tuple | None = None  # (rows in the vector file, rows in the table, bytes of a file row)

    def line(self, text_bytes: int) -> str:
        types = ", ".join(f"{t} {n}" for t, n in self.by_type.most_common()) or "nothing"
        rules = ", ".join(f"{r} {n}" for r, n in self.by_rule.most_common(6))
        grown = max(0, self.store_bytes - empty_store_bytes())
        return (f"kept {self.total} memories ({types}; by rule: {rules or '-'}); store "
                f"{self.store_bytes / 1e6:.2f} MB, {grown / 1e6:.2f} MB over an empty one = "
                f"{grown / max(1, text_bytes):.1f}x the {text_bytes / 1e6:.2f} MB of transcript text")

    def growth(self, text_bytes: int, top: int = 8) -> str:
        """Where the growth over an empty store went, largest first, each as a multiple of the
        transcript text (the table with its indexes, the FTS index's shadow tables together)."""
        empty = empty_store_parts()
        grown: Counter = Counter()
        for name, size in self.by_part.items():
            grown[_part_group(name)] += size - empty.get(name, 0)
        parts = [(n, b) for n, b in grown.most_common() if b > 0][:top]
        line = "grown by: " + ", ".join(f"{n} {b / 1e3:.0f} KB ({b / max(1, text_bytes):.2f}x)" for n, b in parts)
        if self.vectors is not None:
            # The vector file is rebuilt after REBUILD_SHARE / MIN_REBUILD_ROWS changes: until then
            # it holds few of the vectors (a search reads the rest from the table), and its share
            # above is not what a store at rest pays for them.
            held, total, row = self.vectors
            line += (f"; the vector file holds {held} of {total} vectors (all of them: "
                     f"{total * row / max(1, text_bytes):.2f}x)")
        return line


STORE_FILES = ("memory.db", "memory.db-wal", "memory.vectors")  # the store: SQLite file, WAL, vector file


def _part_group(name: str) -> str:
    if name.startswith("memory_fts"):
        return "FTS index"
    if name.startswith("memory_vec"):
        return "vec0 mirror"
    return name


def store_parts(folder: Path) -> dict[str, int]:
    """Bytes per table and index (SQLite's dbstat; free pages as `(free)`) and per file beside."""
    path = folder / "memory.db"
    parts: dict[str, int] = {}
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        try:
            for name, size in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
                parts[name] = size
        except sqlite3.OperationalError:  # a SQLite built without dbstat: the files only
            pass
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        parts["(free pages)"] = page * conn.execute("PRAGMA freelist_count").fetchone()[0]
    for name in STORE_FILES[1:]:
        if (folder / name).exists():
            parts[name] = (folder / name).stat().st_size
    return parts


def store_bytes(folder: Path) -> int:
    return sum((folder / name).stat().st_size for name in STORE_FILES if (folder / name).exists())


_EMPTY_STORE: list[tuple[int, dict]] = []


def _empty_store() -> tuple[int, dict]:
    """The size of a freshly created store (schema, indexes) and its parts, measured once."""
    if not _EMPTY_STORE:
        from llmem.store import Store

        with tempfile.TemporaryDirectory(prefix="llmem-recall-empty-") as folder:
            path = Path(folder) / "memory.db"
            Store.open(path).close()
            parts = store_parts(Path(folder))
            _EMPTY_STORE.append((store_bytes(Path(folder)), parts))
    return _EMPTY_STORE[0]


def empty_store_bytes() -> int:
    return _empty_store()[0]


def empty_store_parts() -> dict:
    return _empty_store()[1]


def kept(home: Home) -> Kept:
    with home.connect() as conn:
        rows = conn.execute("SELECT type, metadata FROM memory WHERE invalidated_at IS NULL").fetchall()
    by_type, by_rule = Counter(), Counter()
    for memory_type, metadata in rows:
        by_type[memory_type] += 1
        try:
            by_rule[(json.loads(metadata or "{}") or {}).get("rule") or "-"] += 1
        except ValueError:
            by_rule["?"] += 1
    # Our own temp store, with llmem stopped: fold the WAL in so the size is what is held.
    parts = store_parts(home.llmem_home)
    return Kept(len(rows), by_type, by_rule, store_bytes(home.llmem_home), parts, vector_rows(home))


def vector_rows(home: Home) -> tuple[int, int, int] | None:
    """(vectors the vector file holds, vectors in the table, bytes per vector in the file)."""
    from llmem.db.vector_file import HEADER

    path = home.llmem_home / STORE_FILES[2]
    with home.connect() as conn:
        row = conn.execute("SELECT count(*), max(dim) FROM embedding").fetchone()
    if not path.exists() or not row[0]:
        return None
    with path.open("rb") as handle:
        held = HEADER.unpack(handle.read(HEADER.size))[3]
    return held, row[0], row[1] + 4 + 8  # int8 components, a float32 scale, an int64 seq


# ---- scoring ------------------------------------------------------------------------------


MIN_TURN_WORDS = 6


def words(text: str) -> set[str]:
    return set(_WORDS.findall(text.lower()))


def flat(text: str) -> str:
    """Lower-cased words joined by single spaces: text compared whatever its layout."""
    return " ".join(_WORDS.findall(text.lower()))


class TurnMap:
    """A memory's (session, turns) from its session_id, its metadata and its text."""

    def __init__(self, corpus: Corpus, written: Written):
        self.written = written
        self.turn_words = {(s.key, t.key): words(t.text) for s in corpus.sessions for t in s.turns}
        self.turn_text = {(s.key, t.key): flat(t.text) for s in corpus.sessions for t in s.turns}
        self.session_turns = {s.key: [t.key for t in s.turns] for s in corpus.sessions}
        self.how = Counter()

    def locate(self, session_id: str | None, metadata: dict, content: str) -> tuple[str | None, set[str]]:
        session = self.written.by_id.get(session_id or "")
        if session is None:
            self.how["no session"] += 1
            return None, set()
        turns = {turn for sid, turn in (self.written.line_turn.get(v) for v in _strings(metadata)
                                        if v in self.written.line_turn) if sid == session.key}
        order = self.session_turns[session.key]
        for value in metadata.values():
            # A list of message ids (an episode's first and last) stands for the turns between.
            named = [self.written.line_turn.get(v) for v in value if isinstance(v, str)] \
                if isinstance(value, list) else []
            spots = sorted(order.index(t) for s, t in filter(None, named) if s == session.key)
            if len(spots) >= 2:
                turns.update(order[spots[0]:spots[-1] + 1])
        found = words(content)
        text = flat(content)
        contained = set()
        for key in self.session_turns[session.key]:
            own = self.turn_words[(session.key, key)]
            # A short turn ("Fix it.", "Thanks!") counts only when its text is there verbatim:
            # its few words are in many memories that never held it.
            if (len(own) >= MIN_TURN_WORDS and len(own & found) >= 0.8 * len(own)) \
                    or self.turn_text[(session.key, key)] in text:
                contained.add(key)
        turns |= contained
        if not contained and found:
            best = max(self.session_turns[session.key],
                       key=lambda k: len(found & self.turn_words[(session.key, k)]))
            if len(found & self.turn_words[(session.key, best)]) >= 0.8 * len(found):
                turns.add(best)
        self.how["session and turn" if turns else "session only"] += 1
        return session.key, turns


def _strings(value, depth: int = 0):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict) and depth < 3:
        for item in value.values():
            yield from _strings(item, depth + 1)
    elif isinstance(value, list | tuple) and depth < 3:
        for item in value:
            yield from _strings(item, depth + 1)


@dataclass
class Ranked:
    """One question's answer by one system: per rank, the session key and the turn keys."""

    sessions: list[str | None]
    turns: list[set[tuple[str, str]]] | None  # None: the system ranks whole sessions only
    top: float  # the first result's score (0 when nothing was found)


class Scores:
    def __init__(self):
        self.rows: list[tuple[Question, Ranked]] = []

    def add(self, question: Question, ranked: Ranked) -> None:
        self.rows.append((question, ranked))

    def figures(self, keep=lambda q: True) -> dict:
        rows = [(q, r) for q, r in self.rows if q.answerable and keep(q)]
        out: dict = {"n": len(rows)}
        if not rows:
            return out
        hit5 = hit20 = rr = 0.0
        for question, ranked in rows:
            ranks = [i for i, s in enumerate(ranked.sessions[:DEPTH], start=1) if s in question.sessions]
            hit5 += bool(ranks and ranks[0] <= 5)
            hit20 += bool(ranks)
            rr += 1.0 / ranks[0] if ranks else 0.0
        out |= {"hit5": hit5 / len(rows), "hit20": hit20 / len(rows), "mrr": rr / len(rows)}
        if rows[0][1].turns is not None:
            recall = trr = covered = 0.0
            for question, ranked in rows:
                top5 = set().union(*ranked.turns[:5]) if ranked.turns else set()
                covered += len(top5)
                recall += len(question.turns & top5) / len(question.turns)
                rank = next((i for i, t in enumerate(ranked.turns[:DEPTH], start=1) if t & question.turns), None)
                trr += 1.0 / rank if rank else 0.0
            # How many turns the top 5 stand for: a chunk of several turns credits them all.
            out |= {"r5": recall / len(rows), "tmrr": trr / len(rows), "turns5": covered / len(rows)}
        positives = [r.top for q, r in self.rows if q.answerable and keep(q)]
        negatives = [r.top for q, r in self.rows if not q.answerable]
        if positives and negatives:
            out["auroc"] = auroc(positives, negatives)
        return out


def auroc(positives: list[float], negatives: list[float]) -> float:
    """P(a positive scores above a negative), ties counting half."""
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


# ---- baselines over the raw messages ------------------------------------------------------


class BM25:
    """Okapi BM25 (k1 1.2, b 0.75) over lower-cased word tokens."""

    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        self.tfs = [Counter(_WORDS.findall(d.lower())) for d in docs]
        self.lengths = [sum(tf.values()) for tf in self.tfs]
        self.avg = statistics.fmean(self.lengths) if self.lengths else 0.0
        df = Counter(term for tf in self.tfs for term in tf)
        n = len(docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = [t for t in _WORDS.findall(query.lower()) if t in self.idf]
        out = []
        for tf, length in zip(self.tfs, self.lengths, strict=True):
            score = 0.0
            norm = self.k1 * (1 - self.b + self.b * length / (self.avg or 1))
            for term in terms:
                f = tf.get(term)
                if f:
                    score += self.idf[term] * f * (self.k1 + 1) / (f + norm)
            out.append(score)
        return out


class Dense:
    """Cosine over the embedder's unit vectors (query vectors shared through `queries`)."""

    def __init__(self, embedder, docs: list[str], queries: dict):
        import numpy as np

        self.embedder = embedder
        self.queries = queries
        self.matrix = np.asarray(embedder.embed_documents(docs)) if docs else np.zeros((0, 1))

    def scores(self, query: str) -> list[float]:
        import numpy as np

        if query not in self.queries:
            self.queries[query] = np.asarray(self.embedder.embed_query(query))
        return list(self.matrix @ self.queries[query])


def baseline_scores(corpus: Corpus, embedder) -> dict[str, Scores]:
    """BM25 (and dense) over turns and over sessions, within each question's scope."""
    makers = {"BM25": BM25}
    if embedder is not None:
        queries: dict = {}
        makers["dense"] = lambda docs: Dense(embedder, docs, queries)
    scopes: dict[str | None, list[Session]] = {}
    for session in corpus.sessions:
        scopes.setdefault(session.scope, []).append(session)
    results = {f"{name} over {unit}": Scores() for name in makers for unit in ("turns", "sessions")}
    for scope, sessions in scopes.items():
        turns = [(s.key, t) for s in sessions for t in s.turns]
        questions = [q for q in corpus.questions if q.scope == scope]
        for name, make in makers.items():
            by_turn = make([t.text for _, t in turns])
            by_session = make([s.text for s in sessions])
            for question in questions:
                scores = by_turn.scores(question.text)
                order = sorted(range(len(turns)), key=lambda i: -scores[i])[:DEPTH]
                order = [i for i in order if scores[i] > 0] if name == "BM25" else order
                results[f"{name} over turns"].add(question, Ranked(
                    [turns[i][0] for i in order], [{(turns[i][0], turns[i][1].key)} for i in order],
                    float(scores[order[0]]) if order else 0.0))
                scores = by_session.scores(question.text)
                order = sorted(range(len(sessions)), key=lambda i: -scores[i])[:DEPTH]
                order = [i for i in order if scores[i] > 0] if name == "BM25" else order
                results[f"{name} over sessions"].add(question, Ranked(
                    [sessions[i].key for i in order], None, float(scores[order[0]]) if order else 0.0))
    return results


# ---- searching llmem ----------------------------------------------------------------------


def search_llmem(home: Home, corpus: Corpus, cli_check: int) -> tuple[Scores, TurnMap, dict]:
    """Every question through the in-process Searcher the CLI uses; a sample through the CLI."""
    from llmem.app import App

    # The in-process App reads its standard paths (the parsed-config cache) from LLMEM_HOME:
    # this home's, never the user's.
    before = os.environ.get("LLMEM_HOME")
    os.environ["LLMEM_HOME"] = str(home.llmem_home)
    app = App(config_path=str(home.config_path))
    searcher = app.searcher()
    turn_map = TurnMap(corpus, home.writer.written)
    scores = Scores()
    latencies = []
    ids_in_process: dict[int, list[str]] = {}
    try:
        for index, question in enumerate(corpus.questions):
            opts = app.search_options(limit=DEPTH, track=False, project=question.scope,
                                      min_relevance=0.0)  # recall@k ranks every candidate
            started = time.perf_counter()
            hits = searcher.search(question.text, opts).hits
            latencies.append((time.perf_counter() - started) * 1000)
            ids_in_process[index] = [hit.memory.id for hit in hits]
            located = [turn_map.locate(h.memory.session_id, h.memory.metadata or {}, h.memory.content)
                       for h in hits]
            scores.add(question, Ranked([s for s, _ in located], [{(s, t) for t in ts} for s, ts in located],
                                        hits[0].score if hits else 0.0))
    finally:
        app.close()
        if before is None:
            os.environ.pop("LLMEM_HOME", None)
        else:
            os.environ["LLMEM_HOME"] = before
    extra = {"p50_ms": statistics.median(latencies) if latencies else 0.0}
    if cli_check:
        step = max(1, len(corpus.questions) // cli_check)
        sample = list(range(0, len(corpus.questions), step))[:cli_check]
        agree = 0
        for index in sample:
            question = corpus.questions[index]
            args = ["search", "--json", "--no-track", "--limit", str(DEPTH), "--min-relevance", "0"]
            if question.scope:
                args += ["--project", question.scope]
            done = home.llmem(*args, question.text, timeout=120)
            if done.returncode != 0:
                raise SystemExit(f"llmem search failed: {done.stderr.strip()[-500:]}")
            agree += [row["id"] for row in json.loads(done.stdout)] == ids_in_process[index]
        extra["cli"] = f"`llmem search --json` gave the same ranked ids for {agree}/{len(sample)} sampled questions"
    return scores, turn_map, extra


# ---- the run ------------------------------------------------------------------------------


HEAD = (f"{'system':<46} {'Hit@5':>6} {'Hit@20':>6} {'MRR':>6} {'tR@5':>6} {'tMRR':>6} {'t/top5':>6}"
        f" {'AUROC':>6} {'ingest s':>9}")


def row(label: str, figures: dict, seconds: float | None = None) -> str:
    def cell(key, digits=3):
        return f"{figures[key]:6.{digits}f}" if key in figures else f"{'-':>6}"

    took = f"{seconds:9.1f}" if seconds is not None else f"{'':>9}"
    return (f"{label:<46} {cell('hit5')} {cell('hit20')} {cell('mrr')} {cell('r5')} {cell('tmrr')} "
            f"{cell('turns5', 1)} {cell('auroc')} {took}")


GROUPS = {
    "all answerable": lambda q: True,
    "held out": lambda q: "held_out" in q.tags,
    "paraphrased": lambda q: "paraphrase" in q.tags,
    "literal": lambda q: "literal" in q.tags,
}


def run_corpus(corpus: Corpus, args, tmp: Path, embedding_b: dict | None, embedder, out=print) -> dict:
    """Every mode × ingestion on `corpus`, with the baselines; prints the tables, returns figures."""
    out(f"\n=== {corpus.name}: {corpus.describe()}")
    results: dict = {"llmem": {}, "baselines": {}}
    started = time.perf_counter()
    baselines = baseline_scores(corpus, embedder)
    out(f"baselines computed in {time.perf_counter() - started:.1f} s")
    server = None
    if "c" in args.modes:
        server = FakeModelServer().start()
        server.chat_answer = fake_extraction
    systems: list[tuple[str, Scores, float | None]] = []
    try:
        for mode in args.modes:
            if mode == "b" and embedding_b is None:
                continue
            embedding = embedding_b if mode in ("b", "c") and embedding_b else {"provider": "none"}
            name = {"a": "no LLM, no embedder", "b": f"embedder {embedding['provider']}",
                    "c": f"fake LLM, embedder {embedding['provider']}"}[mode]
            for how in args.ingest:
                home = Home(tmp / f"{corpus.name}-{mode}-{how}", embedding,
                            server.url if mode == "c" else None)
                if how == "backfill":
                    ingestion = ingest_backfill(home, corpus)
                else:
                    ingestion = ingest_run(home, corpus, timeout=args.run_timeout)
                what = kept(home)
                scores, turn_map, extra = search_llmem(home, corpus, args.cli_check)
                label = f"llmem ({mode}) {name}, {how}"
                systems.append((label, scores, ingestion.seconds))
                results["llmem"][label] = {"mode": mode, "ingest": how, "figures": scores.figures(),
                                           "ingest_s": ingestion.seconds, "kept": what.total,
                                           "by_type": dict(what.by_type), "store_bytes": what.store_bytes,
                                           "grown_x": max(0, what.store_bytes - empty_store_bytes())
                                           / max(1, home.writer.written.text_bytes),
                                           "text_bytes": home.writer.written.text_bytes,
                                           "parts": what.by_part}
                out(f"  {label}: ingested in {ingestion.seconds:.1f} s ({ingestion.note}); "
                    + what.line(home.writer.written.text_bytes))
                out(f"    {what.growth(home.writer.written.text_bytes)}")
                out(f"    hits located: {dict(turn_map.how)}; search p50 {extra['p50_ms']:.1f} ms"
                    + (f"; {extra['cli']}" if "cli" in extra else ""))
    finally:
        if server is not None:
            chats = sum(path == "/api/chat" for path, _ in server.requests)
            out(f"  fake LLM: {chats} /api/chat requests answered")
            server.stop()
    for name, scores in baselines.items():
        systems.append((f"baseline: {name}", scores, None))
        results["baselines"][name] = scores.figures()
    for group, keep in GROUPS.items():
        sample = systems[0][1].figures(keep)["n"] if systems else 0
        if not sample:
            continue
        out(f"\n{corpus.name}, {group} ({sample} questions; session level Hit@5/Hit@20/MRR; turn level "
            f"R@5/MRR and the turns the top 5 stand for; AUROC answerable vs unanswerable)")
        out(HEAD)
        for label, scores, seconds in systems:
            out(row(label, scores.figures(keep), seconds if group == "all answerable" else None))
    if corpus.name == "locomo":
        categories = sorted({t for q in corpus.questions for t in q.tags if t.startswith("category")})
        out(f"\n{corpus.name}, turn-level R@5 by category")
        out(f"{'system':<46} " + " ".join(f"{c:>11}" for c in categories))
        for label, scores, _ in systems:
            cells = []
            for c in categories:
                f = scores.figures(lambda q, c=c: c in q.tags)
                cells.append(f"{f['r5']:11.3f}" if "r5" in f else f"{'-':>11}")
            out(f"{label:<46} " + " ".join(cells))
    return results


def targets(results: dict) -> list[str]:
    """Issue 18's targets, each beside what it is measured against, for the default mode (b,
    the built-in embedder, no LLM; (a) when b did not run), ingested by backfill."""
    lines = ["", "Targets (issue 18), default mode, backfill; measured / target / baselines in this run"]
    for name, corpus in results.items():
        runs = [r for r in corpus["llmem"].values() if r["ingest"] == "backfill"]
        run = next((r for r in runs if r["mode"] == "b"), next((r for r in runs if r["mode"] == "a"), None))
        if run is None:
            continue
        f, base = run["figures"], corpus["baselines"]

        def beside(key, base=base):
            return ", ".join(f"{n} {b[key]:.3f}" for n, b in base.items() if n.endswith("turns") and key in b)

        mode = f"({run['mode']})"
        if name == "coding":
            lines.append(f"  coding session Hit@5 {mode}: {f.get('hit5', 0):.3f} / >= 0.95 / {beside('hit5')}")
            lines.append(f"  coding session MRR {mode}:   {f.get('mrr', 0):.3f} / >= 0.85 / {beside('mrr')}")
            if "auroc" in f:
                lines.append(f"  coding AUROC {mode}:         {f['auroc']:.3f} / separates (1.0) / {beside('auroc')}")
        if name == "locomo":
            lines.append(f"  LoCoMo turn R@5 {mode}:      {f.get('r5', 0):.3f} / >= 0.55 / {beside('r5')}")
        lines.append(f"  {name} store growth {mode}: {run['grown_x']:.1f}x the transcript text / <= 3x")
    return lines


def locomo_path(given: str | None) -> Path | None:
    if given:
        return Path(given)
    for candidate in (LOCOMO_DEFAULT, *LOCOMO_FALLBACKS):
        if candidate.is_file():
            return candidate
    return None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="coding,locomo", help="coding, locomo or both (comma-separated).")
    parser.add_argument("--modes", default="a,b,c", help="a (no LLM, no embedder), b (built-in embedder), "
                        "c (fake LLM); comma-separated.")
    parser.add_argument("--ingest", default="backfill,run", help="backfill, run or both.")
    parser.add_argument("--builtin", default="auto", metavar="PROVIDER[:MODEL]",
                        help="The embedder of modes b and c (default auto: the built-in when this branch "
                             "has one, else local when sentence-transformers is installed).")
    parser.add_argument("--locomo", metavar="PATH", help="locomo-dev.json (default: ../shared/data/).")
    parser.add_argument("--conversations", type=int, default=0, help="LoCoMo conversations (0: all).")
    parser.add_argument("--sessions", help="Only these coding session keys (comma-separated).")
    parser.add_argument("--quick", action="store_true", help="One LoCoMo conversation.")
    parser.add_argument("--run-timeout", type=float, default=600.0,
                        help="Longest wait for `llmem run` to drain, seconds.")
    parser.add_argument("--cli-check", type=int, default=10,
                        help="Questions also asked through `llmem search --json` (0: none).")
    parser.add_argument("--keep", action="store_true", help="Keep the temp homes (printed).")
    parser.add_argument("--json", metavar="FILE", help="Also write the figures as JSON to FILE.")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    args.ingest = [i for i in args.ingest.split(",") if i]
    if not set(args.modes) <= set(MODES) or not set(args.ingest) <= {"backfill", "run"}:
        parser.error("--modes takes a,b,c and --ingest takes backfill,run")
    corpora = [c for c in args.corpus.split(",") if c]
    if args.quick and not args.conversations:
        args.conversations = 1

    for name in ("LLMEM_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        os.environ.pop(name, None)
    tmp = Path(tempfile.mkdtemp(prefix="llmem-recall-"))
    os.environ["LLMEM_HOME"] = str(tmp / "bench-process")  # nothing in-process reads the real home
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    print(f"llmem recall bench: modes {','.join(args.modes)}, ingestion {','.join(args.ingest)}")
    embedding_b, said = builtin_embedding(args.builtin) if {"b", "c"} & set(args.modes) else (None, "")
    embedder = None
    if embedding_b is not None:
        embedder, probe = probe_embedder(embedding_b)
        if embedder is None:
            said = f"mode b skipped: the embedder {embedding_b} does not load ({probe}); dense baselines skipped"
            embedding_b = None
        else:
            said += f"; first query {probe:.0f} ms (model load included)"
    if said:
        print(said)
    results: dict = {}
    try:
        for name in corpora:
            if name == "coding":
                only = set(args.sessions.split(",")) if args.sessions else None
                corpus = load_coding(only=only)
            elif name == "locomo":
                path = locomo_path(args.locomo)
                if path is None or not path.is_file():
                    print(f"\nlocomo skipped: no data file at {path or LOCOMO_DEFAULT}")
                    continue
                corpus = load_locomo(path, args.conversations)
            else:
                parser.error(f"unknown corpus {name!r}")
            results[name] = run_corpus(corpus, args, tmp, embedding_b, embedder)
    finally:
        if args.keep:
            print(f"\nhomes kept in {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    for line in targets(results):
        print(line)
    print(f"\nwhole run: {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return results


if __name__ == "__main__":
    main()
