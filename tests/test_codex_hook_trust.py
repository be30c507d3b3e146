"""`llmem doctor` reads whether Codex trusts llmem's hooks (issue 21 item 10): Codex runs a
hook from hooks.json only when config.toml holds
`[hooks.state."<hooks.json path>:<event_snake>:<group>:<handler>"] trusted_hash = …`, written
when the user approves it in /hooks (`enabled = false` switches it off)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def codex(configure, tmp_path, monkeypatch):
    home = tmp_path / "codex"
    monkeypatch.setenv("CODEX_HOME", str(home))
    configure("embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: none\n")
    (home / "sessions").mkdir(parents=True)
    return home


def _approve(codex, events: set[str] | None = None, disabled: set[str] = frozenset()) -> None:
    """What Codex's /hooks review writes: one state table per approved handler."""
    snake = {"SessionStart": "session_start", "PreCompact": "pre_compact", "Stop": "stop",
             "SessionEnd": "session_end"}
    hooks = json.loads((codex / "hooks.json").read_text())["hooks"]
    tables = []
    for event, groups in hooks.items():
        for g, group in enumerate(groups):
            for h, _ in enumerate(group["hooks"]):
                if events is None or event in events:
                    tables.append(f'\n[hooks.state."{codex / "hooks.json"}:{snake[event]}:{g}:{h}"]\n'
                                  f'trusted_hash = "sha256:{"0" * 63}{len(tables) + 1}"\n'
                                  + ("enabled = false\n" if event in disabled else ""))
    config = codex / "config.toml"
    config.write_text(config.read_text() + "".join(tables))


def _codex_check(cli) -> dict:
    code, out, _ = cli("doctor", "--json")
    return {c["name"]: c for c in json.loads(out)["checks"]}["codex"]


def test_doctor_says_the_hooks_wait_for_approval_in_codex(cli, codex):
    assert cli("install", "codex")[0] == 0
    check = _codex_check(cli)
    assert "hooks installed, not yet approved — run /hooks in Codex" in check["detail"]
    assert check["status"] == "warn" and check["hooks_approved"] is False
    code, out, _ = cli("doctor")
    assert "not yet approved — run /hooks in Codex" in next(line for line in out.splitlines() if "] codex:" in line)


def test_doctor_says_approved_once_codex_trusts_every_hook(cli, codex):
    assert cli("install", "codex")[0] == 0
    _approve(codex)
    check = _codex_check(cli)
    assert "hooks installed and approved in Codex" in check["detail"]
    assert check["status"] == "ok" and check["hooks_approved"] is True


def test_doctor_names_hooks_left_unapproved_or_switched_off(cli, codex):
    assert cli("install", "codex")[0] == 0
    _approve(codex, events={"SessionStart", "Stop"})
    assert "2 of 4 approved — run /hooks in Codex" in _codex_check(cli)["detail"]
    (codex / "config.toml").write_text((codex / "config.toml").read_text().split("\n[hooks.state")[0] + "\n")
    _approve(codex, disabled={"Stop"})
    check = _codex_check(cli)
    assert "Stop switched off in /hooks" in check["detail"] and check["status"] == "warn"


def test_an_install_from_elsewhere_does_not_borrow_another_files_trust(cli, codex, tmp_path):
    """Trust is per hooks.json path: a state key for another file is not llmem's hook trusted."""
    assert cli("install", "codex")[0] == 0
    _approve(codex)
    config = codex / "config.toml"
    config.write_text(config.read_text().replace(str(codex / "hooks.json"), str(tmp_path / "other" / "hooks.json")))
    assert "not yet approved" in _codex_check(cli)["detail"]
