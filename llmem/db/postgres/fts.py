"""Lexical search on Postgres: the memory's generated tsvector (`search_text`, GIN-indexed).

The callers pass the FTS5 expression db/fts.py `match_expression` builds (quoted terms, OR-ed);
its terms are read back from it and OR-ed in a tsquery, stemmed by the same 'english'
configuration that made the tsvector. ts_rank stands in for bm25, negated so that, as bm25,
lower is better.
"""

from __future__ import annotations

import re

_QUOTED = re.compile(r'"((?:[^"]|"")*)"')
# ts_rank's weights, in its order {D, C, B, A}: the tsvector's A, B, C are content,
# summary and hints (db/postgres/migrations.py), weighted as search.py's BM25_WEIGHTS.
_TSQUERY = "to_tsquery('english'::regconfig, ?)"


def expression_terms(expression: str) -> list[str]:
    """The terms of a `match_expression` result."""
    return [term.replace('""', '"') for term in _QUOTED.findall(expression)]


def _tsquery_text(expression: str) -> str | None:
    """A to_tsquery text OR-ing the terms: each is a run of letters and digits (fts.py's
    `_WORD`), so none holds tsquery syntax; quoted all the same."""
    terms = [t for t in expression_terms(expression) if t]
    if not terms:
        return None
    return " | ".join("'" + t.replace("'", "''").replace("\\", "\\\\") + "'" for t in terms)


def match_count(db, expression: str, limit: int) -> int:
    text = _tsquery_text(expression)
    if text is None:
        return 0
    return db.execute_sql(f"SELECT count(*) FROM (SELECT 1 FROM memory WHERE search_text @@ {_TSQUERY} "
                          "LIMIT ?) t", (text, limit)).fetchone()[0]


def ranked_matches(db, expression: str, weights: tuple[float, ...], fetch: int,
                   where: str, params: list) -> list[tuple[int, float]]:
    text = _tsquery_text(expression)
    if text is None:
        return []
    content, summary, hints = (float(w) for w in weights)
    rank_weights = "{" + ",".join(repr(w) for w in (0.0, hints, summary, content)) + "}"
    condition = "TRUE" if where == "1" else where
    sql = (f"SELECT f.seq, f.score FROM (SELECT seq, -ts_rank(?::float4[], search_text, {_TSQUERY}) AS score "
           f"FROM memory WHERE search_text @@ {_TSQUERY} ORDER BY score, seq LIMIT ?) f "
           f"JOIN memory m ON m.seq = f.seq WHERE {condition} ORDER BY f.score, f.seq")
    return [(int(seq), float(score)) for seq, score in
            db.execute_sql(sql, [rank_weights, text, text, fetch, *params])]
