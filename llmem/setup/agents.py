"""`llmem install <agent>`: each agent's hooks (or plugin) and its MCP registration of
`llmem mcp`, and what `llmem doctor` reports about them.

Files llmem owns whole (the OpenCode plugin, the Copilot hooks file) are written by
integrations.py. The agents' own config files are edited in place, one member at a time
(jsonedit.py for JSON/JSONC, tomlkit for TOML), after a timestamped backup beside the file;
every file of an install is read and checked before any is written, so a broken one stops
the install with nothing changed. A second install changes nothing, and `--uninstall`
removes exactly the members llmem added: a member llmem did not write (a user's own `llmem`
server entry, another notify program) is left as it is and said so.

Formats: FORMATS.md "MCP registration" (OpenCode, Copilot), CLAUDE-CODE.md §3–4, CODEX.md §3–4.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..paths import expand, write_atomically
from . import integrations

AGENTS = ("opencode", "copilot", "claude", "codex")
LABELS = {"opencode": "OpenCode", "copilot": "Copilot CLI", "claude": "Claude Code", "codex": "Codex CLI"}
SERVER_NAME = "llmem"

# Claude Code and Codex share the hooks schema; each lifecycle event → (llmem moment, timeout s).
# SessionStart answers with the context block; the others queue their work and return.
HOOK_EVENTS = {
    "claude": {"SessionStart": ("created", 30), "PreCompact": ("compacting", 15),
               "Stop": ("idle", 15), "SessionEnd": ("ending", 15)},
    # Codex clamps SessionEnd hooks to 3 s, with a warning for a longer timeout (CODEX.md §3.2).
    "codex": {"SessionStart": ("created", 30), "PreCompact": ("compacting", 15),
              "Stop": ("idle", 15), "SessionEnd": ("ending", 3)},
}


# ---- where each agent keeps its files -----------------------------------------------------

def _env_or(variable: str, configured: str) -> Path:
    return expand(os.environ.get(variable) or configured)


def claude_home(config) -> Path:
    """Claude Code's config home: $CLAUDE_CONFIG_DIR, else session.claude.config_dir."""
    from ..adapters.detect import claude_config_dir

    return claude_config_dir(expand(config.values["session"]["claude"]["config_dir"]))


def claude_json_path(config) -> Path:
    """Claude Code's user file with the user-scope MCP servers (CLAUDE-CODE.md §1.1): inside
    $CLAUDE_CONFIG_DIR when set, else `.claude.json` beside the default ~/.claude (a config
    folder elsewhere is only ever used through CLAUDE_CONFIG_DIR, so it holds the file)."""
    if os.environ.get("CLAUDE_CONFIG_DIR"):
        return claude_home(config) / ".claude.json"
    home = claude_home(config)
    return home.parent / ".claude.json" if home.name == ".claude" else home / ".claude.json"


def codex_home(config) -> Path:
    """Codex's home: $CODEX_HOME, else session.codex.home."""
    from ..adapters.detect import codex_home_dir

    return codex_home_dir(expand(config.values["session"]["codex"]["home"]))


def copilot_home(config) -> Path:
    return _env_or("COPILOT_HOME", config.values["session"]["copilot"]["home"])


def opencode_config_file(config) -> Path:
    """OpenCode's global config: opencode.jsonc wins over opencode.json when both exist (it
    is merged last), and a fresh folder gets opencode.json."""
    folder = expand(config.values["session"]["opencode"]["config_dir"])
    jsonc = folder / "opencode.jsonc"
    return jsonc if jsonc.exists() else folder / "opencode.json"


def settings_path(config) -> Path:
    return claude_home(config) / "settings.json"


def codex_config_path(config) -> Path:
    return codex_home(config) / "config.toml"


def codex_hooks_path(config) -> Path:
    return codex_home(config) / "hooks.json"


def copilot_mcp_path(config) -> Path:
    return copilot_home(config) / "mcp-config.json"


# ---- what llmem writes ----------------------------------------------------------------------

def hook_command(command: list[str], agent: str, kind: str) -> str:
    return f"{shlex.join(command)} hook --adapter {agent} --format {agent} --type {kind}"


def desired_hooks(command: list[str], agent: str) -> dict[str, dict]:
    return {event: {"type": "command", "command": hook_command(command, agent, kind), "timeout": timeout}
            for event, (kind, timeout) in HOOK_EVENTS[agent].items()}


def notify_argv(command: list[str]) -> list[str]:
    return [*command, "hook", "--adapter", "codex", "--type", "idle"]


def mcp_entry(agent: str, command: list[str]) -> dict:
    """The `llmem` server entry in the agent's own shape (FORMATS.md M.1/M.2, CLAUDE-CODE.md §4.1,
    CODEX.md §4.1): always the llmem executable itself, never `python` (Copilot rewrites a bare
    `python -m` into `pipx run`)."""
    if agent == "opencode":
        return {"type": "local", "command": [*command, "mcp"], "enabled": True}
    if agent == "copilot":
        return {"type": "local", "command": command[0], "args": [*command[1:], "mcp"], "tools": ["*"]}
    if agent == "claude":
        return {"type": "stdio", "command": command[0], "args": [*command[1:], "mcp"]}
    return {"command": command[0], "args": [*command[1:], "mcp"]}


def _llmem_prefix(argv: Any) -> int:
    """How many leading words of `argv` run llmem (1: the llmem script, 3: python -m llmem), 0: none."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return 0
    if Path(argv[0]).name == "llmem":
        return 1
    if len(argv) >= 3 and argv[1:3] == ["-m", "llmem"]:
        return 3
    return 0


def _entry_argv(agent: str, entry: dict) -> Any:
    if agent == "opencode":
        return entry.get("command")
    args = entry.get("args", [])
    return [entry.get("command"), *args] if isinstance(args, list) else None


def is_llmem_server(agent: str, entry: Any, command: list[str]) -> bool:
    """An `llmem` server entry shaped as llmem install writes it (any llmem path): safe to
    update or remove. One with other keys or other arguments is the user's own."""
    if not isinstance(entry, dict) or not set(entry) <= set(mcp_entry(agent, command)):
        return False
    argv = _entry_argv(agent, entry)
    prefix = _llmem_prefix(argv)
    return bool(prefix) and argv[prefix:] == ["mcp"]


def is_llmem_notify(argv: Any) -> bool:
    prefix = _llmem_prefix(argv)
    return bool(prefix) and argv[prefix:prefix + 1] == ["hook"]


def is_llmem_hook(entry: Any, agent: str) -> bool:
    if not isinstance(entry, dict) or entry.get("type") != "command":
        return False
    text = entry.get("command")
    return isinstance(text, str) and " hook " in text and f"--adapter {agent}" in text \
        and f"--format {agent}" in text


# ---- reading and writing the user's files ---------------------------------------------------

@dataclass
class _File:
    """One file of an install: its text now and the text to write."""

    path: Path
    before: str | None
    after: str | None = None
    backup: Path | None = None

    @property
    def changed(self) -> bool:
        return self.after is not None and self.after != self.before


def _open(path: Path) -> _File:
    # A dotfiles symlink is followed: its target is the user's file; replacing the link with
    # a plain file would cut it off from their repository.
    real = path.resolve() if path.is_symlink() else path
    try:
        return _File(real, real.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return _File(real, None)
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text; nothing was changed",
                         hint="fix or move the file away, then run the install again") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}; nothing was changed") from None


def _json(file: _File, agent: str):
    from .jsonedit import JsonSyntaxError, load_document, new_document

    if file.before is None or not file.before.strip():
        return new_document({})
    try:
        return load_document(file.before)
    except JsonSyntaxError as exc:
        raise UsageError(f"{file.path} is not valid JSON ({exc}); nothing was changed",
                         hint=f"fix the file (or move it away), then run `llmem install {agent}` again") from None


def _toml(file: _File, agent: str):
    import tomlkit
    from tomlkit.exceptions import ParseError

    try:
        return tomlkit.parse(file.before or "")
    except ParseError as exc:
        raise UsageError(f"{file.path} is not valid TOML ({exc}); nothing was changed",
                         hint=f"fix the file (or move it away), then run `llmem install {agent}` again") from None


def _backup_path(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    candidate = path.with_name(f"{path.name}.llmem-backup-{stamp}")
    n = 2
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.llmem-backup-{stamp}-{n}")
        n += 1
    return candidate


def _write(file: _File) -> None:
    """Back the old file up beside it, then replace it atomically keeping its mode (new: 0600)."""
    path = file.path
    if file.before is not None:
        file.backup = _backup_path(path)
        shutil.copy2(path, file.backup)
    else:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = path.stat().st_mode & 0o777 if file.before is not None else 0o600
    write_atomically(path, file.after, mode)


# ---- outcome --------------------------------------------------------------------------------

@dataclass
class Part:
    """What one install did to one thing: the plugin, hooks, notify program or MCP server."""

    part: str  # plugin | hooks | notify | mcp
    path: Path
    action: str  # created | updated | unchanged | removed | absent | kept
    file: _File | None = None

    def as_dict(self) -> dict:
        backup = self.file.backup if self.file is not None else None
        return {"part": self.part, "path": str(self.path), "action": self.action,
                "backup": str(backup) if backup else None}


@dataclass
class Outcome:
    agent: str
    parts: list[Part] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        first = self.parts[0]
        return {"agent": self.agent, "path": str(first.path), "action": first.action,
                "parts": [p.as_dict() for p in self.parts], "notes": self.notes}


# ---- the edits ------------------------------------------------------------------------------

def _our_hooks(data: Any, agent: str) -> list[tuple[str, int, int, dict]]:
    """(event, group index, hook index, hook) of every llmem hook in a hooks document."""
    found = []
    hooks = data.get("hooks") if isinstance(data, dict) else None
    if not isinstance(hooks, dict):
        return found
    for event, groups in hooks.items():
        if not isinstance(groups, list):
            continue
        for g, group in enumerate(groups):
            entries = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(entries, list):
                continue
            found.extend((event, g, h, entry) for h, entry in enumerate(entries)
                         if is_llmem_hook(entry, agent))
    return found


def _remove_hooks(doc, agent: str) -> int:
    removed = 0
    while found := _our_hooks(doc.data, agent):
        event, g, h, _ = found[-1]  # last first: the indices of the others stay right
        doc.remove_member(("hooks", event, g, "hooks"), h)
        removed += 1
    return removed


def _edit_hooks(doc, agent: str, command: list[str], uninstall: bool) -> str:
    found = _our_hooks(doc.data, agent)
    if uninstall:
        return "removed" if _remove_hooks(doc, agent) else "absent"
    wanted = desired_hooks(command, agent)
    have = sorted((event, json.dumps(entry, sort_keys=True)) for event, _, _, entry in found)
    if have == sorted((event, json.dumps(entry, sort_keys=True)) for event, entry in wanted.items()):
        return "unchanged"
    _remove_hooks(doc, agent)
    for event, entry in wanted.items():
        doc.append_item(("hooks", event), {"hooks": [entry]})
    return "updated" if found else "created"


def _edit_json_server(doc, key_path: tuple, agent: str, command: list[str], uninstall: bool,
                      file: Path, notes: list[str]) -> str:
    servers = doc.get(key_path)
    entry = servers.get(SERVER_NAME) if isinstance(servers, dict) else None
    wanted = mcp_entry(agent, command)
    if servers is not None and not isinstance(servers, dict):
        raise UsageError(f"{file}: '{'.'.join(key_path)}' is not an object; nothing was changed",
                         hint="fix the file, then run the install again")
    if entry is None:
        if uninstall:
            return "absent"
        doc.set_member(key_path, SERVER_NAME, wanted)
        return "created"
    if not is_llmem_server(agent, entry, command):
        notes.append(f"{file} already has an `{SERVER_NAME}` MCP server that `llmem install` did "
                     "not write; it was left as it is (remove it by hand to let llmem manage it)")
        return "kept"
    if uninstall:
        doc.remove_member(key_path, SERVER_NAME)
        return "removed"
    if entry.get("enabled") is False:  # switched off in OpenCode by the user: it stays off
        wanted = {**wanted, "enabled": False}
    if entry == wanted:
        return "unchanged"
    doc.set_member(key_path, SERVER_NAME, wanted)
    return "updated"


def _edit_codex_config(doc, command: list[str], uninstall: bool, file: Path, notes: list[str],
                       with_mcp: bool) -> tuple[str, str | None]:
    """(notify action, MCP action or None) on Codex's config.toml document."""
    import tomlkit
    from tomlkit.items import InlineTable

    notify = doc.get("notify")
    current = notify.unwrap() if hasattr(notify, "unwrap") else notify
    wanted = notify_argv(command)
    if current is None:
        notify_action = "absent" if uninstall else "created"
        if not uninstall:
            doc["notify"] = wanted
    elif not is_llmem_notify(current):
        notify_action = "kept"
        if not uninstall:
            theirs = shlex.join(current) if isinstance(current, list) else str(current)
            notes.append(
                f"Codex already runs `{theirs}` as its notify program ({file}); llmem left it, since "
                "Codex runs only one. To feed llmem as well, have your program also run "
                f"`{shlex.join(wanted)} \"$1\"` (with the same JSON argument), or rely on llmem's "
                "Stop hook in hooks.json once you trust it")
    elif uninstall:
        del doc["notify"]
        notify_action = "removed"
    elif current == wanted:
        notify_action = "unchanged"
    else:
        doc["notify"] = wanted
        notify_action = "updated"
    if not with_mcp:
        return notify_action, None

    servers = doc.get("mcp_servers")
    if servers is not None and not isinstance(servers, dict):  # tomlkit's tables are dicts
        raise UsageError(f"{file}: 'mcp_servers' is not a table; nothing was changed",
                         hint="fix the file, then run `llmem install codex` again")
    entry = servers.get(SERVER_NAME) if servers is not None else None
    entry = entry.unwrap() if hasattr(entry, "unwrap") else entry
    wanted_entry = mcp_entry("codex", command)
    if entry is None:
        if uninstall:
            return notify_action, "absent"
        if isinstance(servers, InlineTable):  # `mcp_servers = { … }` takes an inline entry
            table = tomlkit.inline_table()
            table.update(wanted_entry)
        else:
            table = tomlkit.table()
            for key, value in wanted_entry.items():
                table[key] = value
            table.add(tomlkit.nl())  # a blank line before whatever table follows
        if servers is None:
            servers = tomlkit.table(is_super_table=True)
            servers[SERVER_NAME] = table
            doc["mcp_servers"] = servers
        else:
            servers[SERVER_NAME] = table
        return notify_action, "created"
    if not is_llmem_server("codex", entry, command):
        notes.append(f"{file} already has an `[mcp_servers.{SERVER_NAME}]` that `llmem install` did "
                     "not write; it was left as it is (remove it by hand to let llmem manage it)")
        return notify_action, "kept"
    if uninstall:
        del servers[SERVER_NAME]
        if not servers:
            del doc["mcp_servers"]
        return notify_action, "removed"
    if entry == wanted_entry:
        return notify_action, "unchanged"
    for key, value in wanted_entry.items():
        servers[SERVER_NAME][key] = value
    return notify_action, "updated"


# ---- install --------------------------------------------------------------------------------

def install(config, agent: str, *, uninstall: bool = False, with_mcp: bool = True,
            command: list[str] | None = None) -> Outcome:
    """Install (or remove) llmem's hooks/plugin and MCP server for one agent."""
    import tomlkit

    if agent not in AGENTS:
        raise UsageError(f"unknown agent {agent!r}", hint="use one of: " + ", ".join(AGENTS))
    command = command or integrations.llmem_command()
    outcome = Outcome(agent)
    files: list[_File] = []
    parts: list[Part] = []

    # Plan: read and edit every shared file in memory first; a broken one stops here.
    if agent == "claude":
        settings = _open(settings_path(config))
        doc = _json(settings, agent)
        parts.append(Part("hooks", settings.path, _edit_hooks(doc, agent, command, uninstall), settings))
        settings.after = doc.text()
        files.append(settings)
        if with_mcp:
            user = _open(claude_json_path(config))
            doc = _json(user, agent)
            action = _edit_json_server(doc, ("mcpServers",), agent, command, uninstall, user.path, outcome.notes)
            user.after = doc.text()
            parts.append(Part("mcp", user.path, action, user))
            files.append(user)
    elif agent == "codex":
        hooks = _open(codex_hooks_path(config))
        doc = _json(hooks, agent)
        parts.append(Part("hooks", hooks.path, _edit_hooks(doc, agent, command, uninstall), hooks))
        hooks.after = doc.text()
        files.append(hooks)
        toml_file = _open(codex_config_path(config))
        toml_doc = _toml(toml_file, agent)
        notify_action, mcp_action = _edit_codex_config(toml_doc, command, uninstall, toml_file.path,
                                                       outcome.notes, with_mcp)
        toml_file.after = tomlkit.dumps(toml_doc)
        parts.append(Part("notify", toml_file.path, notify_action, toml_file))
        if mcp_action is not None:
            parts.append(Part("mcp", toml_file.path, mcp_action, toml_file))
        files.append(toml_file)
        if not uninstall and parts[0].action in ("created", "updated"):
            outcome.notes.append(
                f"Codex runs the hooks in {hooks.path} only after you trust them, which an installer "
                "cannot do for you: start `codex`, open /hooks and approve llmem's hooks. Until then "
                "Codex's notify program tells llmem when each turn ends")
    elif with_mcp:
        path = opencode_config_file(config) if agent == "opencode" else copilot_mcp_path(config)
        shared = _open(path)
        if shared.before is None and not uninstall and agent == "opencode":
            from .jsonedit import new_document

            doc = new_document({"$schema": "https://opencode.ai/config.json"})
        else:
            doc = _json(shared, agent)
        key = ("mcp",) if agent == "opencode" else ("mcpServers",)
        action = _edit_json_server(doc, key, agent, command, uninstall, shared.path, outcome.notes)
        shared.after = doc.text()
        parts.append(Part("mcp", shared.path, action, shared))
        files.append(shared)

    # Files llmem owns whole: written (or refused) before the shared files are touched.
    if agent in ("opencode", "copilot"):
        write = integrations.install_opencode if agent == "opencode" else integrations.install_copilot
        result = write(config, uninstall=uninstall, command=command)
        parts.insert(0, Part("plugin" if agent == "opencode" else "hooks", result.path, result.action))

    for file in files:
        if uninstall and file.before is not None and file.changed and file.after.strip() in ("{}", ""):
            # Nothing but llmem's members was in it: the file goes (after its backup), as
            # it was before the install created it.
            file.backup = _backup_path(file.path)
            shutil.copy2(file.path, file.backup)
            file.path.unlink()
        elif file.changed and not (file.before is None and uninstall):
            _write(file)
    outcome.parts = parts
    if not uninstall and any(p.action in ("created", "updated") for p in parts):
        outcome.notes.append(f"Restart {LABELS[agent]} to load the changes")
    return outcome


# ---- doctor ---------------------------------------------------------------------------------

def _detected(config, agent: str) -> tuple[bool, Path]:
    from ..adapters.detect import (
        CLAUDE_PROJECTS_DIR,
        CODEX_SESSIONS_DIR,
        has_claude_projects,
        has_codex_sessions,
        has_opencode_data,
        has_sessions,
    )

    session = config.values["session"]
    if agent == "opencode":
        data_dir = expand(session["opencode"]["data_dir"])
        return has_opencode_data(data_dir), data_dir
    if agent == "copilot":
        state_dir = expand(session["copilot"]["state_dir"])
        return has_sessions(state_dir), state_dir
    if agent == "claude":
        home = claude_home(config)
        return has_claude_projects(home), home / CLAUDE_PROJECTS_DIR
    home = codex_home(config)
    return has_codex_sessions(home), home / CODEX_SESSIONS_DIR


def _peek_json(path: Path) -> Any:
    """The data of an agent's JSON file for a read-only check (None when missing)."""
    from .jsonedit import JsonSyntaxError, load_document

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} cannot be read: {exc}") from None
    if not text.strip():
        return None
    try:
        return json.loads(text)  # strict JSON at stdlib speed; JSONC goes to the model below
    except ValueError:
        pass
    try:
        return load_document(text).data
    except JsonSyntaxError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None


def agent_status(config, agent: str) -> dict[str, Any]:
    """Detected (its store is on disk), hooks installed, MCP registered — read only, never raises."""
    detected, store = _detected(config, agent)
    status: dict[str, Any] = {"agent": agent, "detected": detected, "store": str(store),
                              "hooks": False, "mcp": False, "error": None}
    try:
        if agent == "opencode":
            plugin = integrations.opencode_plugin_path(config)
            status["hooks"] = plugin.is_file() and integrations.is_llmem_plugin(plugin.read_text(errors="replace"))
            servers = (_peek_json(opencode_config_file(config)) or {}).get("mcp")
        elif agent == "copilot":
            hooks = integrations.copilot_hooks_path(config)
            status["hooks"] = hooks.is_file() and integrations.is_llmem_hooks(hooks.read_text(errors="replace"))
            servers = (_peek_json(copilot_mcp_path(config)) or {}).get("mcpServers")
        elif agent == "claude":
            found = {event for event, *_ in _our_hooks(_peek_json(settings_path(config)), agent)}
            status["hooks"] = found >= set(HOOK_EVENTS[agent])
            servers = (_peek_json(claude_json_path(config)) or {}).get("mcpServers")
        else:
            import tomlkit

            found = {event for event, *_ in _our_hooks(_peek_json(codex_hooks_path(config)), agent)}
            status["hooks"] = found >= set(HOOK_EVENTS[agent])
            path = codex_config_path(config)
            try:
                codex_config = tomlkit.parse(path.read_text(encoding="utf-8")).unwrap() if path.exists() else {}
            except Exception as exc:  # tomlkit's ParseError and unreadable files alike
                raise ValueError(f"{path} is not valid TOML ({exc})") from None
            status["notify"] = is_llmem_notify(codex_config.get("notify"))
            servers = codex_config.get("mcp_servers")
        status["mcp"] = isinstance(servers, dict) and isinstance(servers.get(SERVER_NAME), dict)
    except ValueError as exc:
        status["error"] = str(exc)
    return status
