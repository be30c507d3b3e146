"""The per-row work of a bulk insert, made cheaper, computes what it did before: the dedupe
hash normalises whitespace as `\\s+` did, the metadata JSON is json.dumps's, and an imported
row stores the values a row added one by one stores."""

from __future__ import annotations

import json
import random
import re
import sys

import pytest

from llmem.db.derived import short_hash
from llmem.db.models import JSONText
from llmem.exchange import apply_import, export_data, plan_import
from llmem.store import Store, content_hash

WHITESPACE = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]


def regex_content_hash(content: str) -> str:
    """content_hash as it was written: runs of `\\s` in the stripped, lowered text → one space."""
    return short_hash(re.sub(r"\s+", " ", content.strip().lower()))


def test_the_dedupe_hash_normalises_every_whitespace_as_the_regex_did():
    rnd = random.Random(5)
    pieces = ["Deploy", "the", "RELEASE", "İstanbul", "ǅ", "ß", "x", "1", "", "é"]
    texts = [f"{space}a{space}B{space}" for space in WHITESPACE]  # each whitespace alone, everywhere
    texts += ["".join(rnd.choice(pieces + WHITESPACE) for _ in range(rnd.randint(0, 12))) for _ in range(3000)]
    for text in texts:
        assert content_hash(text) == regex_content_hash(text), repr(text)


@pytest.mark.parametrize("value", [{}, {"b": 1, "a": ["é", {"z": None, "y": 2.5}]}, [], [{}], "text", 3, None,
                                   {"speaker": "Zoë", "files": ["src/ü.py"]}])
def test_metadata_is_stored_as_json_dumps_writes_it(value):
    expected = None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)
    assert JSONText().db_value(value) == expected


def test_an_imported_row_stores_what_the_exported_one_held(store_url, tmp_path):
    source = Store.open(f"sqlite:///{tmp_path / 'source.db'}")
    source.add("the handleRequest parser of service 4 speaks gRPC", metadata={"speaker": "ana", "turn": 3},
               summary="parser notes", project="/work/p")
    source.add("a plain note without metadata", project=None)
    document = json.loads(json.dumps(export_data(source)))
    # (the times too, but an export writes them to the second)
    columns = "id, type, content, summary, hints, confidence, source, project, session_id, metadata, content_hash, " \
              "embed_hash, trust, visibility"
    expected = source.db.execute_sql(f"SELECT {columns} FROM memory ORDER BY id").fetchall()
    source.close()
    target = Store.open(store_url)
    plan = plan_import(target, document)
    apply_import(target, plan)
    got = [tuple(row) for row in target.db.execute_sql(f"SELECT {columns} FROM memory ORDER BY id").fetchall()]
    target.close()
    assert got == [tuple(row) for row in expected]
