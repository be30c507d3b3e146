"""The labelled secret corpus (issue 20.6): every shape redacted, every near-miss kept."""

from __future__ import annotations

import pytest
from secret_corpus import load_corpus

from llmem.redact import redact

PLANTED, NEAR_MISSES = load_corpus()


def test_the_corpus_has_at_least_sixty_kinds():
    kinds = [entry.kind for entry in PLANTED]
    assert len(set(kinds)) == len(kinds) >= 60
    assert len(NEAR_MISSES) >= 40


@pytest.mark.parametrize("entry", PLANTED, ids=[entry.kind for entry in PLANTED])
def test_every_secret_shape_is_redacted(entry):
    result = redact(entry.text)
    assert [s for s in entry.secrets if s in result.text] == [], result.text
    assert "[REDACTED:" in result.text


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_near_misses_stay_as_they_are(text):
    result = redact(text)
    assert (result.text, result.count) == (text, 0)


def test_the_whole_corpus_in_one_text():
    text = "\n\nsome chat in between\n\n".join(entry.text for entry in PLANTED + [])
    out = redact(text + "\n\n" + "\n\n".join(NEAR_MISSES)).text
    assert [s for entry in PLANTED for s in entry.secrets if s in out] == []
    for near_miss in NEAR_MISSES:
        assert near_miss in out


def test_redaction_is_stable_on_its_own_output():
    for entry in PLANTED:
        once = redact(entry.text).text
        assert redact(once).text == once
