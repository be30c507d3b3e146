"""peewee models of the memory store. Tables are created by migrations, not here.

The classes below are declarations only and are never bound to a database: two stores open
in one process must not share models, so each Store queries through its own bound set,
`store.models` (see `bound_models`). Querying a declaration fails loudly.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import peewee as pw

from .packed_text import PackedText, pack, unpack

MEMORY_TYPES = (
    "fact", "decision", "preference", "event", "project_state", "procedure",
    "conversation", "self_assessment",
)
SOURCES = ("user", "extraction", "introspection", "learn", "review", "dream", "import", "backfill",
           "episode")
# The source of an episode: a piece of the conversation itself (capture/episodes.py), stored
# as a `conversation` memory. Search ranks it below typed memories; the dream never merges or
# promotes it as a fact.
EPISODE_SOURCE = "episode"
RELATION_TYPES = ("supersedes", "contradicts", "depends_on", "related_to", "derived_from")
# `grounded`: evidence staged by `llmem dream rem-backfill --stage-short-term` from a dated note.
RECALL_ORIGINS = ("search", "context", "mcp", "dream", "grounded")
# The recalls a user (or their agent) asked for: context injection and dream re-surface
# memories without anyone asking.
USER_ORIGINS = ("search", "mcp")
# The kinds of memory `llmem share PROJECT` opts into the team's memory: what the project
# knows. Preferences, self-assessments, episodes and events stay their author's.
SHAREABLE_TYPES = ("fact", "decision", "procedure")


class JSONText(pw.TextField):
    """A JSON document stored as text (portable across SQLite drivers)."""

    def db_value(self, value):
        if value is None:
            return None
        return "{}" if value == {} and isinstance(value, dict) else _json_encoder().encode(value)

    def python_value(self, value):
        import json

        return None if value is None else json.loads(value)


@functools.cache
def _json_encoder():
    """json.dumps(value, ensure_ascii=False, sort_keys=True) as one encoder: json.dumps builds
    a new one per call when given options (an import writes 100k metadata documents)."""
    import json

    return json.JSONEncoder(ensure_ascii=False, sort_keys=True)


class StoredText(pw.TextField):
    """Text a SQLite store may keep deflated (db/packed_text.py): a PackedText value (an
    episode's content) is written packed in a store whose column reads packed values back
    (`packs_text`, set when it is opened), any other text as it is, and a packed value reads
    back as its text. PostgreSQL never packs."""

    def db_value(self, value):
        if isinstance(value, (bytes, bytearray)):
            return value  # already a stored value (packed_text.pack)
        if isinstance(value, PackedText) and getattr(self.model._meta.database, "packs_text", False):
            return pack(value)
        return super().db_value(value)

    def python_value(self, value):
        return unpack(value)


class UnboundModelError(pw.InterfaceError):
    """A query ran on a module-level model instead of a store's bound one."""


class _Unbound(pw.SqliteDatabase):
    """The database of the declarations: any query names the fix instead of hitting some store."""

    def __init__(self):
        super().__init__(None)  # deferred: it never connects

    def execute(self, query, **kwargs):
        model = getattr(query, "model", None)
        if model is None:  # count() and friends wrap the model's query
            raise UnboundModelError("the models of llmem.db.models are unbound declarations; "
                                    "query through store.models (bound to that store's database)")
        raise UnboundModelError(
            f"{model.__name__} from llmem.db.models is an unbound declaration; "
            f"query store.models.{model.__name__} (bound to that store's database)")

    def execute_sql(self, sql, params=None, **kwargs):
        raise UnboundModelError("the models of llmem.db.models are unbound declarations; "
                                "query through store.models (bound to that store's database)")


class BaseModel(pw.Model):
    class Meta:
        database = _Unbound()


class Memory(BaseModel):
    """A typed memory. `seq` is the stable integer key the FTS and vector indexes use."""

    seq = pw.AutoField()
    id = pw.TextField(unique=True)
    # type, project and invalidated_at lead the list indexes of migrations 0015/0019, which
    # serve their lookups too: no index of their own (migration 0023).
    type = pw.TextField()
    # An episode's text is kept deflated in a SQLite file (db/packed_text.py, migration 0024).
    content = StoredText()
    summary = pw.TextField(null=True)
    hints = pw.TextField(default="")  # identifier parts, indexed by FTS (see fts.py)
    confidence = pw.FloatField(default=0.7)
    source = pw.TextField(default="user")
    project = pw.TextField(null=True)
    session_id = pw.TextField(null=True, index=True)
    metadata = JSONText(default=dict)
    content_hash = pw.TextField(index=True)  # the dedupe key (normalised content, store.py; derived.HASH_CHARS)
    created_at = pw.FloatField()
    updated_at = pw.FloatField()
    accessed_at = pw.FloatField(null=True)
    access_count = pw.IntegerField(default=0)
    valid_from = pw.FloatField(null=True)
    valid_until = pw.FloatField(null=True)
    invalidated_at = pw.FloatField(null=True)
    promoted_at = pw.FloatField(null=True)
    # Hash of the text its vector must be made from (db/derived.py text_to_embed), kept by the
    # Store with the text; a memory whose embedding carries another hash is pending.
    embed_hash = pw.TextField(null=True)
    # Bumped by every write of the row (store.py, db/queries.py write_memory_columns): the
    # optimistic-concurrency token of the viewer's forms (migration 0014).
    version = pw.IntegerField(default=1)
    # Whose words the memory holds: user | agent | external (llmem/trust.py); set by every writer.
    trust = pw.TextField(default="agent")
    # Who wrote it, as the database knows them (migration 0022): on a PostgreSQL store its
    # role (the column's default, current_user, which row-level security checks); on a
    # SQLite file, the file's one user (null). llmem never sets it: the database says it.
    author = pw.TextField(null=True)
    # private: its author's only | shared: everyone with access to the store (`llmem share`).
    visibility = pw.TextField(default="private")

    class Meta:
        table_name = "memory"


class Relation(BaseModel):
    """A typed, directed link between two memories (unique per triple)."""

    source = pw.ForeignKeyField(Memory, field=Memory.id, column_name="source_id",
                                on_delete="CASCADE", backref="outgoing")
    target = pw.ForeignKeyField(Memory, field=Memory.id, column_name="target_id",
                                on_delete="CASCADE", backref="incoming")
    type = pw.TextField()
    created_at = pw.FloatField()

    class Meta:
        table_name = "relation"
        indexes = ((("source", "target", "type"), True),)


class Embedding(BaseModel):
    """The vector of one memory, with the model and the hash of the exact text it was made from."""

    memory = pw.ForeignKeyField(Memory, field=Memory.id, column_name="memory_id",
                                primary_key=True, on_delete="CASCADE")
    model = pw.TextField()
    dim = pw.IntegerField()
    vector = pw.BlobField()  # float32, unit length
    content_hash = pw.TextField()  # derived.text_hash of the embedded text; "" when stale
    created_at = pw.FloatField()

    class Meta:
        table_name = "embedding"


class RecallEvent(BaseModel):
    """One appearance of a memory in a result list: the raw signal for promotion."""

    memory = pw.ForeignKeyField(Memory, field=Memory.id, column_name="memory_id",
                                on_delete="CASCADE", index=True)
    query_hash = pw.TextField()
    rank = pw.IntegerField()
    score = pw.FloatField()
    origin = pw.TextField(default="search")
    created_at = pw.FloatField(index=True)
    # The rem-backfill run that staged this row (null: a live recall), so its rollback
    # removes exactly what it staged.
    staged_by = pw.TextField(null=True)

    class Meta:
        table_name = "recall_event"


class RecallQuery(BaseModel):
    """The (redacted) text of a user query, once per query hash: what the shadow trial asks."""

    query_hash = pw.TextField(primary_key=True)
    text = pw.TextField()
    created_at = pw.FloatField()

    class Meta:
        table_name = "recall_query"


class Setting(BaseModel):
    """Small key/value state of the store (vector index model and dimension, …)."""

    key = pw.TextField(primary_key=True)
    value = pw.TextField()

    class Meta:
        table_name = "setting"


class DreamRun(BaseModel):
    """One applied dream, promote or backfill run (previews are never recorded)."""

    id = pw.TextField(primary_key=True)
    kind = pw.TextField(default="dream")  # dream | promote | backfill
    phases = pw.TextField(default="")  # comma-separated, in the order they ran
    status = pw.TextField(default="running")  # running | done | failed | undone
    started_at = pw.FloatField(index=True)
    finished_at = pw.FloatField(null=True)
    undone_at = pw.FloatField(null=True)
    summary = JSONText(default=dict)
    error = pw.TextField(null=True)

    class Meta:
        table_name = "dream_run"


class DreamAction(BaseModel):
    """One journaled write of a run, with what it replaced, so `dream undo` can restore it."""

    run = pw.ForeignKeyField(DreamRun, column_name="run_id", on_delete="CASCADE", index=True)
    phase = pw.TextField()
    kind = pw.TextField()  # what the dream did: decay, boost, merge, promote, …
    op = pw.TextField()  # how to undo it: update | create | relate | file
    memory_id = pw.TextField(null=True, index=True)  # no FK: the journal outlives deletions
    before = JSONText(null=True)  # the memory row (update), the file text (file)
    after = JSONText(null=True)
    created_at = pw.FloatField()

    class Meta:
        table_name = "dream_action"


class Event(BaseModel):
    """A lifecycle moment of an agent session, recorded before its task is enqueued.

    The store, not the queue, is the source of truth: huey delivers at most once, so the
    reconcile task re-enqueues events left pending or running too long. The owner fields
    say which process claimed the event last, so a running event whose worker died on this
    host is requeued at once rather than after pipeline.running_timeout_minutes.
    """

    adapter = pw.TextField()
    session_id = pw.TextField(index=True)
    kind = pw.TextField()  # created | idle | ending | compacting
    status = pw.TextField(default="pending", index=True)  # pending | running | done | failed
    attempts = pw.IntegerField(default=0)
    last_error = pw.TextField(null=True)
    detected_at = pw.FloatField()
    started_at = pw.FloatField(null=True)
    finished_at = pw.FloatField(null=True)
    not_before = pw.FloatField(null=True)  # deferred (token budget, extraction interval)
    result = JSONText(null=True)
    owner_pid = pw.IntegerField(null=True)  # the process that claimed it last
    owner_started_at = pw.FloatField(null=True)  # when that process started (a recycled pid is not it)
    owner_host = pw.TextField(null=True)
    # The machine whose agents wrote the session (llmem/machine.py): only its worker can read
    # the transcript, so only it runs the event (migration 0020). Null: written by an llmem
    # older than machines, taken by any.
    machine = pw.TextField(null=True)

    class Meta:
        table_name = "event"


class SessionCursor(BaseModel):
    """How far extraction (and introspection) has read one agent session's transcript."""

    adapter = pw.TextField()
    session_id = pw.TextField()
    project = pw.TextField(null=True)
    cursor = pw.TextField(null=True)  # id of the last message extraction consumed
    introspect_cursor = pw.TextField(null=True)  # id of the last message introspection consumed
    # Id of the last message written as episodes (capture/episodes.py): it moves even when the
    # extraction cursor is held for a later LLM pass, so no turn becomes an episode twice.
    episode_cursor = pw.TextField(null=True)
    messages_read = pw.IntegerField(default=0)
    status = pw.TextField(default="idle")  # idle | done | deferred
    updated_at = pw.FloatField()

    class Meta:
        table_name = "session_cursor"
        indexes = ((("adapter", "session_id"), True),)


class LlmUsage(BaseModel):
    """Tokens of one chat LLM call, for `llmem stats` and the daily token budget."""

    time = pw.FloatField()
    day = pw.TextField(index=True)  # local date, YYYY-MM-DD
    task = pw.TextField()
    provider = pw.TextField()
    model = pw.TextField()
    prompt_tokens = pw.IntegerField(default=0)
    completion_tokens = pw.IntegerField(default=0)

    class Meta:
        table_name = "llm_usage"


ALL_MODELS = [Memory, Relation, Embedding, RecallEvent, RecallQuery, Setting, DreamRun, DreamAction, Event, SessionCursor, LlmUsage]


@dataclass(frozen=True)
class Models:
    """Every model, bound to one database (a Store's `models`)."""

    Memory: type[Memory]
    Relation: type[Relation]
    Embedding: type[Embedding]
    RecallEvent: type[RecallEvent]
    RecallQuery: type[RecallQuery]
    Setting: type[Setting]
    DreamRun: type[DreamRun]
    DreamAction: type[DreamAction]
    Event: type[Event]
    SessionCursor: type[SessionCursor]
    LlmUsage: type[LlmUsage]


def _rebound_foreign_key(field: pw.ForeignKeyField, target: type[BaseModel]) -> pw.ForeignKeyField:
    """`field` pointing at `target` (the bound subclass of its model), so lazy access and
    joins stay inside the same database."""
    rebound = pw.ForeignKeyField(
        target, field=target._meta.fields[field.rel_field.name], column_name=field.column_name,
        backref=field.backref, on_delete=field.on_delete, on_update=field.on_update,
        primary_key=field.primary_key, null=field.null, index=field.index, unique=field.unique,
        lazy_load=field.lazy_load)
    # Keep the declared column order (CREATE TABLE of a new store, SELECT lists).
    rebound._order, rebound._sort_key = field._order, field._sort_key
    return rebound


def bound_models(db: pw.Database) -> Models:
    """Subclasses of every model bound to `db` (same tables, indexes and foreign keys), built
    once per database object and kept on it: a build costs ~2.5 ms (peewee copies every
    field), and opening a fresh store asked for it six times (the migrations, then the Store)."""
    models = getattr(db, "_llmem_bound_models", None)
    if models is None:
        models = db._llmem_bound_models = _build_bound_models(db)
    return models


def _build_bound_models(db: pw.Database) -> Models:
    bound: dict[str, type[BaseModel]] = {}
    for model in ALL_MODELS:  # targets of foreign keys come first in ALL_MODELS
        meta = type("Meta", (), {"database": db, "table_name": model._meta.table_name,
                                 "indexes": model._meta.indexes})
        attrs: dict = {"Meta": meta, "__module__": model.__module__, "__doc__": model.__doc__}
        for field in model._meta.sorted_fields:
            if isinstance(field, pw.ForeignKeyField):
                attrs[field.name] = _rebound_foreign_key(field, bound[field.rel_model.__name__])
            elif not field.primary_key:
                # A shallow copy given here, or peewee deep-copies the inherited field (most
                # of a build's ~2.5 ms, and a build is a store open's ~4.5): a field's
                # declaration (type, default, constraints) is never changed after it, and
                # binding sets the copy's own model, name and column.
                attrs[field.name] = copy.copy(field)
        bound[model.__name__] = type(model.__name__, (model,), attrs)
    return Models(**bound)
