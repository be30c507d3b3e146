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
# The memory_totals change rows a role sees are summed into one per group past this many.
FOLD_AT = 200
# How many of the best bounds a ranking scores first (at least 4 × what it fetches).
FIRST_CONSIDERED = 200
# BM25's N and mean length from memory_totals (migration pg0011): the rows this role sees.
TOTALS_SQL = ("SELECT coalesce(sum(rows), 0)::float8 AS rows, "
              "greatest(sum(words)::float8 / nullif(sum(rows), 0), 1) AS avgdl, count(*) AS parts FROM memory_totals")


def memory_count(db) -> int:
    """How many memories this role can see (BM25's N), from their totals: a count(*) was a
    scan of every memory, on every search (~4 ms at 10k, ten times that at 100k)."""
    rows, _, parts = db.execute_sql(TOTALS_SQL).fetchone()
    if parts > FOLD_AT:
        _fold_totals(db)
    return int(rows)


def _fold_totals(db) -> None:
    """Sum the visible change rows into one per group. Two roles folding at once each take
    rows the other did not (DELETE … RETURNING takes each row once); a transaction that
    may not write leaves them for the next search."""
    import peewee

    try:
        with db.atomic():
            db.execute_sql(
                "WITH gone AS (DELETE FROM memory_totals RETURNING author, visibility, rows, words) "
                "INSERT INTO memory_totals(author, visibility, rows, words) "
                "SELECT author, visibility, sum(rows), sum(words) FROM gone GROUP BY 1, 2")
    except peewee.DatabaseError:
        pass


def expression_terms(expression: str) -> list[str]:
    """The terms of a `match_expression` result."""
    return [term.replace('""', '"') for term in _QUOTED.findall(expression)]


# term → its lexeme ('' for none), as the server's text configuration (fixed by the schema)
# stems it: a search asks for the same terms several times (common words, then the ranking).
_LEXEMES: dict[str, str] = {}
_LEXEMES_KEPT = 65536


def _lexemes(db, expression: str) -> list[str]:
    """The stemmed lexeme of each term of `expression`, in order (a repeat counts again, as a
    repeated phrase does in FTS5)."""
    terms = [t for t in expression_terms(expression) if t]
    unknown = list(dict.fromkeys(t for t in terms if t not in _LEXEMES))
    if unknown:
        rows = db.execute_sql(
            f"SELECT (SELECT lexeme FROM unnest(to_tsvector('{TEXT_CONFIG}'::regconfig, t.term)) LIMIT 1) "
            "FROM unnest(?::text[]) WITH ORDINALITY AS t(term, ord) ORDER BY t.ord", (unknown,)).fetchall()
        if len(_LEXEMES) > _LEXEMES_KEPT:
            _LEXEMES.clear()
        _LEXEMES.update((term, lexeme or "") for term, (lexeme,) in zip(unknown, rows, strict=True))
    return [_LEXEMES[t] for t in terms if _LEXEMES.get(t)]


def _tsquery(lexemes: list[str]) -> str:
    """The lexemes OR-ed as a tsquery literal (already stemmed: cast, not parsed again)."""
    return " | ".join("'" + lex.replace("\\", "\\\\").replace("'", "''") + "'" for lex in dict.fromkeys(lexemes))


def match_count(db, expression: str, limit: int) -> int:
    lexemes = _lexemes(db, expression)
    if not lexemes:
        return 0
    return db.execute_sql("SELECT count(*) FROM (SELECT 1 FROM memory WHERE search_text @@ ?::tsquery LIMIT ?) t",
                          (_tsquery(lexemes), limit)).fetchone()[0]


# frequent_words in two round trips, not one for the totals and one per word: the totals,
# then every word's count up to the threshold in one statement, a subquery per word with its
# tsquery and limit as parameters of its own (a plan made for those values: with the limit
# computed inside the statement, or the tsqueries read from an array, it was 7x slower).
_WORD_COUNT = "(SELECT count(*) FROM (SELECT 1 FROM memory WHERE search_text @@ ?::tsquery LIMIT ?) c)"


def frequent_words(db, words: list[str], *, share: float, min_docs: int) -> set[str]:
    total = memory_count(db)
    threshold = max(int(share * total), min_docs)
    if total <= threshold:
        return set()
    _lexemes(db, " OR ".join('"' + word.replace('"', '""') + '"' for word in words))
    stemmed = [(word, _LEXEMES[word]) for word in words if _LEXEMES.get(word)]  # no lexeme: matches nothing
    if not stemmed:
        return set()
    counts = db.execute_sql("SELECT " + ", ".join([_WORD_COUNT] * len(stemmed)),
                            [value for _, lexeme in stemmed for value in (_tsquery([lexeme]), threshold + 1)]).fetchone()
    return {word for (word, _), count in zip(stemmed, counts, strict=True) if count > threshold}


def recent_match_counts(db, expressions: list[str], window: int) -> tuple[int, list[int]]:
    floor = db.execute_sql("SELECT seq FROM memory ORDER BY seq DESC LIMIT 1 OFFSET ?", (window - 1,)).fetchone()
    above = floor[0] - 1 if floor else 0
    queries = [_tsquery(_lexemes(db, expression)) or None for expression in expressions]  # no lexeme: matches nothing
    counted = ", ".join(["(SELECT count(*) FROM memory WHERE seq > ? AND search_text @@ ?::tsquery)"] * len(queries))
    counts = db.execute_sql(f"SELECT (SELECT count(*) FROM memory WHERE seq > ?), {counted}",
                            [above, *(v for q in queries for v in (above, q))]).fetchone()
    return int(counts[0]), [int(c or 0) for c in counts[1:]]


def newest_matches(db, expression: str, fetch: int, where: str, params: list) -> list[int]:
    lexemes = _lexemes(db, expression)
    if not lexemes:
        return []
    condition = "TRUE" if where == "1" else where
    sql = (f"SELECT m.seq FROM memory m WHERE m.search_text @@ ?::tsquery AND {condition} "
           f"ORDER BY m.seq DESC LIMIT ?")
    return [int(seq) for (seq,) in db.execute_sql(sql, [_tsquery(lexemes), *params, fetch])]


def ranked_matches_bound(db) -> None:
    """None: ranked_matches scores only the matches whose bound can reach its top."""
    return None


def ranked_matches(db, expression: str, weights: tuple[float, ...], fetch: int,
                   where: str, params: list) -> list[tuple[int, float]]:
    """(seq, bm25) of the `fetch` best matches that pass `where`, best first, as FTS5 ranks
    them: the exact top `fetch` of all matches, `where` applied to those (as on SQLite).

    Scoring a match reads its tsvector's positions (an unnest of every lexeme): done for
    every match it was most of a search's time. So each match first gets a cheap bound, the
    most its bm25 could be — the IDFs of the query's lexemes it holds, times k1 + 1, which no
    term frequency or length reaches — and only the `considered` with the highest bounds are
    scored. When the `fetch`-th best score beats the bound of every match left out, no match
    left out could enter the top: the result is exact; otherwise more are considered.
    """
    lexemes = _lexemes(db, expression)
    if not lexemes:
        return []
    content, summary, hints = (float(w) for w in weights)
    condition = "TRUE" if where == "1" else where
    unique = list(dict.fromkeys(lexemes))
    # MATERIALIZED: each term's document count is taken once, not again for every match.
    sql = f"""
        WITH term AS MATERIALIZED (
            SELECT t.lexeme, (SELECT count(*) FROM memory WHERE search_text @@ t.lexeme::tsquery) AS hits
            FROM unnest(?::text[]) AS t(lexeme)),
        totals AS MATERIALIZED ({TOTALS_SQL}),
        idf AS MATERIALIZED (SELECT term.lexeme, term.lexeme::tsquery AS query,
                                    greatest(ln((totals.rows - term.hits + 0.5) / (term.hits + 0.5)), 1e-6) AS idf
                FROM term, totals),
        bound AS MATERIALIZED (
            SELECT m.seq, {K1 + 1} * (SELECT sum(idf.idf) FROM idf WHERE m.search_text @@ idf.query) AS ub,
                   row_number() OVER (ORDER BY {K1 + 1} * (SELECT sum(idf.idf) FROM idf WHERE m.search_text @@ idf.query) DESC, m.seq) AS place
            FROM memory m WHERE m.search_text @@ ?::tsquery),
        considered AS (SELECT seq FROM bound WHERE place <= ?),
        freq AS (
            SELECT m.seq, m.search_words, u.lexeme,
                   sum(CASE w WHEN 'A' THEN ?::float8 WHEN 'B' THEN ?::float8 WHEN 'C' THEN ?::float8 ELSE 0 END) AS f
            FROM considered c JOIN memory m ON m.seq = c.seq, unnest(m.search_text) AS u, unnest(u.weights) AS w
            WHERE u.lexeme = ANY(?::text[])
            GROUP BY m.seq, m.search_words, u.lexeme),
        scored AS (
            SELECT freq.seq, -sum(idf.idf * freq.f * {K1 + 1} / (freq.f + {K1} * (1 - {B} + {B} * freq.search_words / totals.avgdl))) AS score
            FROM freq JOIN idf ON idf.lexeme = freq.lexeme, totals
            GROUP BY freq.seq ORDER BY score, freq.seq LIMIT ?)
        SELECT f.seq, f.score, ({condition}) AS passes, (SELECT max(ub) FROM bound WHERE place > ?) AS left_out,
               (SELECT count(*) FROM bound WHERE ub >= (SELECT -score FROM scored ORDER BY score, seq OFFSET ? LIMIT 1)) AS needed
        FROM scored f JOIN memory m ON m.seq = f.seq
        ORDER BY f.score, f.seq"""
    considered = max(4 * fetch, FIRST_CONSIDERED)
    while True:
        rows = db.execute_sql(sql, [lexemes, _tsquery(lexemes), considered, content, summary, hints, unique,
                                    fetch, *params, considered, fetch - 1]).fetchall()
        left_out = rows[0][3] if rows else None
        # Scores are negated (lower is better): the fetch-th must be out of every left-out's reach.
        if left_out is None or (len(rows) >= fetch and -rows[fetch - 1][1] > left_out):
            return [(int(seq), float(score)) for seq, score, passes, _, _ in rows if passes]
        # Every match whose bound reaches the fetch-th score found so far: scoring them all
        # can only raise that score, so the next pass is the last.
        considered = max(int(rows[0][4] or 0) + 1, considered + 1) if len(rows) >= fetch else considered * 4


def document_frequencies(db, terms: list[str]) -> tuple[int, dict[str, int]]:
    """(memories, {term: memories holding it}); the terms are lexemes (`stem_words`). One
    round trip: the totals (memory_count's) beside the counts."""
    if not terms:
        return memory_count(db), {}
    rows = db.execute_sql(
        f"WITH totals AS MATERIALIZED ({TOTALS_SQL}) "
        "SELECT totals.rows, totals.parts, (SELECT count(*) FROM memory WHERE search_text @@ t.lexeme::tsquery) "
        "FROM unnest(?::text[]) WITH ORDINALITY AS t(lexeme, ord), totals ORDER BY t.ord",
        ([_tsquery([t]) for t in terms],)).fetchall()
    if rows[0][1] > FOLD_AT:
        _fold_totals(db)
    return int(rows[0][0]), dict(zip(terms, (int(count) for _, _, count in rows), strict=True))


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
