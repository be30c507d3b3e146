"""`llmem install opencode|copilot|claude|codex`: hooks and MCP registration in the agents'
own files, edited in place (comments and other keys kept), backed up, idempotent, and
`--uninstall` giving back the user's bytes. Real files in tmp folders, from the documented
fixtures in tests/fixtures/agents."""

from __future__ import annotations

import json
from pathlib import Path

import tomlkit

FIXTURES = Path(__file__).parent / "fixtures" / "agents"


def put(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def backups(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.llmem-backup-*"))


# ---- Claude Code ----------------------------------------------------------------------------

def test_claude_install_is_idempotent_and_uninstall_gives_back_the_bytes(cli, homes):
    settings = put(homes["claude"] / "settings.json", (FIXTURES / "claude_settings.json").read_text())
    original = settings.read_bytes()
    code, out, err = cli("install", "claude")
    assert code == 0, err
    assert "Installed the Claude Code hooks" in out and "MCP server for Claude Code" in out
    data = json.loads(settings.read_text())
    assert data["cleanupPeriodDays"] == 90 and data["$schema"]  # the other keys stay
    ours = {}
    for event, groups in data["hooks"].items():
        for group in groups:
            for hook in group["hooks"]:
                if "--adapter claude" in hook["command"]:
                    ours[event] = hook["command"]
    assert set(ours) == {"SessionStart", "PreCompact", "Stop", "SessionEnd"}
    kinds = {event: command.split("--type ")[1] for event, command in ours.items()}
    assert kinds == {"SessionStart": "created", "PreCompact": "compacting", "Stop": "idle", "SessionEnd": "ending"}
    assert all(" hook --adapter claude --format claude --type " in c and c.startswith("/") for c in ours.values())
    # The user's own hooks are all still there, in their places.
    assert data["hooks"]["SessionStart"][0]["hooks"][0]["command"] == "llmem hook claude-code session-start"
    [backup] = backups(homes["claude"])
    assert backup.read_bytes() == original
    # MCP: user scope of .claude.json, inside CLAUDE_CONFIG_DIR when it is set.
    user = json.loads((homes["claude"] / ".claude.json").read_text())
    server = user["mcpServers"]["llmem"]
    assert server["type"] == "stdio" and server["args"][-1] == "mcp" and Path(server["command"]).is_absolute()

    installed = {p: p.read_bytes() for p in (settings, homes["claude"] / ".claude.json")}
    code, out, _ = cli("install", "claude")
    assert code == 0 and "are already installed" in out and "is already installed" in out
    assert {p: p.read_bytes() for p in installed} == installed
    assert len(backups(homes["claude"])) == 1  # nothing written, nothing backed up

    code, out, _ = cli("install", "claude", "--uninstall")
    assert code == 0 and "Removed the Claude Code hooks" in out
    assert settings.read_bytes() == original
    # .claude.json held nothing but llmem's server: it goes, as before the install.
    assert not (homes["claude"] / ".claude.json").exists()
    code, out, _ = cli("install", "claude", "--uninstall", "--json")
    assert code == 0 and {p["action"] for p in json.loads(out)["parts"]} == {"absent"}


def test_claude_mcp_keeps_the_rest_of_claude_json_and_a_users_own_entry(cli, homes):
    claude_json = put(homes["claude"] / ".claude.json", json.dumps(
        {"numStartups": 3, "projects": {"/home/dev/acme-api": {"mcpServers": {}}},
         "mcpServers": {"acme-docs": {"type": "http", "url": "http://127.0.0.1:8765/mcp"}}}, indent=2))
    original = claude_json.read_bytes()
    assert cli("install", "claude")[0] == 0
    data = json.loads(claude_json.read_text())
    assert list(data["mcpServers"]) == ["acme-docs", "llmem"] and data["numStartups"] == 3
    assert cli("install", "claude", "--uninstall")[0] == 0
    assert claude_json.read_bytes() == original

    # An `llmem` entry the user wrote (other arguments, an env) is neither replaced nor removed.
    mine = {"type": "stdio", "command": "llmem", "args": ["mcp", "serve"], "env": {"LLMEM_HOME": "/x"}}
    put(claude_json, json.dumps({"mcpServers": {"llmem": mine}}, indent=2))
    before = claude_json.read_bytes()
    for args in ((), ("--uninstall",)):
        code, out, _ = cli("install", "claude", *args)
        assert code == 0 and "left as it was" in out and "did not write" in out
        assert claude_json.read_bytes() == before


def test_claude_settings_without_hooks_and_no_mcp(cli, homes):
    settings = put(homes["claude"] / "settings.json", '{\n  "model": "opus"\n}\n')
    original = settings.read_bytes()
    code, out, _ = cli("install", "claude", "--no-mcp")
    assert code == 0 and "MCP" not in out
    assert not (homes["claude"] / ".claude.json").exists()
    assert json.loads(settings.read_text())["model"] == "opus"
    assert cli("install", "claude", "--uninstall", "--no-mcp")[0] == 0
    assert settings.read_bytes() == original


def test_a_missing_settings_file_is_created_private(cli, homes):
    assert cli("install", "claude")[0] == 0
    settings = homes["claude"] / "settings.json"
    assert oct(settings.stat().st_mode & 0o777) == "0o600"
    assert len(json.loads(settings.read_text())["hooks"]) == 4
    assert backups(homes["claude"]) == []  # nothing existed to back up


def test_a_broken_file_stops_the_install_with_nothing_written(cli, homes):
    settings = put(homes["claude"] / "settings.json", '{"hooks": {,}}\n')
    code, out, err = cli("install", "claude")
    assert code == 2 and str(settings) in err and "not valid JSON" in err and "fix the file" in err
    assert settings.read_text() == '{"hooks": {,}}\n'
    assert not (homes["claude"] / ".claude.json").exists() and backups(homes["claude"]) == []
    assert "Traceback" not in err

    config = put(homes["codex"] / "config.toml", 'model = "x"\n[broken\n')
    code, _, err = cli("install", "codex")
    assert code == 2 and str(config) in err and "not valid TOML" in err
    assert config.read_text() == 'model = "x"\n[broken\n' and not (homes["codex"] / "hooks.json").exists()

    # The OpenCode plugin is not written either when its config file is broken.
    opencode = put(homes["opencode"] / "opencode.jsonc", "{ // unfinished\n")
    code, _, err = cli("install", "opencode")
    assert code == 2 and str(opencode) in err
    assert not (homes["opencode"] / "plugins").exists()


# ---- Codex ----------------------------------------------------------------------------------

CODEX_CONFIG = """\
# my Codex settings
model = "gpt-5.5-codex"
approval_policy = "on-request"  # ask first

[history]
persistence = "save-all"   # keep it

[mcp_servers.acme-docs]    # docs server
url = "http://127.0.0.1:8765/mcp"

[projects."/home/dev/acme-api"]
trust_level = "trusted"
"""


def test_codex_install_keeps_toml_comments_and_uninstalls_to_the_byte(cli, homes):
    config = put(homes["codex"] / "config.toml", CODEX_CONFIG)
    hooks = put(homes["codex"] / "hooks.json", (FIXTURES / "codex_hooks.json").read_text())
    hooks_before = hooks.read_bytes()
    code, out, err = cli("install", "codex")
    assert code == 0, err
    text = config.read_text()
    for comment in ("# my Codex settings", "# ask first", "# keep it", "# docs server"):
        assert comment in text
    data = tomlkit.parse(text).unwrap()
    assert data["notify"][1:] == ["hook", "--adapter", "codex", "--type", "idle"]
    assert Path(data["notify"][0]).is_absolute()
    assert data["mcp_servers"]["llmem"]["args"][-1] == "mcp"
    assert data["mcp_servers"]["acme-docs"] == {"url": "http://127.0.0.1:8765/mcp"}
    assert data["projects"]["/home/dev/acme-api"] == {"trust_level": "trusted"}
    hooks_data = json.loads(hooks.read_text())
    # llmem's groups come after the user's, so the trust entries Codex keyed by index still hold.
    assert hooks_data["hooks"]["SessionStart"][0]["matcher"] == "startup|resume"
    assert "--adapter codex --format codex --type created" in hooks_data["hooks"]["SessionStart"][1]["hooks"][0]["command"]
    assert "trust" in out and "/hooks" in out  # Codex hooks need the user's approval

    installed = (config.read_bytes(), hooks.read_bytes())
    assert cli("install", "codex")[0] == 0
    assert (config.read_bytes(), hooks.read_bytes()) == installed
    assert len(backups(homes["codex"])) == 2

    assert cli("install", "codex", "--uninstall")[0] == 0
    assert config.read_text() == CODEX_CONFIG and hooks.read_bytes() == hooks_before


def test_codex_keeps_a_different_notify_program(cli, homes):
    theirs = CODEX_CONFIG.replace('approval_policy', 'notify = ["notify-send", "Codex"]\napproval_policy')
    config = put(homes["codex"] / "config.toml", theirs)
    code, out, _ = cli("install", "codex")
    assert code == 0
    assert tomlkit.parse(config.read_text())["notify"] == ["notify-send", "Codex"]
    assert "notify-send Codex" in out and "hook --adapter codex --type idle" in out  # what to do
    assert cli("install", "codex", "--uninstall")[0] == 0
    assert tomlkit.parse(config.read_text())["notify"] == ["notify-send", "Codex"]
    assert config.read_text() == theirs


def test_codex_from_nothing(cli, homes):
    assert cli("install", "codex")[0] == 0
    data = tomlkit.parse((homes["codex"] / "config.toml").read_text()).unwrap()
    assert set(data) == {"notify", "mcp_servers"}
    assert cli("install", "codex", "--uninstall")[0] == 0
    # Both files held nothing but llmem's: they go, as before the install.
    assert not (homes["codex"] / "config.toml").exists()
    assert not (homes["codex"] / "hooks.json").exists()


def test_codex_inline_mcp_servers(cli, homes):
    text = 'mcp_servers = { docs = { url = "http://127.0.0.1:8765/mcp" } }\n'
    config = put(homes["codex"] / "config.toml", text)
    assert cli("install", "codex")[0] == 0
    servers = tomlkit.parse(config.read_text()).unwrap()["mcp_servers"]
    assert set(servers) == {"docs", "llmem"} and servers["llmem"]["args"][-1] == "mcp"
    assert cli("install", "codex", "--uninstall")[0] == 0
    assert config.read_text() == text


# ---- OpenCode and Copilot -------------------------------------------------------------------

OPENCODE_JSONC = """\
// global OpenCode config
{
  "$schema": "https://opencode.ai/config.json",
  /* providers */
  "model": "anthropic/claude-sonnet-4-5", // the default
  "mcp": {
    "context7": { "type": "local", "command": ["npx", "-y", "@upstash/context7-mcp"], },
  },
  "plugin": ["opencode-wakatime", ["@acme/opencode-notify", { "sound": false }]],
}
"""


def test_opencode_jsonc_keeps_comments_and_trailing_commas(cli, homes):
    put(homes["opencode"] / "opencode.json", '{"theme": "x"}\n')  # .jsonc wins when both exist
    path = put(homes["opencode"] / "opencode.jsonc", OPENCODE_JSONC)
    code, out, err = cli("install", "opencode")
    assert code == 0, err
    text = path.read_text()
    for kept in ("// global OpenCode config", "/* providers */", "// the default",
                 '"command": ["npx", "-y", "@upstash/context7-mcp"], }',
                 '["@acme/opencode-notify", { "sound": false }]]'):
        assert kept in text
    import json5

    server = json5.loads(text)["mcp"]["llmem"]
    assert server["type"] == "local" and server["command"][-1] == "mcp" and server["enabled"] is True
    assert (homes["opencode"] / "plugins" / "llmem.js").is_file()
    assert (homes["opencode"] / "opencode.json").read_text() == '{"theme": "x"}\n'
    first = path.read_bytes()
    assert cli("install", "opencode")[0] == 0 and path.read_bytes() == first
    assert cli("install", "opencode", "--uninstall")[0] == 0
    assert path.read_text() == OPENCODE_JSONC
    assert not (homes["opencode"] / "plugins" / "llmem.js").exists()


def test_opencode_fixture_and_no_mcp(cli, homes):
    path = put(homes["opencode"] / "opencode.json", (FIXTURES / "opencode.json").read_text())
    original = path.read_bytes()
    assert cli("install", "opencode", "--no-mcp")[0] == 0
    assert path.read_bytes() == original and (homes["opencode"] / "plugins" / "llmem.js").is_file()
    assert cli("install", "opencode")[0] == 0
    data = json.loads(path.read_text())
    assert list(data["mcp"]) == ["context7", "llmem"] and data["provider"]["anthropic"]
    assert cli("install", "opencode", "--uninstall")[0] == 0
    assert path.read_bytes() == original


def test_opencode_server_switched_off_by_the_user_stays_off(cli, homes):
    assert cli("install", "opencode")[0] == 0
    path = homes["opencode"] / "opencode.json"
    path.write_text(path.read_text().replace('"enabled": true', '"enabled": false'))
    code, out, _ = cli("install", "opencode", "--json")
    assert code == 0 and [p["action"] for p in json.loads(out)["parts"]] == ["unchanged", "unchanged"]
    assert json.loads(path.read_text())["mcp"]["llmem"]["enabled"] is False


def test_opencode_config_created_with_its_schema(cli, homes):
    assert cli("install", "opencode")[0] == 0
    data = json.loads((homes["opencode"] / "opencode.json").read_text())
    assert list(data) == ["$schema", "mcp"]  # with $schema first OpenCode leaves the file alone


def test_copilot_mcp_config(cli, homes):
    path = put(homes["copilot"] / "mcp-config.json", (FIXTURES / "copilot_mcp-config.json").read_text())
    original = path.read_bytes()
    code, out, err = cli("install", "copilot")
    assert code == 0, err
    assert out.startswith("Installed the Copilot CLI hooks")
    servers = json.loads(path.read_text())["mcpServers"]
    assert list(servers) == ["context7", "llmem"]
    llmem = servers["llmem"]
    assert llmem["type"] == "local" and llmem["tools"] == ["*"] and llmem["args"][-1] == "mcp"
    assert Path(llmem["command"]).name != "python"  # Copilot turns `python -m` into pipx
    assert backups(homes["copilot"])[0].read_bytes() == original
    assert cli("install", "copilot", "--uninstall")[0] == 0
    assert path.read_bytes() == original
    assert not (homes["copilot"] / "hooks" / "llmem.json").exists()


def test_a_symlink_leaving_the_agents_folder_is_refused_and_one_inside_stays_a_link(cli, homes, tmp_path):
    """A link out of the agent's folder could point anywhere (/dev/null, /etc/passwd): refused
    with nothing written. A link to a file beside it is followed and stays a link."""
    target = put(tmp_path / "dotfiles" / "settings.json", '{"model": "opus"}\n')
    link = homes["claude"] / "settings.json"
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    code, out, err = cli("install", "claude", "--no-mcp")
    assert code == 2 and str(link) in err and "outside" in err and "Traceback" not in err
    assert target.read_text() == '{"model": "opus"}\n' and link.is_symlink()
    assert sorted(p.name for p in (tmp_path / "dotfiles").iterdir()) == ["settings.json"]  # no backup there

    link.unlink()
    beside = put(homes["claude"] / "settings.mine.json", '{"model": "opus"}\n')
    link.symlink_to(beside.name)
    assert cli("install", "claude", "--no-mcp")[0] == 0
    assert link.is_symlink() and "--adapter claude" in beside.read_text()


# ---- doctor ---------------------------------------------------------------------------------

def test_doctor_says_detected_hooks_and_mcp_for_each_agent(cli, homes):
    (homes["claude"] / "projects").mkdir(parents=True)
    (homes["codex"] / "sessions").mkdir(parents=True)
    code, out, _ = cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["claude"]["detected"] and not checks["claude"]["hooks"] and not checks["claude"]["mcp"]
    assert checks["claude"]["status"] == "warn" and "llmem install claude" in checks["claude"]["detail"]
    assert not checks["opencode"]["detected"] and checks["opencode"]["status"] == "ok"
    assert cli("install", "claude")[0] == 0
    assert cli("install", "codex")[0] == 0
    code, out, _ = cli("doctor")
    lines = {line.split("]", 1)[1].split(":", 1)[0].strip(): line for line in out.splitlines()}
    assert lines["claude"].startswith("[ok  ]") and "hooks installed; MCP registered" in lines["claude"]
    assert "hooks installed, not yet approved — run /hooks in Codex; notify set; MCP registered" in lines["codex"]
    assert lines["copilot"].startswith("[ok  ] copilot: not detected; no hooks; MCP not registered")

    put(homes["claude"] / "settings.json", "{oops")
    code, out, _ = cli("doctor")
    claude_line = next(line for line in out.splitlines() if "] claude:" in line)
    assert claude_line.startswith("[warn]") and "not valid JSON" in claude_line


# ---- the registration really starts `llmem mcp` ---------------------------------------------

def test_the_registered_server_answers_tools_list(cli, homes, llmem_home, tmp_path):
    """Each agent's entry names the same argv; started as Codex would start it, it serves."""
    import os

    from mcp import StdioServerParameters
    from mcp_client import McpClient

    for agent in ("opencode", "copilot", "claude", "codex"):
        assert cli("install", agent)[0] == 0
    opencode = json.loads((homes["opencode"] / "opencode.json").read_text())["mcp"]["llmem"]["command"]
    copilot = json.loads((homes["copilot"] / "mcp-config.json").read_text())["mcpServers"]["llmem"]
    claude = json.loads((homes["claude"] / ".claude.json").read_text())["mcpServers"]["llmem"]
    codex = tomlkit.parse((homes["codex"] / "config.toml").read_text()).unwrap()["mcp_servers"]["llmem"]
    argvs = [opencode] + [[e["command"], *e["args"]] for e in (copilot, claude, codex)]
    assert all(argv == argvs[0] for argv in argvs) and argvs[0][-1] == "mcp"

    env = {**os.environ, "LLMEM_HOME": str(llmem_home), "HOME": str(tmp_path / "user-home")}
    with (tmp_path / "server-stderr.txt").open("w") as errlog:
        client = McpClient(env, cwd=tmp_path, errlog=errlog)
        client.params = StdioServerParameters(command=codex["command"], args=codex["args"], env=env,
                                              cwd=str(tmp_path))
        client.start()
        try:
            names = {tool.name for tool in client.list_tools().tools}
        finally:
            client.close()
    assert {"search", "remember"} <= names


def test_the_installed_claude_session_start_command_answers(cli, homes, tmp_path):
    """The command line written into settings.json, run by a shell as Claude Code runs it."""
    import os
    import subprocess

    project = tmp_path / "acme-api"
    (project / ".git").mkdir(parents=True)
    assert cli("add", "-c", "Always run the linter before pushing", "-t", "procedure",
               "--project", str(project))[0] == 0
    assert cli("install", "claude", "--no-mcp")[0] == 0
    settings = json.loads((homes["claude"] / "settings.json").read_text())
    [command] = [h["command"] for group in settings["hooks"]["SessionStart"] for h in group["hooks"]]
    payload = {"session_id": "0b6c2f5e-1111-4a2b-8c3d-4e5f60718293", "cwd": str(project),
               "transcript_path": str(homes["claude"] / "projects" / "x" / "0b6c2f5e.jsonl"),
               "hook_event_name": "SessionStart", "source": "startup"}
    proc = subprocess.run(["bash", "-c", command], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=60, env=os.environ.copy())
    assert proc.returncode == 0 and proc.stderr == ""
    context = json.loads(proc.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "Always run the linter" in context


def test_the_installed_codex_commands_run(cli, homes, tmp_path):
    """notify as Codex execs it (the JSON as one more argument) and SessionStart as its shell runs it."""
    import os
    import subprocess

    from session_writers import uuid7

    project = tmp_path / "acme"
    (project / ".git").mkdir(parents=True)
    (homes["codex"] / "sessions").mkdir(parents=True)
    assert cli("add", "-c", "Release tags are signed with the team key", "-t", "procedure",
               "--project", str(project))[0] == 0
    assert cli("install", "codex", "--no-mcp")[0] == 0
    notify = tomlkit.parse((homes["codex"] / "config.toml").read_text()).unwrap()["notify"]
    # The TUI's title thread has no rollout: llmem takes the payload and lets it go.
    title = {"type": "agent-turn-complete", "thread-id": uuid7(), "cwd": str(project),
             "client": "codex-tui", "input-messages": ["Generate a title"], "last-assistant-message": "T"}
    proc = subprocess.run([*notify, json.dumps(title)], capture_output=True, text=True, timeout=60,
                          env=os.environ.copy())
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")

    hooks = json.loads((homes["codex"] / "hooks.json").read_text())["hooks"]
    [command] = [h["command"] for group in hooks["SessionStart"] for h in group["hooks"]]
    payload = {"session_id": uuid7(), "transcript_path": None, "cwd": str(project),
               "hook_event_name": "SessionStart", "source": "startup"}
    proc = subprocess.run(["bash", "-c", command], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=60, env=os.environ.copy())
    assert proc.returncode == 0 and proc.stderr == ""
    assert "Release tags are signed" in json.loads(proc.stdout)["hookSpecificOutput"]["additionalContext"]
