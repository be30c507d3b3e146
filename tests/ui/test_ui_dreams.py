"""The Dreams page: runs with counts per phase and undo, proposed changes with accept/reject
recorded, promotion candidates with signals and gates and promote, the diary, DREAMS.md and
the sandboxed report."""

from __future__ import annotations

import re

from dream_support import add, recall
from proposals_support import propose_changes

from llmem.dream import DreamLock, run_dream
from llmem.dream.review import list_proposals


def no_inline_code(html: str) -> bool:
    return (not re.findall(r"<script(?![^>]*\bsrc=)", html) and " style=" not in html
            and "<style" not in html and not re.search(r"\son[a-z]+=", html))


def run_row(page: str, run_id: str) -> str:
    return page.split(f'id="run-{run_id}"')[1].split("</tr>")[0]


def strong_candidate(store):
    """A memory recalled often enough, by enough queries, on enough days to pass every gate."""
    memory = add(store, "the deploy script needs the staging vpn and a fresh token from vault",
                 "procedure", age_days=10)
    recall(store, memory, [f"deploy question {i}" for i in range(8)], score=0.95,
           days_ago=[0, 0.5, 1, 2, 3, 4, 5, 6])
    return memory


def test_runs_with_counts_per_phase_and_undo_asked_once(viewer):
    store, config = viewer.store, viewer.llmem.config
    outcome = propose_changes(store, config)  # a REM run: a Tier 1 procedure, proposals, a diary
    Memory = store.models.Memory
    created = Memory.get(Memory.type == "procedure")
    page = viewer.get("/dreams").text
    assert no_inline_code(page)
    row = run_row(page, outcome.run_id)
    assert "status-done" in row and "<strong>rem</strong>" in row and "insight 1" in row
    assert f'href="/dreams/runs/{outcome.run_id}/undo"' in row
    confirm = viewer.get(f"/dreams/runs/{outcome.run_id}/undo")
    assert confirm.status_code == 200 and f'action="/dreams/runs/{outcome.run_id}/undo"' in confirm.text
    assert Memory.get_or_none(Memory.id == created.id) is not None  # the GET changed nothing
    response = viewer.post(f"/dreams/runs/{outcome.run_id}/undo")
    assert response.status_code == 303
    assert Memory.get_or_none(Memory.id == created.id) is None
    assert not config.paths.proposed_changes_path.exists()  # the file the run wrote is gone
    after = viewer.get(response.headers["location"]).text
    assert "created memories removed" in after and "status-undone" in run_row(after, outcome.run_id)
    assert 'href="/dreams/runs/' not in run_row(after, outcome.run_id)
    # Undone twice: said, not a traceback.
    again = viewer.post(f"/dreams/runs/{outcome.run_id}/undo")
    assert again.status_code == 400 and "already undone" in again.text


def test_undo_from_the_viewer_keeps_a_memory_edited_since_the_run(viewer):
    # Issue 20 item 4: the viewer's Undo, like the CLI's, leaves the user's edit and says so.
    store, config = viewer.store, viewer.llmem.config
    outcome = propose_changes(store, config)
    Memory = store.models.Memory
    created = Memory.get(Memory.type == "procedure")
    store.update(created.id, content="check the user is not None before reading .name (my words)")
    response = viewer.post(f"/dreams/runs/{outcome.run_id}/undo")
    assert response.status_code == 303
    after = viewer.get(response.headers["location"]).text
    assert "memories edited since the run, left as they are" in after and created.id[:8] in after
    assert f"llmem dream undo {outcome.run_id} --force" in after
    assert store.get(created.id).content == "check the user is not None before reading .name (my words)"


def test_undo_waits_for_a_running_dream(viewer):
    outcome = propose_changes(viewer.store, viewer.llmem.config)
    with DreamLock(viewer.store.db, "someoneelse", what="dream"):
        response = viewer.post(f"/dreams/runs/{outcome.run_id}/undo")
    assert response.status_code == 303
    assert "Not undone" in viewer.get(response.headers["location"]).text
    assert viewer.store.models.DreamRun.get_by_id(outcome.run_id).status == "done"


def test_accepting_a_skill_patch_records_the_decision_and_applies_nothing(viewer):
    store, config = viewer.store, viewer.llmem.config
    propose_changes(store, config)
    path = config.paths.proposed_changes_path
    text_before = path.read_text()
    page = viewer.get("/dreams").text
    card = page.split('id="proposal-skill-patch:EDGE_CASE"')[1].split("</article>")[0]
    assert "[SKILL PATCH] EDGE_CASE" in card and "<h4>Checklist</h4>" in card and "waiting" in card
    response = viewer.post("/dreams/proposals/accept", proposal="skill-patch:EDGE_CASE", note="looks right")
    assert response.status_code == 303
    assert response.headers["location"].endswith("#proposal-skill-patch:EDGE_CASE")
    decided = {p.id: p.decision for p in list_proposals(store.db, path)}
    assert decided["skill-patch:EDGE_CASE"].decision == "accepted"
    assert decided["skill-patch:EDGE_CASE"].by.startswith("llmem ui ")
    assert decided["skill-patch:EDGE_CASE"].note == "looks right"
    assert decided["insight:EDGE_CASE"] is None
    assert path.read_text() == text_before
    page = viewer.get(response.headers["location"]).text
    assert "Nothing was applied" in page
    card = page.split('id="proposal-skill-patch:EDGE_CASE"')[1].split("</article>")[0]
    assert "decision-accepted" in card and "“looks right”" in card
    viewer.post("/dreams/proposals/reject", proposal="insight:EDGE_CASE")
    assert list_proposals(store.db, path)[0].decision.decision == "rejected"
    assert viewer.post("/dreams/proposals/accept", proposal="skill-patch:NOPE").status_code == 404
    assert viewer.post("/dreams/proposals/apply", proposal="skill-patch:EDGE_CASE").status_code == 400


def test_hostile_proposal_diary_and_dreams_md_text_is_escaped(viewer):
    config = viewer.llmem.config
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    path = config.paths.proposed_changes_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Proposed changes\n\n## [SKILL PATCH] X {hostile}\n<!-- llmem:skill-patch X -->\n{hostile}\n")
    config.diary_path.write_text(f"# Diary\n{hostile}\n")
    (config.diary_path.parent / "DREAMS.md").write_text(f"# Dreams\n{hostile}\n")
    page = viewer.get("/dreams").text
    assert "<script>alert" not in page and "<img src=x" not in page
    # The heading, the entry's body (its heading line is the heading), the diary, DREAMS.md.
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 4
    assert 'id="dreams-md"' in page


def test_promotion_candidates_show_signals_and_gates_and_promote(viewer):
    store = viewer.store
    strong = strong_candidate(store)
    weak = add(store, "a note recalled once", age_days=3)
    recall(store, weak, ["one question"])
    page = viewer.get("/dreams").text
    card = page.split(f'id="candidate-{strong.id}"')[1].split("</article>")[0]
    assert "verdict <strong class=\"gate-pass\">promote</strong>" in card
    for signal in ("relevance", "frequency", "query diversity", "recency", "consolidation",
                   "conceptual richness", "phase boost"):
        assert f"<td>{signal}</td>" in card
    assert card.count('class="gate-pass">pass') == 3
    weak_card = page.split(f'id="candidate-{weak.id}"')[1].split("</article>")[0]
    assert "hold: fails" in weak_card and 'class="gate-fail">fail' in weak_card
    assert "Promote the 1 ready memory" in page
    response = viewer.post("/dreams/promote")
    assert response.status_code == 303
    Memory = store.models.Memory
    assert Memory.get_by_id(strong.seq).promoted_at is not None
    assert Memory.get_by_id(weak.seq).promoted_at is None
    run = store.models.DreamRun.get(store.models.DreamRun.kind == "promote")
    assert response.headers["location"].startswith("/dreams?flash=")
    assert response.headers["location"].endswith(f"#run-{run.id}")
    assert "promote 1" in run_row(viewer.get("/dreams").text, run.id)
    nothing = viewer.post("/dreams/promote")
    assert "nothing promoted" in viewer.get(nothing.headers["location"]).text


def test_the_page_scores_the_candidates_once(viewer, monkeypatch):
    """Scoring reads every recall (~120 ms on 5k memories): the waiting counts and the
    candidate list come from one scoring."""
    import llmem.dream.promote as promote
    import llmem.dream.status as status
    import llmem.ui.pages.dreams as page_module

    scored = promote.ranked_top
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return scored(*args, **kwargs)

    for module in (promote, status, page_module):
        monkeypatch.setattr(module, "ranked_top", counted, raising=False)
    strong_candidate(viewer.store)
    weak = add(viewer.store, "a note recalled once", age_days=3)
    recall(viewer.store, weak, ["one question"])
    page = viewer.get("/dreams").text
    assert len(calls) == 1
    assert "1 memories ready for promotion (1 held back by the gates)" in page


def test_the_report_is_served_sandboxed(viewer):
    add(viewer.store, "<script>alert(1)</script> a memory", "fact", age_days=2)
    response = viewer.get("/dreams/report")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert policy.startswith("sandbox;") and "script-src" not in policy and "default-src 'none'" in policy
    assert "llmem dream report" in response.text and "preview" in response.text
    assert "<script>alert" not in response.text
    # Pages keep their own policy.
    assert viewer.get("/dreams").headers["content-security-policy"].startswith("default-src 'self'")


def test_the_report_file_of_the_last_run_is_served_when_configured(viewer, tmp_path):
    report_file = tmp_path / "report.html"
    config = viewer.llmem.config = viewer.llmem.config.with_values({"dream": {"report_path": str(report_file)}})
    outcome = run_dream(viewer.store, config, apply=True, phases=["rem"])
    assert report_file.is_file()
    served = viewer.get("/dreams/report").text
    assert f"run {outcome.run_id}" in served
    assert "preview" in viewer.get("/dreams/report", params={"preview": "1"}).text
    assert 'href="/dreams/report?preview=1"' in viewer.get("/dreams").text


def test_a_hand_edited_marker_id_still_redirects_to_a_valid_url(viewer):
    path = viewer.llmem.config.paths.proposed_changes_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('## [SKILL PATCH] odd\n<!-- llmem:skill-patch ünïcode"<b> -->\ntext\n')
    response = viewer.post("/dreams/proposals/reject", proposal='skill-patch:ünïcode"<b>')
    assert response.status_code == 303
    assert response.headers["location"].endswith("#proposal-skill-patch:%C3%BCn%C3%AFcode%22%3Cb%3E")
    assert list_proposals(viewer.store.db, path)[0].decision.decision == "rejected"


def test_a_candidate_shows_its_counted_recalls_and_its_shadow_verdict_escaped(viewer):
    from fakes import StubLLM

    from llmem.dream.shadow import run_shadow_trial

    store = viewer.store
    strong = strong_candidate(store)
    stub = StubLLM()
    stub.reply = lambda _n: ({"answer": "an answer"} if stub.tasks[-1] != "dream_shadow_judge" else
                             {"verdict": "harmful", "reason": "<script>alert(1)</script> misleading",
                              "risk_flags": ["stale"]})
    assert run_shadow_trial(store, viewer.llmem.config, llm=stub).ran
    card = viewer.get("/dreams").text.split(f'id="candidate-{strong.id}"')[1].split("</article>")[0]
    assert "8 counted recalls of 8 recorded" in card and "on 7 days from 8 query contexts" in card
    assert "Shadow trial (report-only): harmful → reject" in card and "risk flags: stale" in card
    assert "<script>alert" not in card and "&lt;script&gt;" in card


def test_runs_count_changes_as_the_cli_does_and_say_when_dreaming_is_off(viewer):
    from fakes import FakeEmbedder

    from llmem.dream.switch import set_dream_enabled

    store, config = viewer.store, viewer.llmem.config
    emb = FakeEmbedder(dim=512)
    add(store, "the deploy script lives in scripts/deploy.sh and needs AWS_PROFILE", embedder=emb)
    add(store, "the deploy script lives in scripts/deploy.sh and it needs AWS_PROFILE", embedder=emb)
    outcome = run_dream(store, config, apply=True, use_llm=False)
    assert outcome.action_counts()["deep"]["merge"] == 1
    row = run_row(viewer.get("/dreams").text, outcome.run_id)
    # One merge is one change, not the seven journal rows it wrote.
    assert "merge 1" in row and "merge 7" not in row
    set_dream_enabled(store, config, False)
    assert "none: dreaming is off" in viewer.get("/dreams").text


def test_proposals_are_rendered_not_shown_as_markdown_with_their_markers(viewer):
    propose_changes(viewer.store, viewer.llmem.config)
    page = viewer.get("/dreams").text
    card = page.split('id="proposal-skill-patch:EDGE_CASE"')[1].split("</article>")[0]
    assert "llmem:skill-patch" not in card and "&lt;!--" not in card and "<!--" not in card
    assert "###" not in card and "- [ ]" not in card
    assert "<h4>Detection Rule</h4>" in card and "<ul><li>☐ " in card
    insight = page.split('id="proposal-insight:EDGE_CASE"')[1].split("</article>")[0]
    assert "llmem:insight" not in insight and "<li>Seen: 3 self_assessments" in insight


def test_the_markdown_renderer_escapes_everything_it_is_given():
    from llmem.ui.markdown import render_markdown

    html = str(render_markdown("# T <b>x</b>\n\n- **bold** and `<i>code</i>`\n1. one\n\n"
                               "```\n<script>alert(1)</script>\n```\npara <img src=x> line\nnext"))
    assert "<b>" not in html and "<i>" not in html and "<script>" not in html and "<img" not in html
    assert "<h2>T &lt;b&gt;x&lt;/b&gt;</h2>" in html
    assert "<ul><li><strong>bold</strong> and <code>&lt;i&gt;code&lt;/i&gt;</code></li></ul><ol><li>one</li></ol>" in html
    assert "<pre><code>&lt;script&gt;alert(1)&lt;/script&gt;</code></pre>" in html
    assert "<p>para &lt;img src=x&gt; line next</p>" in html
