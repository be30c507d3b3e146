"""db/queries.py's functions whose SQL differs on Postgres."""

from __future__ import annotations


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


def recall_bounds(db, origins: tuple[str, ...], **terms) -> tuple[int, list[tuple[str, float, bool]]]:
    # LEAST and GREATEST are Postgres's min and max of values; its CAST rounds, so the
    # integer part is floor's (the numbers are never negative).
    from ..queries import bounds_of_recalls

    return bounds_of_recalls(db, origins, least="LEAST", greatest="GREATEST", whole="CAST(floor({}) AS INTEGER)",
                             **terms)
