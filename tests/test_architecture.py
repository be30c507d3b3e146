"""Layer rules (STYLE.md): the library never imports workers or huey, except the CLI."""

import ast
from pathlib import Path

LLMEM = Path(__file__).resolve().parent.parent / "llmem"


def imported_modules(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_library_does_not_import_workers_or_huey():
    offenders = []
    for path in LLMEM.rglob("*.py"):
        if "cli" in path.relative_to(LLMEM).parts:
            continue
        for name in imported_modules(path):
            if name.split(".")[0] in ("workers", "huey"):
                offenders.append(f"{path.relative_to(LLMEM)} imports {name}")
    assert not offenders, offenders


def test_pure_modules_do_not_touch_the_store():
    for name in ("adapters", "lifecycle.py", "redact.py"):
        target = LLMEM / name
        paths = list(target.rglob("*.py")) if target.is_dir() else [target] if target.exists() else []
        for path in paths:
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.lstrip(".").startswith(("db", "store", "workers")), path


def test_cli_start_up_imports_no_heavy_module():
    import subprocess
    import sys

    code = ("import sys, llmem.cli; heavy = [m for m in ('numpy', 'peewee', 'httpx', 'yaml', 'huey', 'watchdog') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
