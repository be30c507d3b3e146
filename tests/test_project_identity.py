"""A project is one project on every machine (issue 23): keyed by its repository's remote,
normalised, falling back to the repository's folder, so `/home/a/src/api` and
`/Users/b/code/api` share their memories."""

from __future__ import annotations

import json
import subprocess

import pytest

from llmem.adapters.base import Transcript
from llmem.mcp_server import working_project
from llmem.paths import _normalised_remote, project_key
from llmem.store import Store


@pytest.mark.parametrize("url, key", [
    ("git@github.com:acme/api.git", "github.com/acme/api"),
    ("https://github.com/acme/api", "github.com/acme/api"),
    ("https://user:secret-token@GitHub.com/acme/api.git/", "github.com/acme/api"),
    ("ssh://git@github.com:22/acme/api.git", "github.com/acme/api"),
    ("git@gitlab.example.com:group/sub/api.git", "gitlab.example.com/group/sub/api"),
    ("file:///srv/git/api.git", None),  # on this disk: names no shared project
    ("/srv/git/api.git", None),
    ("../api.git", None),
    ("C:/repos/api.git", None),  # a drive letter, not an scp-like host
    ("https://github.com/", None),
])
def test_remotes_are_normalised_to_host_and_path(url, key):
    assert _normalised_remote(url) == key


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def repo(path, remote: str | None = None):
    path.mkdir(parents=True)
    git("init", "-q", cwd=path)
    if remote:
        git("remote", "add", "origin", remote, cwd=path)
    return path


def test_a_folder_in_a_repository_is_keyed_by_its_remote(tmp_path):
    api = repo(tmp_path / "a" / "src" / "api", "git@github.com:acme/api.git")
    (api / "pkg" / "handlers").mkdir(parents=True)
    assert project_key(str(api / "pkg" / "handlers")) == "github.com/acme/api"
    # Another remote first in the file, origin later: origin is the project.
    git("remote", "add", "upstream", "https://github.com/other/fork", cwd=api)
    assert project_key(str(api)) == "github.com/acme/api"
    # A worktree of the repository (its .git is a file) is the same project.
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x", cwd=api)
    git("worktree", "add", "-q", str(tmp_path / "wt"), cwd=api)
    assert project_key(str(tmp_path / "wt")) == "github.com/acme/api"
    # No remote, or one on this disk: the repository's folder, as before.
    alone = repo(tmp_path / "alone")
    local = repo(tmp_path / "local", "/srv/git/local.git")
    assert project_key(str(alone)) == str(alone) and project_key(str(local)) == str(local)
    assert project_key(str(tmp_path / "no-repo-here")) == str(tmp_path / "no-repo-here")
    assert working_project(api / "pkg") == "github.com/acme/api" and working_project(tmp_path) is None
    transcript = Transcript(adapter="claude", session_id="s", directory=str(api / "pkg"))
    assert transcript.project == "github.com/acme/api"


def test_two_machines_clones_of_one_repository_share_their_memories(tmp_path, monkeypatch, store_url, cli):
    here = repo(tmp_path / "home-a" / "src" / "api", "git@github.com:acme/api.git")
    there = repo(tmp_path / "Users-b" / "code" / "api", "https://github.com/acme/api")
    homes = {}
    for name in ("a", "b"):
        homes[name] = tmp_path / f"llmem-{name}"
        homes[name].mkdir()
        (homes[name] / "config.yaml").write_text(
            f"store:\n  url: {store_url}\nembedding:\n  provider: none\nllm:\n  provider: none\n")
    monkeypatch.setenv("LLMEM_HOME", str(homes["a"]))
    code, out, err = cli("add", "--content", "we deploy with make release, never from a branch",
                         "--type", "decision", "--project", str(here), "--json")
    assert code == 0, err
    assert json.loads(out)["project"] == "github.com/acme/api"
    monkeypatch.setenv("LLMEM_HOME", str(homes["b"]))
    code, out, err = cli("search", "how do we deploy", "--project", str(there), "--json")
    assert code == 0, err
    assert [hit["content"] for hit in json.loads(out)] == ["we deploy with make release, never from a branch"]
    code, out, _ = cli("list", "--project", "github.com/acme/api", "--json")
    assert len(json.loads(out)) == 1


def test_a_store_keyed_by_folders_moves_to_project_keys_when_opened(llmem_home, tmp_path):
    api = repo(tmp_path / "src" / "api", "git@github.com:acme/api.git")
    gone = str(tmp_path / "deleted-since")
    path = llmem_home / "memory.db"
    llmem_home.mkdir(parents=True)
    with Store.open(path) as store:
        for project in (str(api), gone, None):
            store.add(f"a fact of {project}", "fact", project=project)
        store.db.execute_sql("DELETE FROM schema_migration WHERE name = '0021_project_identity'")
    with Store.open(path) as store:
        Memory = store.models.Memory
        assert sorted((m.project or "") for m in Memory.select()) == sorted(["", gone, "github.com/acme/api"])
