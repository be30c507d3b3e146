"""peewee models of the memory store (SPEC §2). Tables are created by migrations, not here."""

from __future__ import annotations

import peewee as pw

MEMORY_TYPES = (
    "fact", "decision", "preference", "event", "project_state", "procedure",
    "conversation", "self_assessment",
)
SOURCES = ("user", "extraction", "introspection", "learn", "review", "dream", "import", "backfill")
RELATION_TYPES = ("supersedes", "contradicts", "depends_on", "related_to", "derived_from")
RECALL_ORIGINS = ("search", "context", "mcp", "dream")


class JSONText(pw.TextField):
    """A JSON document stored as text (portable across SQLite drivers)."""

    def db_value(self, value):
        import json

        return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)

    def python_value(self, value):
        import json

        return None if value is None else json.loads(value)


class BaseModel(pw.Model):
    class Meta:
        database = None  # bound at open time (deferred), so tests can point anywhere


class Memory(BaseModel):
    """A typed memory. `seq` is the stable integer key the FTS and vector indexes use."""

    seq = pw.AutoField()
    id = pw.TextField(unique=True)
    type = pw.TextField(index=True)
    content = pw.TextField()
    summary = pw.TextField(null=True)
    hints = pw.TextField(default="")  # identifier parts, indexed by FTS (see fts.py)
    confidence = pw.FloatField(default=0.7)
    source = pw.TextField(default="user")
    project = pw.TextField(null=True, index=True)
    session_id = pw.TextField(null=True, index=True)
    metadata = JSONText(default=dict)
    content_hash = pw.TextField(index=True)
    created_at = pw.FloatField()
    updated_at = pw.FloatField()
    accessed_at = pw.FloatField(null=True)
    access_count = pw.IntegerField(default=0)
    valid_from = pw.FloatField(null=True)
    valid_until = pw.FloatField(null=True)
    invalidated_at = pw.FloatField(null=True, index=True)
    promoted_at = pw.FloatField(null=True)

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
    """The vector of one memory, with the model and content hash it was made from."""

    memory = pw.ForeignKeyField(Memory, field=Memory.id, column_name="memory_id",
                                primary_key=True, on_delete="CASCADE")
    model = pw.TextField()
    dim = pw.IntegerField()
    vector = pw.BlobField()  # float32, unit length
    content_hash = pw.TextField()
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

    class Meta:
        table_name = "recall_event"


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
    reconcile task re-enqueues events left pending or running too long.
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

    class Meta:
        table_name = "event"


class SessionCursor(BaseModel):
    """How far extraction (and introspection) has read one agent session's transcript."""

    adapter = pw.TextField()
    session_id = pw.TextField()
    project = pw.TextField(null=True)
    cursor = pw.TextField(null=True)  # id of the last message extraction consumed
    introspect_cursor = pw.TextField(null=True)  # id of the last message introspection consumed
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


ALL_MODELS = [Memory, Relation, Embedding, RecallEvent, Setting, DreamRun, DreamAction, Event, SessionCursor, LlmUsage]


def bind_models(db) -> None:
    """Bind every model to an opened database."""
    db.bind(ALL_MODELS, bind_refs=False, bind_backrefs=False)
