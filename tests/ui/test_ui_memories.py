"""The Memories pages over a real store, request by request."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading

from llmem.times import now


def ids_on(html: str) -> list[str]:
    """Memory ids linked from the page, in order, once each."""
    return list(dict.fromkeys(re.findall(r'href="/memories/([0-9a-f-]{16,36})"', html)))


def test_the_list_filters_by_type_project_and_validity(viewer):
    store = viewer.store
    fact = store.add("the api listens on 8080", "fact", project="/work/api").memory
    decision = store.add("we chose postgres over mysql", "decision", project="/work/api").memory
    other = store.add("the blog uses hugo", "fact", project="/work/blog").memory
    gone = store.add("the cache is redis", "fact", project="/work/api").memory
    store.invalidate(gone.id, "moved to memcached")
    expired = store.add("the freeze lasts until friday", "event", valid_until=now() - 60).memory
    newer = store.add("the api listens on 9090", "fact", project="/work/api").memory
    store.relate(newer.id, fact.id, "supersedes")

    def shown(**params):
        response = viewer.get("/memories", params=params)
        assert response.status_code == 200
        return set(ids_on(response.text))

    assert shown() == {fact.id, decision.id, other.id, expired.id, newer.id}
    assert shown(type="decision") == {decision.id}
    assert shown(project="/work/blog") == {other.id}
    assert shown(validity="invalid") == {gone.id}
    assert shown(validity="valid") == {decision.id, other.id, newer.id}  # expired, superseded out
    assert shown(validity="all", project="/work/api") == {fact.id, decision.id, gone.id, newer.id}
    assert shown(type="no-such-type") == shown()  # an unknown choice is no filter
    page = viewer.get("/memories").text
    assert '<option selected>current</option>' in page
    assert "/work/blog</option>" in page  # the project filter offers the store's projects


def test_the_list_pages_newest_first(viewer):
    made = [viewer.store.add(f"note number {n}", created_at=1_000_000 + n).memory for n in range(60)]
    first = viewer.get("/memories").text
    second = viewer.get("/memories", params={"page": 2}).text
    assert ids_on(first) == [m.id for m in reversed(made)][:50]
    assert ids_on(second) == [m.id for m in reversed(made)][50:]
    assert "older →" in first and "← newer" in second and "older →" not in second
    assert viewer.get("/memories", params={"page": "x"}).status_code == 200


def test_search_is_the_clis_search_with_its_explain_breakdown(viewer, cli):
    store = viewer.store
    store.add("deploys to staging need the vpn turned on", "procedure")
    store.add("the vpn client is wireguard", "fact")
    store.add("lunch is at noon", "event")
    code, out, err = cli("search", "vpn staging", "--fts-only", "--explain", "--json", "--no-track")
    assert code == 0, err
    expected = json.loads(out)
    page = viewer.get("/memories", params={"q": "vpn staging"}).text
    assert ids_on(page) == [row["id"] for row in expected]
    for row in expected:
        assert f"score <strong>{row['explain']['final']:.4f}</strong>" in page
        assert f"<th>bm25</th><td class=\"num\">{row['explain']['bm25']:.4f}</td>" in page
    assert page.count('<rect class="bar-fts"') == len(expected)
    assert "fts search" in page


def test_search_records_no_recall_and_respects_the_filters(viewer):
    store = viewer.store
    kept = store.add("the vpn is wireguard", "fact").memory
    gone = store.add("the vpn is openvpn", "fact").memory
    store.invalidate(gone.id, "replaced")
    assert ids_on(viewer.get("/memories", params={"q": "vpn"}).text) == [kept.id]
    assert set(ids_on(viewer.get("/memories", params={"q": "vpn", "validity": "all"}).text)) == {kept.id, gone.id}
    assert ids_on(viewer.get("/memories", params={"q": "vpn", "validity": "invalid"}).text) == [gone.id]
    assert ids_on(viewer.get("/memories", params={"q": "vpn", "type": "decision"}).text) == []
    assert store.get(kept.id).access_count == 0
    assert store.models.RecallEvent.select().count() == 0


def test_a_memory_page_shows_metadata_relations_neighbours_journal_and_recalls(viewer):
    from llmem.dream.journal import Journal, finish_run, start_run

    store = viewer.store
    memory = store.add("the api listens on 8080", "fact", project="/work/api", session_id="ses_api",
                       metadata={"rule": "explicit"}).memory
    older = store.add("the api listens on 80", "fact").memory
    sibling = store.add("the api runs under gunicorn", "fact").memory
    far = store.add("gunicorn runs four workers", "fact").memory
    store.relate(memory.id, older.id, "supersedes")
    store.relate(sibling.id, memory.id, "related_to")
    store.relate(sibling.id, far.id, "depends_on")
    run = start_run(store, "dream", ["deep"])
    with store.db.atomic():
        Journal(store, run).update("deep", "decay", memory.id, {"confidence": 0.55})
    finish_run(store, run, {})
    store.models.RecallEvent.create(memory=memory.id, query_hash="abc123", rank=2, score=0.5,
                                    origin="context", created_at=now())
    page = viewer.get(f"/memories/{memory.id[:8]}").text
    assert "the api listens on 8080" in page
    assert "/work/api" in page and "ses_api" in page and "&#34;rule&#34;: &#34;explicit&#34;" in page
    assert "this supersedes →" in page and "the api listens on 80" in page
    assert "← related_to this" in page and "the api runs under gunicorn" in page
    assert "gunicorn runs four workers" in page  # a neighbour's neighbour
    assert run.id in page and "decay (update)" in page
    assert re.search(r"confidence</span> 0\.7000 → 0\.5500", page)
    assert "1 recall." in page and "abc123" in page and "context" in page


def test_an_unknown_memory_is_a_404_page(viewer):
    response = viewer.get("/memories/0123abcd")
    assert response.status_code == 404
    assert "no memory with id" in response.text
    assert viewer.get("/memories/zz").status_code == 400  # too short a prefix


def test_edit_saves_through_the_store_and_says_so_once(viewer):
    memory = viewer.store.add("the api listens on 8080").memory
    form = viewer.get(f"/memories/{memory.id}/edit").text
    assert 'name="csrf"' in form and "the api listens on 8080</textarea>" in form
    assert f'name="version" value="{memory.version}"' in form
    response = viewer.post(f"/memories/{memory.id}/edit", content="the api listens on 9090",
                           summary="api port", type="decision", confidence="0.8", version=memory.version)
    assert response.status_code == 303
    target = response.headers["location"]
    assert target.startswith(f"/memories/{memory.id}?flash=")
    edited = viewer.store.get(memory.id)
    assert (edited.content, edited.summary, edited.type, edited.confidence) == (
        "the api listens on 9090", "api port", "decision", 0.8)
    assert "Saved" in viewer.get(target).text
    assert "Saved" not in viewer.get(target).text  # shown once
    assert viewer.get("/memories", params={"q": "9090"}).text.count(memory.id[:8]) >= 1  # FTS follows


def test_edit_with_bad_values_changes_nothing(viewer):
    memory = viewer.store.add("the api listens on 8080").memory
    for fields in ({"content": "x", "confidence": "high"}, {"content": "x", "confidence": "7"},
                   {"content": "   ", "confidence": "0.5"}):
        response = viewer.post(f"/memories/{memory.id}/edit", version=memory.version, **fields)
        assert response.status_code == 400, fields
    assert viewer.post(f"/memories/{memory.id}/edit", content="no version").status_code == 400
    kept = viewer.store.get(memory.id)
    assert (kept.content, kept.confidence) == ("the api listens on 8080", 0.7)


def test_correct_supersedes_and_invalidates(viewer):
    memory = viewer.store.add("the api listens on 8080", "fact", project="/work/api").memory
    assert "Supersede" in viewer.get(f"/memories/{memory.id}/correct").text
    response = viewer.post(f"/memories/{memory.id}/correct", content="the api listens on 9090",
                           reason="moved", version=memory.version)
    assert response.status_code == 303
    newer_id = response.headers["location"].split("/memories/")[1].split("?")[0]
    newer = viewer.store.get(newer_id)
    assert newer.content == "the api listens on 9090" and newer.project == "/work/api"
    old = viewer.store.get(memory.id)
    assert old.invalidated_at is not None and old.metadata["invalidation_reason"] == "moved"
    assert "supersedes" in viewer.get(response.headers["location"]).text


def test_invalidate_asks_once_then_invalidates_with_the_reason(viewer):
    memory = viewer.store.add("the api listens on 8080").memory
    confirm = viewer.get(f"/memories/{memory.id}/invalidate").text
    assert "Invalidate this memory?" in confirm and 'name="reason"' in confirm
    assert viewer.store.get(memory.id).invalidated_at is None  # asking changed nothing
    assert viewer.post(f"/memories/{memory.id}/invalidate", reason="", version=1).status_code == 400
    response = viewer.post(f"/memories/{memory.id}/invalidate", reason="the port moved", version=1)
    assert response.status_code == 303
    invalid = viewer.store.get(memory.id)
    assert invalid.invalidated_at is not None
    assert invalid.metadata["invalidation_reason"] == "the port moved"
    again = viewer.post(f"/memories/{memory.id}/invalidate", reason="twice", follow_redirects=True)
    assert "Already invalidated (the port moved)" in again.text
    assert viewer.store.get(memory.id).invalidated_at == invalid.invalidated_at


def test_delete_asks_once_then_deletes(viewer):
    memory = viewer.store.add("the api listens on 8080").memory
    other = viewer.store.add("the db listens on 5432").memory
    viewer.store.relate(memory.id, other.id, "related_to")
    assert "Delete this memory for good?" in viewer.get(f"/memories/{memory.id}/delete").text
    assert viewer.store.get(memory.id)
    response = viewer.post(f"/memories/{memory.id}/delete")
    assert response.status_code == 303 and response.headers["location"].startswith("/memories?flash=")
    assert viewer.get(f"/memories/{memory.id}").status_code == 404
    assert viewer.store.relations_of([other.id]) == []
    assert "Deleted" in viewer.get(response.headers["location"]).text


# ---- a form loaded before a concurrent change is refused with a diff (issue 20 item 8) ------

def test_a_stale_edit_form_is_refused_with_a_diff_and_writes_nothing(viewer):
    memory = viewer.store.add("the api listens on 8080", confidence=0.6).memory
    form = viewer.get(f"/memories/{memory.id}/edit").text
    assert f'name="version" value="{memory.version}"' in form
    viewer.store.update(memory.id, content="the api listens on 8443 behind nginx", confidence=0.95)  # the CLI
    response = viewer.post(f"/memories/{memory.id}/edit", content="the api listens on 8080 (typo fixed)",
                           confidence="0.6", version=memory.version)
    assert response.status_code == 409
    page = response.text
    assert "changed since the form was loaded" in page and "Nothing was written" in page
    assert "the api listens on 8443 behind nginx" in page and "the api listens on 8080 (typo fixed)" in page
    assert "-the api listens on 8443 behind nginx" in page and "+the api listens on 8080 (typo fixed)" in page
    kept = viewer.store.get(memory.id)
    assert (kept.content, kept.confidence) == ("the api listens on 8443 behind nginx", 0.95)
    # The conflict page's form carries the current version: submitting it again is deliberate.
    assert f'name="version" value="{kept.version}"' in page
    again = viewer.post(f"/memories/{memory.id}/edit", content="the api listens on 8080 (typo fixed)",
                        confidence="0.6", version=kept.version)
    assert again.status_code == 303
    assert viewer.store.get(memory.id).content == "the api listens on 8080 (typo fixed)"


def test_stale_correct_and_invalidate_forms_are_refused(viewer):
    memory = viewer.store.add("the api listens on 8080").memory
    assert f'name="version" value="{memory.version}"' in viewer.get(f"/memories/{memory.id}/correct").text
    assert f'name="version" value="{memory.version}"' in viewer.get(f"/memories/{memory.id}/invalidate").text
    viewer.store.update(memory.id, content="the api listens on 9090")
    correct = viewer.post(f"/memories/{memory.id}/correct", content="the api listens on 7070",
                          version=memory.version)
    assert correct.status_code == 409 and "the api listens on 9090" in correct.text
    invalidate = viewer.post(f"/memories/{memory.id}/invalidate", reason="gone", version=memory.version)
    assert invalidate.status_code == 409
    kept = viewer.store.get(memory.id)
    assert kept.invalidated_at is None and kept.content == "the api listens on 9090"
    assert [m.content for m in viewer.store.list(limit=None)] == ["the api listens on 9090"]


WRITER = textwrap.dedent("""
    import os, sys, time
    from llmem.app import App
    store = App().store
    n = 0
    while not os.path.exists(sys.argv[1]):
        with store.db.atomic():
            for _ in range(20):
                store.add(f"written by another process {n}")
                n += 1
        if n == 20:
            print("writing", flush=True)
        time.sleep(0.02)  # a worker writes one extraction's transaction, then reads the next
    print(n)
""")


def test_the_viewer_never_hits_a_lock_while_another_process_writes(viewer, tmp_path):
    """A writer in another process, as the worker is during `llmem run`, a transaction of 20
    memories every 20 ms: pages, searches and edits all succeed (reads are WAL snapshots,
    writes wait their turn within the busy timeout)."""
    memory = viewer.store.add("the api listens on 8080").memory
    stop = tmp_path / "stop-writing"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(stop)], stdout=subprocess.PIPE, text=True)
    statuses = []
    try:
        assert writer.stdout.readline() == "writing\n"
        for n in range(4):
            statuses.append(viewer.get("/memories").status_code)
            statuses.append(viewer.get("/memories", params={"q": "written another"}).status_code)
            statuses.append(viewer.post(f"/memories/{memory.id}/edit", content=f"the api listens on {n}",
                                        confidence="0.7", version=1 + n).status_code)
        assert writer.poll() is None  # it wrote all along
    finally:
        stop.touch()
        written = int(writer.communicate(timeout=30)[0])
    assert statuses == [200, 200, 303] * 4
    assert written > 20
    assert viewer.store.get(memory.id).content == "the api listens on 3"


def test_concurrent_requests_share_the_store_safely(viewer):
    for n in range(30):
        viewer.store.add(f"memory {n} about threads")
    results = []

    def browse():
        for _ in range(5):
            results.append(viewer.get("/memories", params={"q": "threads"}).status_code)

    threads = [threading.Thread(target=browse) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * 20


def test_hybrid_search_draws_the_semantic_share_as_the_cli_explains_it(ollama_config, cli):
    from llmem.app import App
    from llmem.vectors import embed_pending

    from .conftest import open_viewer

    app = App()
    try:
        for text in ("deploys to staging need the vpn turned on", "the vpn client is wireguard",
                     "staging deploys run from the release branch", "lunch is at noon"):
            app.store.add(text, "fact")
        assert embed_pending(app.store, app.embedder) == 4
        code, out, err = cli("search", "staging vpn", "--explain", "--json", "--no-track")
        assert code == 0, err
        expected = json.loads(out)
        with open_viewer(app) as viewer:
            page = viewer.get("/memories", params={"q": "staging vpn"}).text
        assert "hybrid search" in page
        assert ids_on(page) == [row["id"] for row in expected]
        assert any(row["explain"]["vec_rank"] for row in expected)
        widths = [float(w) for w in re.findall(r'<rect class="bar-vec" x="[^"]+" y="0" width="([^"]+)"', page)]
        assert len(widths) == len(expected)
        assert any(width > 0 for width in widths)
        for width, row in zip(widths, expected, strict=True):
            if not row["explain"]["vec_rank"]:
                assert width == 0
            assert f"score <strong>{row['explain']['final']:.4f}</strong>" in page
    finally:
        app.close()


def test_the_breakdown_shares_add_up_to_the_final_score():
    from llmem.search import PRIOR_WEIGHT, Hit
    from llmem.ui.pages.memories import BAR_WIDTH, _breakdown

    lexical, semantic = 0.6, 0.3
    relevance = lexical + semantic - lexical * semantic
    hit = Hit(memory=None, score=(1 - PRIOR_WEIGHT) * relevance + PRIOR_WEIGHT * 0.62, fts_rank=2, vec_rank=5,
              signal=0.62, relevance=relevance, lexical=lexical, semantic=semantic)
    drawn = _breakdown(hit)
    shares = {s["name"]: s["share"] for s in drawn["segments"]}
    assert abs(sum(shares.values()) - hit.score) < 1e-9
    assert shares["fts"] > shares["vec"] > 0 and abs(shares["sig"] - 0.62 * PRIOR_WEIGHT) < 1e-9
    right = drawn["segments"][-1]
    assert abs(right["x"] + right["width"] - hit.score * BAR_WIDTH) < 0.05


def test_search_in_a_project_includes_the_global_memories_as_the_cli_does(viewer):
    store = viewer.store
    mine = store.add("the vpn for api deploys", project="/work/api").memory
    shared = store.add("the vpn needs the yubikey").memory
    store.add("the vpn of the blog", project="/work/blog")
    page = viewer.get("/memories", params={"q": "vpn", "project": "/work/api"}).text
    assert set(ids_on(page)) == {mine.id, shared.id}
    assert "in /work/api and the global memories" in page
    listed = viewer.get("/memories", params={"project": "/work/api"}).text
    assert ids_on(listed) == [mine.id]  # the list, as `llmem list --project`, is that project only


def test_a_recall_shows_the_query_that_found_the_memory_not_its_hash(viewer):
    from llmem.search import Searcher, SearchOptions

    store = viewer.store
    memory = store.add("the api listens on 8080", "fact").memory
    Searcher(store, None).search("which port does the api listen on", SearchOptions(mode="fts", track=True))
    recall = store.models.RecallEvent.get(store.models.RecallEvent.memory == memory.id)
    page = viewer.get(f"/memories/{memory.id}").text
    cell = page.split("<th>query</th>")[1].split("</tr>")[1]
    assert "which port does the api listen on" in cell
    assert f">{recall.query_hash}<" not in cell


def test_the_valid_count_is_the_filters_own_count(viewer):
    """The "valid" total is counted from indexes (the current ones less the expired and the
    superseded), not by the filter: it must still say how many the filter lists, whatever
    scope, and count a memory superseded twice once, and one superseded by an invalid one not."""
    store = viewer.store
    at = now()
    old = store.add("the api listens on 8080", "fact", project="/work/api").memory
    first = store.add("the api listens on 9090", "fact", project="/work/api").memory
    second = store.add("the api listens on 9191", "fact", project="/work/api").memory
    store.relate(first.id, old.id, "supersedes")
    store.relate(second.id, old.id, "supersedes")
    kept = store.add("the blog uses hugo", "fact", project="/work/blog").memory
    withdrawn = store.add("the blog uses jekyll", "decision", project="/work/blog").memory
    store.relate(withdrawn.id, kept.id, "supersedes")
    store.invalidate(withdrawn.id, "never happened")
    store.add("the freeze lasts until friday", "event", project="/work/api", valid_until=at - 60)
    store.add("the freeze is lifted on monday", "event", project="/work/api", valid_until=at + 86400)
    gone = store.add("the cache is redis", "fact", project="/work/api").memory
    store.invalidate(gone.id, "moved to memcached")
    store.relate(first.id, gone.id, "supersedes")

    def total(**params):
        text = viewer.get("/memories", params={"validity": "valid", **params}).text
        return int(re.search(r"(\d+) memor(?:y|ies), newest first", text).group(1)), len(ids_on(text))

    assert total() == (4, 4)  # first, second, kept, the freeze lifted on monday
    assert total(project="/work/api") == (3, 3)
    assert total(project="/work/blog") == (1, 1)
    assert total(type="event") == (1, 1)
    assert total(type="decision") == (0, 0)
