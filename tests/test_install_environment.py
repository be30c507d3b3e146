"""The variables that place llmem's and the agents' folders reach `llmem mcp` where an agent
starts it with a filtered environment (issue 21 item 9): Codex gives an MCP server only a
short allow-list of its own environment plus the entry's `env` table (the
`[mcp_servers.llmem.env]` that `codex mcp add --env` writes), and Copilot's docs say only PATH
is inherited (so what llmem needs goes into `env` anyway)."""

from __future__ import annotations

import json
import os
import tomllib

import pytest
from conftest import store_location

from llmem.setup.environment import without_password

# What Codex passes from its own environment to a stdio MCP server, before the entry's `env`.
CODEX_INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "USER", "LANG", "LC_ALL", "TERM", "TMPDIR", "TZ")


@pytest.fixture
def homes(homes, tmp_path, monkeypatch):
    """The installers' agent folders (conftest), with XDG_DATA_HOME set as well."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    return homes


def _codex_entry(homes) -> dict:
    return tomllib.loads((homes["codex"] / "config.toml").read_text())["mcp_servers"]["llmem"]


def test_codex_entry_carries_the_folder_variables(cli, homes, llmem_home, tmp_path):
    assert cli("install", "codex")[0] == 0
    env = _codex_entry(homes)["env"]
    # On the suite's PostgreSQL run LLMEM_STORE_URL is set too: the store variables go along
    # (tests/test_install_store_environment.py).
    store = {"LLMEM_STORE_URL": without_password(os.environ["LLMEM_STORE_URL"]),
             "PGPASSFILE": str(tmp_path / "user-home" / ".pgpass")} if os.environ.get("LLMEM_STORE_URL") else {}
    assert env == {"LLMEM_HOME": str(llmem_home), "CLAUDE_CONFIG_DIR": str(homes["claude"]),
                   "CODEX_HOME": str(homes["codex"]), "COPILOT_HOME": str(homes["copilot"]),
                   "XDG_DATA_HOME": str(tmp_path / "xdg-data"), **store}
    text = (homes["codex"] / "config.toml").read_text()
    assert "\n\n[mcp_servers.llmem.env]\n" in text  # the shape `codex mcp add --env` writes
    # Idempotent, and uninstall takes the env table with the entry.
    code, out, _ = cli("install", "codex", "--json")
    assert code == 0 and {p["part"]: p["action"] for p in json.loads(out)["parts"]}["mcp"] == "unchanged"
    assert cli("install", "codex", "--uninstall")[0] == 0
    assert not (homes["codex"] / "config.toml").exists()  # llmem created it: it goes


def test_a_changed_variable_updates_the_entry_and_an_edited_env_is_the_users(cli, homes, tmp_path, monkeypatch):
    assert cli("install", "codex")[0] == 0
    monkeypatch.setenv("LLMEM_HOME", str(tmp_path / "elsewhere"))
    code, out, _ = cli("install", "codex", "--json")
    assert {p["part"]: p["action"] for p in json.loads(out)["parts"]}["mcp"] == "updated"
    assert _codex_entry(homes)["env"]["LLMEM_HOME"] == str(tmp_path / "elsewhere")
    # A variable llmem does not pass, added by the user: the entry is theirs from now on.
    config = homes["codex"] / "config.toml"
    config.write_text(config.read_text().replace("[mcp_servers.llmem.env]\n",
                                                 '[mcp_servers.llmem.env]\nOPENAI_API_KEY = "sk-x"\n'))
    code, out, _ = cli("install", "codex", "--json")
    assert {p["part"]: p["action"] for p in json.loads(out)["parts"]}["mcp"] == "kept"


def test_copilot_entry_carries_the_folder_variables(cli, homes, llmem_home):
    assert cli("install", "copilot")[0] == 0
    entry = json.loads((homes["copilot"] / "mcp-config.json").read_text())["mcpServers"]["llmem"]
    assert entry["env"]["LLMEM_HOME"] == str(llmem_home)
    assert entry["env"]["CODEX_HOME"] == str(homes["codex"])
    assert cli("install", "copilot", "--uninstall")[0] == 0


def test_a_relative_variable_is_passed_as_an_absolute_path(cli, homes, tmp_path, monkeypatch):
    """The agent starts the server in the session's folder, not where install ran."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", "xdg-rel")
    assert cli("install", "codex")[0] == 0
    assert _codex_entry(homes)["env"]["XDG_DATA_HOME"] == str(tmp_path / "xdg-rel")


def test_the_codex_server_started_as_codex_starts_it_opens_this_store(cli, homes, llmem_home, tmp_path):
    """The end-to-end symptom: with LLMEM_HOME set, the server Codex starts opened an empty
    store under $HOME and found nothing."""
    from mcp import StdioServerParameters
    from mcp_client import McpClient

    location = store_location()
    if isinstance(location, str):  # a store on a server: its URL where its user keeps it, in the file
        config = llmem_home / "config.yaml"  # (Codex passes no LLMEM_STORE_URL on)
        config.write_text(config.read_text() + f"store:\n  url: {location}\n")
    project = tmp_path / "acme"
    (project / ".git").mkdir(parents=True)
    assert cli("add", "-c", "Release tags are signed with the team key", "-t", "procedure",
               "--project", str(project))[0] == 0
    assert cli("install", "codex")[0] == 0
    entry = _codex_entry(homes)
    env = {key: os.environ[key] for key in CODEX_INHERITED if key in os.environ}
    env.update(entry.get("env", {}))
    with (tmp_path / "server-stderr.txt").open("w") as errlog:
        client = McpClient(env, cwd=project, errlog=errlog)
        client.params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env,
                                              cwd=str(project))
        client.start()
        try:
            found = client.text("search", query="release tags signed")
        finally:
            client.close()
    assert "team key" in found
    assert not (tmp_path / "user-home" / ".config" / "llmem" / "memory.db").exists()


def test_doctor_names_a_codex_entry_registered_for_other_folders(cli, homes, tmp_path, monkeypatch):
    """An entry from an earlier install (no env, or another LLMEM_HOME) opens another store."""
    (homes["codex"] / "sessions").mkdir(parents=True)
    assert cli("install", "codex")[0] == 0
    config = homes["codex"] / "config.toml"
    config.write_text(config.read_text().split("\n[mcp_servers.llmem.env]")[0] + "\n")  # as before the fix
    code, out, _ = cli("doctor", "--json")
    check = {c["name"]: c for c in json.loads(out)["checks"]}["codex"]
    assert "MCP registered without LLMEM_HOME" in check["detail"] and "llmem install codex" in check["detail"]
    assert check["status"] == "warn"
    assert cli("install", "codex")[0] == 0
    code, out, _ = cli("doctor", "--json")
    assert "MCP registered;" in {c["name"]: c for c in json.loads(out)["checks"]}["codex"]["detail"] + ";"
