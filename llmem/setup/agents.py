"""`llmem install <agent>`: each agent's hooks (or plugin) and its MCP registration of
`llmem mcp`, and what `llmem doctor` reports about them.

Files llmem owns whole (the OpenCode plugin, the Copilot hooks file) are written by
integrations.py. The agents' own config files are checked by userfile.py (no link out of the
agent's folder, no device or FIFO, no foreign or read-only file) and edited in place, one
member at a time (jsonedit.py for JSON/JSONC, tomledit.py for TOML), after a backup beside the
file (one per original); every file of an install is read and checked before any is written,
so a bad one stops the install with nothing changed. Uninstall gives back the original bytes
from that backup when the file is still exactly what the install made of them. A second install changes nothing, and `--uninstall`
removes exactly the members llmem added: a member llmem did not write (a user's own `llmem`
server entry, another notify program) is left as it is and said so."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LlmemError, UsageError
from ..paths import write_atomically
from . import integrations, userfile
from .environment import FOLDER_VARIABLES, STORE_VARIABLES, launch_environment, store_environment

SERVER_NAME = "llmem"


# ---- which agents, from the registry (adapters/registry.py) ----------------------------------

def _unit(agent: str):
    from ..adapters.registry import get_agent

    return get_agent(agent)


def installable_agents() -> tuple[str, ...]:
    """The registered agents llmem installs into: those with a recipe (RECIPES, below)."""
    from ..adapters.registry import agent_names

    return tuple(name for name in agent_names() if name in RECIPES)


def label(agent: str) -> str:
    """The agent as its user knows it ("Codex CLI")."""
    return _unit(agent).label


def filters_mcp_env(agent: str) -> bool:
    """Whether the agent starts an MCP server without passing its environment through (Codex
    passes an allow-list, Copilot only PATH): its entry carries the folder variables in `env`."""
    return _unit(agent).mcp_env_filtered


def hook_events(agent: str) -> dict[str, tuple[str, int]]:
    """The agent's hook events (Claude Code and Codex share the schema) → (llmem moment, timeout s)."""
    return _unit(agent).hook_events


# ---- where each agent keeps its files -----------------------------------------------------

def claude_home(config) -> Path:
    """Claude Code's config home: $CLAUDE_CONFIG_DIR, else session.claude.config_dir."""
    return _unit("claude").config_home(config)


def claude_json_path(config) -> Path:
    """Claude Code's user file with the user-scope MCP servers: inside
    $CLAUDE_CONFIG_DIR when set, else `.claude.json` beside the default ~/.claude (a config
    folder elsewhere is only ever used through CLAUDE_CONFIG_DIR, so it holds the file)."""
    if os.environ.get("CLAUDE_CONFIG_DIR"):
        return claude_home(config) / ".claude.json"
    home = claude_home(config)
    return home.parent / ".claude.json" if home.name == ".claude" else home / ".claude.json"


def codex_home(config) -> Path:
    """Codex's home: $CODEX_HOME, else session.codex.home."""
    return _unit("codex").home(config)


def copilot_home(config) -> Path:
    """Copilot CLI's home: $COPILOT_HOME, else session.copilot.home."""
    return _unit("copilot").home(config)


def opencode_config_file(config) -> Path:
    """OpenCode's global config: opencode.jsonc wins over opencode.json when both exist (it
    is merged last), and a fresh folder gets opencode.json."""
    folder = config.session.opencode.config_dir
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
    return f"{shlex.join(command)} hook --adapter {agent} --format {_unit(agent).hook_format} --type {kind}"


def desired_hooks(command: list[str], agent: str) -> dict[str, dict]:
    return {event: {"type": "command", "command": hook_command(command, agent, kind), "timeout": timeout}
            for event, (kind, timeout) in hook_events(agent).items()}


def notify_argv(command: list[str]) -> list[str]:
    return [*command, "hook", "--adapter", "codex", "--type", "idle"]


def mcp_entry(agent: str, command: list[str]) -> dict:
    """The `llmem` server entry in the agent's own shape: always the llmem executable itself, never `python` (Copilot rewrites a bare
    `python -m` into `pipx run`); for an agent that filters the environment, with the folder
    and store variables set now in `env` (the store URL without its password)."""
    recipe = RECIPES[agent]
    entry = recipe.mcp_entry(command)
    if not filters_mcp_env(agent):
        return entry
    env = launch_environment()
    if recipe.env_expands_variables:  # `$VAR` in an env value would be expanded: such a path would change
        env = {name: value for name, value in env.items() if "$" not in value}
    return {**entry, "env": env} if env else entry


def _is_llmem_env(env: Any) -> bool:
    """An `env` llmem writes: folder and store variables only, as strings (any values: set at
    install)."""
    return isinstance(env, dict) and set(env) <= {*FOLDER_VARIABLES, *STORE_VARIABLES} \
        and all(isinstance(value, str) for value in env.values())


def _llmem_prefix(argv: Any) -> int:
    """How many leading words of `argv` run llmem (1: the llmem script, 4: python -I -m llmem,
    3: the python -m llmem of earlier installs), 0: none."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return 0
    if Path(argv[0]).name == "llmem":
        return 1
    flags = 1
    while flags < len(argv) and argv[flags] in ("-I", "-E", "-P"):
        flags += 1
    return flags + 2 if argv[flags:flags + 2] == ["-m", "llmem"] else 0


def _command_and_args(entry: dict) -> Any:
    """The argv of an entry holding `command` and `args` (Claude Code, Copilot, Codex)."""
    args = entry.get("args", [])
    return [entry.get("command"), *args] if isinstance(args, list) else None


def is_llmem_server(agent: str, entry: Any, command: list[str]) -> bool:
    """An `llmem` server entry shaped as llmem install writes it (any llmem path): safe to
    update or remove. One with other keys or other arguments is the user's own."""
    ours = set(mcp_entry(agent, command)) | ({"env"} if filters_mcp_env(agent) else set())
    if not isinstance(entry, dict) or not set(entry) <= ours or not _is_llmem_env(entry.get("env", {})):
        return False
    argv = RECIPES[agent].entry_argv(entry)
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
        and f"--format {_unit(agent).hook_format}" in text


# ---- reading and writing the user's files ---------------------------------------------------

# How many times a file that changed under llmem (the agent rewrote it meanwhile) is read and
# edited again before the install gives up and says so.
WRITE_ATTEMPTS = 5


@dataclass
class _File:
    """One file of an install: its text now and the text to write.

    `path` is the config path as named, `real` the file read and written (the target of a
    symlink that stays in the agent's folder). `edit(text, uninstall)` gives the new text and
    each part's action for any content, so the file can be edited again when it changed.
    """

    path: Path
    real: Path
    before: str | None
    edit: Callable[[str | None, bool], tuple[str | None, dict[str, str], list[str]]]
    after: str | None = None
    backup: Path | None = None
    remove: bool = False  # uninstall deletes the file: llmem created it and only llmem's was in it
    restored: bool = False  # uninstall gives back the original bytes kept in a backup
    fresh: dict | None = None  # what a file llmem creates starts with (OpenCode's `$schema`)
    actions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.remove or (self.after is not None and self.after != self.before)


def _open(path: Path, edit) -> _File:
    real = userfile.real_path(path)
    return _File(path, real, userfile.read_text(real), edit)


def _json(text: str | None):
    from .jsonedit import JsonSyntaxError, load_document, new_document

    if text is None or not text.strip():
        return new_document({})
    try:
        return load_document(text)
    except RecursionError:
        raise JsonSyntaxError("nested too deeply") from None


def _refusal(path: Path, agent: str, exc: Exception) -> UsageError:
    """The UsageError for a file llmem cannot edit (broken, or not shaped as the agent reads it)."""
    from tomllib import TOMLDecodeError

    from .tomledit import TomlEditError

    if isinstance(exc, RecursionError):
        detail = "not valid JSON (nested too deeply)"
    elif isinstance(exc, TOMLDecodeError):
        detail = f"not valid TOML ({exc})"
    elif isinstance(exc, TomlEditError):
        detail = f"not edited: {exc}"
    elif str(exc).startswith("'"):  # "'hooks' is not an object": the shape, not the syntax
        detail = f"not shaped as {label(agent)} reads it: {exc}"
    else:
        detail = f"not valid JSON ({exc})"
    return UsageError(f"{path} is {detail}; nothing was changed",
                      hint=f"fix the file (or move it away), then run `llmem install {agent}` again")


def _changes(actions: dict[str, str]) -> bool:
    return any(action in ("created", "updated", "removed") for action in actions.values())


def _plan(file: _File, agent: str, uninstall: bool) -> None:
    """Work out `file.after` (or its removal) from `file.before`; UsageError when it cannot be edited."""
    from tomllib import TOMLDecodeError

    from .jsonedit import JsonSyntaxError
    from .tomledit import TomlEditError

    try:
        after, file.actions, notes = file.edit(file.before, uninstall)
    except (JsonSyntaxError, TOMLDecodeError, TomlEditError, RecursionError) as exc:
        raise _refusal(file.path, agent, exc) from None
    file.notes = notes
    file.after, file.remove, file.restored = after, False, False
    if not uninstall or not _changes(file.actions) or file.before is None:
        return
    original = _original(file)
    if original is not None:
        file.after, file.restored = original, True
    elif after.strip() in ("{}", "") or (file.fresh is not None and _json(after).data == file.fresh):
        # Only llmem's members (and what llmem starts a new file with) were in it and no
        # backup holds an earlier file: llmem created it, so it goes, as before the install.
        file.remove = True


def _original(file: _File) -> str | None:
    """The bytes the file had before llmem was installed into it, when the file is still exactly
    what the install made of them: a backup without llmem's members whose install gives the
    file as it is now. Uninstall then gives back those bytes (CRLF, comments, a user's empty
    `"hooks": {}`), not an approximation."""
    backups = [text for text in map(userfile.read_backup, userfile.backups_of(file.real)) if text is not None]
    if file.after in backups:
        return file.after  # removing llmem's members already gives back a backup's bytes
    for text in backups:
        try:
            _, actions, _ = file.edit(text, True)
            if _changes(actions):
                continue  # llmem's members are in it: not an original
            installed, _, _ = file.edit(text, False)
        except Exception:  # a backup that no longer parses is simply not the one
            continue
        if installed == file.before:
            return text
    return None


def _kept_containers(real: Path):
    """For a member removal: the containers (object paths) a backup of the original had, which
    stay even when removing llmem's member leaves them empty."""
    for backup in userfile.backups_of(real):
        text = userfile.read_backup(backup)
        try:
            data = json.loads(text) if text and text.strip() else None
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and not _holds_llmem(data):
            def keep(path, data=data) -> bool:
                node: Any = data
                for step in path:
                    if not isinstance(step, str) or not isinstance(node, dict) or step not in node:
                        return False
                    node = node[step]
                return True
            return keep
    return None


def _holds_llmem(data: dict) -> bool:
    """Whether a JSON config holds a member llmem installs (a backup made after an install)."""
    if any(_our_hooks(data, agent) for agent in installable_agents() if hook_events(agent)):
        return True
    return any(isinstance(data.get(key), dict) and SERVER_NAME in data[key] for key in ("mcpServers", "mcp"))


def _worth_a_backup(file: _File) -> bool:
    """Whether the file as it is now is backed up before llmem writes it: an original (none of
    llmem's members in it: the user's file before llmem went in), or any file when no backup
    of it exists yet. A file llmem already edited is not backed up again at each run: the
    backup of its original stays the one (userfile.back_up keeps one per file)."""
    if not userfile.backups_of(file.real):
        return True
    try:
        _, actions, _ = file.edit(file.before, True)
    except Exception:  # it parsed when planned; unreadable now means: keep a copy
        return True
    return not _changes(actions)


def _before_replace(path: Path) -> None:
    """Called between reading a file and replacing it (a seam for the concurrent-writer tests)."""


def _commit(file: _File, agent: str, uninstall: bool) -> None:
    """Write (or remove) one planned file; when the agent rewrote it meanwhile, read and edit
    it again, and after writing read it back: a write lost to a concurrent writer is retried,
    never reported as done."""
    for _ in range(WRITE_ATTEMPTS):
        if not file.changed:
            return
        userfile.check_writable(file.real)
        if file.before is not None and not file.restored and not file.remove and _worth_a_backup(file):
            file.backup = userfile.back_up(file.real, file.before)
        _before_replace(file.real)
        now = userfile.read_text(userfile.real_path(file.path))
        if now == file.before:
            if file.remove:
                file.real.unlink()
                return
            if file.before is None:
                userfile.make_folder(file.real)
            mode = userfile.file_mode(file.real) if file.before is not None else 0o600
            write_atomically(file.real, file.after, mode)
            now = userfile.read_text(file.real)
            if now == file.after:
                return
        # Someone else wrote the file between our read and now: edit what is there.
        file.before = now
        _plan(file, agent, uninstall)
    raise LlmemError(f"{file.path} kept changing while llmem wrote it (another program, likely "
                     f"{label(agent)} itself, rewrites it); llmem's change may be missing",
                     hint=f"quit {label(agent)}, then run the install again")


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


def _remove_hooks(doc, agent: str, keep=None) -> int:
    removed = 0
    while found := _our_hooks(doc.data, agent):
        event, g, h, _ = found[-1]  # last first: the indices of the others stay right
        doc.remove_member(("hooks", event, g, "hooks"), h, keep)
        removed += 1
    return removed


def _edit_hooks(doc, agent: str, command: list[str], uninstall: bool, keep=None) -> str:
    found = _our_hooks(doc.data, agent)
    if uninstall:
        return "removed" if _remove_hooks(doc, agent, keep) else "absent"
    wanted = desired_hooks(command, agent)
    have = sorted((event, json.dumps(entry, sort_keys=True)) for event, _, _, entry in found)
    if have == sorted((event, json.dumps(entry, sort_keys=True)) for event, entry in wanted.items()):
        return "unchanged"
    _remove_hooks(doc, agent)
    for event, entry in wanted.items():
        doc.append_item(("hooks", event), {"hooks": [entry]})
    return "updated" if found else "created"


def _edit_json_server(doc, key_path: tuple, agent: str, command: list[str], uninstall: bool,
                      file: Path, notes: list[str], keep=None) -> str:
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
        doc.remove_member(key_path, SERVER_NAME, keep)
        return "removed"
    if entry.get("enabled") is False:  # switched off in OpenCode by the user: it stays off
        wanted = {**wanted, "enabled": False}
    if entry == wanted:
        return "unchanged"
    doc.set_member(key_path, SERVER_NAME, wanted)
    return "updated"


def _edit_codex_config(doc, command: list[str], uninstall: bool, file: Path, notes: list[str],
                       with_mcp: bool) -> dict[str, str]:
    """The notify (and MCP) actions on Codex's config.toml (a tomledit.TomlDocument)."""
    current = doc.data.get("notify")
    wanted = notify_argv(command)
    if current is None:
        notify_action = "absent" if uninstall else "created"
        if not uninstall:
            doc.set_notify(wanted)
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
        doc.remove_notify()
        notify_action = "removed"
    elif current == wanted:
        notify_action = "unchanged"
    else:
        doc.set_notify(wanted)
        notify_action = "updated"
    if not with_mcp:
        return {"notify": notify_action}

    servers = doc.data.get("mcp_servers")
    if servers is not None and not isinstance(servers, dict):
        raise UsageError(f"{file}: 'mcp_servers' is not a table; nothing was changed",
                         hint="fix the file, then run `llmem install codex` again")
    entry = servers.get(SERVER_NAME) if servers is not None else None
    wanted_entry = mcp_entry("codex", command)
    if entry is None:
        if uninstall:
            return {"notify": notify_action, "mcp": "absent"}
        doc.add_server(SERVER_NAME, wanted_entry)
        mcp_action = "created"
    elif not is_llmem_server("codex", entry, command):
        notes.append(f"{file} already has an `[mcp_servers.{SERVER_NAME}]` that `llmem install` did "
                     "not write; it was left as it is (remove it by hand to let llmem manage it)")
        mcp_action = "kept"
    elif uninstall:
        doc.remove_server(SERVER_NAME)
        mcp_action = "removed"
    elif entry == wanted_entry:
        mcp_action = "unchanged"
    else:
        doc.remove_server(SERVER_NAME)
        doc.add_server(SERVER_NAME, wanted_entry)
        mcp_action = "updated"
    return {"notify": notify_action, "mcp": mcp_action}


# ---- install --------------------------------------------------------------------------------

def _json_file(path: Path, edit_parts, fresh: dict | None = None) -> _File:
    """A JSON/JSONC file of an install; edit_parts(doc, uninstall, notes, keep) -> actions."""
    from .jsonedit import new_document

    def edit(text, uninstall):
        notes: list[str] = []
        doc = new_document(dict(fresh)) if text is None and fresh and not uninstall else _json(text)
        keep = _kept_containers(file.real) if uninstall else None
        actions = edit_parts(doc, uninstall, notes, keep)
        return (doc.text() if _changes(actions) else text), actions, notes

    file = _open(path, edit)
    file.fresh = fresh
    return file


def _toml_file(path: Path, command: list[str], with_mcp: bool) -> _File:
    from .tomledit import TomlDocument

    def edit(text, uninstall):
        notes: list[str] = []
        doc = TomlDocument(text or "")
        actions = _edit_codex_config(doc, command, uninstall, path, notes, with_mcp)
        return (doc.text if _changes(actions) else text), actions, notes

    return _open(path, edit)


def install(config, agent: str, *, uninstall: bool = False, with_mcp: bool = True,
            command: list[str] | None = None) -> Outcome:
    """Install (or remove) llmem's hooks/plugin and MCP server for one agent."""
    recipe = RECIPES.get(agent)
    if recipe is None:
        raise UsageError(f"unknown agent {agent!r}", hint="use one of: " + ", ".join(installable_agents()))
    command = command or integrations.llmem_command()
    outcome = Outcome(agent)
    plan: list[_File] = []

    # Plan: read, check and edit every shared file in memory first; a bad one stops here.
    def hooks(doc, undo, notes, keep):
        return {"hooks": _edit_hooks(doc, agent, command, undo, keep)}

    def server(key_path: tuple, path: Path):
        return lambda doc, undo, notes, keep: {
            "mcp": _edit_json_server(doc, key_path, agent, command, undo, path, notes, keep)}

    plan = recipe.files(config, command, with_mcp, hooks, server)
    for file in plan:
        _plan(file, agent, uninstall)
    for file in plan:  # a read-only or foreign file stops the install before anything is written
        if file.changed:
            userfile.check_writable(file.real)

    # Files llmem owns whole: written (or refused) before the shared files are touched.
    first: list[Part] = []
    if recipe.owned is not None:
        result = recipe.owned(config, uninstall=uninstall, command=command)
        first.append(Part(recipe.owned_part, result.path, result.action))

    for file in plan:
        _commit(file, agent, uninstall)
    outcome.parts = first + [Part(name, file.real, action, file)
                             for file in plan for name, action in file.actions.items()]
    outcome.notes = [note for file in plan for note in file.notes]
    if not uninstall and with_mcp and filters_mcp_env(agent) and (note := store_environment()[1]):
        outcome.notes.append(note)
    if recipe.installed_note is not None and not uninstall:
        outcome.notes += [note for note in [recipe.installed_note(plan)] if note]
    if not uninstall and any(p.action in ("created", "updated") for p in outcome.parts):
        outcome.notes.append(f"Restart {label(agent)} to load the changes")
    return outcome


# ---- doctor ---------------------------------------------------------------------------------

def _detected(config, agent: str) -> tuple[bool, Path]:
    """Whether the agent's store holds sessions, and where it is (adapters/agent.py)."""
    unit = _unit(agent)
    store = unit.store_dir(config)
    return unit.holds_sessions(store), store


def _peek_text(path: Path) -> str | None:
    """An agent's file for a read-only check, as the installer would read it (a FIFO or a link
    out of the folder is reported, never opened); None when missing."""
    try:
        return userfile.read_text(userfile.real_path(path))
    except UsageError as exc:
        raise ValueError(exc.message.removesuffix("; nothing was changed")) from None


def _peek_json(path: Path) -> Any:
    """The data of an agent's JSON file for a read-only check (None when missing)."""
    from .jsonedit import JsonSyntaxError, load_document

    text = _peek_text(path)
    if text is None or not text.strip():
        return None
    try:
        return json.loads(text)  # strict JSON at stdlib speed; JSONC goes to the model below
    except ValueError:
        pass
    try:
        return load_document(text).data
    except JsonSyntaxError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None


def _env_missing(agent: str, entry: dict) -> list[str]:
    """The folder variables set here that llmem's server entry does not pass as they are: the
    server the agent starts opens another store (an entry from an earlier install)."""
    command = integrations.llmem_command()
    if not is_llmem_server(agent, entry, command):
        return []  # the user's own entry: theirs to set
    have = entry.get("env") or {}
    return [name for name, value in (mcp_entry(agent, command).get("env") or {}).items() if have.get(name) != value]


def _snake(event: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(event))


def codex_hook_trust(ours: list, codex_config: dict, hooks_path: Path) -> dict[str, list[str]]:
    """Which of llmem's hooks in hooks.json Codex runs: it runs one only after the user approves
    it in /hooks, which writes `[hooks.state."<hooks.json path>:<event_snake>:<group>:<handler>"]`
    with a `trusted_hash` (`enabled = false`: switched off) into config.toml.
    The hash input is undocumented, so a hook llmem changed since may be trusted no more; what
    this reads is whether the user approved a hook in that place. {"approved"|"disabled"|
    "pending": [event, …]}."""
    state = codex_config.get("hooks", {}).get("state") if isinstance(codex_config.get("hooks"), dict) else None
    state = state if isinstance(state, dict) else {}
    places = {str(hooks_path), str(hooks_path.resolve())}
    trust: dict[str, list[str]] = {"approved": [], "disabled": [], "pending": []}
    for event, g, h, _ in ours:
        entry = next((state[key] for place in places
                      if isinstance(state.get(key := f"{place}:{_snake(event)}:{g}:{h}"), dict)), None)
        if entry is None or not entry.get("trusted_hash"):
            trust["pending"].append(event)
        elif entry.get("enabled") is False:
            trust["disabled"].append(event)
        else:
            trust["approved"].append(event)
    return trust


def agent_status(config, agent: str) -> dict[str, Any]:
    """Detected (its store is on disk), hooks installed, MCP registered — read only, never raises."""
    detected, store = _detected(config, agent)
    status: dict[str, Any] = {"agent": agent, "detected": detected, "store": str(store),
                              "hooks": False, "mcp": False, "error": None}
    try:
        servers = RECIPES[agent].status(config, agent, status)
        status["mcp"] = isinstance(servers, dict) and isinstance(servers.get(SERVER_NAME), dict)
        if status["mcp"] and filters_mcp_env(agent):
            status["mcp_env_missing"] = _env_missing(agent, servers[SERVER_NAME])
    except ValueError as exc:
        status["error"] = str(exc)
    return status


# ---- each agent's recipe --------------------------------------------------------------------
# What differs between agents is said once per agent here: its MCP entry's shape, the files an
# install edits (the shared ones, in place) or writes whole (integrations.py), what doctor reads
# back. The agent itself (its label, hook events, whether it filters the environment) is its
# unit's (adapters/agents/<name>.py); an agent without a recipe is read, never installed into.

@dataclass(frozen=True)
class Recipe:
    """How `llmem install <agent>` wires llmem into one agent."""

    # The `llmem` MCP server entry, without `env` (mcp_entry adds it where it is needed).
    mcp_entry: Callable[[list[str]], dict]
    # The argv an entry of that shape runs.
    entry_argv: Callable[[dict], Any]
    # files(config, command, with_mcp, hooks, server) → the shared files to edit, where `hooks`
    # edits a hooks document and `server(key_path, path)` an MCP servers member.
    files: Callable[..., list[_File]]
    # status(config, agent, status) fills status["hooks"] (and the agent's own keys) from its
    # files, and returns its MCP servers table.
    status: Callable[[Any, str, dict], Any]
    # A file llmem owns whole (integrations.install_*), and what an install outcome calls it.
    owned: Callable[..., Any] | None = None
    owned_part: str = "hooks"
    # The agent expands `$VAR` in an MCP entry's env values.
    env_expands_variables: bool = False
    # A note after an install that changed something, from the planned files (None: none).
    installed_note: Callable[[list[_File]], str | None] | None = None


def _opencode_files(config, command, with_mcp, hooks, server) -> list[_File]:
    if not with_mcp:
        return []
    path = opencode_config_file(config)
    return [_json_file(path, server(("mcp",), path), {"$schema": "https://opencode.ai/config.json"})]


def _opencode_status(config, agent: str, status: dict) -> Any:
    plugin = _peek_text(integrations.opencode_plugin_path(config))
    status["hooks"] = plugin is not None and integrations.is_llmem_plugin(plugin)
    return (_peek_json(opencode_config_file(config)) or {}).get("mcp")


def _copilot_files(config, command, with_mcp, hooks, server) -> list[_File]:
    return [_json_file(copilot_mcp_path(config), server(("mcpServers",), copilot_mcp_path(config)))] if with_mcp else []


def _copilot_status(config, agent: str, status: dict) -> Any:
    hooks = _peek_text(integrations.copilot_hooks_path(config))
    status["hooks"] = hooks is not None and integrations.is_llmem_hooks(hooks)
    return (_peek_json(copilot_mcp_path(config)) or {}).get("mcpServers")


def _claude_files(config, command, with_mcp, hooks, server) -> list[_File]:
    plan = [_json_file(settings_path(config), hooks)]
    if with_mcp:
        plan.append(_json_file(claude_json_path(config), server(("mcpServers",), claude_json_path(config))))
    return plan


def _claude_status(config, agent: str, status: dict) -> Any:
    found = {event for event, *_ in _our_hooks(_peek_json(settings_path(config)), agent)}
    status["hooks"] = found >= set(hook_events(agent))
    return (_peek_json(claude_json_path(config)) or {}).get("mcpServers")


def _codex_files(config, command, with_mcp, hooks, server) -> list[_File]:
    return [_json_file(codex_hooks_path(config), hooks), _toml_file(codex_config_path(config), command, with_mcp)]


def _codex_status(config, agent: str, status: dict) -> Any:
    import tomllib

    hooks_path = codex_hooks_path(config)
    ours = _our_hooks(_peek_json(hooks_path), agent)
    status["hooks"] = {event for event, *_ in ours} >= set(hook_events(agent))
    path = codex_config_path(config)
    try:
        codex_config = tomllib.loads(_peek_text(path) or "")
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML ({exc})") from None
    status["notify"] = is_llmem_notify(codex_config.get("notify"))
    if status["hooks"]:
        status["hook_trust"] = codex_hook_trust(ours, codex_config, hooks_path)
    return codex_config.get("mcp_servers")


def _codex_installed_note(plan: list[_File]) -> str | None:
    if plan[0].actions["hooks"] not in ("created", "updated"):
        return None
    return (f"Codex runs the hooks in {plan[0].real} only after you trust them, which an installer "
            "cannot do for you: start `codex`, open /hooks and approve llmem's hooks. Until then "
            "Codex's notify program tells llmem when each turn ends")


RECIPES: dict[str, Recipe] = {
    "opencode": Recipe(mcp_entry=lambda command: {"type": "local", "command": [*command, "mcp"], "enabled": True},
                       entry_argv=lambda entry: entry.get("command"), files=_opencode_files,
                       status=_opencode_status, owned=integrations.install_opencode, owned_part="plugin"),
    "copilot": Recipe(mcp_entry=lambda command: {"type": "local", "command": command[0],
                                                 "args": [*command[1:], "mcp"], "tools": ["*"]},
                      entry_argv=_command_and_args, files=_copilot_files, status=_copilot_status,
                      owned=integrations.install_copilot, env_expands_variables=True),
    "claude": Recipe(mcp_entry=lambda command: {"type": "stdio", "command": command[0], "args": [*command[1:], "mcp"]},
                     entry_argv=_command_and_args, files=_claude_files, status=_claude_status),
    "codex": Recipe(mcp_entry=lambda command: {"command": command[0], "args": [*command[1:], "mcp"]},
                    entry_argv=_command_and_args, files=_codex_files, status=_codex_status,
                    installed_note=_codex_installed_note),
}
