"""Codex lifecycle rules on rollouts written as Codex writes them, read
through the watcher's CodexTail: busy, idle, a compaction, an interrupted turn, inactivity."""

from __future__ import annotations

from session_writers import CodexRollout

from llmem.adapters.codex import CodexTail
from llmem.adapters.lifecycle import DEFAULT_INACTIVITY_MS, Moment, codex_lifecycle

SECOND = 1000


def look(tail: CodexTail, after_ms: int = 2 * SECOND, **kwargs):
    marks = tail.read()
    last = max(mark.at_ms for mark in marks)
    return codex_lifecycle(marks, last + after_ms, **kwargs)


def test_a_turn_is_busy_then_idle_once_per_reply(tmp_path):
    rollout = CodexRollout(tmp_path)
    rollout.begin("fix the test")
    tail = CodexTail(rollout.path)
    busy = look(tail)
    assert busy.moments == {Moment.BUSY} and busy.reply_id is None
    rollout.tool("pytest -q", "1 passed")
    assert look(tail).moments == {Moment.BUSY}
    rollout.finish("Fixed.")
    idle = look(tail)
    assert idle.moments == {Moment.IDLE} and idle.reply_id is not None
    # Inside the debounce the reply is known, the moment not yet.
    assert look(tail, after_ms=100).moments == frozenset()
    rollout.turn("and the next one")
    assert look(tail).reply_id not in (None, idle.reply_id)


def test_compaction_shows_after_the_fact(tmp_path):
    rollout = CodexRollout(tmp_path, mode="legacy")
    rollout.turn("first")
    tail = CodexTail(rollout.path)
    assert Moment.JUST_COMPACTED not in look(tail)
    rollout.compact("Summary: first turn done.")
    compacted = look(tail)
    assert Moment.JUST_COMPACTED in compacted and Moment.IDLE in compacted
    assert Moment.JUST_COMPACTED not in look(tail, seen_compaction_id=compacted.compaction_id)


def test_an_interrupted_turn_is_idle(tmp_path):
    rollout = CodexRollout(tmp_path)
    rollout.begin("a long task")
    tail = CodexTail(rollout.path)
    assert Moment.BUSY in look(tail)
    rollout.abort()
    assert look(tail).moments == {Moment.IDLE}


def test_ending_after_inactivity_never_while_busy(tmp_path):
    rollout = CodexRollout(tmp_path)
    rollout.turn("one turn")
    tail = CodexTail(rollout.path)
    ended = look(tail, after_ms=DEFAULT_INACTIVITY_MS)
    assert Moment.ENDING in ended and ended.ending_reason == "inactive"
    assert Moment.ENDING not in look(tail, after_ms=DEFAULT_INACTIVITY_MS - SECOND)
    rollout.begin("resumed, still running")
    assert Moment.ENDING not in look(tail, after_ms=DEFAULT_INACTIVITY_MS)
    assert look(tail).last_turn_id != ended.last_turn_id


def test_the_tail_reads_only_new_lines_and_starts_over_on_a_new_file(tmp_path):
    rollout = CodexRollout(tmp_path)
    rollout.turn("first")
    tail = CodexTail(rollout.path)
    count = len(tail.read())
    rollout.turn("second")
    assert len(tail.read()) > count and len({mark.id for mark in tail.marks}) == len(tail.marks)
    replaced = rollout.path.with_suffix(".new")
    replaced.write_text(rollout.path.read_text().split("\n", 1)[0] + "\n")
    replaced.replace(rollout.path)
    assert [mark.kind for mark in tail.read()] == ["session_meta"]
