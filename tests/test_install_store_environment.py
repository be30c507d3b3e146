"""The store an agent's `llmem mcp` opens is the one llmem uses here (issue 23): with
LLMEM_STORE_URL pointing at the team's PostgreSQL, Codex (an allow-list of its environment plus
the entry's `env`) and Copilot (PATH only) started the server without it, and it opened the
local SQLite file. The installers hand the store variables on, the URL without its password:
the agents' files are not private, so the password comes from a private file (PGPASSFILE)."""

from __future__ import annotations

import json
import os
import tomllib

import pytest
from mcp_client import McpClient
from servers import PG_PASSWORD

from llmem.setup.environment import without_password

# What each agent passes from its own environment to a stdio MCP server, before the entry's `env`.
INHERITED = {"codex": ("HOME", "LOGNAME", "PATH", "SHELL", "USER", "LANG", "LC_ALL", "TERM", "TMPDIR", "TZ"),
             "copilot": ("PATH",)}


def _entry(agent: str, homes) -> tuple[dict, str]:
    if agent == "codex":
        text = (homes["codex"] / "config.toml").read_text()
        return tomllib.loads(text)["mcp_servers"]["llmem"], text
    text = (homes["copilot"] / "mcp-config.json").read_text()
    return json.loads(text)["mcpServers"]["llmem"], text


def _search_as_the_agent_starts_it(agent: str, entry: dict, cwd, errlog) -> str:
    from mcp import StdioServerParameters  # here, not at collection: the SDK costs ~1.2 s of CPU

    env = {key: os.environ[key] for key in INHERITED[agent] if key in os.environ}
    env.update(entry.get("env", {}))
    client = McpClient(env, cwd=cwd, errlog=errlog)
    client.params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env, cwd=str(cwd))
    client.start()
    try:
        return client.text("search", query="release tags signed")
    finally:
        client.close()


@pytest.mark.backend
@pytest.mark.parametrize("agent", ["codex", "copilot"])
def test_the_server_the_agent_starts_opens_the_postgres_store_with_the_password_from_a_private_file(
        agent, cli, homes, llmem_home, tmp_path, monkeypatch, servers):
    url = servers.fresh_database()
    assert f":{PG_PASSWORD}@" in url
    monkeypatch.setenv("LLMEM_STORE_URL", url)
    project = tmp_path / "acme"
    (project / ".git").mkdir(parents=True)
    assert cli("add", "-c", "Release tags are signed with the team key", "-t", "procedure",
               "--project", str(project))[0] == 0

    code, out, _ = cli("install", agent, "--json")
    assert code == 0
    pgpass = tmp_path / "user-home" / ".pgpass"
    notes = json.loads(out)["notes"]
    assert any(f"{pgpass} does not exist" in note and "LLMEM_STORE_URL" in note for note in notes), notes
    entry, text = _entry(agent, homes)
    assert PG_PASSWORD not in text  # the agent's file is not private
    assert entry["env"]["LLMEM_STORE_URL"] == without_password(url) != url
    assert entry["env"]["PGPASSFILE"] == str(pgpass)
    assert entry["env"]["LLMEM_HOME"] == str(llmem_home)

    # The password where libpq reads it, in a private file written after the install.
    port = url.rsplit(":", 1)[1].split("/")[0]
    pgpass.parent.mkdir(exist_ok=True)
    pgpass.write_text(f"127.0.0.1:{port}:*:postgres:{PG_PASSWORD}\n")
    pgpass.chmod(0o600)
    with (tmp_path / "server-stderr.txt").open("w") as errlog:
        found = _search_as_the_agent_starts_it(agent, entry, project, errlog)
    assert "team key" in found, (tmp_path / "server-stderr.txt").read_text()
    assert not list(llmem_home.glob("*.db")) and not (tmp_path / "user-home" / ".config").exists()

    # Installed again: unchanged (and no note, the file is there); uninstalled: the entry goes.
    code, out, _ = cli("install", agent, "--json")
    result = json.loads(out)
    assert {p["part"]: p["action"] for p in result["parts"]}["mcp"] == "unchanged"
    assert not any("pgpass" in note for note in result["notes"])
    assert cli("install", agent, "--uninstall")[0] == 0
    path = homes["codex"] / "config.toml" if agent == "codex" else homes["copilot"] / "mcp-config.json"
    assert not path.exists() or "llmem" not in path.read_text()


def test_without_password_drops_the_user_part_password_and_a_password_parameter():
    assert without_password("postgresql://team:s3cret@db.example:5432/llmem") == "postgresql://team@db.example:5432/llmem"
    assert without_password("postgresql://team@db/llmem?sslmode=require&password=x") == \
        "postgresql://team@db/llmem?sslmode=require"
    assert without_password("postgresql://team@db/llmem?sslmode=require") == "postgresql://team@db/llmem?sslmode=require"
    assert without_password("sqlite:////home/a/memory.db") == "sqlite:////home/a/memory.db"


def test_a_store_url_the_config_file_names_is_not_repeated_and_a_systemd_unit_keeps_the_password(
        cli, homes, llmem_home, monkeypatch):
    """The server reads the (private) config file itself; a password-free copy in the entry
    would win over the file's URL with the password. A unit file is private: the URL as it is."""
    from llmem.setup.systemd import render_unit

    url = "postgresql://team:s3cret@db.example:5432/llmem"
    config = llmem_home / "config.yaml"
    config.write_text(config.read_text() + f"store:\n  url: {url}\n")
    monkeypatch.setenv("LLMEM_STORE_URL", url)
    assert cli("install", "codex")[0] == 0
    entry, text = _entry("codex", homes)
    assert "LLMEM_STORE_URL" not in entry["env"] and "s3cret" not in text
    assert "LLMEM_STORE_URL" not in render_unit("llmem-watch.service")
    # Another URL in the environment than in the file: it goes into the entry, without the password.
    other = "postgresql://team:s3cret@other.example/llmem"
    monkeypatch.setenv("LLMEM_STORE_URL", other)
    assert cli("install", "codex")[0] == 0
    entry, text = _entry("codex", homes)
    assert entry["env"]["LLMEM_STORE_URL"] == "postgresql://team@other.example/llmem" and "s3cret" not in text
    assert f'Environment="LLMEM_STORE_URL={other}"' in render_unit("llmem-watch.service")
