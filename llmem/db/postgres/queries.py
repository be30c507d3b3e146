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
