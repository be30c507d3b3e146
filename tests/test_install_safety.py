"""The installers on a real machine (issue 20 items 12 and 15): the commands they write cannot
be hijacked from the project folder, a megabyte `.claude.json` installs fast, and a concurrent
writer of the file never silently loses llmem's registration."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from test_install_agents import put

from llmem.setup import agents, integrations


def test_the_python_fallback_ignores_a_llmem_package_in_the_hooks_folder(cli, homes, tmp_path, monkeypatch):
    """With no console script, every command llmem writes is `python -I -m llmem`: run from a
    repository holding a hostile `llmem/` package, the installed hook runs llmem, not that."""
    monkeypatch.setattr(integrations, "_console_script", lambda: None)
    assert cli("install", "claude")[0] == 0
    settings = json.loads((homes["claude"] / "settings.json").read_text())
    server = json.loads((homes["claude"] / ".claude.json").read_text())["mcpServers"]["llmem"]
    assert server["args"][:3] == ["-I", "-m", "llmem"]
    [command] = [h["command"] for group in settings["hooks"]["SessionStart"] for h in group["hooks"]]
    assert " -I -m llmem hook " in command

    project = tmp_path / "hostile-repo"
    (project / ".git").mkdir(parents=True)
    marker = tmp_path / "pwned"
    (project / "llmem").mkdir()
    payload = f"open({str(marker)!r}, 'w').write('ran')\n"
    (project / "llmem" / "__init__.py").write_text(payload)
    (project / "llmem" / "__main__.py").write_text(payload)
    stdin = {"session_id": "0b6c2f5e-1111-4a2b-8c3d-4e5f60718293", "cwd": str(project),
             "hook_event_name": "SessionStart", "source": "startup",
             "transcript_path": str(homes["claude"] / "projects" / "x" / "0b6c2f5e.jsonl")}
    proc = subprocess.run(["bash", "-c", command], input=json.dumps(stdin), capture_output=True, text=True,
                          timeout=60, cwd=project, env=os.environ.copy())
    assert not marker.exists(), "the hook ran the project's llmem/ package"
    assert proc.returncode == 0 and "hookSpecificOutput" in proc.stdout, proc.stderr
    # The MCP entry and Codex's notify are recognised as llmem's, so uninstall removes them.
    assert cli("install", "claude", "--uninstall")[0] == 0
    assert not (homes["claude"] / ".claude.json").exists()


def _big_claude_json(megabytes: float) -> str:
    """A compact ~/.claude.json of at least `megabytes` MB: projects added 500 at a time until
    the dump reaches it. Its length is summed entry by entry (dumping the whole dict after each
    500, as before, was ~0.6 s of CPU for the 3.3 MB: more than the install it measures)."""
    projects = {}
    n = 0
    # '{"numStartups":412,"projects":{' + entries joined by ',' + '}}'
    length = len(json.dumps({"numStartups": 412, "projects": {}}, separators=(",", ":"))) - 1
    while length < megabytes * 1_000_000:
        for _ in range(500):
            n += 1
            key, value = f"/home/dev/project-{n}", {
                "allowedTools": [], "history": [{"display": f"fix the flaky test number {n} " * 4,
                                                 "pastedContents": {}}],
                "mcpServers": {}, "hasTrustDialogAccepted": True, "lastCost": 0.0123 * n}
            projects[key] = value
            length += len(json.dumps({key: value}, separators=(",", ":"))) - 2 + (n > 1)
    return json.dumps({"numStartups": 412, "projects": projects}, separators=(",", ":"))


def test_a_3mb_compact_claude_json_installs_in_well_under_a_second(cli, homes):
    path = put(homes["claude"] / ".claude.json", _big_claude_json(3.3))
    original = path.read_bytes()
    assert len(original) >= 3_300_000
    # The floor, measured in the same run: reading, parsing, dumping and writing the file once.
    # Before the fix: 28 s, ~100x it. Both are CPU time of this process (the install runs in
    # it): wall time on the shared 2-core machine reached 10 s for this test under load and
    # came near the bound without llmem being any slower.
    start = time.process_time()
    homes["claude"].joinpath("floor.json").write_text(json.dumps(json.loads(path.read_text()),
                                                                 separators=(",", ":")))
    floor = time.process_time() - start
    start = time.process_time()
    code, out, err = cli("install", "claude")
    took = time.process_time() - start
    assert code == 0, err
    assert took < max(5.0, 25 * floor), f"install took {took:.2f} s of CPU (floor {floor:.2f} s)"
    data = json.loads(path.read_text())
    assert data["mcpServers"]["llmem"]["args"][-1] == "mcp" and data["numStartups"] == 412
    start = time.process_time()
    assert cli("install", "claude", "--uninstall")[0] == 0
    assert time.process_time() - start < max(5.0, 25 * floor)
    assert path.read_bytes() == original


def _claude_rewrite(path, stale: str | None = None) -> None:
    """What Claude Code does to ~/.claude.json: read it, change a counter, write it whole
    (from `stale`, what it read before llmem wrote, when given)."""
    data = json.loads(stale if stale is not None else path.read_text())
    data["numStartups"] += 1
    tmp = path.with_name(".claude.json.claude-tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def test_a_write_between_llmems_read_and_rename_is_kept_and_so_is_the_registration(cli, homes, monkeypatch):
    path = put(homes["claude"] / ".claude.json", json.dumps({"numStartups": 1}, indent=2))
    calls = []

    def agent_writes(real):
        calls.append(real)
        if real == path and len([c for c in calls if c == path]) == 1:
            _claude_rewrite(path)

    monkeypatch.setattr(agents, "_before_replace", agent_writes)
    code, out, err = cli("install", "claude")
    assert code == 0, err
    data = json.loads(path.read_text())
    assert data["numStartups"] == 2, "the agent's own write was overwritten"
    assert data["mcpServers"]["llmem"]["args"][-1] == "mcp"


def test_a_stale_write_just_after_llmems_rename_is_seen_and_the_registration_redone(cli, homes, monkeypatch):
    """The agent read the file before llmem wrote and writes its copy right after: llmem reads
    the file back, sees its entry gone and edits again, instead of saying "Installed"."""
    path = put(homes["claude"] / ".claude.json", json.dumps({"numStartups": 1}, indent=2))
    stale = path.read_text()
    real_write = agents.write_atomically
    writes = []

    def write_then_agent_overwrites(target, text, mode):
        real_write(target, text, mode)
        writes.append(target)
        if target == path and writes.count(path) == 1:
            _claude_rewrite(path, stale)

    monkeypatch.setattr(agents, "write_atomically", write_then_agent_overwrites)
    code, out, err = cli("install", "claude")
    assert code == 0, err
    assert writes.count(path) == 2
    data = json.loads(path.read_text())
    assert data["mcpServers"]["llmem"]["args"][-1] == "mcp" and data["numStartups"] == 2


def test_a_file_that_never_settles_is_an_error_not_installed(cli, homes, monkeypatch):
    path = put(homes["claude"] / ".claude.json", json.dumps({"numStartups": 1}, indent=2))
    stale = path.read_text()
    real_write = agents.write_atomically

    def always_overwritten(target, text, mode):
        real_write(target, text, mode)
        if target == path:
            _claude_rewrite(path, stale)

    monkeypatch.setattr(agents, "write_atomically", always_overwritten)
    code, out, err = cli("install", "claude")
    assert code == 1 and "kept changing" in err and "Installed" not in out
    assert "Traceback" not in err


@pytest.mark.parametrize("original", ["{}", "{}\n", "", "  \n", '{\r\n  "hooks": {}\r\n}\r\n'])
def test_uninstall_gives_back_a_trivial_file_instead_of_deleting_it(cli, homes, original):
    path = homes["claude"] / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(original.encode())
    assert cli("install", "claude", "--no-mcp")[0] == 0
    assert "--adapter claude" in path.read_text()
    assert cli("install", "claude", "--uninstall", "--no-mcp")[0] == 0
    assert path.read_bytes() == original.encode()


def test_a_user_edit_after_install_keeps_their_empty_containers_on_uninstall(cli, homes):
    """No exact original to give back (the user changed the file since): llmem's members go,
    and the containers the original had (`"hooks": {}`, `"Stop": []`) stay, empty."""
    path = put(homes["claude"] / "settings.json", '{\n  "hooks": {\n    "Stop": []\n  }\n}\n')
    assert cli("install", "claude", "--no-mcp")[0] == 0
    data = json.loads(path.read_text())
    data["model"] = "opus"
    path.write_text(json.dumps(data, indent=2) + "\n")
    assert cli("install", "claude", "--uninstall", "--no-mcp")[0] == 0
    assert json.loads(path.read_text()) == {"hooks": {"Stop": []}, "model": "opus"}


def test_doctor_reports_a_fifo_config_instead_of_hanging_on_it(homes, tmp_path):
    import sys

    homes["claude"].mkdir(parents=True)
    os.mkfifo(homes["claude"] / "settings.json")
    done = subprocess.run([sys.executable, "-m", "llmem", "doctor", "--json"], capture_output=True,
                          text=True, timeout=60, env=os.environ.copy())
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert "FIFO" in checks["claude"]["detail"], checks["claude"]
