"""The hostile-input corpus (tests/hostile/cases.yaml) run through the real CLI.

Every case runs through the console script's own entry point (`llmem.__main__.main`); a
sample runs it as a real `python -m llmem` process: the first case of each kind (config,
import, cli, …) and every case that hands a hook or the context its stdin, where the process
is the point (hooks fail open with exit 0, stdin is read as an agent's pipe). The rest run
in-process (tests/inproc.py) with the same environment, working folder, stdin and UTF-8
output: the same code answers the same argv, and the same exit code, message, absence of a
traceback and untouched files are asserted; a fresh interpreter per case only added ~150 ms.

Each case gets a fresh LLMEM_HOME (a config and a store holding one memory) and must end with
the expected exit code, a message holding the expected fragment, no traceback, and nothing
written: the home's files (log files and the parsed-config cache aside), the scratch folder and the input's folder are as
they were.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from inproc import run_llmem

CORPUS = Path(__file__).parent / "hostile"
CASES = yaml.safe_load((CORPUS / "cases.yaml").read_text(encoding="utf-8"))
# The cases run as real processes: the first of each kind (its id's first word), and every
# one that feeds stdin to a hook or the context (an agent's pipe, exit codes that fail open).
REAL_PROCESS = {case["id"] for case in CASES if "stdin" in case or case["args"][0] in ("hook", "context")}
REAL_PROCESS |= {next(case["id"] for case in CASES if case["id"].split("-")[0] == kind)
                 for kind in {case["id"].split("-")[0] for case in CASES}}
BASE_CONFIG = "embedding:\n  provider: none\nllm:\n  provider: none\nsession:\n  adapter: none\n"


def _run(home: Path, cwd: Path, args: list[str], stdin: bytes | None = None, *,
         real: bool = True, damaged: bool = False) -> subprocess.CompletedProcess:
    if not real:
        return run_llmem(args, env={"LLMEM_HOME": str(home), "HOME": str(home.parent / "user-home")},
                         cwd=cwd, stdin=stdin, drop_env=("LLMEM_", "XDG_"), collect_garbage=damaged)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMEM_", "XDG_"))}
    env.update(LLMEM_HOME=str(home), HOME=str(home.parent / "user-home"), PYTHONIOENCODING="utf-8")
    done = subprocess.run([sys.executable, "-m", "llmem", *args], cwd=cwd, env=env, input=stdin or b"",
                          capture_output=True, timeout=60)
    done.stdout = done.stdout.decode("utf-8", errors="replace")
    done.stderr = done.stderr.decode("utf-8", errors="replace")
    return done


@pytest.fixture(scope="module")
def pristine_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("pristine") / "llmem-home"
    home.mkdir()
    (home / "config.yaml").write_text(BASE_CONFIG)
    for args in (["init"], ["add", "-c", "The deploy script runs the database migrations first."]):
        done = _run(home, home.parent, args, real=False)
        assert done.returncode == 0, done.stderr
    return home


def _snapshot(folder: Path, *, own_files: bool = False, store: bool = False) -> dict[str, str]:
    """Every file under `folder` with a hash of its bytes.

    own_files: leave out what llmem may rightly rewrite in its home while refusing an input:
    its log files (they record the refusal) and the parsed-config cache. store: leave out the
    store too (a case whose job is to write it).
    """
    files = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if own_files and (relative.parts[0] == "logs" or path.name.endswith(".parsed.json")):
            continue
        if store and path.name.startswith("memory.db"):
            continue
        if path.is_symlink():  # a link is what it says, not what it points at (maybe a loop)
            files[str(relative)] = "link:" + os.readlink(path)
        elif path.is_file():
            files[str(relative)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            files[str(relative)] = "folder"
    return files


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_hostile_input_is_refused_cleanly(case, pristine_home, tmp_path):
    home = tmp_path / "llmem-home"
    shutil.copytree(pristine_home, home)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    input_path = ""
    if "input" in case:
        source = CORPUS / case["input"]
        input_path = str(inputs / source.name)
        if source.is_dir():
            shutil.copytree(source, input_path, symlinks=True)  # links stay links (loops, dangling)
        else:
            shutil.copy(source, input_path)

    def fill(text: str) -> str:
        return text.replace("{input}", input_path).replace("{scratch}", str(scratch))

    if "config" in case:
        config = (CORPUS / case["config"]).read_bytes()  # bytes: some are not UTF-8 on purpose
        (home / "config.yaml").write_bytes(config.replace(b"{input}", input_path.encode()))
    if "store" in case:
        shutil.copy(CORPUS / case["store"], home / "memory.db")
    if "queue" in case:
        shutil.copy(CORPUS / case["queue"], home / "queue.db")
    writes = bool(case.get("stores"))
    before = (_snapshot(home, own_files=True, store=writes), _snapshot(scratch), _snapshot(inputs))

    stdin = (CORPUS / case["stdin"]).read_bytes() if "stdin" in case else None
    done = _run(home, scratch, [fill(arg) for arg in case["args"]], stdin,
                real=case["id"] in REAL_PROCESS, damaged="store" in case or "queue" in case)

    output = done.stderr + done.stdout
    assert "Traceback" not in output, output
    assert "unexpected failure" not in output, output
    assert done.returncode == case["exit"], output
    assert fill(case["message"]).lower() in output.lower(), output
    after = (_snapshot(home, own_files=True, store=writes), _snapshot(scratch), _snapshot(inputs))
    assert after == before, ("files changed", {k: (before[0].get(k), after[0].get(k)) for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k)})
    for secret in case.get("absent", []):
        assert secret not in output, f"{secret!r} in the output"
        holding = [str(p) for p in home.rglob("*")
                   if p.is_file() and secret.encode() in p.read_bytes()]
        assert holding == [], f"{secret!r} in {holding}"
