"""DREAMS.md and the narrative diary: managed phase blocks rewritten in place, escaped memory
text, the dream model with its retry-once and refusal rules, the template fallback, phase
reports, no diary entry for a run with nothing new, readable themes, the light phase's skip
reason and one count of changes everywhere. Real stores, the real CLI, a real HTTP server."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest
from conftest import free_port_url
from dream_support import add, open_store, recall, run_cli
from fakes import FakeEmbedder, StubLLM

from llmem.config import load_config
from llmem.dream import run_dream
from llmem.dream.dreams_md import marker
from llmem.store import Store

HOSTILE = "# Heading <script>alert(1)</script> `tick` --> <!-- llmem:dreams light end --> [x](javascript:y)"


def ruff_store(home, config_text: str = ""):
    """No vectors (light skips); REM finds the ruff theme; deep promotes a recalled memory."""
    store, config = open_store(home, config_text)
    add(store, "ruff is the linter for this repo")
    add(store, "run ruff check before every commit")
    busy = add(store, "ruff format replaces black here")
    recall(store, busy, [f"format {i}" for i in range(6)], days_ago=[0, 0, 1, 1, 2, 3])
    return store, config


def pair_store(home, config_text: str = "", first: str = HOSTILE):
    """Two near-duplicates with vectors, so light has a pair to tell about."""
    store, config = open_store(home, config_text)
    emb = FakeEmbedder(dim=512)
    add(store, first + " the deploy script lives in scripts/deploy.sh", embedder=emb, age_days=2)
    add(store, first + " the deploy script lives in scripts/deploy.sh too", embedder=emb, age_days=1)
    return store, config, emb


def blocks_removed(text: str) -> str:
    """The file without its managed blocks: what belongs to the user."""
    return re.sub(r"<!-- llmem:dreams (\w+) begin -->.*?<!-- llmem:dreams \1 end -->\n?", "", text, flags=re.S)


def test_blocks_are_rewritten_in_place_and_outside_text_is_kept(llmem_home):
    store, config, emb = pair_store(llmem_home, first="plain")
    run_dream(store, config, apply=True, use_llm=False)
    path = llmem_home / "DREAMS.md"
    first = path.read_text()
    for phase in ("light", "rem", "deep"):
        assert first.count(marker(phase, "begin")) == first.count(marker(phase, "end")) == 1
    assert "## Light Sleep" in first and "## REM Sleep" in first and "## Deep Sleep" in first
    # The user writes around and between the blocks, without a final newline.
    mine = first.replace("<!-- llmem:dreams rem begin -->", "My note between blocks.\n\n<!-- llmem:dreams rem begin -->")
    mine = "Preface by hand.\n\n" + mine + "\nTrailing note, no newline"
    path.write_text(mine)
    add(store, "a new memory about the cache layout in cache/layout.md", embedder=emb)
    second = run_dream(store, config, apply=True, use_llm=False)
    run_dream(store, config, apply=True, use_llm=False)
    text = path.read_text()
    for phase in ("light", "rem", "deep"):
        assert text.count(marker(phase, "begin")) == text.count(marker(phase, "end")) == 1
        assert text.count(f"## {dict(light='Light', rem='REM', deep='Deep')[phase]} Sleep") == 1
    assert blocks_removed(text) == blocks_removed(mine)
    assert second.run_id not in text  # the third run's block replaced the second's
    store.close()


def test_damaged_markers_leave_the_file_alone_and_say_so(llmem_home):
    store, config, _ = pair_store(llmem_home, first="plain")
    path = llmem_home / "DREAMS.md"
    damaged = "# Mine\n\n" + marker("light", "begin") + "\nhalf a block, its end marker deleted\n"
    path.write_text(damaged)
    outcome = run_dream(store, config, apply=True, use_llm=False)
    assert path.read_text() == damaged
    assert any("damaged Light Sleep block" in note for note in outcome.notes)
    store.close()


def test_hostile_memory_text_is_escaped(llmem_home):
    store, config, _ = pair_store(llmem_home, "dream:\n  phase_reports: true\n")
    run_dream(store, config, apply=True, use_llm=False)
    day = datetime.now().astimezone().strftime("%Y-%m-%d")
    files = [llmem_home / "DREAMS.md", llmem_home / "dream-diary.md",
             llmem_home / "dreaming" / "light" / f"{day}.md"]
    dreams = files[0].read_text()
    assert "alert(1)" in dreams  # the text is shown…
    assert dreams.count("<!--") == dreams.count("-->") == 6  # …but only our markers are comments
    for path in files:
        text = path.read_text()
        assert "<script" not in text and "`tick`" not in text
        assert "](javascript" not in text
        for line in text.splitlines():
            assert not line.startswith("# Heading")
    store.close()


def test_narrative_from_the_model_keeps_only_grounded_sentences(llmem_home):
    store, config = ruff_store(llmem_home)
    llm = StubLLM(lambda n: {"entry": "The dream noticed the ruff theme. "
                                      "The user also switched to tabs in src/app.py last week."})
    outcome = run_dream(store, config, apply=True, use_llm=True, diary_llm=llm)
    assert set(llm.tasks) == {"dream_diary"} and len(llm.tasks) == 2  # REM and deep had material
    prompt = llm.messages[0][1]["content"]
    assert "ruff is the linter for this repo" in prompt  # the memories themselves are the material
    rem = outcome.narratives["rem"]
    assert rem["text"] == "The dream noticed the ruff theme."
    assert rem["by"] == "model llama3.1:8b"
    assert "light" not in outcome.narratives  # nothing embedded: not enough material
    dreams = (llmem_home / "DREAMS.md").read_text()
    assert "The dream noticed the ruff theme." in dreams and "tabs" not in dreams
    store.close()


def test_an_ungrounded_reply_falls_back_to_the_template(llmem_home):
    store, config = ruff_store(llmem_home)
    llm = StubLLM({"entry": "Kubernetes pods restarted 42 times."})
    outcome = run_dream(store, config, apply=True, diary_llm=llm)
    assert outcome.narratives["rem"]["by"] == "template"
    assert outcome.narratives["rem"]["text"].startswith("REM Sleep looked over")
    assert any("named things this run did not do" in note for note in outcome.notes)
    store.close()


def _chat_models(server) -> list[str]:
    return [body["model"] for path, body in server.requests if path.endswith("/chat") or path.endswith("completions")]


def ruff_store_dreaming_with(home, provider: str, url: str):
    """The ruff store reopened with an LLM (`provider` at `url`) and dream.model: dreamer."""
    ruff_store(home)[0].close()
    (home / "config.yaml").write_text(f"embedding:\n  provider: none\nllm:\n  provider: {provider}\n"
                                      f"  base_url: {url}\ndream:\n  model: dreamer\n")
    config = load_config()
    return Store.open(config.store_location), config


ENTRY = json.dumps({"entry": "The dream noticed the ruff theme."})


def test_unavailable_dream_model_is_retried_once_with_the_default(llmem_home, model_server):
    model_server.chat_status["dreamer"] = 404
    model_server.chat_replies += [ENTRY, ENTRY]
    store, config = ruff_store_dreaming_with(llmem_home, "ollama", model_server.url)
    outcome = run_dream(store, config, apply=True)
    # dreamer once (404), then llama3.1:8b for each phase with material; dreamer not asked again.
    assert _chat_models(model_server)[0] == "dreamer"
    assert _chat_models(model_server).count("dreamer") == 1
    assert set(_chat_models(model_server)[1:]) == {"llama3.1:8b"}
    assert outcome.narratives["rem"] == {"by": "model llama3.1:8b", "text": "The dream noticed the ruff theme."}
    assert any("dreamer unavailable" in note and "retrying once" in note for note in outcome.notes)
    store.close()


def test_a_refused_dream_model_is_not_retried_and_stays_visible(llmem_home, model_server):
    model_server.chat_status["dreamer"] = 401
    store, config = ruff_store_dreaming_with(llmem_home, "openai", model_server.url)
    outcome = run_dream(store, config, apply=True)
    assert _chat_models(model_server) == ["dreamer"]  # no retry, no second phase asked
    assert any("dreamer was refused (401" in note for note in outcome.notes)
    assert outcome.narratives["rem"]["text"] is None
    run = store.models.DreamRun.get(store.models.DreamRun.id == outcome.run_id)
    assert any("refused" in note for note in run.summary["notes"])
    assert "_Narrative: none: the diary model was refused" in (llmem_home / "DREAMS.md").read_text()
    store.close()


def test_no_model_answering_falls_back_to_the_template(llmem_home):
    store, config = ruff_store_dreaming_with(llmem_home, "ollama", free_port_url())
    outcome = run_dream(store, config, apply=True)
    assert outcome.narratives["rem"]["by"] == "template"
    assert outcome.narratives["deep"]["by"] == "template"
    unavailable = [n for n in outcome.notes if "unavailable" in n]
    assert len(unavailable) == 2 and "dreamer" in unavailable[0] and "llama3.1:8b" in unavailable[1]
    store.close()


def test_phase_reports_gain_one_section_per_run(llmem_home):
    store, config = ruff_store(llmem_home, "dream:\n  phase_reports: true\n")
    first = run_dream(store, config, apply=True, use_llm=False)
    run_dream(store, config, apply=True, use_llm=False)  # nothing new: no section
    busy = add(store, "pytest runs with -n 2 here")
    recall(store, busy, [f"tests {i}" for i in range(6)], days_ago=[0, 0, 1, 1, 2, 3])
    second = run_dream(store, config, apply=True, use_llm=False)
    day = datetime.now().astimezone().strftime("%Y-%m-%d")
    for phase in ("light", "rem", "deep"):
        text = (llmem_home / "dreaming" / phase / f"{day}.md").read_text()
        assert text.count("\n## Run ") == 2
        assert first.run_id in text and second.run_id in text
    store.close()


def test_no_diary_entry_for_a_run_with_nothing_new(llmem_home):
    store, config = ruff_store(llmem_home)
    run_dream(store, config, apply=True, use_llm=False)
    diary = (llmem_home / "dream-diary.md").read_text()
    dreams = (llmem_home / "DREAMS.md").read_text()
    assert diary.count("## Dream run") == 1
    llm = StubLLM({"entry": "The dream noticed the ruff theme."})
    quiet = run_dream(store, config, apply=True, diary_llm=llm)
    assert not quiet.actions
    assert llm.tasks == [] and quiet.narratives == {}  # no model asked to retell old themes
    assert (llmem_home / "dream-diary.md").read_text() == diary
    assert dreams == (llmem_home / "DREAMS.md").read_text()  # still the run that did something
    store.close()


def test_themes_skip_filler_words_and_name_their_memories(llmem_home):
    store, config = open_store(llmem_home)
    ids = [add(store, text).id for text in (
        "User decided to use ruff for linting; yes, none of black",
        "User decided to use ruff format too. Recurring: none",
        "User prefers pytest; yes, use ruff in CI")]
    outcome = run_dream(store, config, phases=["rem"])
    terms = {t for theme in outcome.rem.themes for t in theme["terms"]}
    assert "ruff" in terms
    assert not {"user", "none", "yes", "use", "decided"} & terms
    ruff = next(theme for theme in outcome.rem.themes if "ruff" in theme["terms"])
    assert ruff["memories"] == 3
    assert {s["id"] for s in ruff["sources"]} == set(ids)
    assert all(s["text"] for s in ruff["sources"])
    code, out, _ = run_cli("dream", "--phase", "rem")
    assert "theme ruff (3 memories)" in out and any(i[:8] in out for i in ids)
    store.close()


def test_light_says_why_it_skipped(llmem_home):
    store, _ = ruff_store(llmem_home)
    store.close()
    code, out, _ = run_cli("dream", "--phase", "light")
    assert code == 0
    assert "0 changed vs 0" not in out
    assert "0 memories embedded" in out and "llmem embed" in out and "embedding.provider: none" in out


def test_light_says_nothing_changed_since_the_last_run(llmem_home):
    store, config, _ = pair_store(llmem_home, first="plain")
    run_dream(store, config, apply=True, use_llm=False)
    again = run_dream(store, config, phases=["light"])
    assert again.light.skipped.startswith("no memory embedded since the last light run")
    store.close()


def test_preview_status_and_dreams_md_report_one_count(llmem_home):
    store, config, emb = pair_store(llmem_home, first="plain")
    busy = add(store, "ruff is the linter for this repo", embedder=emb)
    recall(store, busy, [f"lint {i}" for i in range(6)], days_ago=[0, 0, 1, 1, 2, 3])
    store.close()
    code, out, _ = run_cli("dream", "--json")
    preview = json.loads(out)
    proposed = sum(sum(kinds.values()) for kinds in preview["counts"].values())
    assert proposed == len(preview["actions"]) >= 3  # merge, boost, promote at least
    code, out, _ = run_cli("dream")
    assert f"{proposed} changes proposed." in out
    code, out, err = run_cli("dream", "--apply", "--no-llm")
    assert f"{proposed} changes made." in out, err
    code, out, _ = run_cli("dream", "status", "--json")
    last = json.loads(out)["last_run"]
    assert last["changes"] == proposed
    assert last["writes"] > proposed  # the journal's rows are not what the user counts
    code, out, _ = run_cli("dream", "status")
    assert f": {proposed} changes (" in out
    dreams = (llmem_home / "DREAMS.md").read_text()
    per_phase = [int(n) for n in re.findall(r"_Run \w+, [^:]+:\d\d [^:]*: (\d+) changes?_", dreams)]
    assert len(per_phase) == 3 and sum(per_phase) == proposed


@pytest.mark.parametrize("text", [HOSTILE, "- a list item", "1. numbered", "> quoted", "a & b < c"])
def test_md_escape_never_leaves_markdown_or_html(text):
    from llmem.dream.narrate import md

    out = md(text)
    assert "<" not in out and "`" not in out.replace("\\`", "")
    assert not re.match(r"^([-+>#]|\d+\.)", out)


def test_grounding_keeps_paraphrase_and_drops_inventions():
    from llmem.dream.narrate import grounded

    material = ("- Theme “ruff” in 3 memories: ab12cd34 “ruff is the linter for this repo”.\n"
                "- Promoted ab12cd34 (score 0.84, 6 recalls): “ruff is the linter for this repo”.")
    reply = ("Tonight the REM phase reflected on 3 memories, and ruff came back as the main theme. "
             "The linter memory was promoted after 6 recalls. "
             "Kubernetes restarted the linter. "
             "It ran 12 times. "
             "The config lives in pyproject.toml.")
    assert grounded(reply, material) == ("Tonight the REM phase reflected on 3 memories, and ruff came back as "
                                         "the main theme. The linter memory was promoted after 6 recalls.")


def test_one_phase_run_rewrites_only_its_own_block(llmem_home):
    store, config, _ = pair_store(llmem_home, first="plain")
    run_dream(store, config, apply=True, use_llm=False)
    path = llmem_home / "DREAMS.md"
    before = path.read_text()
    busy = add(store, "ruff is the linter for this repo")
    recall(store, busy, [f"lint {i}" for i in range(6)], days_ago=[0, 0, 1, 1, 2, 3])
    deep = run_dream(store, config, apply=True, use_llm=False, phases=["deep"])
    after = path.read_text()

    def block_of(text: str, phase: str) -> str:
        return text[text.index(marker(phase, "begin")):text.index(marker(phase, "end"))]

    assert block_of(after, "light") == block_of(before, "light")
    assert block_of(after, "rem") == block_of(before, "rem")
    assert deep.run_id in block_of(after, "deep") and deep.run_id not in block_of(before, "deep")
    store.close()
