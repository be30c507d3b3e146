"""The installers fed 50-odd kinds of config file (issue 20, items 2, 3, 15 and 16).

Each case puts one hostile or unusual file where an agent keeps its config and runs the real
`llmem install` (and `--uninstall`). A case is one of:

- refused: exit 2, a message naming the file, no traceback, and nothing changed anywhere: not
  the file, not what a link points at, no backup, no temp file, no folder made outside;
- round trip: the install registers llmem and keeps every other value where it was (TOML
  top-level keys stay top-level), a second install changes nothing, `--uninstall` gives back
  the original bytes, and one backup at most is kept per original.

A failure says "DATA LOST" when the user's bytes are gone (neither in the file nor in a
backup) or something outside the agent's folder changed; the closing note counts both.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_install_agents import put

SETTINGS = '{\n  "model": "opus",\n  "hooks": {\n    "Stop": [\n      {\n        "hooks": [\n          {\n' \
           '            "type": "command",\n            "command": "say done"\n          }\n        ]\n' \
           '      }\n    ]\n  }\n}\n'
DOTTED_TOML = 'model = "o3"\nmcp_servers.github.command = "gh-mcp"\napproval_policy = "never"\n'


@dataclass
class Case:
    id: str
    agent: str
    file: str  # the file the case is about: "<agent folder>/<name>", e.g. "claude/settings.json"
    make: object  # (path, outside folder) -> None: puts the hostile thing at `path`
    refused: bool = False
    message: str = ""
    extra: dict = field(default_factory=dict)  # other files: "claude/.claude.json" -> text
    slow_open: bool = False  # a FIFO: run in a subprocess with a timeout, never in-process


def text(content: str, mode: int | None = None):
    def make(path: Path, outside: Path) -> None:
        put(path, content)
        if mode is not None:
            path.chmod(mode)
    return make


def raw(content: bytes):
    def make(path: Path, outside: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return make


def link_to(target_of, make_target=None):
    """A symlink at `path` to target_of(path, outside), made first by make_target when given."""
    def make(path: Path, outside: Path) -> None:
        target = target_of(path, outside)
        if make_target:
            make_target(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    return make


def fifo(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(target)


def device(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers


def unix_socket(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(target))
    sock.close()  # the socket file stays


def regular(content: str):
    return lambda target: put(target, content)


def foreign_owner(content: str):
    def make(path: Path, outside: Path) -> None:
        put(path, content)
        os.chown(path, 12345, 12345)
    return make


def folder(path: Path, outside: Path) -> None:
    path.mkdir(parents=True)


def loop(path: Path, outside: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    other = path.with_name("other-link")
    path.symlink_to(other)
    other.symlink_to(path)


def dangling_folder(path: Path, outside: Path) -> None:
    """The agent's folder itself a link to a folder that does not exist."""
    path.parent.symlink_to(outside / "missing" / "claude")


def self_loop(path: Path, outside: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(path.name)


def deep_json(depth: int) -> str:
    return '{"hooks": ' + "[" * depth + "]" * depth + "}\n"


OUT = lambda name: (lambda path, outside: outside / name)  # noqa: E731
BESIDE = lambda name: (lambda path, outside: path.with_name(name))  # noqa: E731

CASES = [
    # ---- refused: where the path points --------------------------------------------------
    Case("link-to-device", "claude", "claude/settings.json", link_to(OUT("null"), device), True, "symlink"),
    Case("is-a-device", "claude", "claude/settings.json", lambda p, o: device(p), True, "device"),
    Case("link-to-fifo", "claude", "claude/settings.json", link_to(OUT("pipe"), fifo), True, "symlink",
         slow_open=True),
    Case("is-a-fifo", "claude", "claude/settings.json", lambda p, o: fifo(p), True, "FIFO", slow_open=True),
    Case("link-to-fifo-inside", "claude", "claude/settings.json", link_to(BESIDE("pipe"), fifo), True, "FIFO",
         slow_open=True),
    Case("link-to-socket", "claude", "claude/settings.json", link_to(OUT("sock"), unix_socket), True, "symlink"),
    Case("is-a-socket", "claude", "claude/settings.json", lambda p, o: unix_socket(p), True, "socket"),
    Case("dangling-link-outside", "claude", "claude/settings.json",
         link_to(OUT("missing/dir/settings.json")), True, "does not exist"),
    Case("dangling-link-inside", "claude", "claude/settings.json", link_to(BESIDE("gone.json")), True,
         "does not exist"),
    Case("agent-folder-dangling-link", "claude", "claude/settings.json", dangling_folder, True,
         "cannot be created"),
    Case("symlink-loop", "claude", "claude/settings.json", loop, True, "loop"),
    Case("symlink-self-loop", "claude", "claude/settings.json", self_loop, True, "loop"),
    Case("link-to-outside-json", "claude", "claude/settings.json",
         link_to(OUT("dotfiles/settings.json"), regular('{"model": "opus"}\n')), True, "outside"),
    Case("link-to-outside-passwd", "claude", "claude/settings.json",
         link_to(OUT("etc/passwd"), regular("root:x:0:0:root:/root:/bin/bash\n")), True, "outside"),
    Case("claude-json-link-outside", "claude", "claude/.claude.json",
         link_to(OUT("elsewhere.json"), regular('{"numStartups": 1}\n')), True, "outside"),
    Case("foreign-owner", "claude", "claude/settings.json", foreign_owner('{"model": "opus"}\n'), True,
         "another user"),
    Case("read-only", "claude", "claude/settings.json", text('{"model": "opus"}\n', 0o444), True, "read-only"),
    Case("read-only-claude-json", "claude", "claude/.claude.json", text('{"numStartups": 1}\n', 0o444), True,
         "read-only"),
    Case("is-a-folder", "claude", "claude/settings.json", folder, True, "folder"),
    Case("codex-toml-link-outside", "codex", "codex/config.toml",
         link_to(OUT("config.toml"), regular('model = "o3"\n')), True, "outside"),
    Case("codex-toml-fifo", "codex", "codex/config.toml", lambda p, o: fifo(p), True, "FIFO", slow_open=True),
    Case("codex-toml-read-only", "codex", "codex/config.toml", text('model = "o3"\n', 0o444), True, "read-only"),
    Case("codex-hooks-device-link", "codex", "codex/hooks.json", link_to(OUT("null"), device), True, "symlink"),
    Case("codex-toml-foreign-owner", "codex", "codex/config.toml", foreign_owner('model = "o3"\n'), True,
         "another user"),
    Case("opencode-plugin-link-outside", "opencode", "opencode/plugins/llmem.js",
         link_to(OUT("plugin.js"), regular("// mine\n")), True, "outside"),
    Case("opencode-config-link-to-device", "opencode", "opencode/opencode.json", link_to(OUT("null"), device),
         True, "symlink"),
    Case("copilot-hooks-link-to-device", "copilot", "copilot/hooks/llmem.json", link_to(OUT("null"), device),
         True, "symlink"),
    Case("copilot-mcp-read-only", "copilot", "copilot/mcp-config.json", text('{"mcpServers": {}}\n', 0o444),
         True, "read-only"),
    # ---- refused: what the file holds ----------------------------------------------------
    Case("hooks-a-list", "claude", "claude/settings.json", text('{"hooks": []}\n'), True, "'hooks'"),
    Case("hooks-a-string", "claude", "claude/settings.json", text('{"hooks": "none"}\n'), True, "'hooks'"),
    Case("stop-an-object", "claude", "claude/settings.json", text('{"hooks": {"Stop": {}}}\n'), True,
         "'hooks.Stop'"),
    Case("deeply-nested-settings", "claude", "claude/settings.json", text(deep_json(100_000)), True,
         "nested too deeply"),
    Case("deeply-nested-claude-json", "claude", "claude/.claude.json",
         text('{"projects": ' + "[" * 100_000 + "]" * 100_000 + "}\n"), True, "nested too deeply"),
    Case("mcp-servers-a-list", "claude", "claude/.claude.json", text('{"mcpServers": []}\n'), True,
         "'mcpServers'"),
    Case("top-level-array", "claude", "claude/settings.json", text("[1, 2]\n"), True, "not an object"),
    Case("latin1", "claude", "claude/settings.json", raw(b'{"model": "\xe9t\xe9"}\n'), True, "UTF-8"),
    Case("broken-json", "claude", "claude/settings.json", text('{"hooks": {,}}\n'), True, "not valid JSON"),
    Case("codex-hooks-a-list", "codex", "codex/hooks.json", text('{"hooks": []}\n'), True, "'hooks'"),
    Case("codex-mcp-servers-a-string", "codex", "codex/config.toml", text('mcp_servers = "x"\n'), True,
         "'mcp_servers'"),
    # ---- round trips ---------------------------------------------------------------------
    Case("crlf-settings", "claude", "claude/settings.json", text(SETTINGS.replace("\n", "\r\n"))),
    Case("empty-hooks", "claude", "claude/settings.json", text('{\n  "hooks": {}\n}\n')),
    Case("empty-stop", "claude", "claude/settings.json", text('{\n  "hooks": {\n    "Stop": []\n  }\n}\n')),
    Case("keep-me-comment", "claude", "claude/settings.json",
         text('{\n  "hooks": {\n    // keep me\n  },\n  "model": "opus"\n}\n')),
    Case("empty-object", "claude", "claude/settings.json", text("{}")),
    Case("empty-object-newline", "claude", "claude/.claude.json", text("{}\n")),
    Case("empty-file", "claude", "claude/settings.json", text("")),
    Case("whitespace-file", "claude", "claude/settings.json", text("  \n\n")),
    Case("compact-claude-json", "claude", "claude/.claude.json",
         text(json.dumps({"numStartups": 3, "projects": {"/x": {"allowedTools": []}}}, separators=(",", ":")))),
    Case("four-space-indent", "claude", "claude/settings.json", text(json.dumps({"model": "opus"}, indent=4))),
    Case("tab-indent", "claude", "claude/settings.json", text(json.dumps({"model": "opus"}, indent="\t") + "\n")),
    Case("link-inside-folder", "claude", "claude/settings.json",
         link_to(BESIDE("settings.real.json"), regular('{"model": "opus"}\n'))),
    Case("codex-dotted-keys", "codex", "codex/config.toml", text(DOTTED_TOML)),
    Case("codex-dotted-under-table", "codex", "codex/config.toml",
         text('model = "o3"\n\n[profiles.fast]\nmodel = "o4-mini"\nsandbox.mode = "read-only"\n')),
    Case("codex-inline-tables", "codex", "codex/config.toml",
         text('model = "o3"\nmcp_servers = { docs = { url = "http://127.0.0.1:8765/mcp" } }\n'
              'approval_policy = "never"\n')),
    Case("codex-arrays-of-tables", "codex", "codex/config.toml",
         text('model = "o3"\n\n[[skills]]\nname = "a"\n\n[[skills]]\nname = "b"\n')),
    Case("codex-comments-between-keys", "codex", "codex/config.toml",
         text('# top\nmodel = "o3"\n# between\napproval_policy = "never" # trailing\n\n# before table\n'
              '[mcp_servers.github]\ncommand = "gh-mcp" # gh\n')),
    Case("codex-crlf", "codex", "codex/config.toml",
         text('model = "o3"\r\napproval_policy = "never"\r\n\r\n[history]\r\npersistence = "none"\r\n')),
    Case("codex-no-final-newline", "codex", "codex/config.toml", text('model = "o3"\n[history]\nmax_bytes = 1')),
    Case("codex-other-notify", "codex", "codex/config.toml",
         text('notify = ["notify-send", "Codex"]\nmodel = "o3"\n')),
    Case("codex-crlf-hooks-json", "codex", "codex/hooks.json",
         text('{\r\n  "hooks": {\r\n    "Stop": []\r\n  }\r\n}\r\n')),
    Case("opencode-jsonc", "opencode", "opencode/opencode.jsonc",
         text('// mine\n{\n  "model": "x", // the default\n  "mcp": {},\n}\n')),
    Case("copilot-crlf", "copilot", "copilot/mcp-config.json",
         text('{\r\n  "mcpServers": {\r\n    "docs": {\r\n      "type": "http",\r\n      "url": "http://x"\r\n'
              '    }\r\n  }\r\n}\r\n')),
]


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under `root`: its kind, and its bytes' hash for a regular file."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            found[str(path)] = "link:" + os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() + f":{stat.S_IMODE(info.st_mode):o}"
        else:
            found[str(path)] = f"kind:{stat.S_IFMT(info.st_mode)}"
    return found


def _kind(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    return ("link" if stat.S_ISLNK(mode) else "file" if stat.S_ISREG(mode) else "folder" if stat.S_ISDIR(mode)
            else "device" if stat.S_ISCHR(mode) else "FIFO" if stat.S_ISFIFO(mode) else "socket")


def _run(cli, case: Case, *args: str) -> tuple[int, str]:
    if not case.slow_open:
        code, out, err = cli("install", case.agent, *args)
        return code, out + err
    try:
        done = subprocess.run([sys.executable, "-m", "llmem", "install", case.agent, *args],
                              capture_output=True, text=True, timeout=20, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return -1, "HUNG: no answer in 20 s"
    return done.returncode, done.stdout + done.stderr


def _backups(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".llmem-backup-" in p.name]


def _saved(root: Path, data: bytes) -> bool:
    """Whether `data` is still somewhere under `root` (the file itself or a backup)."""
    return any(p.is_file() and not p.is_symlink() and p.read_bytes() == data for p in root.rglob("*"))


def _without_llmem_toml(data: dict) -> dict:
    data = json.loads(json.dumps(data))
    notify = data.get("notify")
    if isinstance(notify, list) and "hook" in notify and "--adapter" in notify:
        del data["notify"]
    servers = data.get("mcp_servers")
    if isinstance(servers, dict):
        servers.pop("llmem", None)
        if not servers:
            del data["mcp_servers"]
    return data


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_installer_battery(case, cli, homes, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    path = tmp_path / case.file
    case.make(path, outside)
    for name, content in case.extra.items():
        put(tmp_path / name, content)
    agent_folder = tmp_path / case.agent
    # The user's bytes, when they live in the agent's folder (what a link outside points at
    # is watched by the snapshot of `outside`).
    inside = path.is_file() and path.resolve().is_relative_to(agent_folder.resolve())
    original = path.read_bytes() if inside and not case.slow_open else None
    before_outside = _snapshot(outside)
    before_agent = _snapshot(agent_folder)

    kind = _kind(path)
    code, output = _run(cli, case)
    if kind not in ("missing", "file", "link") and _kind(path) != kind:
        pytest.fail(f"DATA LOST: the {kind} at {path} was replaced (exit {code}): {output}")
    if _snapshot(outside) != before_outside:
        pytest.fail(f"DATA LOST: something outside the agent's folder changed (exit {code}): {output}")
    if original is not None and not _saved(agent_folder, original):
        pytest.fail(f"DATA LOST: the original bytes of {path} are gone (exit {code}): {output}")
    if case.refused:
        assert "Traceback" not in output and "unexpected failure" not in output, output
        assert code == 2, output
        assert path.name in output and case.message.lower() in output.lower(), output
        assert _snapshot(agent_folder) == before_agent, "files changed in the agent's folder"
        code, output = _run(cli, case, "--uninstall")
        assert _snapshot(outside) == before_outside, "DATA LOST: uninstall changed a file outside"
        assert _snapshot(agent_folder) == before_agent, "uninstall changed files in the agent's folder"
        assert code in (0, 2) and "Traceback" not in output, output  # 0: nothing of llmem's to remove
        return

    assert code == 0, output
    installed = path.read_bytes().decode("utf-8") if path.exists() else ""
    assert "llmem" in installed, "llmem is not in the installed file"
    if path.suffix == ".toml":
        assert _without_llmem_toml(tomllib.loads(installed)) == tomllib.loads(original.decode()), \
            "the other keys of config.toml moved"
        assert "mcp_servers" in tomllib.loads(installed)
    if "link" in case.id:
        assert path.is_symlink(), "the link was replaced"
    snapshot = _snapshot(agent_folder)
    assert _run(cli, case)[0] == 0
    assert _snapshot(agent_folder) == snapshot, "a second install changed something"
    for _ in range(2):
        code, output = _run(cli, case, "--uninstall")
        assert code == 0, output
        assert path.read_bytes() == original, f"uninstall did not give back the bytes of {path}"
        assert _run(cli, case)[0] == 0
    assert _run(cli, case, "--uninstall")[0] == 0
    assert path.read_bytes() == original
    per_file: dict[str, int] = {}
    for backup in _backups(agent_folder):
        key = backup.name.split(".llmem-backup-")[0]
        per_file[key] = per_file.get(key, 0) + 1
    assert all(n <= 1 for n in per_file.values()), f"backups pile up: {per_file}"
