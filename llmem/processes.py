"""What the kernel says about a process: whether it lives, its state and when it started.

The Copilot adapter (is the CLI that holds a session's lock file still running?), the dream
lock (did the run that took the lock die?) and the event pipeline (did the worker running
this event die?) ask; none of them owns the question. Also how llmem starts Python for
itself (`python_module_command`): the detached hook runs and the commands the installers write.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path


def interpreter_flags() -> list[str]:
    """-I, unless llmem itself was installed in the user site, which -I would hide: then -E -P
    (still neither the cwd nor PYTHONPATH on the import path)."""
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site and Path(__file__).resolve().is_relative_to(Path(user_site).resolve()):
        return ["-E", "-P"]
    return ["-I"]


def python_module_command() -> list[str]:
    """`python -I -m llmem` with this interpreter's absolute path. A plain `python -m` puts the
    working folder first on sys.path, so a `llmem/` package in the folder an agent runs a hook
    from (any checked-out repository) would run instead of llmem."""
    return [os.path.abspath(sys.executable), *interpreter_flags(), "-m", "llmem"]


def pid_is_alive(pid: int) -> bool:
    """True if a process with this id exists (signal 0 probes without signalling)."""
    if pid <= 0:
        # 0 and negative ids address process groups, never one process.
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def process_state(pid: int) -> tuple[str, float] | None:
    """(state letter, start time in epoch seconds) of a process, from /proc; None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return fields[0], boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, StopIteration, ValueError):
        return None


def boot_id() -> str | None:
    """This boot's id (a new one after every reboot), or None without /proc."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_identity(pid: int) -> dict | None:
    """What names one process for as long as it runs, whatever the wall clock does: the boot
    and its start in clock ticks since that boot. None where /proc cannot tell.

    /proc's start time in epoch seconds is boot time + ticks, and the kernel's boot time
    moves with every jump of the wall clock: compared with a wall-clock stamp taken before
    the jump, a live process looks as if it started later (a recycled pid).
    """
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None
    boot = boot_id()
    return {"boot_id": boot, "start_ticks": ticks} if boot else None


def process_is(pid: int, identity: dict) -> bool:
    """Whether `pid` is still the process `identity` (process_identity's) was taken from:
    alive, not a zombie, same boot, same start tick. Clock jumps do not change the answer."""
    if not pid_is_alive(pid):
        return False
    now_identity = process_identity(pid)
    if now_identity is None:
        return True  # /proc cannot tell: the pid lives
    state = process_state(pid)
    return (state is None or state[0] != "Z") and now_identity == {
        "boot_id": identity.get("boot_id"), "start_ticks": identity.get("start_ticks")}


def process_is_running(pid: int, started_by: float) -> bool:
    """Whether `pid` is still the process that was running at `started_by` (epoch seconds).

    False when no process has this id, when it is a zombie (finished, not yet reaped), or
    when /proc says it started after `started_by`: a later process was given the recycled
    pid (boot time and clock ticks round to a second or so, hence the slack). True when the
    pid lives and /proc cannot tell when it started.
    """
    if not pid_is_alive(pid):
        return False
    state = process_state(pid)
    if state is None:
        return True
    letter, process_started = state
    return letter != "Z" and process_started <= started_by + 2.0
