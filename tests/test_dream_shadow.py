"""The shadow trial: report-only verdicts from the LLM, shown by promote-explain and
`dream status --deep`; never a promotion, never MEMORY.md; says so when it cannot run."""

from __future__ import annotations

import json

from conftest import free_port_url
from dream_support import add, open_store, recall, run_cli
from fakes import StubLLM

from llmem.config import load_config
from llmem.dream.shadow import run_shadow_trial
from llmem.store import Store

VERDICTS = {"postgres": "helpful", "tabs": "neutral", "force-push": "harmful"}


def build(home, llm_config: str = "llm:\n  provider: none\n"):
    store, _ = open_store(home)
    memories = {
        "postgres": add(store, "The api uses postgres 16; migrations run with alembic upgrade head", "decision"),
        "tabs": add(store, "Makefiles in this repo are indented with tabs", "fact"),
        "force-push": add(store, "To fix a broken main, force-push your local branch over it", "procedure"),
    }
    store.close()
    (home / "config.yaml").write_text("embedding:\n  provider: none\n" + llm_config)
    for key in memories:  # a real search records the query's text for the trial's question
        code, _, err = run_cli("search", key)
        assert code == 0, err
    config = load_config()
    store = Store.open(config.store_location)
    for key, memory in memories.items():
        recall(store, memory, [f"{key} a", f"{key} b", f"{key} c"], days_ago=[3, 2, 1])
    return store, config, memories


def judge(stub: StubLLM):
    """Answers as the trial asks: two answers, then a verdict depending on the memory."""
    def reply(_n):
        task = stub.tasks[-1]
        if task != "dream_shadow_judge":
            return {"answer": f"an answer for {task}"}
        prompt = stub.messages[-1][-1]["content"]
        verdict = next(v for k, v in VERDICTS.items() if k in prompt.lower())
        return {"verdict": verdict, "reason": f"the memory is {verdict}",
                "risk_flags": ["unsafe", "made-up flag"] if verdict == "harmful" else []}
    return reply


def test_verdicts_are_recorded_as_a_report_and_shown_never_promoted(home):
    store, config, memories = build(home)
    stub = StubLLM()
    stub.reply = judge(stub)
    outcome = run_shadow_trial(store, config, llm=stub)
    assert outcome.ran and len(outcome.rows) == 3
    by_id = {row["memory_id"]: row for row in outcome.rows}
    for key, memory in memories.items():
        row = by_id[memory.id]
        assert row["verdict"] == VERDICTS[key]
        assert row["suggestion"] == {"helpful": "promote", "neutral": "defer", "harmful": "reject"}[VERDICTS[key]]
        assert row["question_from"] == "recalls" and key in row["question"]
        assert row["promotion_action"] == "report-only"
    assert by_id[memories["force-push"].id]["risk_flags"] == ["other", "unsafe"]
    # Per candidate: the baseline asked without the memory, the second answer with it.
    assert stub.tasks == ["dream_shadow_baseline", "dream_shadow_candidate", "dream_shadow_judge"] * 3
    for i in range(0, 9, 3):
        shown = stub.messages[i + 2][-1]["content"].split("Memory: ", 1)[1].split("\n\n", 1)[0]
        assert shown not in json.dumps(stub.messages[i]) and shown in stub.messages[i + 1][0]["content"]
    Memory = store.models.Memory
    assert Memory.select().where(Memory.promoted_at.is_null(False)).count() == 0
    store.close()
    assert not (home / "MEMORY.md").exists()

    code, out, _ = run_cli("promote-explain", memories["force-push"].id)
    assert "shadow trial: harmful → reject suggestion" in out and "risk flags: other, unsafe" in out
    code, out, _ = run_cli("dream", "status", "--deep", "--json")
    deep = json.loads(out)["deep"]
    order = [c["memory_id"] for c in deep["candidates"]]
    assert order[0] == memories["postgres"].id and order[-1] == memories["force-push"].id
    assert deep["shadow_trial"]["verdicts"] == {"harmful": 1, "helpful": 1, "neutral": 1}
    assert all(c["holding_gates"] == [] for c in deep["candidates"])  # a verdict opens or closes no gate
    code, out, _ = run_cli("dream", "status", "--deep")
    assert "shadow trial: helpful → promote suggestion" in out


def test_a_verdict_goes_stale_when_the_memory_changes_and_undo_retracts_it(home):
    store, config, memories = build(home)
    stub = StubLLM()
    stub.reply = judge(stub)
    run_id = run_shadow_trial(store, config, llm=stub).run_id
    store.update(memories["postgres"].id, content="The api uses postgres 17 now")
    store.close()
    code, out, _ = run_cli("promote-explain", memories["postgres"].id, "--json")
    assert json.loads(out)[0]["shadow"]["stale"] is True
    code, out, _ = run_cli("dream", "undo", run_id)
    assert code == 0
    code, out, _ = run_cli("promote-explain", memories["tabs"].id, "--json")
    assert json.loads(out)[0]["shadow"] is None


def test_the_shadow_command_through_a_real_model_server(home, model_server):
    store, _, memories = build(home, f"llm:\n  provider: ollama\n  base_url: {model_server.url}\n")
    store.close()
    model_server.chat_replies = [json.dumps({"answer": "no idea"}), json.dumps({"answer": "postgres 16"}),
                                 json.dumps({"verdict": "helpful", "reason": "names the version", "risk_flags": []})]
    code, out, err = run_cli("dream", "shadow", "--limit", "1")
    assert code == 0, err
    assert "helpful  → promote" in out and "report-only" in out
    chats = [body for path, body in model_server.requests if path == "/api/chat"]
    assert len(chats) == 3
    assert not (home / "MEMORY.md").exists()


def test_without_an_llm_the_trial_says_it_did_not_run(home):
    store, _, _ = build(home)
    store.close()
    code, out, err = run_cli("dream", "shadow")
    assert code == 0, err
    assert "Shadow trial did not run: no LLM is configured" in out
    code, out, _ = run_cli("dream", "status", "--deep")
    assert "Shadow trial: did not run: no LLM is configured" in out


def test_an_llm_that_is_down_runs_no_trial_and_records_nothing(home):
    store, _, _ = build(home, f"llm:\n  provider: ollama\n  base_url: {free_port_url()}\n  timeout: 2\n")
    store.close()
    code, out, err = run_cli("dream", "shadow", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ran"] is False and "unavailable" in data["reason"] and data["run_id"] is None
    code, out, _ = run_cli("dream", "status", "--deep", "--json")
    assert json.loads(out)["deep"]["shadow_trial"] is None
