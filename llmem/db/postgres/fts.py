"""Lexical search on Postgres: BM25 over the memory's generated tsvector (`search_text`,
GIN-indexed) with FTS5's formula, so a ranking here is the SQLite store's ranking.

The callers pass the FTS5 expression db/fts.py `match_expression` builds (quoted terms, OR-ed);
its terms are read back from it and stemmed by the configuration that made the tsvectors
(db/postgres/migrations.py). The GIN index finds the matches; each is scored as FTS5's bm25()
scores it: per term, IDF · f·(k1+1) / (f + k1·(1 − b + b·|D|/avgdl)), f the term's
occurrences weighted by column, |D| the memory's length in words, IDF = ln((N − n + 0.5) /
(n + 0.5)) floored at 1e-6, negated so that lower is better. (ts_rank_cd, Postgres's own,
is not BM25: LoCoMo's BM25-only recall@5 was 0.04 lower with it.)
"""

from __future__ import annotations

import functools
import re

import Stemmer

from .migrations import TEXT_CONFIG

_QUOTED = re.compile(r'"((?:[^"]|"")*)"')
K1, B = 1.2, 0.75  # FTS5's bm25() constants


def expression_terms(expression: str) -> list[str]:
    """The terms of a `match_expression` result."""
    return [term.replace('""', '"') for term in _QUOTED.findall(expression)]


def _lexemes(db, expression: str) -> list[str]:
    """The stemmed lexeme of each term of `expression`, in order (a repeat counts again, as a
    repeated phrase does in FTS5)."""
    terms = [t for t in expression_terms(expression) if t]
    if not terms:
        return []
    rows = db.execute_sql(
        f"SELECT (SELECT lexeme FROM unnest(to_tsvector('{TEXT_CONFIG}'::regconfig, t.term)) LIMIT 1) "
        "FROM unnest(?::text[]) WITH ORDINALITY AS t(term, ord) ORDER BY t.ord", (terms,)).fetchall()
    return [lexeme for (lexeme,) in rows if lexeme]


def _tsquery(lexemes: list[str]) -> str:
    """The lexemes OR-ed as a tsquery literal (already stemmed: cast, not parsed again)."""
    return " | ".join("'" + lex.replace("\\", "\\\\").replace("'", "''") + "'" for lex in dict.fromkeys(lexemes))


def match_count(db, expression: str, limit: int) -> int:
    lexemes = _lexemes(db, expression)
    if not lexemes:
        return 0
    return db.execute_sql("SELECT count(*) FROM (SELECT 1 FROM memory WHERE search_text @@ ?::tsquery LIMIT ?) t",
                          (_tsquery(lexemes), limit)).fetchone()[0]


def ranked_matches(db, expression: str, weights: tuple[float, ...], fetch: int,
                   where: str, params: list) -> list[tuple[int, float]]:
    lexemes = _lexemes(db, expression)
    if not lexemes:
        return []
    content, summary, hints = (float(w) for w in weights)
    condition = "TRUE" if where == "1" else where
    # MATERIALIZED: each term's document count is taken once, not again for every match.
    sql = f"""
        WITH term AS MATERIALIZED (
            SELECT t.lexeme, (SELECT count(*) FROM memory WHERE search_text @@ t.lexeme::tsquery) AS hits
            FROM unnest(?::text[]) AS t(lexeme)),
        totals AS MATERIALIZED (SELECT count(*)::float8 AS rows, greatest(avg(search_words), 1)::float8 AS avgdl FROM memory),
        idf AS MATERIALIZED (SELECT term.lexeme, greatest(ln((totals.rows - term.hits + 0.5) / (term.hits + 0.5)), 1e-6) AS idf
                FROM term, totals),
        freq AS (
            SELECT m.seq, m.search_words, u.lexeme,
                   sum(CASE w WHEN 'A' THEN ?::float8 WHEN 'B' THEN ?::float8 WHEN 'C' THEN ?::float8 ELSE 0 END) AS f
            FROM memory m, unnest(m.search_text) AS u, unnest(u.weights) AS w
            WHERE m.search_text @@ ?::tsquery AND u.lexeme = ANY(?::text[])
            GROUP BY m.seq, m.search_words, u.lexeme),
        scored AS (
            SELECT freq.seq, -sum(idf.idf * freq.f * {K1 + 1} / (freq.f + {K1} * (1 - {B} + {B} * freq.search_words / totals.avgdl))) AS score
            FROM freq JOIN idf ON idf.lexeme = freq.lexeme, totals
            GROUP BY freq.seq ORDER BY score, freq.seq LIMIT ?)
        SELECT f.seq, f.score FROM scored f JOIN memory m ON m.seq = f.seq WHERE {condition}
        ORDER BY f.score, f.seq"""
    unique = list(dict.fromkeys(lexemes))
    return [(int(seq), float(score)) for seq, score in
            db.execute_sql(sql, [lexemes, content, summary, hints, _tsquery(lexemes), unique, fetch, *params])]


def document_frequencies(db, terms: list[str]) -> tuple[int, dict[str, int]]:
    """(memories, {term: memories holding it}); the terms are lexemes (`stem_words`)."""
    total = db.execute_sql("SELECT count(*) FROM memory").fetchone()[0]
    if not terms:
        return total, {}
    rows = db.execute_sql(
        "SELECT (SELECT count(*) FROM memory WHERE search_text @@ t.lexeme::tsquery) "
        "FROM unnest(?::text[]) WITH ORDINALITY AS t(lexeme, ord) ORDER BY t.ord",
        ([_tsquery([t]) for t in terms],)).fetchall()
    return total, dict(zip(terms, (int(count) for (count,) in rows), strict=True))


_ENGLISH = Stemmer.Stemmer("english")


@functools.lru_cache(maxsize=65536)
def _english_stem(word: str) -> str:
    return _ENGLISH.stemWord(word)


def stem_words(db, words: list[str]) -> list[str]:
    """Lowercased words as the tsvectors hold them: the snowball English stemmer of
    TEXT_CONFIG, which PyStemmer's `english` is."""
    return [_english_stem(w) for w in words]


def compact_after_bulk_add(db, added: int) -> bool:
    """Nothing to do: the GIN index takes a bulk write in place (its pending list is merged by
    the server's autovacuum)."""
    return False
