"""The OpenCode plugin never holds a turn or a compaction for long when llmem hangs (issue 14.13)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from llmem.setup import integrations

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")

# Calls one hook of the real plugin (real child_process) and reports how long it took.
DRIVER = """\
import { pathToFileURL } from "node:url"
const [plugin, hookName] = process.argv.slice(2)
const mod = await import(pathToFileURL(plugin).href)
const hooks = await mod.LlmemPlugin({ directory: "/work/proj" })
const output = { system: [], context: [] }
const started = Date.now()
await hooks[hookName]({ sessionID: "ses_hang" }, output)
console.log(JSON.stringify({ ms: Date.now() - started, system: output.system, context: output.context }))
process.exit(0)
"""


def waits(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(r"const (\w+_TIMEOUT_MS) = (\d+)", text)}


def test_the_generated_plugin_waits_seconds_not_minutes():
    limits = waits(integrations.render_opencode_plugin(["/opt/llmem/bin/llmem"]))
    assert limits["CONTEXT_TIMEOUT_MS"] <= 2000  # a session's first turn waits for its block
    assert limits["COMPACTING_TIMEOUT_MS"] <= 5000  # a compaction is never held for long


# The bounds the plugin is rendered with here: the hanging tests prove the plugin gives up at
# its bound, whatever it is (the shipped bounds are checked above), in a fraction of a second.
SHORT_CONTEXT_MS, SHORT_COMPACTING_MS = 300, 500


@pytest.fixture
def hanging_plugin(tmp_path, monkeypatch):
    fake = tmp_path / "llmem"
    fake.write_text("#!/bin/sh\nexec sleep 300\n")  # an llmem stuck on a locked store or a dead LLM
    fake.chmod(0o755)
    monkeypatch.setattr(integrations, "CONTEXT_TIMEOUT_MS", SHORT_CONTEXT_MS)
    monkeypatch.setattr(integrations, "COMPACTING_TIMEOUT_MS", SHORT_COMPACTING_MS)
    plugin = tmp_path / "llmem.mjs"
    plugin.write_text(integrations.render_opencode_plugin([str(fake)]))
    assert waits(plugin.read_text()) == {"CONTEXT_TIMEOUT_MS": SHORT_CONTEXT_MS,
                                         "COMPACTING_TIMEOUT_MS": SHORT_COMPACTING_MS}
    driver = tmp_path / "driver.mjs"
    driver.write_text(DRIVER)

    def call(hook_name: str) -> dict:
        proc = subprocess.run([NODE, str(driver), str(plugin), hook_name], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    return call


@needs_node
def test_a_hanging_llmem_holds_the_first_turn_for_the_context_bound_only(hanging_plugin):
    outcome = hanging_plugin("experimental.chat.system.transform")
    assert SHORT_CONTEXT_MS <= outcome["ms"] < SHORT_CONTEXT_MS + 1500
    assert outcome["system"] == []  # the turn goes on without memory


@needs_node
def test_a_hanging_llmem_holds_a_compaction_for_the_compacting_bound_only(hanging_plugin):
    outcome = hanging_plugin("experimental.session.compacting")
    assert SHORT_COMPACTING_MS <= outcome["ms"] < SHORT_COMPACTING_MS + 1500
    assert outcome["context"] == []
