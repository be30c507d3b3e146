"""One memory service under three front-ends (issue 21 item 1): the same corrections and
invalidations through the CLI's real command, the MCP tools over the SDK's own client (the
server's tools in this process, through the SDK's in-memory session: what the front-end does,
not its process, is compared here; tests/test_mcp.py drives the real `llmem mcp`) and the
viewer's forms (its request-level test client) leave the same store. The embedder is down throughout (an Ollama URL where nothing listens): every front-end
commits, and the new memory stays pending for `embed --pending`.

It lives beside the viewer's tests for their `open_viewer` fixture.
"""

from __future__ import annotations

from contextlib import closing

import pytest
from conftest import free_port_url
from mcp_client import InProcessMcpClient

from llmem.app import App
from llmem.memories import memory_journal
from llmem.paths import project_root_of

from .conftest import open_viewer

API, WIFI, VPN = "the api listens on 8080", "the office wifi is acme-guest", "deploys need the vpn"


class Cli:
    name = "cli"

    def __init__(self, cli):
        self.run = cli

    def correct(self, memory, content, reason):
        code, out, err = self.run("correct", memory.id, "--content", content, "--reason", reason)
        return code == 0, out + err

    def invalidate(self, memory, reason):
        code, out, err = self.run("invalidate", memory.id, "--reason", reason)
        return code == 0, out + err


class Mcp:
    name = "mcp"

    def __init__(self, client):
        self.client = client

    def _said(self, result):
        return not result.is_error, "\n".join(part.text for part in result.content)

    def correct(self, memory, content, reason):
        return self._said(self.client.call("correct", id=memory.id, content=content, reason=reason))

    def invalidate(self, memory, reason):
        return self._said(self.client.call("correct", id=memory.id, reason=reason))


class Viewer:
    name = "viewer"

    def __init__(self, viewer):
        self.viewer = viewer

    def _said(self, response):
        shown = self.viewer.get(response.headers["location"]).text if response.status_code == 303 else response.text
        return response.status_code == 303, shown

    def correct(self, memory, content, reason):
        return self._said(self.viewer.post(f"/memories/{memory.id}/correct", content=content, reason=reason,
                                           version=memory.version))

    def invalidate(self, memory, reason):
        return self._said(self.viewer.post(f"/memories/{memory.id}/invalidate", reason=reason,
                                           version=memory.version))


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "acme" / ".git").mkdir(parents=True)
    return tmp_path / "acme"


@pytest.fixture(params=["cli", "mcp", "viewer"])
def front_end(request, configure, llmem_home, repo, tmp_path):
    configure(f"embedding:\n  provider: ollama\n  base_url: {free_port_url()}\n  timeout: 2\n"
              "llm:\n  provider: none\n")
    if request.param == "cli":
        yield Cli(request.getfixturevalue("cli"))
    elif request.param == "mcp":
        client = InProcessMcpClient(cwd=repo).start()
        try:
            yield Mcp(client)
        finally:
            client.close()
    else:
        app = App()
        try:
            with open_viewer(app) as viewer:
                yield Viewer(viewer)
        finally:
            app.close()


def state(store) -> list[tuple]:
    """The store as a front-end-independent picture: ids replaced by the texts they name."""
    memories = store.list(include_invalid=True, limit=None)
    text_of = {m.id: m.content for m in memories}
    rows = []
    for m in sorted(memories, key=lambda m: m.content):
        meta = {k: text_of.get(v, v) if isinstance(v, str) else v for k, v in (m.metadata or {}).items()
                if k != "origin"}  # MCP marks its writes; the trust they earn is checked below
        reason = meta.pop("invalidation_reason", None)
        for memory_id, text in text_of.items():
            reason = reason.replace(memory_id, text) if reason else reason
        rows.append((m.content, m.type, m.project, m.session_id, m.source, round(m.confidence, 2),
                     m.invalidated_at is not None, reason, tuple(sorted(meta.items()))))
    relations = sorted((text_of[r.source_id], r.type, text_of[r.target_id])
                       for r in store.relations_of(list(text_of)))
    return rows + relations


def text_of(store, memory_id):
    return store.get(memory_id).content


def test_every_front_end_corrects_and_invalidates_through_one_service(front_end, repo):
    project = project_root_of(str(repo))
    with closing(App()) as seeded:
        api, wifi, vpn = (seeded.store.add(text, "fact", project=project, session_id="ses_1",
                                           confidence=0.6).memory for text in (API, WIFI, VPN))
    said = {}
    said["correct"] = front_end.correct(api, "the api listens on 9090", "moved to 9090")
    said["invalidate"] = front_end.invalidate(wifi, "the office closed")
    with closing(App()) as reading:
        wifi_now = reading.store.get(wifi.id)
    said["again"] = front_end.invalidate(wifi_now, "another reason")
    said["dead"] = front_end.correct(wifi_now, "the office wifi is acme-guest-2", "renamed")
    said["same"] = front_end.correct(vpn, "  Deploys need the VPN ", "no change")

    # "again" is no failure: every front-end says it left the memory as it was.
    assert [said[k][0] for k in ("correct", "invalidate", "dead", "same")] == [True, True, False, False], said
    assert "left as it was" in said["again"][1] and "the office closed" in said["again"][1]
    assert "already invalidated" in said["dead"][1]
    assert "already says" in said["same"][1]
    with closing(App()) as reading:
        store = reading.store
        assert state(store) == [
            (VPN, "fact", project, "ses_1", "user", 0.6, False, None, ()),
            (API, "fact", project, "ses_1", "user", 0.6, True, "moved to 9090", ()),
            ("the api listens on 9090", "fact", project, "ses_1", "user", 0.9, False, None,
             (("corrects", API),)),
            (WIFI, "fact", project, "ses_1", "user", 0.6, True, "the office closed", ()),
            ("the api listens on 9090", "supersedes", API),
        ]
        newer = store.find_duplicate(store.get(api.id).content_hash, project)
        assert newer is None  # the old text is invalid: no valid memory says it any more
        stats = store.stats()
        # The embedder is down: nothing was embedded, and the correction waits for its vector.
        assert (stats["embedded"], stats["pending_embedding"]) == (0, 2)
        correction = [m for m in store.list(limit=None) if m.content.endswith("9090")][0]
        # MCP's writes are the agent's words (llmem/trust.py); the CLI's and the viewer's the user's.
        assert correction.trust == ("agent" if front_end.name == "mcp" else "user")
        # Each write that changed something is journaled once, as made through this front-end;
        # the ones left as they were or refused are not.
        edits = memory_journal(store, edits_only=True)
        runs = list(dict.fromkeys((e.run_id, e.what, e.phase) for e in edits))
        assert [(what, phase) for _, what, phase in runs] == [("invalidate", front_end.name),
                                                              ("correct", front_end.name)]
        assert sorted((e.op, text_of(store, e.memory_id)) for e in edits if e.what == "correct") == [
            ("create", "the api listens on 9090"), ("relate", "the api listens on 9090"), ("update", API)]


def test_a_remember_over_mcp_is_journaled_as_the_agents_and_the_page_says_so(configure, repo):
    # The MCP tools in-process (the parametrised test above runs the real server): a remember
    # goes through the service and is journaled as the agent's; a repeat changes nothing.
    from llmem.mcp_server import MemoryTools

    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    tools = MemoryTools(App(), default_project=project_root_of(str(repo)))
    try:
        said = tools.remember("the api listens on 8080")
        again = tools.remember("The api listens on  8080")
    finally:
        tools.close()
    assert said.startswith("Stored fact") and again.startswith("Already stored")
    with closing(App()) as app:
        memory = app.store.list()[0]
        assert [(e.what, e.op, e.phase) for e in memory_journal(app.store, memory.id)] == [("add", "create", "mcp")]
        with open_viewer(app) as viewer:
            viewer.post(f"/memories/{memory.id}/edit", content="the api listens on 8081", version=memory.version)
            page = viewer.get(f"/memories/{memory.id}").text
    assert "your agent, over MCP" in page and "you, in this viewer" in page
    assert "the api listens on 8080" in page and "the api listens on 8081" in page
