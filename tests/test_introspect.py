"""Introspection, learn and track-review: nine-field self_assessments on real stores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from session_writers import copilot_session
from test_extract import DONE, FIXTURES, PROJECT, session_config

from llmem.app import App
from llmem.capture.introspect import (
    CATEGORIES,
    CONTENT_FIELDS,
    FIELDS,
    introspect_manual,
    introspect_session,
    introspect_text,
    learn,
    track_review,
)
from llmem.db.models import Memory
from llmem.errors import UsageError


@pytest.fixture
def app():
    application = App()
    yield application
    application.close()


def assessments(store) -> list[Memory]:
    Memory = store.models.Memory
    return list(Memory.select().where(Memory.type == "self_assessment").order_by(Memory.seq))


def fields_of(memory: Memory) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in memory.content.splitlines())


def test_manual_introspection_uses_the_nine_fields_and_fills_recurring(app, fts_config):
    (first,) = introspect_manual(app, "NULL_SAFETY", "missing null check", context="handler.py:42",
                                 caught_by="self-review", proposed_fix="always check for None before .field")
    # Recurring depends on what was stored before: metadata, never the content.
    assert list(fields_of(first)) == list(CONTENT_FIELDS) == [f for f in FIELDS if f != "Recurring"]
    assert fields_of(first) == {
        "Category": "NULL_SAFETY", "Context": "handler.py:42", "What_happened": "missing null check",
        "Outcomes": "-", "What_caught_it": "self-review", "Estimates_vs_actual": "-",
        "Proposed_update": "always check for None before .field", "Iteration_count": "-"}
    assert set(first.metadata) >= {f.lower() for f in FIELDS}
    assert first.metadata["recurring"] == "no" and first.metadata["recurring_ids"] == []
    assert first.metadata["category"] == "NULL_SAFETY" and first.metadata["what_caught_it"] == "self-review"
    assert (first.type, first.source, first.confidence) == ("self_assessment", "introspection", 0.9)

    (second,) = introspect_manual(app, "null_safety", "missing null check on user.profile", iteration_count=3)
    assert second.metadata["recurring"] == "yes" and second.metadata["recurring_ids"] == [first.id]
    assert second.metadata["iteration_count"] == 3
    # No proposed fix given and no LLM: the category's default directive.
    assert "None/null/undefined" in fields_of(second)["Proposed_update"]
    (other,) = introspect_manual(app, "OFF_BY_ONE", "loop ran one past the end")
    assert other.metadata["recurring"] == "no"


def test_unknown_category_is_a_usage_error_naming_the_taxonomy(app, fts_config, cli):
    with pytest.raises(UsageError) as caught:
        introspect_manual(app, "TYPO", "x")
    assert all(c in caught.value.hint for c in CATEGORIES)
    code, _, err = cli("introspect", "--category", "TYPO", "--what-happened", "x")
    assert code == 2 and "unknown category 'TYPO'" in err and "NULL_SAFETY" in err
    assert "Traceback" not in err


def test_cli_flags_as_in_the_seed(fts_config, cli, tmp_path):
    code, out, _ = cli("introspect", "--category", "NULL_SAFETY", "--what-happened", "missing null check",
                       "--context", "handler.py:42", "--caught-by", "self-review",
                       "--proposed-fix", "always check for None before .field")
    assert code == 0 and "NULL_SAFETY, recurring: no" in out
    code, out, _ = cli("introspect", "--auto", "--text", "Encountered a null pointer error", "--json")
    assert code == 0 and json.loads(out)[0]["metadata"]["category"] == "NULL_SAFETY"
    code, out, _ = cli("learn", "--wrong", "called wrong function", "--right",
                       "call correctFunction() instead", "--context", "handler.py:42")
    assert code == 0 and out.startswith("Stored procedure")
    for args, message in [
        (("introspect", "--auto"), "exactly one of --session"),
        (("introspect", "--what-happened", "x"), "needs --category and --what-happened"),
        (("introspect", "--text", "x"), "need --auto"),
        (("learn", "--wrong", "x"), "Missing option '--right'"),
        (("track-review", "--single"), "--single needs --category"),
        (("track-review", "--single", "--category", "EDGE_CASE", "--findings", str(tmp_path / "f.json")),
         "cannot be combined"),
    ]:
        code, _, err = cli(*args)
        assert code == 2 and message in err, (args, err)


def test_learn_stores_a_procedure(app, fts_config):
    (memory,) = learn(app, "called wrong function", "call correctFunction() instead", "handler.py:42")
    assert memory.type == "procedure" and memory.source == "learn" and memory.confidence == 0.9
    assert memory.content.splitlines() == ["Do: call correctFunction() instead",
                                           "Instead of: called wrong function", "Context: handler.py:42"]
    with pytest.raises(UsageError):
        learn(app, " ", "x")


def test_track_review_modes(app, fts_config, tmp_path, cli):
    (passed,) = track_review(app)
    assert fields_of(passed)["Category"] == "REVIEW_PASSED" and passed.source == "review"
    (single,) = track_review(app, single={"category": "NULL_SAFETY", "context": "handler.py:42"})
    assert fields_of(single)["Context"] == "handler.py:42" and fields_of(single)["What_caught_it"] == "review"

    findings = tmp_path / "review-findings.json"
    findings.write_text(json.dumps({"findings": [
        {"category": "OFF_BY_ONE", "file": "pager.py", "line": 10, "description": "last page dropped",
         "severity": "high", "suggestion": "test the last page"},
        {"category": "edge_case", "message": "empty cart crashes"},
    ]}))
    batch = track_review(app, findings_file=findings, context="handler.py")
    assert [fields_of(m)["Context"] for m in batch] == ["pager.py:10", "handler.py"]
    assert fields_of(batch[0])["What_happened"] == "[high] last page dropped"
    assert fields_of(batch[0])["Proposed_update"] == "test the last page"
    assert fields_of(batch[1])["Category"] == "EDGE_CASE"

    # A bad file stores nothing, and says which finding is wrong.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"category": "NULL_SAFETY"}, {"category": "NOPE"}]))
    Memory = app.store.models.Memory
    before = Memory.select().count()
    code, _, err = cli("track-review", "--findings", str(bad))
    assert code == 2 and "finding #2" in err and "unknown category 'NOPE'" in err
    assert Memory.select().count() == before
    code, _, err = cli("track-review", "--findings", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err

    code, out, _ = cli("track-review", "--clean")
    assert code == 0 and "Invalidated 4 earlier track-review memories" in out
    assert all(m.invalidated_at for m in assessments(app.store))
    code, out, _ = cli("track-review")
    assert code == 0 and "REVIEW_PASSED" in out


def test_auto_text_records_nothing_when_nothing_went_wrong(app, fts_config):
    assert introspect_text(app, "Implemented the feature and shipped it.") == []
    (memory,) = introspect_text(app, "The deploy crashed: IndexError: list index out of range in pager")
    assert memory.metadata["category"] == "OFF_BY_ONE"
    # A guess from wording: marked as such, and less sure than an LLM's reading (0.7).
    assert memory.metadata["source"] == "heuristic" and memory.confidence == 0.5
    assert memory.source == "introspection"


def test_auto_text_twice_adds_nothing(app, fts_config, cli):
    text = "it was None, crashed in prod"
    first = introspect_text(app, text)
    again = introspect_text(app, text)
    assert [m.id for m in again] == [m.id for m in first] and len(first) == 1
    assert first[0].metadata["category"] == "NULL_SAFETY"
    # An earlier assessment of the category makes it recurring, yet the same text stays one memory.
    introspect_manual(app, "NULL_SAFETY", "no None check before .email")
    assert [m.id for m in introspect_text(app, text)] == [first[0].id]
    Memory = app.store.models.Memory
    count = Memory.select().count()
    for _ in range(2):
        code, _, err = cli("introspect", "--auto", "--text", text)
        assert code == 0, err
    assert Memory.select().count() == count


def test_auto_text_twice_adds_nothing_with_an_llm_that_answers_differently(app, ollama_config):
    ollama_config.chat_replies = [json.dumps({"assessments": [{
        "category": "EDGE_CASE", "what_happened": f"empty cart crashed checkout ({n})"}]}) for n in (1, 2)]
    text = "Checkout crashed on an empty cart."
    (first,) = introspect_text(app, text)
    assert [m.id for m in introspect_text(app, text)] == [first.id]
    Memory = app.store.models.Memory
    assert Memory.select().count() == 1
    assert [p for p, _ in ollama_config.requests].count("/api/chat") == 1  # not asked again


@pytest.mark.parametrize("text, memory_type, content", [
    ("No, use uv instead of pip", "procedure", "Do: Use uv\nInstead of: pip"),
    ("this is wrong: the orders table's key is order_id, the code still reads orderId",
     "fact", "Correction from the user: The orders table's key is order_id, the code still reads orderId"),
    ("I'd rather you kept the changelog in CHANGES.md", "preference",
     "The user would rather you kept the changelog in CHANGES.md"),
])
def test_auto_text_correction_becomes_what_it_states(app, fts_config, text, memory_type, content):
    (memory,) = introspect_text(app, text)
    assert (memory.type, memory.content) == (memory_type, content)
    assert memory.metadata["source"] == "heuristic" and memory.source == "introspection"
    # Never a generic self_assessment ("Run the relevant tests") made of a correction.
    Memory = app.store.models.Memory
    assert not Memory.select().where(Memory.type == "self_assessment").exists()
    assert introspect_text(app, text)[0].id == memory.id
    assert Memory.select().count() == 1


def test_auto_session_heuristics_find_the_agents_mistakes(configure, state_dir, app):
    session = copilot_session(state_dir, "ses-oops", cwd=PROJECT)
    session.user("Add a discount field to the order API.")
    session.assistant("Running the tests first.", [{"name": "bash", "arguments": {"command": "pytest"},
                                                    "output": "3 failed, AssertionError: before my change"}])
    session.assistant("Editing.", [{"name": "edit", "arguments": {"path": "api.py"}, "output": "ok"}])
    session.assistant("", [{"name": "bash", "arguments": {"command": "pytest -q"},
                            "output": "AttributeError: 'NoneType' object has no attribute 'discount'"}])
    session.assistant("", [{"name": "bash", "arguments": {"command": "pytest -q"},
                            "output": "AttributeError: 'NoneType' object has no attribute 'discount'"}])
    session.user("No, use order.total_discount instead of order.discount.")
    session_config(configure, state_dir)

    memories = introspect_session(app, "ses-oops")

    (null_memory,) = [m for m in memories if m.type == "self_assessment"]
    assert null_memory.metadata["category"] == "NULL_SAFETY"
    assert null_memory.metadata["source"] == "heuristic" and null_memory.confidence == 0.5
    null = fields_of(null_memory)
    assert "NoneType" in null["What_happened"] and "before my change" not in null["What_happened"]
    assert null["Iteration_count"] == "3" and null["What_caught_it"] == "test"
    # The user's correction is the wrong → right pair it states, not a MISSING_VERIFICATION lesson.
    (pair,) = [m for m in memories if m.type != "self_assessment"]
    assert pair.type == "procedure"
    assert pair.content == "Do: Use order.total_discount\nInstead of: order.discount"
    assert pair.metadata["wrong"] == "order.discount" and pair.metadata["source"] == "heuristic"
    assert all(m.session_id == "ses-oops" and m.project == "/home/dev/shop" for m in memories)
    # The ending hook may run twice: the second run reads nothing new.
    assert introspect_session(app, "ses-oops") == []


def test_auto_session_twice_adds_nothing_even_without_its_cursor(configure, state_dir, app, cli):
    session = copilot_session(state_dir, "ses-twice", cwd=PROJECT)
    session.user("Fix the export.")
    session.assistant("Editing.", [{"name": "edit", "arguments": {"path": "export.py"}, "output": "ok"}])
    session.user("it was None, crashed in prod")
    session.user("No, use csv.DictWriter instead of string joins.")
    session_config(configure, state_dir)

    code, out, err = cli("introspect", "--auto", "--session", "ses-twice")
    assert code == 0, err
    Memory, SessionCursor = app.store.models.Memory, app.store.models.SessionCursor
    stored = {m.type: m for m in Memory.select()}
    assert set(stored) == {"self_assessment", "procedure"}
    assert stored["self_assessment"].metadata["category"] == "NULL_SAFETY"
    code, out, _ = cli("introspect", "--auto", "--session", "ses-twice")
    assert code == 0 and Memory.select().count() == 2
    # Even a lost cursor re-reads the session into the same memories, not new ones.
    SessionCursor.delete().execute()
    assert introspect_session(app, "ses-twice") == []
    assert Memory.select().count() == 2


def test_auto_session_moves_its_cursor_with_its_writes(configure, state_dir, app, monkeypatch):
    """A failure while storing leaves the cursor where it was, so nothing is skipped."""
    import llmem.capture.introspect as introspect

    session = copilot_session(state_dir, "ses-atomic", cwd=PROJECT)
    session.assistant("Editing.", [{"name": "edit", "arguments": {"path": "a.py"}, "output": "ok"}])
    session.user("it was None, crashed in prod")
    session.user("No, use uv instead of pip.")
    session_config(configure, state_dir)

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(introspect, "_write_stated", broken)
    with pytest.raises(RuntimeError):
        introspect_session(app, "ses-atomic")
    Memory, SessionCursor = app.store.models.Memory, app.store.models.SessionCursor
    assert not Memory.select().exists()  # the assessment went with the failed transaction
    assert SessionCursor.get_or_none(SessionCursor.session_id == "ses-atomic") is None
    monkeypatch.undo()
    memories = introspect_session(app, "ses-atomic")
    assert {m.type for m in memories} == {"self_assessment", "procedure"}
    assert SessionCursor.get(SessionCursor.session_id == "ses-atomic").introspect_cursor


def test_auto_session_records_nothing_for_a_clean_session(configure, tmp_path, app):
    shutil.copytree(FIXTURES / "copilot", tmp_path / "copilot")
    session_config(configure, tmp_path / "copilot" / "session-state")
    # The failing run before any edit reproduces the reported bug: not a mistake.
    assert introspect_session(app, DONE) == []
    # ...and the session was read: its introspection cursor moved past it.
    SessionCursor = app.store.models.SessionCursor
    assert SessionCursor.get(SessionCursor.session_id == DONE).introspect_cursor


def test_auto_session_with_the_llm(configure, state_dir, app, model_server):
    session = copilot_session(state_dir, "ses-llm-i", cwd=PROJECT)
    session.user("Why is the cache stale after updates?")
    session.assistant("I forgot to invalidate the cache in update_order.")
    session_config(configure, state_dir, server=model_server)
    earlier = introspect_manual(app, "DATA_INTEGRITY", "cache not invalidated on delete")[0]
    model_server.chat_replies = [json.dumps({"assessments": [{
        "category": "DATA_INTEGRITY", "what_happened": "update_order left the cache stale",
        "what_caught_it": "user", "proposed_update": "Invalidate the cache in every write path.",
        "iteration_count": 2}]})]

    (memory,) = introspect_session(app, "ses-llm-i")

    fields = fields_of(memory)
    assert memory.metadata["recurring_ids"] == [earlier.id] and "Recurring" not in fields
    assert "source" not in memory.metadata and memory.confidence == 0.7  # the LLM's reading
    assert fields["Proposed_update"] == "Invalidate the cache in every write path."
    assert fields["Context"].startswith("session ses-llm-i")
    request = [b for p, b in model_server.requests if p == "/api/chat"][0]
    assert "forgot to invalidate" in request["messages"][1]["content"]


def test_auto_text_falls_back_to_heuristics_on_garbage(app, ollama_config):
    ollama_config.chat_replies = ["nope", "still nope"]
    (memory,) = introspect_text(app, "Race: two workers wrote the same row, database is locked")
    assert memory.metadata["category"] == "RACE_CONDITION"
    assert [p for p, _ in ollama_config.requests].count("/api/chat") == 2  # asked, then retried


def test_manual_with_model_override_asks_for_a_proposed_update(ollama_config, cli):
    ollama_config.chat_replies = [json.dumps({"proposed_update": "Guard .field with an is-None check."})]
    code, out, _ = cli("introspect", "--category", "NULL_SAFETY", "--what-happened", "missing null check",
                       "--model", "glm-5.1:cloud", "--base-url", ollama_config.url, "--json")
    assert code == 0
    (memory,) = json.loads(out)
    assert memory["metadata"]["proposed_update"] == "Guard .field with an is-None check."
    (request,) = [b for p, b in ollama_config.requests if p == "/api/chat"]
    assert request["model"] == "glm-5.1:cloud"


@pytest.fixture
def state_dir(tmp_path) -> Path:
    path = tmp_path / "session-state"
    path.mkdir()
    return path


def test_cli_introspect_records_the_project_it_is_given(fts_config, cli):
    code, out, err = cli("introspect", "--category", "NULL_SAFETY", "--what-happened", "missing null check",
                         "--project", "/home/dev/acme-api", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["project"] == "/home/dev/acme-api"
    code, out, err = cli("introspect", "--auto", "--text", "Encountered a null pointer error",
                         "--project", "/home/dev/acme-api", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["project"] == "/home/dev/acme-api"
    code, _, err = cli("introspect", "--auto", "--session", "ses_1", "--project", "/x")
    assert code == 2 and "--project" in err
