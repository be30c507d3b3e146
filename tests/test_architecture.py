"""The house rules (ARCHITECTURE.md): a declared layer order, no import cycles, the queue
kept out of the library.

Every import is read from the source with ast: `import x` and `from x import y`, absolute
and relative, at module level, inside functions and under TYPE_CHECKING (a type-only cycle
is still a cycle for a reader). The files in tests/fixtures/architecture/ each hold one
wrong import of one kind; laid over the real tree, each must make its rule fail.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "architecture"

# Units: each top-level module or package of llmem, workers, and the `__main__` entry
# points. Lowest first; a unit imports only units of lower layers, never one of its own.
LAYERS = [
    ("__init__", "errors", "times", "processes", "redact", "text", "tokens", "trust", "svg"),
    ("paths", "hookclient"),
    ("logconfig", "logreader", "machine", "context_cache", "mcprelay"),
    ("db", "adapters"),
    ("config", "store", "cursors"),
    ("providers",),
    ("vectors", "search", "exchange", "transfer"),
    ("memories",),
    ("capture", "app"),
    ("context", "dream"),
    ("pipeline", "setup", "mcp_server"),
    ("ui",),
    ("workers",),
    ("cli",),
    ("__main__",),
]
LAYER_OF = {unit: level for level, units in enumerate(LAYERS) for unit in units}

# The library's one door to the queue: the CLI enqueues and runs the consumer through it.
QUEUE_DOOR = "llmem.cli.queueing"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    """{module: (source, is_package)} of llmem and workers."""
    return dict(_read_source_modules(root))


@functools.cache
def _read_source_modules(root: Path) -> tuple[tuple[str, tuple[str, bool]], ...]:
    """Read once per test process: a dozen tests check the same tree (each its own rule)."""
    found = []
    for top in ("llmem", "workers"):
        for path in sorted((root / top).rglob("*.py")):
            found.append((module_name(path, root), (path.read_text(), path.name == "__init__.py")))
    return tuple(found)


@functools.cache
def _import_nodes(source: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The import statements of `source`, wherever they sit (parsed once per text)."""
    return tuple(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import | ast.ImportFrom))


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in `source`, wherever it sits.

    `from a import b` counts as an import of `a.b` when that is a module, else of `a`;
    relative imports are resolved against `module`'s package.
    """
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in _import_nodes(source):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                name = f"{target}.{alias.name}"
                found.append((name if name in known else target, node.lineno))
    return found


def unit_of(module: str) -> str | None:
    """The layer unit of one of our modules; None for a third-party one."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return "__main__"
    if parts[0] == "workers":
        return "workers"
    if parts[0] == "llmem":
        return parts[1] if len(parts) > 1 else "__init__"  # llmem/__init__.py: the version
    return None


def import_graph(modules: dict[str, tuple[str, bool]]) -> dict[str, list[tuple[str, int]]]:
    """{module: [(imported module, line)]} over every import, ours and third-party."""
    known = set(modules)
    return {name: imports_of(name, source, is_package, known)
            for name, (source, is_package) in modules.items()}


def our_module(name: str, known: set[str]) -> str | None:
    """The nearest of our modules `name` lies in (`llmem.adapters.X` → `llmem.adapters`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def layer_violations(graph) -> list[str]:
    known = set(graph)
    problems = []
    for module, imported in graph.items():
        unit = unit_of(module)
        if unit not in LAYER_OF:
            problems.append(f"{module}: unit {unit!r} is in no layer (add it to LAYERS)")
            continue
        for name, line in imported:
            target = our_module(name, known)
            other = unit_of(target) if target else None
            if other is None or other == unit:
                continue
            if other not in LAYER_OF or LAYER_OF[other] >= LAYER_OF[unit]:
                problems.append(f"{module}:{line} imports {target}: {unit} (layer {LAYER_OF[unit]}) "
                                f"may not import {other} (layer {LAYER_OF.get(other)})")
    return problems


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return cycles


def module_cycles(graph) -> list[list[str]]:
    known = set(graph)
    edges = {module: {t for name, _ in imported if (t := our_module(name, known)) and t != module}
             for module, imported in graph.items()}
    return find_cycles(edges)


def unit_cycles(graph) -> list[list[str]]:
    known = set(graph)
    edges: dict[str, set[str]] = {}
    for module, imported in graph.items():
        for name, _ in imported:
            target = our_module(name, known)
            if target and unit_of(target) != unit_of(module):
                edges.setdefault(unit_of(module), set()).add(unit_of(target))
    return find_cycles(edges)


def queue_leaks(graph) -> list[str]:
    """Library modules (all of llmem but the queue door) that import workers or huey."""
    return [f"{module}:{line} imports {name}"
            for module, imported in graph.items()
            if module.startswith("llmem") and module != QUEUE_DOOR
            for name, line in imported if name.split(".")[0] in ("workers", "huey")]


RULES = {"layers": layer_violations, "module cycles": module_cycles,
         "unit cycles": unit_cycles, "queue": queue_leaks}


@pytest.fixture(scope="module")
def graph():
    """The real tree's import graph, built once: parsing every module is ~1 s of CPU, and the
    module scope keeps these tests on one xdist worker (tests/conftest.py's scheduler), where
    spread over both each worker parsed the tree for itself."""
    return import_graph(source_modules())


def test_imports_follow_the_layers(graph):
    assert layer_violations(graph) == []


def test_no_module_imports_itself_back(graph):
    assert module_cycles(graph) == []


def test_no_unit_imports_itself_back(graph):
    assert unit_cycles(graph) == []


def test_only_the_queue_door_imports_workers_or_huey(graph):
    assert queue_leaks(graph) == []


def test_every_unit_has_a_layer():
    units = {unit_of(module) for module in source_modules()}
    assert units - set(LAYER_OF) == set()
    assert set(LAYER_OF) - units == set(), "a layer names a unit that no longer exists"


def test_architecture_page_shows_the_same_layers():
    """ARCHITECTURE.md's table lists each layer's units as LAYERS does (the entry points aside)."""
    table = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        if row := re.match(r"\| (\d+) \| ([^|]+) \|", line):
            table[int(row.group(1))] = {name.rstrip("/") for name in re.findall(r"`([^`]+)`", row.group(2))}
    declared = {level: set(units) - {"__init__"} for level, units in enumerate(LAYERS) if units != ("__main__",)}
    assert table == declared


# Each fixture (files named by the module they pose as, laid over the real tree) and the
# rules it must break. A cycle between units also runs up a layer somewhere: the unit rule
# guards the layer table itself, should it be edited to let one through.
WRONG = {
    "upward_absolute": {"layers"},
    "upward_relative": {"layers"},
    "upward_plain": {"layers"},
    "upward_in_function": {"layers"},
    "upward_type_only": {"layers"},
    "module_cycle": {"module cycles"},
    "unit_cycle": {"unit cycles", "layers"},
    "imports_workers": {"queue"},
    "imports_huey": {"queue"},
}


def test_every_fixture_is_listed():
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(WRONG)


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_a_wrong_import_breaks_its_rule(kind):
    planted = {path.stem: (path.read_text(), False) for path in (FIXTURES / kind).glob("*.py")}
    assert planted
    graph = import_graph({**source_modules(), **planted})
    broken = {rule: found for rule, check in RULES.items() if (found := check(graph))}
    assert set(broken) == WRONG[kind], broken
    for rule, found in broken.items():
        # Unit cycles name units; the other rules name the planted module itself.
        marks = {unit_of(name) for name in planted} if rule == "unit cycles" else set(planted)
        assert any(mark in problem for problem in found for mark in marks), (rule, found)


def test_cli_start_up_imports_no_heavy_module():
    code = ("import sys, llmem.cli; heavy = [m for m in ('numpy', 'peewee', 'httpx', 'yaml', 'huey', 'watchdog') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("reader", ["copilot", "codex", "opencode"])
def test_a_reader_loads_no_other_agents_reader(reader):
    # adapters/__init__.py promises the readers load on first use: a Copilot or Codex hook
    # must not pay for importing Claude Code's reader through the shared lifecycle rules.
    others = [name for name in ("opencode", "copilot", "claude", "codex") if name != reader]
    code = (f"import sys, llmem.adapters.{reader}; print([m for m in {others!r} "
            "if 'llmem.adapters.' + m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# A config section read as a dict: `config.values["dream"]["x"]`, `app.config.values.get("llm")`.
CONFIG_AS_DICT = re.compile(r"""\bconfig\.values\b|\.values(\[["']|\.get\()""")


def test_config_is_read_through_its_typed_sections():
    """Every module and test reads `config.dream.report_path` (llmem/config.py builds the typed,
    expanded sections once): a dict read skips the path expansion and the type."""
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for folder in ("llmem", "workers", "bench", "tests") for path in sorted((ROOT / folder).rglob("*.py"))
                 if path not in (ROOT / "llmem" / "config.py", Path(__file__).resolve())
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if CONFIG_AS_DICT.search(line)]
    assert offenders == []


def test_systemctl_is_run_in_one_place():
    """`setup/systemd.py` `systemctl` runs it (PATH check, time-out, errors as LlmemError)."""
    runs = [f"{path.relative_to(ROOT)}:{number}"
            for path in sorted((ROOT / "llmem").rglob("*.py")) if path != ROOT / "llmem/setup/systemd.py"
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if re.search(r"""\[\s*["']systemctl["']""", line)]
    assert runs == []
