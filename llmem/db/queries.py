"""Reads over the memory table that the portable peewee query API cannot say, or says too slowly
(and the dream's fast column writes).

Each function returns plain rows or a peewee expression, so the code above `db/` holds no
SQL dialect: a PostgreSQL backend answers the same calls with its own SQL.
"""

from __future__ import annotations

from typing import Any

import peewee as pw

from .backend import per_backend
from .models import JSONText, Memory
from .packed_text import unpack


@per_backend
def metadata_equals(field: pw.Field, key: str, value: Any) -> pw.Node:
    """The condition (for a peewee `where`) that `key` of a JSON column, a dotted path, holds
    `value` (a string, a number or a bool)."""
    return pw.fn.json_extract(field, f"$.{key}") == value


@per_backend
def metadata_flag_off(field: pw.Field, key: str) -> pw.Node:
    """The condition that `key` of a JSON column is missing, null, false or 0."""
    flag = pw.fn.json_extract(field, f"$.{key}")
    return flag.is_null() | (flag == 0)


def memory_filter(*, memory_type: str | None, project: str | None, include_invalid: bool,
                  valid_only: bool, at: float) -> tuple[str, list[Any]]:
    """(SQL condition over `memory m`, its parameters) for a search's filters; "1" keeps all."""
    clauses, params = [], []
    if memory_type:
        clauses.append("m.type = ?")
        params.append(memory_type)
    if project:
        # A project's searches see its own memories and the global ones.
        clauses.append("(m.project = ? OR m.project IS NULL)")
        params.append(project)
    if not include_invalid:
        clauses.append("m.invalidated_at IS NULL")
    if valid_only:
        clauses.append("(m.valid_until IS NULL OR m.valid_until > ?)")
        params.append(at)
        clauses.append("NOT EXISTS (SELECT 1 FROM relation r JOIN memory s ON s.id = r.source_id "
                       "WHERE r.target_id = m.id AND r.type = 'supersedes' "
                       "AND s.invalidated_at IS NULL)")
    return (" AND ".join(clauses) or "1"), params


@per_backend
def seqs_passing(db, seqs: list[int], where: str, params: list) -> set[int]:
    """The memory seqs among `seqs` that pass a `memory_filter` condition."""
    marks = ",".join("?" * len(seqs))
    # NOT INDEXED: the seqs are looked up by rowid. With no ANALYZE figures SQLite took the
    # index on invalidated_at for selective and walked every valid row of it (74 ms of a
    # 127 ms KNN at 1M memories).
    rows = db.execute_sql(f"SELECT m.seq FROM memory m NOT INDEXED WHERE m.seq IN ({marks}) AND {where}",
                          [*seqs, *params])
    return {r[0] for r in rows}


def rank_fields(db, seqs: list[int]) -> list[tuple]:
    """(seq, type, confidence, accessed_at, access_count, created_at, source) of each memory in `seqs`."""
    marks = ",".join("?" * len(seqs))
    return db.execute_sql("SELECT seq, type, confidence, accessed_at, access_count, created_at, source "
                          f"FROM memory WHERE seq IN ({marks})", seqs).fetchall()


@per_backend
def shared_content_rows(db) -> list[tuple]:
    """(content_hash, project, id) of the valid memories whose content hash another valid
    memory of the same project shares, ordered by hash, project, age."""
    # The unary pluses keep SQLite off the index on invalidated_at: through it, the groups walked
    # every valid row and looked each up in the table, and the outer query did it again to
    # test each against the (usually empty) list; the content_hash index is read in hash
    # order instead, and the few shared hashes are looked up in it (100k: 0.3 -> 0.13 s).
    return db.execute_sql(
        "SELECT content_hash, project, id FROM memory WHERE +invalidated_at IS NULL AND content_hash IN ("
        " SELECT content_hash FROM memory WHERE +invalidated_at IS NULL"
        " GROUP BY content_hash, project HAVING COUNT(*) > 1)"
        " ORDER BY content_hash, project, created_at, seq").fetchall()


def recall_rows(db, origins: tuple[str, ...], memory_ids: list[str] | None) -> list[tuple]:
    """(memory_id, query_hash, created_at, score, origin) of every recall of `origins` (of
    `memory_ids`, or of all memories), by memory then time."""
    marks = ",".join("?" * len(origins))
    sql = f"SELECT memory_id, query_hash, created_at, score, origin FROM recall_event WHERE origin IN ({marks})"
    params: list[Any] = list(origins)
    if memory_ids is not None:
        sql += f" AND memory_id IN ({','.join('?' * len(memory_ids))})"
        params += memory_ids
    return db.execute_sql(sql + " ORDER BY memory_id, created_at", params).fetchall()


@per_backend
def recall_bounds(db, origins: tuple[str, ...], **terms) -> tuple[int, list[tuple[str, float, bool]]]:
    """`bounds_of_recalls` in SQLite's words: min and max of two values, CAST truncates."""
    return bounds_of_recalls(db, origins, least="min", greatest="max", whole="CAST({} AS INTEGER)", **terms)


def bounds_of_recalls(db, origins: tuple[str, ...], *, least: str, greatest: str, whole: str, at: float,
                      weights: dict[str, float], frequency: list[float], burst: float, shortest_day: float,
                      diversity: int, consolidation: int, recency_half_life: float, constant: float, top: int,
                      gates: tuple[int, int, float]) -> tuple[int, list[tuple[str, float, bool]]]:
    """(how many valid, unpromoted memories have recalls of `origins`, and (memory_id, bound,
    may pass) of those whose bound is among the `top` best or whose raw counts and bound can
    pass `gates` = (min recalls, min queries, min score)), best bound first.

    The bound is promotion's score ceiling from the recall aggregates (dream/promote.py
    ranked_top says why each term is one), computed here so 63k recalled memories are
    ranked without one Python object each: `frequency[r]` is the frequency signal of r
    counted recalls (the last value for more), recency is bounded by 1 / (1 + ln 2 · age / half-life)
    (above 0.5 ** (age / half-life)), and `constant` adds the terms no aggregate bounds.
    `least` and `greatest` name the backend's functions of two values, `whole` the integer
    part of a non-negative number ({} its argument).
    """
    marks = ",".join("?" * len(origins))
    cases = " ".join(f"WHEN {r} THEN {value!r}" for r, value in enumerate(frequency[:-1]))
    lo, hi = least, greatest
    bound = (f"{weights['relevance']!r} * {hi}(0.0, {lo}(1.0, coalesce(best, 0.0)))"
             f" + {weights['frequency']!r} * (CASE r {cases} ELSE {frequency[-1]!r} END)"
             f" + {weights['query_diversity']!r} * {lo}(1.0, {lo}(q, r) / {float(diversity)!r})"
             f" + {weights['recency']!r} / (1.0 + {hi}(0.0, (? - last) / 86400.0) * 0.6931471805599453 / {recency_half_life!r})"
             f" + {weights['consolidation']!r} * {lo}(1.0, {hi}(0, d - 1) / {float(consolidation - 1)!r})"
             f" + {constant!r}")
    days = whole.format(f"(last - first) / {shortest_day!r}")
    bursts = whole.format(f"(last - first) / {burst!r}")
    sql = (
        f"WITH agg AS MATERIALIZED (SELECT memory_id, n, q, best, last, r,"
        f"   CASE WHEN last = first THEN 1 ELSE {lo}(r, {days} + 2) END AS d"
        f" FROM (SELECT memory_id, n, q, best, first, last,"
        f"         {lo}(n, {bursts} + 1) AS r"
        f"       FROM (SELECT r.memory_id, COUNT(*) AS n, COUNT(DISTINCT r.query_hash) AS q, MAX(r.score) AS best,"
        f"             MIN(r.created_at) AS first, MAX(r.created_at) AS last"
        f"             FROM recall_event r WHERE r.origin IN ({marks}) GROUP BY r.memory_id) g"
        # The few invalidated or promoted ones set aside, not a join reading the row of
        # every recalled memory (half the query's time at 100k).
        f"       WHERE g.memory_id NOT IN (SELECT id FROM memory"
        f"                                 WHERE invalidated_at IS NOT NULL OR promoted_at IS NOT NULL))),"
        f" bounded AS MATERIALIZED (SELECT memory_id, n, q, {bound} AS bound FROM agg)"
        f" SELECT memory_id, bound, (n >= ? AND q >= ? AND bound >= ?) AS may_pass, (SELECT COUNT(*) FROM bounded)"
        f" FROM bounded WHERE memory_id IN (SELECT memory_id FROM bounded ORDER BY bound DESC, memory_id LIMIT ?)"
        f" OR (n >= ? AND q >= ? AND bound >= ?) ORDER BY bound DESC, memory_id")
    rows = db.execute_sql(sql, [*origins, at, *gates, top, *gates]).fetchall()
    total = rows[0][3] if rows else 0
    return total, [(memory_id, float(b), bool(may)) for memory_id, b, may, _ in rows]


def promotion_generation(db) -> str | None:
    """A value that changes whenever a write may move a promotion bound (a recall added,
    changed or removed; a memory invalidated, promoted or deleted: triggers of
    0019_viewer_indexes bump it), so `recall_bounds` read at one value holds while it is
    unchanged. Read it before the bounds: a write in between then only costs a re-read."""
    row = db.execute_sql("SELECT value FROM setting WHERE key = 'promotion_generation'").fetchone()
    return row[0] if row else None


def recall_counts_outside(db, origins: tuple[str, ...], memory_ids: list[str]) -> dict[str, int]:
    """memory_id → its recalls of any origin but `origins`, for `memory_ids`."""
    marks = ",".join("?" * len(origins))
    rows = db.execute_sql(f"SELECT memory_id, COUNT(*) FROM recall_event WHERE origin NOT IN ({marks}) "
                          f"AND memory_id IN ({','.join('?' * len(memory_ids))}) GROUP BY memory_id",
                          [*origins, *memory_ids]).fetchall()
    return dict(rows)


def valid_type_counts(db) -> list[tuple[str, int]]:
    """(type, count) of the valid memories, by type."""
    return db.execute_sql("SELECT type, COUNT(*) FROM memory WHERE invalidated_at IS NULL "
                          "GROUP BY type ORDER BY type").fetchall()


def newest_valid_contents(db, since: float, limit: int) -> list[tuple[str, str]]:
    """(id, content) of at most `limit` valid memories created since `since`, newest first."""
    return db.execute_sql("SELECT id, content FROM memory WHERE invalidated_at IS NULL AND created_at >= ? "
                          "ORDER BY created_at DESC LIMIT ?", (since, limit)).fetchall()


def contents_of(db, memory_ids: list[str]) -> list[str]:
    """The content of each memory in `memory_ids` (in no particular order)."""
    marks = ", ".join("?" * len(memory_ids))
    return [c for (c,) in db.execute_sql(f"SELECT content FROM memory WHERE id IN ({marks})", memory_ids)]


def valid_assessments_since(db, since: float) -> list[tuple]:
    """(id, content, metadata text, created_at, project, session_id) of the valid
    self_assessments created since `since`, oldest first."""
    return db.execute_sql(
        "SELECT id, content, metadata, created_at, project, session_id FROM memory "
        "WHERE type = 'self_assessment' AND invalidated_at IS NULL AND created_at >= ? ORDER BY created_at",
        (since,)).fetchall()


@per_backend
def insight_procedure_rows(db) -> list[tuple]:
    """(id, metadata text, created_at) of the valid procedures that carry an `insight_key`."""
    return db.execute_sql(
        "SELECT id, metadata, created_at FROM memory WHERE type = 'procedure' AND invalidated_at IS NULL "
        "AND json_extract(metadata, '$.insight_key') IS NOT NULL").fetchall()


@per_backend
def procedure_use_rows(db) -> list[tuple]:
    """(id, access_count, created_at, metadata's stale_procedure) of the valid procedures."""
    return db.execute_sql(
        "SELECT id, access_count, created_at, json_extract(metadata, '$.stale_procedure') FROM memory "
        "WHERE type = 'procedure' AND invalidated_at IS NULL").fetchall()


@per_backend
def decay_rows(db, *, except_source: str | None = None):
    """A cursor over (id, type, confidence, accessed_at, created_at, access_count, the
    metadata's decayed_at, boosted_at_count, stale_procedure, and seq) of the valid,
    unpromoted memories (but those of `except_source`): read it in chunks (fetchmany), 1M of
    these rows at once held ~350 MB."""
    return db.execute_sql(
        "SELECT id, type, confidence, accessed_at, created_at, access_count, "
        "json_extract(metadata, '$.decayed_at'), json_extract(metadata, '$.boosted_at_count'), "
        "json_extract(metadata, '$.stale_procedure'), seq "
        "FROM memory WHERE invalidated_at IS NULL AND promoted_at IS NULL AND source IS NOT ?",
        (except_source,))


# The memory columns an undo restores: everything but the keys.
# The author is the database's to say (db/visibility.py), never restored or copied.
MEMORY_ROW_FIELDS = tuple(f.name for f in Memory._meta.sorted_fields if f.name not in ("seq", "id", "author"))
_MEMORY_ROW_SQL = ", ".join(f'"{Memory._meta.fields[name].column_name}"' for name in MEMORY_ROW_FIELDS)


def memory_row(db, memory_id: str) -> tuple | None:
    """The stored values of MEMORY_ROW_FIELDS of one memory (metadata as its JSON text), or None.

    Raw SQL: the journal reads this once per action (100k times on a big night), and a
    peewee .get() costs ~30× more than the query itself.
    """
    return db.execute_sql(f"SELECT {_MEMORY_ROW_SQL} FROM memory WHERE id = ?", (memory_id,)).fetchone()


def memory_snapshot(db, memory_id: str) -> dict[str, Any] | None:
    """The memory's row as stored, metadata decoded (a journal's before- and after-images), or None."""
    import json

    row = memory_row(db, memory_id)
    if row is None:
        return None
    snapshot = dict(zip(MEMORY_ROW_FIELDS, row, strict=True))
    snapshot["metadata"] = json.loads(snapshot["metadata"] or "{}")
    return snapshot


def write_memory_columns(db, memory_id: str, values: dict[str, Any]) -> int:
    """Set columns of one memory from plain values (field name → value); return 1, or 0 when
    the memory is gone.

    Raw SQL: a big dream night writes ~100k rows, and a peewee save costs ~30× more.
    Every write bumps `version` (a restored before-image never puts an old one back, so a
    form loaded before the write is still seen as stale).
    """
    fields = Memory._meta.fields
    values = {name: value for name, value in values.items() if name != "version"}
    assignments = ", ".join([f'"{fields[name].column_name}" = ?' for name in values] + ['"version" = "version" + 1'])
    params = [fields[name].db_value(value) for name, value in values.items()]
    cursor = db.cursor()
    cursor.execute(f"UPDATE memory SET {assignments} WHERE id = ?", (*params, memory_id))
    return cursor.rowcount


def insert_memory_rows(db, rows: list[dict[str, Any]]) -> None:
    """Insert memory rows (field name → value, every row the same fields) in one executemany.

    Raw SQL: a 10,000-turn session makes ~20,000 episodes, and peewee's insert_many spends
    ~0.15 ms building SQL per row.

    Many rows go through a staging table on SQLite (insert_staged): the FTS5 trigger's cost.
    """
    if not rows:
        return
    fields = Memory._meta.fields
    names = list(rows[0])
    # Only the JSON columns need their field's conversion: text and numbers go to the driver
    # as they are (the column's affinity stores them as peewee's adapt would), and calling
    # db_value for each of ~20 columns of each row cost a third of an import's own work.
    converted = [(i, fields[name].db_value) for i, name in enumerate(names) if isinstance(fields[name], JSONText)]
    values = []
    for row in rows:
        value = [row[name] for name in names]
        for i, convert in converted:
            value[i] = convert(value[i])
        values.append(value)
    insert_memory_values(db, names, values)


def insert_memory_values(db, names: list[str], values: list) -> None:
    """Insert memory rows given as the stored values of the fields `names` (JSON as text), in
    one executemany (staged on SQLite: insert_staged)."""
    fields = Memory._meta.fields
    columns = ", ".join(f'"{fields[name].column_name}"' for name in names)
    insert_staged(db, "memory", columns, ", ".join("?" * len(names)), values)


# From this many rows on, a SQLite insert goes through a staging table (see insert_staged).
STAGED_ROWS = 64


@per_backend
def insert_staged(db, table: str, columns: str, marks: str, values: list, on_conflict: str = "") -> None:
    """INSERT the rows `values` (each a sequence matching `columns`) into `table`, with an
    optional `ON CONFLICT …` clause, as one executemany would.

    On SQLite, from STAGED_ROWS rows on, they go into a temporary table first and then into
    `table` in one INSERT … SELECT: each statement of an executemany is a savepoint, with a
    statement journal for the table's triggers, at which FTS5 also writes its pending terms out
    as a new segment. One statement per row made a segment per memory row, about as much work
    as the rest of the insert (100k memories: 6.4 → 3.9 s of CPU; 100k embedding rows, whose
    trigger logs each change: 1.05 → 0.73 s). The staging table has no column types, so the
    target's own affinities apply as in a direct insert, and the rows keep their order (a
    memory's `seq`).
    """
    if len(values) < STAGED_ROWS:
        db.cursor().executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks}) {on_conflict}", values)
        return
    cursor = db.cursor()
    cursor.execute("DROP TABLE IF EXISTS temp.rows_staged")
    cursor.execute(f"CREATE TEMP TABLE rows_staged ({columns})")
    try:
        cursor.executemany(f"INSERT INTO temp.rows_staged ({columns}) VALUES ({marks})", values)
        # WHERE true: without it SQLite would read ON CONFLICT as the SELECT's join constraint.
        cursor.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM temp.rows_staged "
                       f"WHERE true ORDER BY rowid {on_conflict}")
    finally:
        cursor.execute("DROP TABLE temp.rows_staged")


def session_cursor_values(db, adapter: str, session_id: str, columns: tuple[str, ...]) -> tuple | None:
    """The values of `columns` (from a fixed list) of one session's cursor row, or None."""
    return db.execute_sql(f"SELECT {', '.join(columns)} FROM session_cursor WHERE adapter = ? AND session_id = ?",
                          (adapter, session_id)).fetchone()


def recall_counts_by_origin(db) -> list[tuple[str, int, int]]:
    """(origin, results recalled, distinct queries) for each recall origin."""
    return db.execute_sql(
        "SELECT origin, COUNT(*), COUNT(DISTINCT query_hash) FROM recall_event GROUP BY origin").fetchall()


@per_backend
def probe_write(db) -> None:
    """Take the write lock and write a temporary table: raises when the store is not writable."""
    with db.atomic():
        db.execute_sql("CREATE TEMP TABLE IF NOT EXISTS doctor_probe(x)")


# ---- reading a damaged store (export's rescue) ----------------------------------------------

_ALL_MEMORY_COLUMNS = tuple(f.column_name for f in Memory._meta.sorted_fields)


def _probe_seqs(conn) -> int:
    """The highest memory seq that can be found: max() walks the right edge of the table's
    b-tree; when a page on that path is damaged, what a scan from either end reads first."""
    try:
        return conn.execute("SELECT max(seq) FROM memory").fetchone()[0] or 0
    except Exception:  # the driver's error family: a damaged page
        pass
    top = 0
    for order in ("ASC", "DESC"):
        try:
            for (seq,) in conn.execute(f"SELECT seq FROM memory ORDER BY seq {order}"):
                top = max(top, seq)
        except Exception:
            continue
    return top


def readable_memory_rows(db):
    """Every memory row that can still be read, one rowid lookup each, so a damaged page
    costs only the rows on it: yields (seq, {column: value} or None when unreadable, how
    many of its text columns held bytes that are not UTF-8, decoded with U+FFFD)."""
    conn = db.connection()
    top = _probe_seqs(conn)
    sql = f"SELECT {', '.join(_ALL_MEMORY_COLUMNS)} FROM memory WHERE seq = ?"
    saved_factory = conn.text_factory
    conn.text_factory = bytes  # an undecodable column must not end the whole read
    try:
        for seq in range(1, top + 1):
            try:
                row = conn.execute(sql, (seq,)).fetchone()
            except Exception:
                yield seq, None, 0
                continue
            if row is None:
                continue  # deleted long ago: no row to save
            values, bad = {}, 0
            for column, value in zip(_ALL_MEMORY_COLUMNS, row, strict=True):
                if isinstance(value, bytes) and Memory._meta.columns[column].field_type != "BLOB":
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        value, bad = value.decode("utf-8", errors="replace"), bad + 1
                values[column] = value
            yield seq, values, bad
    finally:
        conn.text_factory = saved_factory


def readable_relation_rows(db) -> tuple[list[tuple[str, str, str, float]], int]:
    """(source_id, target_id, type, created_at) of every relation that can be read, and how
    many rowids could not be."""
    conn = db.connection()
    rows, lost = [], 0
    try:
        top = conn.execute("SELECT max(id) FROM relation").fetchone()[0] or 0
    except Exception:
        return [], 1
    for rowid in range(1, top + 1):
        try:
            row = conn.execute("SELECT source_id, target_id, type, created_at FROM relation WHERE id = ?",
                               (rowid,)).fetchone()
        except Exception:
            lost += 1
            continue
        if row is not None:
            rows.append(row)
    return rows, lost


# ---- what the search rerank reads (search.py) ---------------------------------------------

# The columns of `candidate_rows`: what the rerank scores a candidate by, and `passes`.
CANDIDATE_COLUMNS = ("seq", "id", "type", "confidence", "created_at", "source", "content", "summary", "hints",
                     "passes")
_CANDIDATE_TEXTS = ("content", "summary", "hints")  # the last before `passes`, in CANDIDATE_COLUMNS


def candidate_rows(db, seqs: list[int], where: str, params: list) -> list[tuple]:
    """(CANDIDATE_COLUMNS) of each memory of `seqs`, in no particular order; `passes` is 1
    when it passes a `memory_filter` condition `where` (over `memory m`), else 0 (and its
    texts are None).

    One statement for the rerank's columns and the vector candidates' filter check (two
    before). Only these columns: the results' whole rows are read for the few returned
    (`memory_rows`), as building 25 Python values for each of ~100 candidates cost 0.4 ms.
    """
    if not seqs:
        return []
    marks = ",".join("?" * len(seqs))
    condition = "1 = 1" if where == "1" else where
    columns = ", ".join(f"m.{c} AS {c}" for c in CANDIDATE_COLUMNS[:-1])
    # The texts only of the memories that pass: a selective filter reads hundreds of vector
    # candidates to keep a few (a 1-in-50 project: 800 on PostgreSQL), and only those are scored.
    texts = ", ".join(f"CASE WHEN passes = 1 THEN {c} END" for c in _CANDIDATE_TEXTS)
    plain = ", ".join(c for c in CANDIDATE_COLUMNS[:-1] if c not in _CANDIDATE_TEXTS)
    rows = db.execute_sql(f"SELECT {plain}, {texts}, passes FROM (SELECT {columns}, "
                          f"CASE WHEN {condition} THEN 1 ELSE 0 END AS passes FROM memory m "
                          f"WHERE m.seq IN ({marks})) c", [*params, *seqs]).fetchall()
    # The CASE is an expression, which the column's PACKED_TEXT conversion does not reach: an
    # episode's deflated content is unpacked here (db/packed_text.py).
    at = len(CANDIDATE_COLUMNS) - 1 - len(_CANDIDATE_TEXTS)
    return [row if not isinstance(row[at], bytes) else (*row[:at], unpack(row[at]), *row[at + 1:])
            for row in rows]


def rank_signals(db, memory_ids: list[str], origins: tuple[str, ...]) -> tuple[dict[str, int], dict[str, str]]:
    """({memory id: how often it was in the top three of a recall of `origins`}, {memory id:
    the id of the newest valid memory that supersedes it}) for `memory_ids`, in one statement
    (chosen_recalls and superseded_by, which say why each is read so)."""
    if not memory_ids:
        return {}, {}
    marks, omarks = ",".join("?" * len(memory_ids)), ",".join("?" * len(origins))
    rows = db.execute_sql(
        f"SELECT r.memory_id, count(*), NULL, 0 FROM recall_event r WHERE r.memory_id IN ({marks}) "
        f"AND r.origin IN ({omarks}) AND r.rank <= 3 GROUP BY r.memory_id "
        "UNION ALL "
        "SELECT r.target_id, NULL, r.source_id, r.created_at FROM relation r WHERE r.type = 'supersedes' "
        f"AND r.target_id IN ({marks}) AND EXISTS (SELECT 1 FROM memory s "
        "WHERE s.id = r.source_id AND s.invalidated_at IS NULL) ORDER BY 4",
        [*memory_ids, *origins, *memory_ids]).fetchall()
    uses = {memory_id: int(count) for memory_id, count, successor, _ in rows if successor is None}
    successors = {memory_id: successor for memory_id, _, successor, _ in rows if successor is not None}
    return uses, successors


def memory_rows(db, seqs: list[int]) -> list[tuple]:
    """Every column of each memory of `seqs` (in declaration order: `memories_from_rows`)."""
    if not seqs:
        return []
    marks = ",".join("?" * len(seqs))
    columns = ", ".join(_ALL_MEMORY_COLUMNS)
    return db.execute_sql(f"SELECT {columns} FROM memory WHERE seq IN ({marks})", seqs).fetchall()


def memories_from_rows(model, rows: list[tuple]) -> list:
    """Instances of `model` (a store's bound Memory) from `memory_rows`, converted as peewee
    converts a select's values, without building a query (1 ms a search in peewee's query
    builder)."""
    converters = [(f.name, f.python_value) for f in model._meta.sorted_fields]
    out = []
    for row in rows:
        memory = model(__no_default__=1)  # no defaults, nothing dirty: as a select's instance
        # Every field set at once (a memory has no foreign key, whose setter would do more).
        memory.__data__ = {name: convert(value) for (name, convert), value in zip(converters, row, strict=True)}
        out.append(memory)
    return out


def ranking_rows(db, seqs: list[int]) -> list[tuple]:
    """(seq, id, type, confidence, created_at, source, project, content, summary, hints) of
    each memory in `seqs`: what the rerank scores a candidate by, without loading the model."""
    marks = ",".join("?" * len(seqs))
    return db.execute_sql("SELECT seq, id, type, confidence, created_at, source, project, content, "
                          f"summary, hints FROM memory WHERE seq IN ({marks})", seqs).fetchall()


def chosen_recalls(db, memory_ids: list[str], origins: tuple[str, ...]) -> dict[str, int]:
    """How often each memory was in the top three of a recall someone asked for (`origins`):
    automatic context injections and the dream's re-surfacing do not count as use."""
    if not memory_ids:
        return {}
    marks, omarks = ",".join("?" * len(memory_ids)), ",".join("?" * len(origins))
    rows = db.execute_sql(f"SELECT memory_id, count(*) FROM recall_event WHERE memory_id IN ({marks}) "
                          f"AND origin IN ({omarks}) AND rank <= 3 GROUP BY memory_id", [*memory_ids, *origins])
    return {memory_id: int(count) for memory_id, count in rows}


def superseded_by(db, memory_ids: list[str]) -> dict[str, str]:
    """{memory id: id of the valid memory that supersedes it} for those of `memory_ids` replaced."""
    if not memory_ids:
        return {}
    marks = ",".join("?" * len(memory_ids))
    # From the relation side (its target index), then each source by id: joined the other way
    # round, SQLite scanned every memory (~290 ms at 100k).
    rows = db.execute_sql("SELECT r.target_id, r.source_id FROM relation r WHERE r.type = 'supersedes' "
                          f"AND r.target_id IN ({marks}) AND EXISTS (SELECT 1 FROM memory s "
                          "WHERE s.id = r.source_id AND s.invalidated_at IS NULL) ORDER BY r.created_at", memory_ids)
    return {target: source for target, source in rows}


def next_turns(db, seqs: list[int], where: str, params: list) -> dict[int, int]:
    """{seq: the seq of the next turn of its conversation}: for each conversation memory of
    `seqs` that has a session, the first later memory of that session and type passing `where`
    (over `memory m`), if any."""
    if not seqs:
        return {}
    marks = ",".join("?" * len(seqs))
    rows = db.execute_sql(
        f"SELECT q.seq, (SELECT m.seq FROM memory m WHERE m.session_id = q.session_id AND m.seq > q.seq "
        f"AND m.type = q.type AND {where} ORDER BY m.seq LIMIT 1) FROM memory q "
        f"WHERE q.seq IN ({marks}) AND q.session_id IS NOT NULL", [*params, *seqs]).fetchall()
    return {int(seq): int(reply) for seq, reply in rows if reply is not None}
