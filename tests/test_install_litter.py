"""What install + uninstall leave behind (issue 21 item 12): the user's bytes and nothing else —
no blank line added to a table-less config.toml, no config holding only what llmem put in a
file it created (`{"$schema": …}`), no backup of a file llmem created, and one backup per
original however many times the install runs."""

from __future__ import annotations

from pathlib import Path

import pytest


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


TABLELESS = ['model = "gpt-5"\napproval_policy = "on-request"\n', 'model = "gpt-5"',
             '# my settings\nmodel = "gpt-5"\n# the end\n', 'model = "gpt-5"\r\n', '', '\n',
             'model = "gpt-5"\n\n']


@pytest.mark.parametrize("text", TABLELESS)
@pytest.mark.parametrize("mcp", [True, False])
def test_a_tableless_config_toml_comes_back_byte_for_byte(cli, homes, text, mcp):
    config = homes["codex"] / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes(text.encode())
    flags = () if mcp else ("--no-mcp",)
    assert cli("install", "codex", *flags)[0] == 0
    assert cli("install", "codex", *flags)[0] == 0
    assert cli("install", "codex", "--uninstall", *flags)[0] == 0
    assert config.read_bytes() == text.encode()


# A file without a final newline gets one with llmem's table and keeps it once the user has
# edited the file (no backup gives its bytes back): which newline was whose is not in the text.
@pytest.mark.parametrize("text", [t for t in TABLELESS if t.strip() and t.endswith("\n")])
def test_a_tableless_config_toml_edited_meanwhile_keeps_the_edit_and_gains_nothing(cli, homes, text):
    """No backup to give back (the user changed the file since): llmem's lines go, and only
    they: no blank line, no newline added."""
    config = homes["codex"] / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes(text.encode())
    assert cli("install", "codex")[0] == 0
    config.write_bytes(config.read_bytes().replace(b'"gpt-5"', b'"gpt-5.5"'))
    assert cli("install", "codex", "--uninstall")[0] == 0
    assert config.read_bytes() == text.replace('"gpt-5"', '"gpt-5.5"').encode()


@pytest.mark.parametrize("agent", ["opencode", "copilot", "claude", "codex"])
def test_a_fresh_home_is_left_without_files(cli, homes, agent):
    assert cli("install", agent)[0] == 0
    assert files_under(homes[agent])
    assert cli("install", agent)[0] == 0
    assert cli("install", agent, "--uninstall")[0] == 0
    assert files_under(homes[agent]) == {}


@pytest.mark.parametrize("agent,name,text", [
    ("opencode", "opencode.json", '{\n  "$schema": "https://opencode.ai/config.json",\n  "theme": "tokyonight"\n}\n'),
    ("copilot", "mcp-config.json", '{\n  "mcpServers": {}\n}\n'),
    ("claude", "settings.json", '{\n  "model": "opus"\n}\n'),
    ("codex", "config.toml", 'model = "gpt-5"\n'),
])
def test_one_backup_per_original_however_many_runs(cli, homes, agent, name, text):
    path = homes[agent] / name
    path.parent.mkdir(parents=True)
    path.write_text(text)
    for _ in range(4):
        assert cli("install", agent)[0] == 0
        assert cli("install", agent, "--uninstall")[0] == 0
        assert cli("install", agent)[0] == 0
    backups = sorted(p.name for p in homes[agent].rglob("*.llmem-backup-*"))
    assert len([b for b in backups if b.startswith(name)]) == 1, backups
    assert cli("install", agent, "--uninstall")[0] == 0
    assert path.read_text() == text


@pytest.mark.parametrize("agent,name,text", [
    ("opencode", "opencode.json", '{\n  "theme": "tokyonight"\n}\n'),
    ("codex", "config.toml", 'model = "gpt-5"\n'),
])
def test_edits_between_runs_still_keep_one_backup_the_latest_original(cli, homes, agent, name, text):
    """The user edits the file between install and uninstall, each time: every uninstall leaves
    the user's file (llmem's members out), and the backups do not pile up: one, of the latest
    file as it was before llmem went into it."""
    path = homes[agent] / name
    path.parent.mkdir(parents=True)
    path.write_text(text)
    value = "tokyonight" if agent == "opencode" else "gpt-5"
    for run in range(3):
        assert cli("install", agent)[0] == 0
        path.write_text(path.read_text().replace(f'"{value}"', f'"{agent}-{run}"'))
        value = f"{agent}-{run}"
        assert cli("install", agent, "--uninstall")[0] == 0
    latest = path.read_text()
    assert "-2" in latest and "llmem" not in latest
    backups = sorted(homes[agent].glob(f"{name}.llmem-backup-*"))
    assert len(backups) == 1 and "-1" in backups[0].read_text(), [b.read_text() for b in backups]
