"""The no-LLM correction classifier against a labelled set of corrections and mistake statements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmem.capture.heuristics import KINDS, categorize, classify_correction, is_correction
from llmem.capture.taxonomy import ERROR_CATEGORIES

ROOT = Path(__file__).resolve().parent.parent
LABELLED = ROOT / "tests" / "fixtures" / "corrections.yaml"
STATED_KINDS = ("fact", "preference", "procedure", "decision", "learn")


@pytest.fixture(scope="module")
def items() -> list[dict]:
    return yaml.safe_load(LABELLED.read_text(encoding="utf-8"))


def _right(item: dict) -> bool:
    verdict = classify_correction(item["text"])
    return verdict.kind == item["kind"] and (
        item["kind"] != "self_assessment" or verdict.category == item["category"])


def test_the_set_is_well_formed(items):
    assert len(items) >= 60
    assert len({i["text"] for i in items}) == len(items)
    for item in items:
        assert item["kind"] in KINDS, item
        assert (item["kind"] == "self_assessment") == ("category" in item), item
        if "category" in item:
            assert item["category"] in ERROR_CATEGORIES, item
    kinds = {i["kind"] for i in items}
    assert kinds == set(KINDS)
    assert {i["category"] for i in items if "category" in i} == set(ERROR_CATEGORIES)


def test_accuracy_on_the_labelled_set(items):
    right = [i for i in items if _right(i)]
    assert len(right) / len(items) >= 0.80, [i["text"] for i in items if not _right(i)]
    held = [i for i in items if i.get("held_out")]
    assert len(held) >= 20
    assert sum(_right(i) for i in held) / len(held) >= 0.80


def test_a_correction_never_becomes_a_self_assessment(items):
    for item in items:
        if item["kind"] in STATED_KINDS + ("none",):
            assert classify_correction(item["text"]).kind != "self_assessment", item["text"]


def test_the_issues_examples():
    pair = classify_correction("No, use uv instead of pip")
    assert pair.kind == "learn"
    (candidate,) = pair.candidates
    assert candidate.type == "procedure"
    assert candidate.metadata == {"wrong": "pip", "right": "Use uv"}
    assert candidate.content == "Do: Use uv\nInstead of: pip"

    fact = classify_correction("this is wrong: the orders table's key is order_id")
    assert fact.kind == "fact"
    assert fact.candidates[0].content == "Correction from the user: The orders table's key is order_id"

    crash = classify_correction("it was None, crashed in prod")
    assert (crash.kind, crash.category) == ("self_assessment", "NULL_SAFETY")


@pytest.mark.parametrize("text, category", [
    ("bash failed: AttributeError: 'NoneType' object has no attribute 'discount'", "NULL_SAFETY"),
    ("TypeError: Cannot read properties of undefined (reading 'id')", "NULL_SAFETY"),
    ("IndexError: list index out of range", "OFF_BY_ONE"),
    ("sqlite3.OperationalError: database is locked", "RACE_CONDITION"),
    ("pytest failed: 3 failed, 12 passed", None),  # a failure, but no class of mistake
    ("exited with exit code 1", None),
    ("Added caching to the search endpoint.", None),  # a topic without trouble is no mistake
])
def test_categories_from_tool_output_and_plain_text(text, category):
    assert categorize(text) == category


def test_what_counts_as_a_correction():
    assert is_correction("No, use uv instead of pip.")
    assert is_correction("That's wrong: the column is order_id.")
    assert is_correction("Use pathlib instead of os.path.")
    # Task instructions and chat are not corrections.
    assert not is_correction("Add a discount field to the order API.")
    assert not is_correction("Run the tests please")
    assert not is_correction("No worries, carry on.")


def test_the_benchmark_prints_accuracy_confusion_and_misses():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "heuristics.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    for heading in ("accuracy: ", "batch blind-2: ", "held out while the rules were written: ",
                    "false lessons", "confusion (rows: expected kind", "self_assessment categories",
                    "misses ("):
        assert heading in done.stdout


def test_a_pasted_log_is_read_in_bounded_time():
    import time

    log_dump = "ERROR worker 7: you said it works, but the job died " * 8000  # ~400 KB on one line
    started = time.perf_counter()
    verdict = classify_correction(log_dump)
    assert time.perf_counter() - started < 1.5
    assert (verdict.kind, verdict.category) == ("self_assessment", "MISSING_VERIFICATION")
