"""REM themes: the subjects many recent memories share, with the memories they came from.

A theme is a content word, so besides the search's English stop words (db/fts.STOPWORDS)
this drops the filler that memories of a coding agent are full of: who said it ("user"),
how ("decided", "prefers", "use"), answers and placeholders ("yes", "none", "n/a") and the
self_assessment's own field names and categories, which are structure rather than subject.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..capture.taxonomy import TAXONOMY
from ..db.queries import newest_valid_contents
from .text import NINE_FIELDS, distinct_terms, one_line

THEME_SAMPLE = 20_000  # recent memories read for themes
SOURCES_SHOWN = 3  # memories kept per theme, as ids and one-line excerpts
EXCERPT_CHARS = 90

FILLER = frozenset((
    "user", "users", "assistant", "agent", "model", "llm", "person", "team", "someone", "people", "yes",
    "none", "null", "nil", "true", "false", "okay", "n/a", "unknown", "tbd", "todo", "etc", "also",
    "always", "never", "sometimes", "often", "usually", "maybe", "really", "actually", "still", "already",
    "instead", "rather", "else", "ever", "even", "much", "many", "lot", "lots", "use", "uses", "used",
    "using", "want", "wants", "wanted", "need", "needs", "needed", "like", "likes", "liked", "prefer",
    "prefers", "preferred", "decide", "decides", "decided", "decision", "choose", "chose", "chosen",
    "pick", "picked", "make", "makes", "made", "making", "get", "gets", "got", "getting", "take", "takes",
    "took", "taken", "give", "gives", "gave", "put", "puts", "keep", "keeps", "kept", "let", "lets", "try",
    "tries", "tried", "say", "says", "said", "tell", "tells", "told", "ask", "asks", "asked", "think",
    "thinks", "thought", "know", "knows", "knew", "see", "sees", "saw", "seen", "look", "looks", "looked",
    "find", "finds", "found", "come", "comes", "came", "work", "works", "worked", "working", "run", "runs",
    "ran", "running", "goes", "went", "done", "does", "thing", "things", "stuff", "way", "ways", "time",
    "times", "one", "two", "three", "first", "last", "next", "new", "old", "good", "bad", "better", "best",
    "right", "wrong", "sure", "well", "able", "via", "per", "within", "without", "across", "around",
    "among", "upon", "whether", "though", "although", "however", "therefore", "thus", "since", "should",
    "must", "might", "may", "shall", "would", "could", "can", "cannot", "will", "here", "there", "where",
    "when", "which", "who", "whom", "whose", "what", "why", "how", "every", "each", "any", "some", "all",
    "both", "either", "neither", "other", "others", "another", "same", "different", "such", "own", "just",
    "only", "more", "most", "less", "least", "few", "several", "enough", "quite", "very", "too", "again",
    "once", "twice", "note", "notes", "noted", "remember", "remembered", "important", "please", "thanks",
    "fine",
))
NOT_THEMES = FILLER | frozenset(f.lower() for f in (*NINE_FIELDS, *TAXONOMY))


def theme_terms(text: str) -> set[str]:
    """The terms of a memory that can make a theme."""
    return {t for t in distinct_terms(text) if t not in NOT_THEMES and not t.isdigit()}


def themes(db, since: float, limit: int = 10) -> list[dict[str, Any]]:
    """The terms most recent memories share (in two memories at least), each with the ids and
    excerpts of the memories it came from."""
    # created_at, not updated_at: dream's own decays touch every idle memory's updated_at.
    rows = newest_valid_contents(db, since, THEME_SAMPLE)
    df: Counter[str] = Counter()
    sources: dict[str, list[dict[str, str]]] = {}
    for memory_id, content in rows:
        for term in theme_terms(content):
            df[term] += 1
            bucket = sources.setdefault(term, [])
            if len(bucket) < SOURCES_SHOWN:
                bucket.append({"id": memory_id, "text": one_line(content, EXCERPT_CHARS)})
    # Terms found in exactly the same memories are one subject: "postgres, migrations, alembic".
    groups: dict[tuple, list[str]] = {}
    for term in sorted((t for t, c in df.items() if c >= 2), key=lambda t: (-df[t], t)):
        groups.setdefault((df[term], tuple(s["id"] for s in sources[term])), []).append(term)
    out = []
    for (count, _ids), terms in list(groups.items())[:limit]:
        out.append({"term": ", ".join(terms[:4]), "terms": terms, "memories": count,
                    "examples": [s["id"] for s in sources[terms[0]]], "sources": sources[terms[0]]})
    return out
