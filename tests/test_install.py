"""`llmem install opencode|copilot`: where the files go, idempotence, uninstall, and that they work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from llmem.setup import integrations

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


@pytest.fixture
def dirs(configure, tmp_path):
    plugins, hooks = tmp_path / "opencode" / "plugins", tmp_path / "copilot" / "hooks"
    configure("embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: none\n"
              f"  opencode:\n    plugins_dir: {plugins}\n  copilot:\n    hooks_dir: {hooks}\n")
    return plugins, hooks


def test_install_opencode_is_idempotent_and_uninstalls(cli, dirs):
    plugins, _ = dirs
    path = plugins / "llmem.js"
    code, out, err = cli("install", "opencode")
    assert code == 0, err
    assert out.startswith("Installed the OpenCode plugin") and path.is_file()
    first, mtime = path.read_bytes(), path.stat().st_mtime_ns
    code, out, _ = cli("install", "opencode")
    assert code == 0 and "already installed" in out
    assert path.read_bytes() == first and path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in plugins.iterdir()) == ["llmem.js"]  # no temp files left
    text = first.decode()
    command = json.loads(text.split("const LLMEM = ", 1)[1].split("\n", 1)[0])
    assert Path(command[0]).is_absolute() and Path(command[0]).exists()
    assert oct(path.stat().st_mode & 0o777) == "0o600"

    code, out, _ = cli("install", "opencode", "--uninstall")
    assert code == 0 and out.startswith("Removed") and not path.exists()
    code, out, _ = cli("install", "opencode", "--uninstall", "--json")
    assert code == 0 and json.loads(out)["action"] == "absent"


def test_a_file_llmem_did_not_write_is_left_alone(cli, dirs):
    plugins, hooks = dirs
    plugins.mkdir(parents=True)
    hooks.mkdir(parents=True)
    (plugins / "llmem.js").write_text("export const Mine = async () => ({})\n")
    (hooks / "llmem.json").write_text('{"version": 1, "hooks": {"sessionStart": [{"type": "command", "bash": "echo hi"}]}}')
    for agent, path in (("opencode", plugins / "llmem.js"), ("copilot", hooks / "llmem.json")):
        before = path.read_text()
        for args in ((), ("--uninstall",)):
            code, out, err = cli("install", agent, *args)
            assert code == 2 and "not written by llmem" in err
            assert path.read_text() == before


def test_an_older_llmem_file_is_updated(dirs):
    from llmem.config import load_config

    config = load_config()
    old = integrations.install_opencode(config, command=["/old/place/llmem"])
    assert old.action == "created"
    assert integrations.install_opencode(config).action == "updated"
    assert integrations.install_opencode(config).action == "unchanged"
    assert integrations.install_copilot(config, command=["/old/llmem"]).action == "created"
    assert integrations.install_copilot(config).action == "updated"


def test_a_hooks_file_from_before_adapters_were_named_is_updated(dirs):
    from llmem.config import load_config

    _, hooks = dirs
    hooks.mkdir(parents=True)
    # What `llmem install copilot` wrote before its commands named the adapter.
    old = {"version": 1, "hooks": {"agentStop": [
        {"type": "command", "bash": "/old/llmem hook --type idle --format copilot", "timeoutSec": 15}]}}
    (hooks / "llmem.json").write_text(json.dumps(old))
    assert integrations.install_copilot(load_config()).action == "updated"
    assert "--adapter copilot" in (hooks / "llmem.json").read_text()


def test_install_copilot_writes_the_hooks_file(cli, dirs):
    _, hooks = dirs
    path = hooks / "llmem.json"
    code, out, err = cli("install", "copilot")
    assert code == 0 and out.startswith("Installed the Copilot CLI hooks")
    first = path.read_bytes()
    assert cli("install", "copilot")[0] == 0 and path.read_bytes() == first
    data = json.loads(first)
    assert data["version"] == 1
    assert set(data["hooks"]) == {"sessionStart", "agentStop", "preCompact", "sessionEnd"}
    kinds = {}
    for event, entries in data["hooks"].items():
        [entry] = entries
        assert entry["type"] == "command" and entry["timeoutSec"] > 0
        assert entry["bash"].startswith("/") and "--format copilot" in entry["bash"]
        # The session ids Copilot hands over are its own: no lookup in other agents' stores.
        assert "--adapter copilot" in entry["bash"]
        kinds[event] = entry["bash"].split("--type ", 1)[1].split()[0]
    assert kinds == {"sessionStart": "created", "agentStop": "idle", "preCompact": "compacting",
                     "sessionEnd": "ending"}
    assert "--detach" not in data["hooks"]["sessionStart"][0]["bash"]
    assert cli("install", "copilot", "--uninstall")[0] == 0 and not path.exists()


def test_copilot_session_start_command_really_answers(cli, dirs, llmem_home):
    _, hooks = dirs
    assert cli("add", "-c", "Always run the linter before pushing", "-t", "procedure")[0] == 0
    assert cli("install", "copilot")[0] == 0
    data = json.loads((hooks / "llmem.json").read_text())
    command = data["hooks"]["sessionStart"][0]["bash"]
    payload = {"sessionId": "3f1e2d3c-aaaa-4bbb-8ccc-000000000001", "timestamp": 1,
               "cwd": str(llmem_home), "source": "new"}
    proc = subprocess.run(["bash", "-c", command], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=30, env=os.environ.copy())
    assert proc.returncode == 0 and proc.stderr == ""
    answer = json.loads(proc.stdout)
    assert "Always run the linter" in answer["additionalContext"]


# ---- the OpenCode plugin under node ---------------------------------------------------------

STUB = """\
import { EventEmitter } from "node:events"
const calls = (globalThis.__llmemCalls ??= [])
export function spawn(cmd, args, opts) {
  calls.push({ cmd, args, detached: Boolean(opts?.detached) })
  const mode = globalThis.__llmemMode ?? "ok"
  if (mode === "throw") throw new Error("spawn failed")
  const child = new EventEmitter()
  child.stdout = new EventEmitter()
  child.kill = () => { child.killed = true }
  child.unref = () => {}
  if (mode === "hang") return child
  setTimeout(() => {
    if (mode === "error") return child.emit("error", new Error("ENOENT"))
    const text = mode === "garbage" ? "Traceback: boom" : `<llmem-context>\\n${args.join(" ")}\\n</llmem-context>\\n`
    child.stdout.emit("data", text)
    child.emit("close", mode === "exit1" ? 1 : 0)
  }, 1)
  return child
}
export default { spawn }
"""

LOADER = """\
export async function resolve(specifier, context, next) {
  if (specifier === "node:child_process" || specifier === "child_process") {
    return { url: new URL("./stub_child_process.mjs", import.meta.url).href, shortCircuit: true }
  }
  return next(specifier, context)
}
"""

REGISTER = """\
import { register } from "node:module"
register("./loader.mjs", import.meta.url)
"""

SCENARIO = """\
import { pathToFileURL } from "node:url"
const mod = await import(pathToFileURL(process.argv[2]).href)
const exported = Object.keys(mod)
const hooks = await mod[exported[0]]({ directory: "/work/proj/sub", worktree: "/work/proj" })
const SYS = "experimental.chat.system.transform", COMPACT = "experimental.session.compacting"
const r = { exported, hookNames: Object.keys(hooks).sort() }
const mark = () => globalThis.__llmemCalls.length
const since = (n) => globalThis.__llmemCalls.slice(n)

let n = mark()
r.turn1 = { system: ["base"] }; await hooks[SYS]({ sessionID: "ses_A", model: {} }, r.turn1)
r.turn2 = { system: ["base"] }; await hooks[SYS]({ sessionID: "ses_A", model: {} }, r.turn2)
r.turnCalls = since(n)
n = mark()
r.compact = { context: [], prompt: undefined }; await hooks[COMPACT]({ sessionID: "ses_A" }, r.compact)
r.compactCalls = since(n)
n = mark()
await hooks.event({ event: { type: "session.idle", properties: { sessionID: "ses_A" } } })
await hooks.event({ event: { type: "session.compacted", properties: { sessionID: "ses_A" } } })
await hooks.event({ event: { type: "message.updated", properties: { info: {} } } })
r.eventCalls = since(n)
n = mark()
r.turn3 = { system: [] }; await hooks[SYS]({ sessionID: "ses_A" }, r.turn3)
r.afterCompactCalls = since(n)

r.failures = {}
for (const mode of ["throw", "error", "garbage", "exit1", "hang"]) {
  globalThis.__llmemMode = mode
  const out = { system: [] }, ctx = { context: [] }
  const sid = "ses_" + mode
  await hooks[SYS]({ sessionID: sid }, out)
  await hooks[COMPACT]({ sessionID: sid }, ctx)
  await hooks.event({ event: { type: "session.idle", properties: { sessionID: sid } } })
  r.failures[mode] = { system: out.system, context: ctx.context }
}
globalThis.__llmemMode = "ok"
n = mark()
await hooks[SYS](undefined, undefined)
await hooks[SYS]({}, { system: [] })
await hooks[COMPACT]({ sessionID: "x" }, {})
await hooks.event(undefined)
await hooks.event({})
await hooks.event({ event: { type: "session.idle", properties: { sessionID: 42 } } })
r.oddCalls = since(n)
console.log(JSON.stringify(r))
"""


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "plugins" / "llmem.js"
    path.parent.mkdir()
    path.write_text(integrations.render_opencode_plugin(["/opt/llmem/bin/llmem"]))
    return path


@needs_node
def test_plugin_is_valid_javascript(plugin_file):
    proc = subprocess.run([NODE, "--check", str(plugin_file)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@needs_node
def test_plugin_runs_the_right_llmem_commands_and_never_throws(plugin_file, tmp_path, monkeypatch):
    # A short timeout for the "hang" case: the plugin gives up and goes on without memory.
    text = plugin_file.read_text().replace(f"const CONTEXT_TIMEOUT_MS = {integrations.CONTEXT_TIMEOUT_MS}\n",
                                           "const CONTEXT_TIMEOUT_MS = 50\n")
    plugin_file.write_text(text.replace(f"const COMPACTING_TIMEOUT_MS = {integrations.COMPACTING_TIMEOUT_MS}\n",
                                        "const COMPACTING_TIMEOUT_MS = 50\n"))
    harness = tmp_path / "harness"
    harness.mkdir()
    for name, body in (("stub_child_process.mjs", STUB), ("loader.mjs", LOADER),
                       ("register.mjs", REGISTER), ("scenario.mjs", SCENARIO)):
        (harness / name).write_text(body)
    proc = subprocess.run([NODE, "--import", str(harness / "register.mjs"), str(harness / "scenario.mjs"),
                           str(plugin_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)

    assert r["exported"] == ["LlmemPlugin"]  # OpenCode calls every exported function as a plugin
    assert r["hookNames"] == ["event", "experimental.chat.system.transform",
                              "experimental.session.compacting"]
    exe = "/opt/llmem/bin/llmem"
    # Every command names its agent: the ids the plugin sees are OpenCode's.
    context_args = ["context", "--session-id", "ses_A", "--adapter", "opencode", "--project", "/work/proj"]
    # once per session, not per turn; the block is pushed on every turn
    assert r["turnCalls"] == [{"cmd": exe, "args": context_args, "detached": False}]
    for turn in ("turn1", "turn2"):
        assert r[turn]["system"][0] == "base" and r[turn]["system"][1].startswith("<llmem-context>")
    assert r["compactCalls"] == [{"cmd": exe, "args": ["hook", "--type", "compacting", "--session-id",
                                                        "ses_A", "--adapter", "opencode",
                                                        "--project", "/work/proj"],
                                  "detached": False}]
    assert r["compact"]["context"][0].startswith("<llmem-context>\nhook --type compacting")
    idle = {"cmd": exe, "args": ["hook", "--type", "idle", "--session-id", "ses_A", "--adapter", "opencode"],
            "detached": True}
    assert r["eventCalls"] == [idle, idle]  # session.idle and session.compacted; others ignored
    assert r["afterCompactCalls"] == [{"cmd": exe, "args": context_args, "detached": False}]
    for mode, outcome in r["failures"].items():
        assert outcome == {"system": [], "context": []}, mode
    assert r["oddCalls"] == []
