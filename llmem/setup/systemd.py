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


def render_unit(name: str) -> str:
    """A unit with ExecStart pointing at this llmem, and LLMEM_HOME / LLMEM_CONFIG kept."""
    text = _template(name).replace("@LLMEM@", llmem_command())
    env = [f"Environment={_unit_word(f'{key}={os.environ[key]}')}" for key in ("LLMEM_HOME", "LLMEM_CONFIG")
           if os.environ.get(key)]
    if env and "[Service]\n" in text:
        text = text.replace("[Service]\n", "[Service]\n" + "\n".join(env) + "\n", 1)
    return text


@dataclass
class SystemdOutcome:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _systemctl(outcome: SystemdOutcome, *args: str) -> None:
    command = ["systemctl", "--user", *args]
    outcome.commands.append(" ".join(command))
    if shutil.which("systemctl") is None:
        raise LlmemError(f"systemctl is not on PATH: `{' '.join(command)}` was not run",
                         hint="enable the written units by hand, or run llmem run in a terminal")
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise LlmemError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout.strip()}",
                         hint="is a user systemd instance running? (loginctl enable-linger $USER)")


def install(*, target: Path | None = None, enable: bool = True, dream_timer: bool = False) -> SystemdOutcome:
    """Write the four units (idempotent) and enable watch + worker (+ the dream timer)."""
    folder = target or unit_dir()
    outcome = SystemdOutcome()
    for name in UNITS:
        text = render_unit(name)
        path = folder / name
        if path.exists() and path.read_text(encoding="utf-8") == text:
            outcome.unchanged.append(str(path))
            continue
        write_private_text(path, text)
        path.chmod(0o644)  # systemd reads units; nothing secret in them
        outcome.written.append(str(path))
    if enable:
        _systemctl(outcome, "daemon-reload")
        _systemctl(outcome, "enable", "--now", *ENABLED, *(("llmem-dream.timer",) if dream_timer else ()))
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
