"""db/queries.py's functions whose SQL differs on Postgres.

JSON metadata is a text column on both backends; here it is read as jsonb. A value read with
`->` comes back as the Python value psycopg loads from jsonb (a JSON null as None), as
SQLite's json_extract gives it, with one difference the callers do not see: a JSON true is
True here and 1 there.
"""

from __future__ import annotations

import json
from typing import Any

import peewee as pw


def _json_path(key: str) -> pw.Node:
    return pw.NodeList((pw.SQL("CAST("), pw.Value("{" + ",".join(key.split(".")) + "}"), pw.SQL(" AS text[])")),
                       glue="")


def _json_at(field: pw.Field, key: str) -> pw.Node:
    """`key` (a dotted path) of a JSON text column, as jsonb; SQL NULL when missing."""
    return pw.NodeList((pw.SQL("(CAST("), field, pw.SQL(" AS jsonb) #> "), _json_path(key), pw.SQL(")")), glue="")


def metadata_equals(field: pw.Field, key: str, value: Any) -> pw.Node:
    return pw.NodeList((_json_at(field, key), pw.SQL(" = CAST("), pw.Value(json.dumps(value)), pw.SQL(" AS jsonb)")),
                       glue="")


def metadata_flag_off(field: pw.Field, key: str) -> pw.Node:
    return pw.NodeList((pw.SQL("COALESCE("), _json_at(field, key),
                        pw.SQL(" IN ('null'::jsonb, 'false'::jsonb, '0'::jsonb), TRUE)")), glue="")


# From this many rows on, an insert with no ON CONFLICT (which COPY cannot do) is one COPY.
COPY_ROWS = 64


def insert_staged(db, table: str, columns: str, marks: str, values: list, on_conflict: str = "") -> None:
    """No FTS5 segment per statement to avoid here (db/queries.py stages the rows on SQLite),
    but an executemany is still one INSERT per row, each firing the table's statement-level
    triggers (memory_totals' change row, migration pg0011) and parsed apart: many rows go in by
    one COPY (text format: each value is read by its column's type, as a bound one is cast)."""
    if on_conflict or len(values) < COPY_ROWS:
        db.cursor().executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks}) {on_conflict}", values)
        return
    with db.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for row in values:
            copy.write_row(row)


def seqs_passing(db, seqs: list[int], where: str, params: list) -> set[int]:
    if not seqs:
        return set()
    marks = ",".join("?" * len(seqs))
    condition = "TRUE" if where == "1" else where
    rows = db.execute_sql(f"SELECT m.seq FROM memory m WHERE m.seq IN ({marks}) AND {condition}", [*seqs, *params])
    return {r[0] for r in rows}


def probe_write(db) -> None:
    with db.atomic():
        db.execute_sql("CREATE TEMP TABLE IF NOT EXISTS doctor_probe(x integer)")


def insight_procedure_rows(db) -> list[tuple]:
    return db.execute_sql(
        "SELECT id, metadata, created_at FROM memory WHERE type = 'procedure' AND invalidated_at IS NULL "
        "AND CAST(metadata AS jsonb) ->> 'insight_key' IS NOT NULL").fetchall()


def procedure_use_rows(db) -> list[tuple]:
    return db.execute_sql(
        "SELECT id, access_count, created_at, CAST(metadata AS jsonb) -> 'stale_procedure' FROM memory "
        "WHERE type = 'procedure' AND invalidated_at IS NULL").fetchall()


def shared_content_rows(db) -> list[tuple]:
    # SQLite's text less its planner hints (unary +), which Postgres's planner does not need.
    return db.execute_sql(
        "SELECT content_hash, project, id FROM memory WHERE invalidated_at IS NULL AND content_hash IN ("
        " SELECT content_hash FROM memory WHERE invalidated_at IS NULL"
        " GROUP BY content_hash, project HAVING COUNT(*) > 1)"
        " ORDER BY content_hash, project, created_at, seq").fetchall()


def decay_rows(db, *, except_source: str | None = None):
    return db.execute_sql(
        "SELECT id, type, confidence, accessed_at, created_at, access_count, "
        "m.meta -> 'decayed_at', m.meta -> 'boosted_at_count', m.meta -> 'stale_procedure', seq "
        "FROM (SELECT *, CAST(metadata AS jsonb) AS meta FROM memory) m "
        "WHERE invalidated_at IS NULL AND promoted_at IS NULL AND source IS DISTINCT FROM ?",
        (except_source,))


def recall_bounds(db, origins: tuple[str, ...], **terms) -> tuple[int, list[tuple[str, float, bool]]]:
    # LEAST and GREATEST are Postgres's min and max of values; its CAST rounds, so the
    # integer part is floor's (the numbers are never negative).
    from ..queries import bounds_of_recalls

    return bounds_of_recalls(db, origins, least="LEAST", greatest="GREATEST", whole="CAST(floor({}) AS INTEGER)",
                             **terms)
