"""Render the reference systemd user units in systemd/ for this Python and install them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LlmemError
from ..paths import write_private_text
from ..processes import python_module_command
from .environment import launch_environment

UNITS = ("llmem-watch.service", "llmem-worker.service", "llmem-dream.service", "llmem-dream.timer")
ENABLED = ("llmem-watch.service", "llmem-worker.service")


def unit_dir() -> Path:
    """Where systemd looks for user units."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def _unit_word(value: str, *, exec_line: bool = False) -> str:
    """`value` as one quoted word of a unit file: backslash and double quote escaped, `%` doubled
    (systemd expands `%h`, `%u` … everywhere) and, on an Exec line, `$` doubled (systemd
    substitutes `$VAR` there). A newline cannot be written into a unit at all."""
    if "\n" in value or "\r" in value:
        raise LlmemError(f"cannot write {value!r} into a systemd unit: it holds a line break",
                         hint="use a path without line breaks")
    quoted = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if exec_line:
        quoted = quoted.replace("$", "$$")
    return f'"{quoted}"'


def llmem_command() -> str:
    """The command that starts this llmem: its console script, else `python -I -m llmem` (-I:
    the unit's working folder is never put on sys.path, so no `llmem/` there can stand in)."""
    script = Path(sys.executable).parent / "llmem"
    if script.exists():
        return _unit_word(str(script), exec_line=True)
    python, *rest = python_module_command()
    return " ".join([_unit_word(python, exec_line=True), *rest])


def _template(name: str) -> str:
    # The reference units live in the repository's systemd/ folder next to the package
    # (the README installs llmem from its checkout).
    source = Path(__file__).resolve().parent.parent.parent / "systemd" / name
    if not source.exists():
        raise LlmemError(f"the unit template {source} is missing",
                         hint="install llmem from its source checkout (pip install -e .)")
    return source.read_text(encoding="utf-8")


_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # systemd's week starts on Monday


def _calendar_field(values: set[int], low: int, high: int) -> str:
    if values == set(range(low, high + 1)):
        return "*"
    return ",".join(f"{value:02d}" for value in sorted(values))


def _weekdays(days: set[int]) -> str:
    """Cron weekdays (0 = Sunday) the way systemd writes them: runs as `Mon..Fri`, others listed."""
    runs: list[list[int]] = []
    for position in sorted((day - 1) % 7 for day in days):
        if runs and runs[-1][-1] + 1 == position:
            runs[-1].append(position)
        else:
            runs.append([position])
    return ",".join(_WEEKDAYS[run[0]] + (f"..{_WEEKDAYS[run[-1]]}" if len(run) > 1 else "") for run in runs)


def on_calendar(schedule: str, timezone: str | None = None) -> list[str]:
    """The timer's OnCalendar= values for the cron `schedule` (dream.schedule), read in
    `timezone` (dream.timezone; None: the machine's zone), firing when the worker's periodic
    dream would. systemd ANDs a weekday with a date where cron ORs a restricted day-of-month
    and day-of-week, so that case takes two lines (a timer fires on the union)."""
    from ..dream.schedule import CronSchedule

    cron = CronSchedule(schedule)  # UsageError naming dream.schedule when it is not cron
    clock = f"{_calendar_field(cron.hours, 0, 23)}:{_calendar_field(cron.minutes, 0, 59)}:00"
    months = _calendar_field(cron.months, 1, 12)
    zone = f" {timezone}" if timezone else ""
    by_date = f"*-{months}-{_calendar_field(cron.days, 1, 31)} {clock}{zone}"
    by_weekday = f"{_weekdays(cron.weekdays)} *-{months}-* {clock}{zone}"
    if cron.dom_any and cron.dow_any:
        return [f"*-{months}-* {clock}{zone}"]
    if cron.dom_any:
        return [by_weekday]
    if cron.dow_any:
        return [by_date]
    return [by_date, by_weekday]


def render_unit(name: str, calendar: list[str] | None = None) -> str:
    """A unit with ExecStart pointing at this llmem and the folder and store variables set now
    kept (the user manager does not have the shell's environment; the unit file is private, so
    the store URL goes as it is); the timer with `calendar` as its
    OnCalendar= lines when given."""
    text = _template(name).replace("@LLMEM@", llmem_command())
    env = [f"Environment={_unit_word(f'{key}={value}')}" for key, value in launch_environment(private_file=True).items()]
    if env and "[Service]\n" in text:
        text = text.replace("[Service]\n", "[Service]\n" + "\n".join(env) + "\n", 1)
    if calendar:
        lines = [line for line in text.split("\n") if not line.startswith("OnCalendar=")]
        at = lines.index("[Timer]") + 1
        text = "\n".join([*lines[:at], *(f"OnCalendar={value}" for value in calendar), *lines[at:]])
    return text


@dataclass
class SystemdOutcome:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def systemctl(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`systemctl --user ARGS`, its output captured: the one place llmem runs systemctl.
    LlmemError when it is not on PATH, cannot be started or does not answer in time."""
    command = ["systemctl", "--user", *args]
    if shutil.which("systemctl") is None:
        raise LlmemError(f"systemctl is not on PATH: `{' '.join(command)}` was not run",
                         hint="enable the written units by hand, or run llmem run in a terminal")
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise LlmemError(f"`{' '.join(command)}` did not run: {exc}",
                         hint="is a user systemd instance running? (loginctl enable-linger $USER)") from None


def _systemctl(outcome: SystemdOutcome, *args: str) -> None:
    command = ["systemctl", "--user", *args]
    outcome.commands.append(" ".join(command))
    done = systemctl(*args)
    if done.returncode != 0:
        raise LlmemError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout.strip()}",
                         hint="is a user systemd instance running? (loginctl enable-linger $USER)")


def install(*, target: Path | None = None, enable: bool = True, dream_timer: bool = False,
            schedule: str | None = None, timezone: str | None = None) -> SystemdOutcome:
    """Write the four units (idempotent) and enable watch + worker (+ the dream timer, firing
    on `schedule` read in `timezone`: dream.schedule and dream.timezone)."""
    folder = target or unit_dir()
    outcome = SystemdOutcome()
    calendar = on_calendar(schedule, timezone) if schedule else None
    for name in UNITS:
        text = render_unit(name, calendar if name.endswith(".timer") else None)
        path = folder / name
        if path.exists() and path.read_text(encoding="utf-8") == text:
            outcome.unchanged.append(str(path))
            continue
        write_private_text(path, text)
        path.chmod(0o644)  # systemd reads units; nothing secret in them
        outcome.written.append(str(path))
    if enable:
        units = [*ENABLED, *(("llmem-dream.timer",) if dream_timer else ())]
        try:
            _systemctl(outcome, "daemon-reload")
            _systemctl(outcome, "enable", "--now", *units)
        except LlmemError as exc:  # no user bus (ssh, a container): the files stay, and it is said
            raise LlmemError(
                f"the units are written in {folder} but not enabled: {exc.message}",
                hint=f"once a user systemd instance runs (loginctl enable-linger $USER), run "
                     f"`systemctl --user daemon-reload && systemctl --user enable --now {' '.join(units)}`; "
                     f"or remove them with `llmem install systemd --uninstall --no-enable"
                     f"{'' if target is None else ' --unit-dir ' + str(folder)}`") from None
    return outcome


def uninstall(*, target: Path | None = None, disable: bool = True) -> SystemdOutcome:
    """Stop and disable the units, then remove the files llmem wrote.

    The files go even when systemctl cannot reach a user instance (no user bus: over ssh, in a
    container): with no systemd running them there is nothing to stop, and the user asked for
    them gone. What systemctl said is kept as a warning.
    """
    folder = target or unit_dir()
    outcome = SystemdOutcome()
    present = [name for name in UNITS if (folder / name).exists()]
    reachable = disable and bool(present)
    if reachable:
        try:
            _systemctl(outcome, "disable", "--now", *present)
        except LlmemError as exc:
            outcome.warnings.append(f"{exc.message}; the unit files are removed all the same")
            reachable = False
    for name in present:
        (folder / name).unlink()
        outcome.removed.append(str(folder / name))
    if reachable:
        _systemctl(outcome, "daemon-reload")
    return outcome
