"""The context block's sections (issue 19.6): a budget per kind of memory, each ranked by
relevance to the session, room flowing to the sections that need it, and an explanation that
matches what went in."""

from __future__ import annotations

import json
import time

import pytest
from session_writers import copilot_session

from llmem.app import App
from llmem.capture.markers import CLOSE_MARKER, OPEN_MARKER
from llmem.context import (
    CONTEXT_MIN_RELEVANCE,
    HEADER,
    LINE_CHARS,
    SEARCH_LIMIT,
    TITLES,
    assemble_context,
    cut_block,
)
from llmem.search import Searcher, SearchOptions
from llmem.tokens import estimate_tokens

PROJECT = "/home/dev/acme-api"
DAY = 86400.0
# The most a line can cost: its id, type label and cut content, plus " (global)".
LINE_TOKENS = estimate_tokens("- [12345678] project_state: " + "x" * LINE_CHARS + " (global)\n")
STATE, FACTS, PROCEDURES, PREFERENCES, LESSONS = (TITLES[k] for k in (
    "state", "facts", "procedures", "preferences", "lessons"))


@pytest.fixture
def state_dir(configure, tmp_path):
    state = tmp_path / "session-state"
    state.mkdir()
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state}\n")
    return state


@pytest.fixture
def app(state_dir):
    instance = App()
    yield instance
    instance.close()


def add(app, content, memory_type="fact", **kw):
    kw.setdefault("project", PROJECT)
    return app.store.add(content, memory_type, **kw).memory


def crowd(app, count=45, kinds=("procedure", "preference")):
    """A project's many procedures and preferences: what filled the whole block before."""
    for i in range(count):
        if "procedure" in kinds:
            add(app, f"Procedure {i}: before touching module_{i} run the lint and the type check, "
                     "then the unit suite, and rebuild the fixtures cache", "procedure", confidence=0.9)
        if "preference" in kinds:
            add(app, f"Preference {i}: in module_{i} keep lint warnings at zero and name every "
                     "branch of a match", "preference", confidence=0.9)


def section_text(text: str, title: str) -> str:
    """The rendered section `title` of a block, heading included ("" when absent)."""
    start = text.find(f"\n### {title}\n")
    if start < 0:
        return ""
    end = text.find("\n### ", start + 1)
    return text[start:end if end >= 0 else text.index(CLOSE_MARKER)]


def explained(block) -> dict[str, dict]:
    return {s["section"]: s for s in block.explanation["sections"]}


@pytest.mark.parametrize("with_session", [True, False])
def test_many_procedures_and_preferences_leave_room_for_decisions_and_facts(app, state_dir, with_session):
    """Issue 19: with ~40 procedures and preferences the block was all of them and carried no
    decision or fact, whenever the session's words found the procedures."""
    crowd(app)
    decisions = [add(app, "We deploy with blue-green switches on Fridays only", "decision").id,
                 add(app, "Orders are stored in Postgres 16, not MySQL", "decision", confidence=0.7).id,
                 add(app, "The release branch is cut every second Tuesday", "project_state").id]
    facts = [add(app, "The orders service reads its settings from orders.toml", confidence=0.8).id,
             add(app, "Staging runs on the eu-west-2 cluster", confidence=0.6).id]
    session_id = None
    if with_session:
        session = copilot_session(state_dir, cwd=PROJECT)
        session.user("Fix the lint warnings in module_3 and module_7 before the type check runs")
        session_id = session.id
    block = assemble_context(app, session_id, project=PROJECT)
    assert block.tokens <= 1500
    for memory_id in decisions + facts:
        assert memory_id in block.memory_ids, block.text
    # and the procedures and preferences keep their share, most of the block
    procedures = block.sections[PROCEDURES]
    preferences = block.sections[PREFERENCES]
    assert len(procedures) >= 5 and len(preferences) >= 4
    if with_session:  # the ones the session's words name come first
        first = app.store.get(procedures[0]).content
        assert "module_3" in first or "module_7" in first


def test_budgets_hold_in_tokens_and_unused_room_flows(app, state_dir):
    session = copilot_session(state_dir, cwd=PROJECT)
    session.user("Why does the cursor pagination of orders break when created_at ties?")
    filler = " ".join(["pagination cursor orders created_at keyset"] * 8)
    for i in range(40):  # every section has more than it can show
        for kind in ("decision", "fact", "procedure", "preference"):
            add(app, f"{kind} {i}: {filler}", kind, project=PROJECT if i % 2 else None)
        add(app, f"lesson {i}", "self_assessment",
            metadata={"category": f"CATEGORY_{i % 6}", "proposed_update": f"Lesson {i}: {filler}"})
    for budget in (120, 300, 800, 1500, 4000):
        block = assemble_context(app, session.id, max_tokens=budget)
        assert block.tokens <= budget, budget
        frame = estimate_tokens(f"{OPEN_MARKER}\n{HEADER}\n{CLOSE_MARKER}")
        sections = explained(block)
        assert sum(s["used_tokens"] for s in sections.values()) <= budget - frame
        assert sum(s["budget_tokens"] for s in sections.values()) <= budget - frame
        for title, s in sections.items():
            rendered = section_text(block.text, title)
            assert estimate_tokens(rendered) == s["used_tokens"], title
            assert [line[3:11] for line in rendered.splitlines() if line.startswith("- [")] == \
                [c["id"][:8] for c in s["lines"]]
            if budget in (800, 1500):
                # Every section overfull: each holds its own share, give or take the lines
                # that fill what the others could not use.
                assert s["left_out_for_budget"], title
                assert s["used_tokens"] >= s["budget_tokens"] - LINE_TOKENS, (budget, title)
                assert s["used_tokens"] <= s["budget_tokens"] + len(sections) * LINE_TOKENS
        if budget >= 800:
            assert list(block.sections) == [STATE, FACTS, PROCEDURES, PREFERENCES, LESSONS]

    # Few lessons and no facts: their room goes to the kinds that have more to say.
    Memory = app.store.models.Memory
    Memory.delete().where(Memory.type.in_(["fact", "self_assessment"])).execute()
    block = assemble_context(app, session.id, max_tokens=1500)
    sections = explained(block)
    assert FACTS not in block.sections and LESSONS not in block.sections
    for title in (STATE, PROCEDURES, PREFERENCES):
        assert sections[title]["used_tokens"] > sections[title]["budget_tokens"] + LINE_TOKENS
    assert block.tokens > 1500 - 2 * LINE_TOKENS  # the room was used, not left empty


def test_explain_says_why_each_line_is_in_and_what_was_left_out(app, state_dir, cli):
    session = copilot_session(state_dir, cwd=PROJECT)
    session.user("Which Postgres version do the orders tables run on?")
    old = add(app, "The orders tables run on Postgres 12", "decision")
    new = add(app, "The orders tables run on Postgres 16 since the spring upgrade", "decision")
    app.store.relate(new.id, old.id, "supersedes")
    gone = add(app, "Orders tables moved to MySQL", "decision")
    app.store.invalidate(gone.id, "wrong")
    pref = add(app, "Answer in British English", "preference", project=None)
    faint = add(app, "Some old note about a mailing list", "fact", project=None, confidence=0.1)
    Memory = app.store.models.Memory
    Memory.update(updated_at=time.time() - 700 * DAY, created_at=time.time() - 700 * DAY).where(
        Memory.id == faint.id).execute()
    crowd(app, 30, kinds=("procedure",))

    block = assemble_context(app, session.id, max_tokens=450)
    sections = explained(block)
    assert old.id not in block.memory_ids and gone.id not in block.memory_ids
    assert faint.id not in block.memory_ids
    assert block.explanation["superseded"] == [{"id": old.id, "superseded_by": new.id}]

    line = {c["id"]: (title, c) for title, s in sections.items() for c in s["lines"]}
    assert set(line) == set(block.memory_ids)
    for memory_id, (title, c) in line.items():  # each line sits under the section that says so
        assert f"[{memory_id[:8]}]" in section_text(block.text, title)
        assert c["relevance"] >= CONTEXT_MIN_RELEVANCE
    title, decision = line[new.id]
    assert title == STATE and decision["reason"] == "query match"
    # the relevance is the search's, combined with the memory's standing as a noisy-or
    opts = SearchOptions(limit=SEARCH_LIMIT, mode="fts", project=PROJECT, valid_only=True, track=False,
                         min_relevance=CONTEXT_MIN_RELEVANCE)
    hit = next(h for h in Searcher(app.store, None).search(block.query, opts).hits if h.memory.id == new.id)
    assert decision["signals"]["query"] == round(hit.relevance, 4)
    expected = 1 - (1 - hit.relevance) * (1 - decision["signals"]["standing"])
    assert decision["relevance"] == pytest.approx(expected, abs=1e-3)
    title, preference = line[pref.id]
    assert title == PREFERENCES and preference["reason"] == "global"
    assert preference["signals"]["scope"] == "global" and "query" not in preference["signals"]
    assert [c["id"] for c in sections[FACTS]["below_floor"]] == [faint.id]
    assert sections[FACTS]["below_floor"][0]["relevance"] < CONTEXT_MIN_RELEVANCE
    left_out = [c["id"] for s in sections.values() for c in s["left_out_for_budget"]]
    assert left_out and not set(left_out) & set(block.memory_ids)
    for memory_id in left_out:
        assert f"[{memory_id[:8]}]" not in block.text
    # Recalls are recorded for what went in, never for what the budget left out.
    recalled = {r.memory_id for r in app.store.models.RecallEvent.select()}
    assert recalled and recalled <= set(block.memory_ids)

    code, out, err = cli("context", "--session-id", session.id, "--max-tokens", "450", "--explain")
    assert code == 0, err
    text, why = out.split(CLOSE_MARKER)
    assert f"[{new.id[:8]}]" in text and f"[{old.id[:8]}]" not in text
    assert f"[{new.id[:8]}] " in why and "query match" in why and "left out for the budget" in why
    assert f"left out, superseded: [{old.id[:8]}] by [{new.id[:8]}]" in why
    assert "Preferences:" in why and "below the floor: 1" in why
    code, out, err = cli("context", "--session-id", session.id, "--max-tokens", "450", "--explain", "--json")
    data = json.loads(out)
    assert [s["section"] for s in data["explain"]["sections"]] == list(TITLES.values())[1:]
    code, out, err = cli("context", "--session-id", session.id, "--json")
    assert "explain" not in json.loads(out)


def test_the_first_prompt_and_a_compactions_tail_guide_the_ranking(app, state_dir):
    billing = add(app, "The billing ledger lives in schema ledger_v2", "fact")
    queue = add(app, "Drain the orders-high redis queue before a deploy", "procedure")
    session = copilot_session(state_dir, cwd=PROJECT)
    session.user("Migrate the billing ledger to the new schema")
    session.reply("Done.")
    for n in range(3):  # later turns about something else: the first prompt is out of the recent text
        session.user(f"Now rename helper {n} in utils.py")
        session.reply(f"Renamed helper {n}.")
    session.user("What is still pending?")
    session.reply("The orders-high redis queue still holds jobs from before the deploy.")

    def query_signal(block):
        return {c["id"]: c["signals"].get("query", 0.0) for s in block.explanation["sections"]
                for c in s["lines"]}

    start = assemble_context(app, session.id)
    assert query_signal(start)[billing.id] > CONTEXT_MIN_RELEVANCE  # the first prompt counts
    assert query_signal(start)[queue.id] == 0.0  # the agent's words do not, at start
    compact = assemble_context(app, session.id, compacting=True)
    assert query_signal(compact)[queue.id] > CONTEXT_MIN_RELEVANCE  # a compaction's tail does


def test_an_agents_cap_cuts_the_least_relevant_lines_of_every_kind_not_the_last_kinds(app, state_dir):
    crowd(app, 40)
    for i in range(12):
        add(app, f"Decision {i}: the orders service keeps its retries at {i} with jitter and backoff", "decision")
        add(app, f"Fact {i}: the orders service answers on port 80{i:02d} behind the gateway", "fact")
    for category in ("NULL_SAFETY", "EDGE_CASE"):
        for n in range(2):
            add(app, f"{category} slip {n}", "self_assessment",
                metadata={"category": category, "proposed_update": f"Check {category.lower()} first"})
    block = assemble_context(app, None, project=PROJECT, max_tokens=4000).text
    cap = len(block) // 2
    cut = cut_block(block, cap)
    assert len(cut) <= cap and cut.endswith("\n" + CLOSE_MARKER) and cut.startswith(OPEN_MARKER + "\n")
    assert len(cut) > cap - 2 * LINE_TOKENS * 4
    for title in (STATE, FACTS, PROCEDURES, PREFERENCES, LESSONS):
        whole, kept = ([line for line in section_text(text, title).splitlines() if line]
                       for text in (block, cut))
        assert len(kept) > 1 and whole[:len(kept)] == kept, title  # each kind keeps its best lines
    assert all(line in block.splitlines() for line in cut.splitlines())
    assert cut_block(block, len(block)) == block
    assert cut_block(block, 40) == ""  # not even the header: no block rather than a broken one

    # Built for an agent with a cap (its unit's context_cap), the budget is shared inside it.
    from llmem.adapters.registry import get_agent

    for agent in ("claude", "codex"):
        cap = get_agent(agent).context_cap
        capped = assemble_context(app, None, project=PROJECT, max_tokens=4000, adapter_name=agent)
        assert capped.max_tokens == cap // 4 and cap - 2 * LINE_TOKENS * 4 < len(capped.text) <= cap
        assert list(capped.sections) == [STATE, FACTS, PROCEDURES, PREFERENCES, LESSONS]
        assert cut_block(capped.text, cap) == capped.text


def test_the_mcp_context_tool_explains_on_request(app):
    from llmem.mcp_server import MemoryTools

    decision = add(app, "Orders are stored in Postgres 16", "decision")
    tools = MemoryTools(app, default_project=PROJECT)
    plain = tools.context()
    assert plain.endswith(CLOSE_MARKER) and f"[{decision.id[:8]}]" in plain
    block, why = tools.context(explain=True).split(CLOSE_MARKER + "\n\n")
    assert block + CLOSE_MARKER == plain
    assert f"{STATE}: 1 line," in why and f"[{decision.id[:8]}] " in why and "project match" in why
