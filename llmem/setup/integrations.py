"""Agent integration: the OpenCode plugin and the Copilot CLI hooks file that call llmem.

Both files are rendered deterministically from the absolute command of this llmem, so
installing twice changes nothing (byte for byte); uninstalling removes a file only when
llmem wrote it. The shapes are those of an
OpenCode plugin module and a Copilot CLI hooks file.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..paths import write_atomically
from ..processes import python_module_command
from . import userfile

PLUGIN_FILE = "llmem.js"
HOOKS_FILE = "llmem.json"
PLUGIN_MARK = "// Written by `llmem install opencode`"

# How long the plugin waits for llmem before going on without it (fail open), killing it
# then: the first turn of a session waits for its context block, and a compaction for its
# block, so neither may hang on a stuck llmem. The compacting hook queues its work
# (or detaches it) before printing, so a timeout loses only the block.
CONTEXT_TIMEOUT_MS = 2_000
COMPACTING_TIMEOUT_MS = 5_000
# Copilot kills a hook command after timeoutSec; idle/compacting/ending return at once
# (queued for the worker, or detached when no worker runs).
COPILOT_START_TIMEOUT_SEC = 30
COPILOT_DETACHED_TIMEOUT_SEC = 15


def _console_script() -> str | None:
    """The absolute path of this llmem's console script, when there is one."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 and Path(argv0).name == "llmem" and Path(argv0).is_file():
        return os.path.abspath(argv0)
    # The script sits beside the interpreter of the environment llmem is installed in (do
    # not resolve symlinks: a venv's python is a link to the base interpreter).
    beside = Path(os.path.abspath(sys.executable)).parent / "llmem"
    if beside.is_file():
        return str(beside)
    found = shutil.which("llmem")
    return os.path.abspath(found) if found else None


def llmem_command() -> list[str]:
    """The absolute command that runs this llmem: its console script, else `python -I -m llmem`.

    -I (isolated mode): an agent runs hooks in the project's folder, and a plain `python -m`
    puts that folder first on sys.path, so a `llmem/` package in a checked-out repository
    would run instead of llmem."""
    script = _console_script()
    return [script] if script else python_module_command()


# ---- OpenCode --------------------------------------------------------------------------

_PLUGIN_TEMPLATE = """\
// llmem: long-term memory for OpenCode sessions.
// Written by `llmem install opencode`; `llmem install opencode --uninstall` removes it.
// Generated: edits are lost when llmem is installed again.
import { spawn } from "node:child_process"

const LLMEM = __COMMAND__
const CONTEXT_TIMEOUT_MS = __CONTEXT_TIMEOUT__
const COMPACTING_TIMEOUT_MS = __COMPACTING_TIMEOUT__
const MARKER = "<llmem-context>"
// Every session id this plugin sees is OpenCode's: llmem need not look it up in other agents.
const AGENT = ["--adapter", "opencode"]

// Run llmem and resolve with its output ("" on any failure or timeout). Never rejects.
function runLlmem(args, timeoutMs) {
  return new Promise((resolve) => {
    let out = ""
    let settled = false
    let timer = null
    const finish = (text) => {
      if (settled) return
      settled = true
      if (timer) clearTimeout(timer)
      resolve(text)
    }
    try {
      const child = spawn(LLMEM[0], [...LLMEM.slice(1), ...args], {
        stdio: ["ignore", "pipe", "ignore"],
        windowsHide: true,
      })
      timer = setTimeout(() => {
        try { child.kill() } catch {}
        finish("")
      }, timeoutMs)
      child.stdout?.setEncoding?.("utf8") // a character split across chunks stays whole
      child.stdout?.on("data", (chunk) => { out += chunk })
      child.on("error", () => finish(""))
      child.on("close", (code) => finish(code === 0 ? out.trim() : ""))
    } catch {
      finish("")
    }
  })
}

// Start llmem in a session of its own and do not wait: the agent never blocks on memory work.
function startLlmem(args) {
  try {
    const child = spawn(LLMEM[0], [...LLMEM.slice(1), ...args], {
      stdio: "ignore",
      detached: true,
      windowsHide: true,
    })
    child.on?.("error", () => {})
    child.unref?.()
  } catch {}
}

const contextBlock = (text) => (typeof text === "string" && text.includes(MARKER) ? text : "")

export const LlmemPlugin = async ({ directory, worktree } = {}) => {
  const project = worktree && worktree !== "/" ? worktree : directory
  const where = typeof project === "string" && project ? ["--project", project] : []
  // One context per session (not per turn): sessionID -> Promise<string>.
  const contexts = new Map()
  return {
    "experimental.chat.system.transform": async (input, output) => {
      try {
        const id = input?.sessionID
        if (typeof id !== "string" || !id || !Array.isArray(output?.system)) return
        if (!contexts.has(id)) {
          contexts.set(id, runLlmem(["context", "--session-id", id, ...AGENT, ...where], CONTEXT_TIMEOUT_MS))
        }
        const text = contextBlock(await contexts.get(id))
        if (text) output.system.push(text)
      } catch {}
    },
    "experimental.session.compacting": async (input, output) => {
      try {
        const id = input?.sessionID
        if (typeof id !== "string" || !id || !Array.isArray(output?.context)) return
        const text = contextBlock(await runLlmem(
          ["hook", "--type", "compacting", "--session-id", id, ...AGENT, ...where], COMPACTING_TIMEOUT_MS))
        if (text) output.context.push(text)
      } catch {}
    },
    event: async ({ event } = {}) => {
      try {
        const id = event?.properties?.sessionID
        if (typeof id !== "string" || !id) return
        if (event.type === "session.idle") {
          startLlmem(["hook", "--type", "idle", "--session-id", id, ...AGENT])
        } else if (event.type === "session.compacted") {
          // Catch up on what came after the compaction; the next turn gets a fresh block.
          contexts.delete(id)
          startLlmem(["hook", "--type", "idle", "--session-id", id, ...AGENT])
        }
      } catch {}
    },
  }
}
"""


def render_opencode_plugin(command: list[str] | None = None) -> str:
    """The plugin's JavaScript (ESM) for this llmem command."""
    command = command or llmem_command()
    return (_PLUGIN_TEMPLATE
            .replace("__COMMAND__", json.dumps(command))
            .replace("__CONTEXT_TIMEOUT__", str(CONTEXT_TIMEOUT_MS))
            .replace("__COMPACTING_TIMEOUT__", str(COMPACTING_TIMEOUT_MS)))


def is_llmem_plugin(text: str) -> bool:
    return PLUGIN_MARK in text[:400]


# ---- Copilot CLI -----------------------------------------------------------------------

COPILOT_EVENTS = {  # Copilot hook event -> (llmem hook type, timeoutSec)
    "sessionStart": ("created", COPILOT_START_TIMEOUT_SEC),
    "agentStop": ("idle", COPILOT_DETACHED_TIMEOUT_SEC),
    "preCompact": ("compacting", COPILOT_DETACHED_TIMEOUT_SEC),
    "sessionEnd": ("ending", COPILOT_DETACHED_TIMEOUT_SEC),
}


def render_copilot_hooks(command: list[str] | None = None) -> str:
    """The Copilot hooks file: each event's JSON arrives on stdin, `--format copilot` answers."""
    command = command or llmem_command()
    exe = " ".join(shlex.quote(part) for part in command)
    hooks = {
        event: [{"type": "command",
                 "bash": f"{exe} hook --type {kind} --adapter copilot --format copilot",
                 "timeoutSec": timeout}]
        for event, (kind, timeout) in COPILOT_EVENTS.items()
    }
    return json.dumps({"version": 1, "hooks": hooks}, indent=2) + "\n"


def is_llmem_hooks(text: str) -> bool:
    """True when a hooks file holds llmem's hook commands and nothing else."""
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if not isinstance(data, dict) or not isinstance(data.get("hooks"), dict):
        return False
    entries = [e for value in data["hooks"].values() if isinstance(value, list) for e in value]
    return bool(entries) and all(
        isinstance(e, dict) and " hook --type " in str(e.get("bash", "")) and "--format copilot" in str(e.get("bash", ""))
        for e in entries)


# ---- installing ------------------------------------------------------------------------

@dataclass
class InstallResult:
    agent: str
    path: Path
    action: str  # created | updated | unchanged | removed | absent

    def as_dict(self) -> dict:
        return {"agent": self.agent, "path": str(self.path), "action": self.action}


def _write(path: Path, text: str) -> None:
    # New folders are private; an existing one (the agent's own) keeps its mode. The temp file
    # is beside the real file (userfile.real_path keeps that inside the agent's folder).
    userfile.check_writable(path)
    userfile.make_folder(path)
    write_atomically(path, text, 0o600)


def _install(agent: str, path: Path, text: str, ours) -> InstallResult:
    real = userfile.real_path(path)
    current = userfile.read_text(real)
    if current is not None:
        if current == text:
            return InstallResult(agent, path, "unchanged")
        if not ours(current):
            raise UsageError(f"{path} exists and was not written by llmem; left as it is",
                             hint="move it away, then run the install again")
        _write(real, text)
        return InstallResult(agent, path, "updated")
    _write(real, text)
    return InstallResult(agent, path, "created")


def _uninstall(agent: str, path: Path, ours) -> InstallResult:
    real = userfile.real_path(path)
    current = userfile.read_text(real)
    if current is None:
        return InstallResult(agent, path, "absent")
    if not ours(current):
        raise UsageError(f"{path} was not written by llmem; left as it is",
                         hint="remove it by hand if you are sure")
    userfile.check_writable(real)
    real.unlink()
    if real != path:
        path.unlink()  # the link beside it would dangle
    return InstallResult(agent, path, "removed")


def opencode_plugin_path(config) -> Path:
    return config.session.opencode.plugins_dir / PLUGIN_FILE


def copilot_hooks_path(config) -> Path:
    return config.session.copilot.hooks_dir / HOOKS_FILE


def install_opencode(config, *, uninstall: bool = False, command: list[str] | None = None) -> InstallResult:
    """Write (or remove) the OpenCode plugin in session.opencode.plugins_dir."""
    path = opencode_plugin_path(config)
    if uninstall:
        return _uninstall("opencode", path, is_llmem_plugin)
    return _install("opencode", path, render_opencode_plugin(command), is_llmem_plugin)


def install_copilot(config, *, uninstall: bool = False, command: list[str] | None = None) -> InstallResult:
    """Write (or remove) the Copilot CLI hooks file in session.copilot.hooks_dir."""
    path = copilot_hooks_path(config)
    if uninstall:
        return _uninstall("copilot", path, is_llmem_hooks)
    return _install("copilot", path, render_copilot_hooks(command), is_llmem_hooks)
