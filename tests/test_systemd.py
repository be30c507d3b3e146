"""`llmem install systemd` with a fake systemctl on PATH."""

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest


def fake_systemctl(tmp_path, monkeypatch, exit_code=0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "systemctl.log"
    script = bin_dir / "systemctl"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_install_renders_for_this_python_enables_and_is_idempotent(cli, tmp_path, monkeypatch, llmem_home):
    log = fake_systemctl(tmp_path, monkeypatch)
    units = tmp_path / "units"
    code, out, err = cli("install", "systemd", "--unit-dir", str(units), "--json")
    assert code == 0, err
    outcome = json.loads(out)
    assert len(outcome["written"]) == 4
    worker = (units / "llmem-worker.service").read_text()
    exec_line = next(line for line in worker.splitlines() if line.startswith("ExecStart="))
    assert str(Path(sys.executable).parent) in exec_line and exec_line.endswith(" worker")
    assert f'Environment="LLMEM_HOME={llmem_home}"' in worker
    assert "KillSignal=SIGINT" in worker
    assert "OnCalendar=*-*-* 03:00:00" in (units / "llmem-dream.timer").read_text()
    calls = log.read_text().splitlines()
    assert calls == ["--user daemon-reload", "--user enable --now llmem-watch.service llmem-worker.service"]
    before = {p.name: p.read_text() for p in units.iterdir()}
    code, out, _ = cli("install", "systemd", "--unit-dir", str(units), "--json")
    assert json.loads(out)["written"] == [] and len(json.loads(out)["unchanged"]) == 4
    assert {p.name: p.read_text() for p in units.iterdir()} == before
    code, out, _ = cli("install", "systemd", "--unit-dir", str(units), "--uninstall", "--json")
    assert code == 0 and len(json.loads(out)["removed"]) == 4
    assert not list(units.iterdir())
    assert "--user disable --now" in log.read_text()


def test_systemctl_failure_is_a_clear_error(cli, tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch, exit_code=1)
    code, out, err = cli("install", "systemd", "--unit-dir", str(tmp_path / "u"))
    assert code == 1 and "systemctl --user" in err and "Traceback" not in err


def test_uninstall_without_a_user_bus_still_removes_the_units(cli, tmp_path, monkeypatch):
    units = tmp_path / "units"
    fake_systemctl(tmp_path, monkeypatch)
    assert cli("install", "systemd", "--unit-dir", str(units))[0] == 0
    # Now systemctl fails as it does with no user bus (ssh session, container).
    (tmp_path / "bin" / "systemctl").write_text(
        "#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n")
    code, out, err = cli("install", "systemd", "--unit-dir", str(units), "--uninstall", "--json")
    assert code == 0, err
    assert len(json.loads(out)["removed"]) == 4 and not list(units.iterdir())
    assert "Failed to connect to bus" in json.loads(out)["warnings"][0]


def test_uninstall_without_systemctl_on_path_still_removes_the_units(cli, tmp_path, monkeypatch):
    units = tmp_path / "units"
    fake_systemctl(tmp_path, monkeypatch)
    assert cli("install", "systemd", "--unit-dir", str(units))[0] == 0
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    code, out, err = cli("install", "systemd", "--unit-dir", str(units), "--uninstall")
    assert code == 0 and not list(units.iterdir())
    assert "removed" in out and "systemctl is not on PATH" in err


def test_every_value_in_a_unit_is_quoted_and_its_percent_signs_escaped(tmp_path, monkeypatch):
    """A home under `we ird%h` (issue 20 item 18): unquoted, systemd splits the value at the
    space and expands %h to the user's home; written as one quoted word with `%%`, it reads back
    as the path itself."""
    from llmem.setup import systemd

    home = tmp_path / "we ird%h" / "llmem"
    monkeypatch.setenv("LLMEM_HOME", str(home))
    monkeypatch.setenv("LLMEM_CONFIG", str(tmp_path / 'say "hi"\\x' / "config.yaml"))
    python = tmp_path / "py $HOME %u" / "python"
    monkeypatch.setattr(systemd.sys, "executable", str(python))  # no llmem script beside it
    unit = systemd.render_unit("llmem-worker.service")
    lines = unit.splitlines()
    escaped_home = str(home).replace("%", "%%")
    assert f'Environment="LLMEM_HOME={escaped_home}"' in lines
    config = str(tmp_path / 'say \\"hi\\"\\\\x' / "config.yaml")
    assert f'Environment="LLMEM_CONFIG={config}"' in lines
    exec_line = next(line for line in lines if line.startswith("ExecStart="))
    escaped_python = str(python).replace("$", "$$").replace("%", "%%")
    assert exec_line == f'ExecStart="{escaped_python}" -I -m llmem worker'


def test_a_line_break_in_a_value_is_refused(tmp_path, monkeypatch):
    from llmem.errors import LlmemError
    from llmem.setup import systemd

    monkeypatch.setenv("LLMEM_HOME", str(tmp_path / "a\nExecStartPre=/bin/evil"))
    with pytest.raises(LlmemError, match="line break"):
        systemd.render_unit("llmem-worker.service")


# ---- issue 21 item 11 -----------------------------------------------------------------------

def test_the_units_carry_the_agents_folder_variables(tmp_path, monkeypatch, llmem_home):
    """The user manager's environment is not the shell's: a watcher started by systemd looked
    for Claude Code, Codex and Copilot in their default folders, and llmem's XDG folders moved."""
    from llmem.setup import systemd

    values = {"CLAUDE_CONFIG_DIR": tmp_path / "claude", "CODEX_HOME": tmp_path / "codex",
              "COPILOT_HOME": tmp_path / "copilot", "XDG_CONFIG_HOME": tmp_path / "xdg-config",
              "XDG_DATA_HOME": tmp_path / "xdg-data", "XDG_STATE_HOME": tmp_path / "xdg-state"}
    for name, value in values.items():
        monkeypatch.setenv(name, str(value))
    for unit in ("llmem-watch.service", "llmem-worker.service", "llmem-dream.service"):
        lines = systemd.render_unit(unit).splitlines()
        assert f'Environment="LLMEM_HOME={llmem_home}"' in lines
        for name, value in values.items():
            assert f'Environment="{name}={value}"' in lines, (unit, name)


def test_install_without_a_user_bus_says_the_units_are_written_but_not_enabled(cli, tmp_path, monkeypatch):
    units = tmp_path / "units"
    fake_systemctl(tmp_path, monkeypatch)
    (tmp_path / "bin" / "systemctl").write_text(
        "#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n")
    code, out, err = cli("install", "systemd", "--unit-dir", str(units))
    assert code == 1 and "Traceback" not in err
    assert len(list(units.iterdir())) == 4
    assert "Failed to connect to bus" in err
    assert f"written in {units}" in err and "not enabled" in err
    assert "llmem install systemd --uninstall" in err  # how to take them away again


def _timer_lines(units: Path) -> list[str]:
    return [line.removeprefix("OnCalendar=") for line in (units / "llmem-dream.timer").read_text().splitlines()
            if line.startswith("OnCalendar=")]


def test_the_timer_follows_dream_schedule_and_timezone(cli, configure, tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch)
    configure('dream:\n  schedule: "30 */6 * * mon-fri"\n  timezone: America/Los_Angeles\n')
    units = tmp_path / "units"
    assert cli("install", "systemd", "--unit-dir", str(units))[0] == 0
    assert _timer_lines(units) == ["Mon..Fri *-*-* 00,06,12,18:30:00 America/Los_Angeles"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("schedule", ["0 3 * * *", "*/20 9-17 * * 1-5", "15 4 1,15 * *",
                                      "0 12 1 * mon", "5 0 * 2,8 sun", "0 0 29 2 *"])
def test_the_timer_fires_when_the_worker_would(cli, configure, tmp_path, monkeypatch, schedule):
    """systemd's own reading of the written OnCalendar lines gives the same next 12 runs as the
    worker's cron reader (cron's rule: a restricted day-of-month OR day-of-week)."""
    import re
    import subprocess
    from datetime import UTC, datetime

    from llmem.dream.schedule import CronSchedule

    fake_systemctl(tmp_path, monkeypatch)
    configure(f'dream:\n  schedule: "{schedule}"\n  timezone: UTC\n')
    units = tmp_path / "units"
    assert cli("install", "systemd", "--unit-dir", str(units))[0] == 0
    base = datetime(2026, 12, 1, 16, 0, tzinfo=UTC)
    done = subprocess.run(["systemd-analyze", "calendar", "--iterations=12",
                           f"--base-time=@{int(base.timestamp())}", *_timer_lines(units)],
                          capture_output=True, text=True, timeout=30, env={**os.environ, "TZ": "UTC"})
    assert done.returncode == 0, done.stderr
    fired = {datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
             for stamp in re.findall(r"(?:Next elapse|Iter\. #\d+): \w+ (\S+ \S+) UTC", done.stdout)}
    cron, moment, expected = CronSchedule(schedule), base, []
    for _ in range(12):
        moment = cron.next_after(moment)
        expected.append(moment)
    assert sorted(fired)[:12] == expected


def test_doctor_reads_the_services_through_the_same_systemctl(cli, tmp_path, monkeypatch, configure):
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n")
    log = fake_systemctl(tmp_path, monkeypatch)
    (tmp_path / "bin" / "systemctl").write_text(
        f'#!/bin/sh\necho "$@" >> {log}\ncase "$3" in llmem-worker.service) echo active;; *) echo inactive;; esac\n')
    code, out, err = cli("doctor", "--json")
    (check,) = [c for c in json.loads(out)["checks"] if c["name"] == "services"]
    assert check["status"] == "ok" and "llmem-worker.service: active" in check["detail"]
    assert "llmem-watch.service: inactive" in check["detail"]
    assert log.read_text().splitlines()[0] == "--user is-active llmem-watch.service"
