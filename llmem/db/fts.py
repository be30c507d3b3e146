"""The FTS5 index over memories: identifier hints and safe MATCH expressions.

unicode61 already splits `handle_request` and `handler.py` at `_` and `.`; camelCase is one
token to it, so each memory also carries `hints`: the parts of its camelCase identifiers
(`correctFunction` → `correct function`) and its descriptive metadata (who said it, which
file), indexed in their own column.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

import Stemmer

from .backend import per_backend
from .space import reclaim_space

# A query is read up to this many characters (100 KB pasted by mistake costs nothing more).
MAX_QUERY_CHARS = 2000
# Tokens as FTS5's unicode61 sees them: runs of letters and digits.
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Boundaries inside an identifier: aB, ABc, a1, 1a.
_CAMEL_SPLIT = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")

# Words that carry no topic in a question; dropped from queries that have other words.
STOPWORDS = frozenset(["a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves"])


def identifier_hints(*texts: str | None) -> str:
    """Space-separated parts of the camelCase/PascalCase identifiers found in the texts."""
    parts: list[str] = []
    seen: set[str] = set()
    for text in texts:
        if not text:
            continue
        for word in _WORD.findall(text):
            if word.isalpha() and word.islower():
                continue  # no capital, no digit: no boundary to split at (and most words)
            pieces = _CAMEL_SPLIT.split(word)
            if len(pieces) < 2:
                continue
            for piece in pieces:
                low = piece.lower()
                if low not in seen:
                    seen.add(low)
                    parts.append(low)
    return " ".join(parts)


# Metadata that says what a memory is about (who said it, which file, which topic) is
# indexed with it; structural metadata (ids, adapters, scores, timestamps) is not.
DESCRIPTIVE_METADATA = ("speaker", "author", "title", "topic", "tags", "file", "files")
_DESCRIPTIVE_KEYS = frozenset(DESCRIPTIVE_METADATA)


def metadata_text(metadata: dict | None) -> str:
    """The descriptive metadata values of a memory, as one text."""
    if not isinstance(metadata, dict) or _DESCRIPTIVE_KEYS.isdisjoint(metadata):
        return ""  # most metadata holds none of them: every write asks this twice
    values: list[str] = []
    for key in DESCRIPTIVE_METADATA:
        value = metadata.get(key)
        if isinstance(value, str):
            values.append(value[:200])
        elif isinstance(value, list):
            values.extend(v[:200] for v in value[:20] if isinstance(v, str))
    return " ".join(values)


def index_hints(content: str, summary: str | None, metadata: dict | None) -> str:
    """The `hints` column: identifier parts of the text, plus its descriptive metadata."""
    return described_hints(content, summary, metadata_text(metadata))


def described_hints(content: str, summary: str | None, described: str) -> str:
    """index_hints, given the metadata's descriptive text (metadata_text)."""
    return " ".join(part for part in (identifier_hints(content, summary, described), described) if part)


# A query word that is an identifier, kept whole: it has a digit beside letters (E0502,
# ge0463z, v2.14.3), an inner `_`, `/` or `.` (TF_WORKSPACE_42, src/api/user.go), a leading
# `-`/`:` (--no-verify, :8443) or camelCase. Surrounding quotes and sentence punctuation go.
_ATOM_EDGES = "\"'`,;!?()[]{}<>"
_ATOM_SHAPE = re.compile(r"^(?:[-:]{1,2}[^\W_]|.*[^\W_][_/.:][^\W_]|.*[A-Za-z]\d|.*\d[A-Za-z]|.*[a-z][A-Z])", re.UNICODE)


def _kept_word(word: str) -> bool:
    """Single letters and short bare numbers never match alone (`e` of "e.g.", `s` of "let's",
    the `3` of `v2.14.3`); a number of three digits or more (a migration, a ticket) stays."""
    if word.isdigit():
        return len(word) >= 3
    return len(word) > 1 and word not in STOPWORDS


@dataclass(frozen=True)
class QueryTerms:
    """What a query searches for: identifiers as atoms (each a phrase of index tokens) and the
    plain words; an atom's parts come in only as weaker alternatives (`parts`)."""

    atoms: tuple[tuple[str, ...], ...]
    words: tuple[str, ...]
    parts: tuple[str, ...]
    spelled: tuple[str, ...] = ()  # each atom as written, lowercased (`--release`, `:8443`)

    def all_terms(self) -> list[str]:
        return list(dict.fromkeys([*self.words, *self.parts]))


def parse_query(text: str) -> QueryTerms:
    """The atoms, words and atom parts of a user query (MAX_QUERY_CHARS of it at most)."""
    text = text[:MAX_QUERY_CHARS]
    atoms: list[tuple[str, ...]] = []
    spelled: dict[tuple[str, ...], str] = {}
    words: list[str] = []
    parts: list[str] = []
    for raw in text.split():
        token = raw.strip(_ATOM_EDGES).rstrip(".")
        pieces = [w.lower() for w in _WORD.findall(token)]
        if not pieces:
            continue
        if _ATOM_SHAPE.match(token) and any(len(w) > 1 or w.isdigit() for w in pieces):
            atoms.append(tuple(pieces))
            spelled.setdefault(tuple(pieces), token.lower())
            camel = [c.lower() for w in _WORD.findall(token) for c in _CAMEL_SPLIT.split(w)]
            parts.extend(w for w in dict.fromkeys([*pieces, *camel]) if _kept_word(w))
            continue
        for word in _WORD.findall(token):
            words.append(word.lower())
            camel = _CAMEL_SPLIT.split(word)
            if len(camel) > 1:
                parts.extend(c.lower() for c in camel if _kept_word(c.lower()))
    words = [w for w in dict.fromkeys(words) if _kept_word(w)]
    parts = [w for w in dict.fromkeys(parts) if w not in words]
    unique = tuple(dict.fromkeys(atoms))
    return QueryTerms(unique, tuple(words), tuple(parts), tuple(spelled[a] for a in unique))


def query_terms(text: str) -> list[str]:
    """The single-word search terms of a user query: words and identifier parts."""
    parsed = parse_query(text)
    return [*[a[0] for a in parsed.atoms if len(a) == 1], *parsed.all_terms()]


def _quoted(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def match_expression(text: str) -> str | None:
    """A valid FTS5 MATCH expression for any user text (None when it has nothing to match).

    Each term is double-quoted, so FTS5 syntax in the text (quotes, -, *, :, parentheses,
    NEAR, AND/OR) is never interpreted; an identifier is one phrase (its tokens in order),
    its parts and the words are OR-ed beside it, and bm25 ranks memories that match more.
    """
    alternatives = match_alternatives(text)
    return " OR ".join(alternatives) if alternatives else None


def match_alternatives(text: str) -> list[str]:
    """The quoted terms `match_expression` OR-s together: identifiers whole, then every term."""
    parsed = parse_query(text)
    alternatives = [_quoted(" ".join(atom)) for atom in parsed.atoms] + [_quoted(t) for t in parsed.all_terms()]
    return list(dict.fromkeys(alternatives))


# bm25 gives a term in more than half of the memories no weight: FTS5 clamps an IDF below zero
# to 1e-6 (the PostgreSQL ranking copies it). Ranking every memory such a term matches cost
# 96 ms at 100k memories for one word in 86% of them, to order memories that all tie.
UNIVERSAL_SHARE = 0.5
# The share is read in the newest memories only, as many as this (0.2 ms for a word in most
# of them, at any size); below it the store is small enough to rank exactly.
UNIVERSAL_WINDOW = 4096
UNIVERSAL_MIN_MEMORIES = 2 * UNIVERSAL_WINDOW


def universal_terms(db, alternatives: list[str]) -> set[str]:
    """The `match_alternatives` in more than UNIVERSAL_SHARE of the newest memories (none in a
    store of fewer than UNIVERSAL_MIN_MEMORIES)."""
    if not alternatives or memory_count(db) < UNIVERSAL_MIN_MEMORIES:
        return set()
    window, counts = recent_match_counts(db, alternatives, UNIVERSAL_WINDOW)
    return {a for a, count in zip(alternatives, counts, strict=True) if count > UNIVERSAL_SHARE * window}


@per_backend
def recent_match_counts(db, expressions: list[str], window: int) -> tuple[int, list[int]]:
    """(memories among the newest `window`, how many of them each expression matches)."""
    floor = db.execute_sql("SELECT seq FROM memory ORDER BY seq DESC LIMIT 1 OFFSET ?", (window - 1,)).fetchone()
    above = floor[0] - 1 if floor else 0
    counted = ", ".join(["(SELECT count(*) FROM memory_fts WHERE memory_fts MATCH ? AND rowid > ?)"] * len(expressions))
    counts = db.execute_sql(f"SELECT (SELECT count(*) FROM memory WHERE seq > ?), {counted}",
                            [above, *(v for e in expressions for v in (e, above))]).fetchone()
    return int(counts[0]), [int(c) for c in counts[1:]]


@per_backend
def newest_matches(db, expression: str, fetch: int, where: str, params: list) -> list[int]:
    """The seqs of the `fetch` newest memories matching `expression` that pass `where`,
    unranked: the FTS index is read backwards and stops at `fetch`."""
    sql = (f"SELECT f.rowid FROM memory_fts f JOIN memory m ON m.seq = f.rowid "
           f"WHERE memory_fts MATCH ? AND {where} ORDER BY f.rowid DESC LIMIT ?")
    return [int(seq) for (seq,) in db.execute_sql(sql, [expression, *params, fetch])]


# A query's bm25 ranking scores about this many matches at most (Searcher._bounded_ranking):
# FTS5 scores every match (~1.3 µs each); a store of fewer memories ranks all of them.
RANKED_MATCHES = 8192


@per_backend
def ranked_matches_bound(db) -> int | None:
    """How many matches a search's keyword ranking may score at most, or None when
    `ranked_matches` bounds its own scoring (PostgreSQL's)."""
    return RANKED_MATCHES


def alternative_matches(db, alternatives: list[str], known: dict[str, int] | None = None) -> list[int]:
    """How many memories each of `match_alternatives` matches at most: the document frequency
    of its rarest token (an identifier's phrase is held by fewer), from the index's vocabulary.
    `known`: frequencies the caller read already (a term absent from the index at 0), so the
    vocabulary is read only for the others (at 1M memories each read cost ~1.5 ms)."""
    tokens = [stem_words(db, alternative[1:-1].replace('""', '"').split()) for alternative in alternatives]
    df = dict(known or {})
    unknown = sorted({t for stems in tokens for t in stems} - df.keys())
    if unknown:
        df.update(document_frequencies(db, unknown)[1])
    return [min((df.get(t, 0) for t in stems), default=0) for stems in tokens]


@per_backend
def document_frequencies(db, terms: list[str]) -> tuple[int, dict[str, int]]:
    """(memories in the index, {term: memories holding it}) from the FTS index's own vocabulary."""
    total = memory_count(db)
    if not terms:
        return total, {}
    conn = db.connection()
    if getattr(db._state, "llmem_vocabulary", None) is not conn:  # a temp table: one per connection
        db.execute_sql("CREATE VIRTUAL TABLE IF NOT EXISTS temp.memory_fts_terms USING fts5vocab(main, memory_fts, row)")
        db._state.llmem_vocabulary = conn
    marks = ",".join("?" * len(terms))
    rows = db.execute_sql(f"SELECT term, doc FROM temp.memory_fts_terms WHERE term IN ({marks})", terms)
    return total, {term: int(doc) for term, doc in rows}


# Every ASCII character that is not a letter or a digit, as a space: on ASCII text, `_WORD`'s
# tokens are the words split() finds after this translation (at two thirds of the regex's cost).
_ASCII_SEPARATORS = str.maketrans({chr(c): " " for c in range(128) if not chr(c).isalnum()})


def index_tokens(*texts: str | None) -> list[str]:
    """A memory's text as the index's tokens (lowercased runs of letters and digits)."""
    tokens: list[str] = []
    for text in texts:
        if not text:
            continue
        if text.isascii():  # lowercased whole, the same tokens at a fraction of the cost (a search ranks ~100)
            tokens += text.lower().translate(_ASCII_SEPARATORS).split()
        else:  # lowercasing may change what is a letter (`İ` → `i` + a combining dot): token by token
            tokens += [w.lower() for w in _WORD.findall(text)]
    return tokens


# FTS5's porter tokenizer leaves a token shorter than 3 or longer than 64 characters as it is.
_PORTER_LENGTHS = range(3, 65)
_PORTER = Stemmer.Stemmer("porter")


@functools.lru_cache(maxsize=65536)
def _porter_stem(word: str) -> str:
    if not word.isascii():  # remove_diacritics 2: `café` is indexed as `cafe`
        word = "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))
    return _PORTER.stemWord(word) if len(word) in _PORTER_LENGTHS else word


@per_backend
def stem_words(db, words: list[str]) -> list[str]:
    """Lowercased index tokens as the index stores them, so that a query's `linting` is found
    in a memory's `lint`. The store's FTS5 tokenizer is `porter unicode61 remove_diacritics 2`;
    PyStemmer's porter is the same algorithm (it differs on 6 of the 4,297 words of LoCoMo dev
    and the ranking set: `ecology`, `incredibly`, `psychology`, `trekked`), and short words
    are left alone as FTS5 leaves them."""
    return [_porter_stem(w) for w in words]


# The FTS5 index's leaf size (its `pgsz`, migration 0025): a leaf and the index's two small
# records fit one 4 KB page (a leaf of FTS5's default 4050 fills the page alone).
LEAF_BYTES = 4000
# A bulk write adding at least this share of the store's memories compacts the index after it.
BULK_SHARE = 0.25


@per_backend
def compact_after_bulk_add(db, added: int) -> bool:
    """After a bulk write (a backfill) that added `added` memories, a quarter of the store or
    more, merge the FTS index's segments into one and give the freed pages back; True when it
    did. Each transaction of the write left a small segment, each with its own term
    dictionary (~10% of the index on LoCoMo dev); merging rewrites the whole index, so a few
    memories added to a large store leave it to FTS5's own incremental merges."""
    total = db.execute_sql("SELECT count(*) FROM memory").fetchone()[0]
    if added <= 0 or added < BULK_SHARE * total:
        return False
    db.execute_sql("INSERT INTO memory_fts(memory_fts) VALUES ('optimize')")
    reclaim_space(db, share=0.0)
    return True


def counted_words(text: str) -> list[str]:
    """The words of `text` `common_words` asks about: lowercased, once each, no stopwords."""
    return [w for w in dict.fromkeys(w.lower() for w in _WORD.findall(text)) if w not in STOPWORDS]


def common_words(db, text: str, *, share: float, min_docs: int,
                 frequencies: tuple[int, dict[str, int]] | None = None) -> set[str]:
    """The words of `text` found in more than `share` of the memories (and in >= min_docs).

    Such a word (a speaker's name in a chat log, the project's own name) cannot tell
    memories apart. Counting stops at the threshold, so a check costs at most that many
    index rows per word; stopwords are never counted. `frequencies` (document_frequencies
    of the words' stems) answers without asking the index again: a search reads them once
    for this and for its ranking.
    """
    words = counted_words(text)
    if not words:
        return set()
    if frequencies is None:
        return frequent_words(db, words, share=share, min_docs=min_docs)
    total, counts = frequencies
    threshold = max(int(share * total), min_docs)
    if total <= threshold:
        return set()
    return {word for word, stem in zip(words, stem_words(db, words), strict=True) if counts.get(stem, 0) > threshold}


@per_backend
def frequent_words(db, words: list[str], *, share: float, min_docs: int) -> set[str]:
    """The words among `words` (lower case, no stopwords) in more than `share` of the memories
    and in >= min_docs (common_words)."""
    total = memory_count(db)
    threshold = max(int(share * total), min_docs)
    if total <= threshold:
        return set()
    return {word for word in words if match_count(db, _quoted(word), threshold + 1) > threshold}


@per_backend
def memory_count(db) -> int:
    """How many memories there are (BM25's N).

    A count(*) reads a whole index (0.3 ms at 100k, asked twice a search): it is kept on the
    connection and counted again only when the store changed since, by this connection
    (`total_changes`) or another (`PRAGMA data_version`)."""
    conn = db.connection()
    state = (conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes)
    kept = getattr(db._state, "llmem_memory_count", None)  # per thread, as the connection is
    if kept is not None and kept[0] is conn and kept[1] == state:
        return kept[2]
    total = db.execute_sql("SELECT count(*) FROM memory").fetchone()[0]
    db._state.llmem_memory_count = (conn, state, total)
    return total


@per_backend
def match_count(db, expression: str, limit: int) -> int:
    """How many memories match `expression`, counted up to `limit`."""
    return db.execute_sql("SELECT count(*) FROM (SELECT rowid FROM memory_fts WHERE memory_fts MATCH ? LIMIT ?)",
                          (expression, limit)).fetchone()[0]


@per_backend
def ranked_matches(db, expression: str, weights: tuple[float, ...], fetch: int,
                   where: str, params: list) -> list[tuple[int, float]]:
    """(seq, bm25) of the `fetch` best matches that pass `where`, best first (bm25 is negative).

    bm25 ranks inside the FTS table first and `where` (over `memory m`) joins afterwards, on
    the top rows only: joining every matching row to `memory` before ranking cost ~10 ms
    per query at 100k memories.
    """
    columns = ", ".join(str(w) for w in weights)
    sql = (f"SELECT f.seq, f.score FROM (SELECT rowid AS seq, bm25(memory_fts, {columns}) AS score "
           f"FROM memory_fts WHERE memory_fts MATCH ? ORDER BY score LIMIT ?) f "
           f"JOIN memory m ON m.seq = f.seq WHERE {where} ORDER BY f.score, f.seq")
    return [(int(seq), float(score)) for seq, score in db.execute_sql(sql, [expression, fetch, *params])]


def semantic_text(db, text: str, *, share: float = 0.10, min_docs: int = 20,
                  frequencies: tuple[int, dict[str, int]] | None = None) -> str:
    """The query to embed: `text` without the words most memories share.

    Embedding models weigh every word of a short query alike, so a word that is in a large
    part of the store (a name, above all) pulls the query towards every memory that
    mentions it and away from the topic; bm25 discounts such words by their IDF, the
    semantic query drops them. Stopwords stay (they carry the question's grammar), and a
    query with no other word left is kept whole.
    """
    common = common_words(db, text, share=share, min_docs=min_docs, frequencies=frequencies)
    if not common:
        return text
    tokens = _WORD.findall(text)
    kept = [t for t in tokens if t.lower() not in common]
    if all(t.lower() in STOPWORDS for t in kept):
        return text
    return " ".join(kept)
