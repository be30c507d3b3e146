"""Two backends behind db/ (ARCHITECTURE.md, "Where a PostgreSQL + pgvector backend plugs
in"): nothing above db/ knows which one a store runs on, each `@per_backend` function of db/
has its Postgres sibling, and the db/ functions still holding SQLite-only SQL with no sibling
are listed here by name (what the Postgres store cannot do yet), so the list can only shrink.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
from pathlib import Path

from test_storage_boundary import modules_above_db

ROOT = Path(__file__).resolve().parent.parent
DB = ROOT / "llmem" / "db"

# What only db/ may import or ask: the backend switch, the Postgres modules, their driver.
BACKEND_ONLY = re.compile(r"\bllmem\.db\.(?:backend|postgres)\b|^\s*(?:from|import)\s+psycopg|"
                          r"\bis_postgres\b|\.backend\s*==|from \.+db\.(?:backend|postgres)|"
                          r"from \.+db import (?:backend|postgres)", re.M)

# SQL only SQLite runs: FTS5, vec0, its catalogue and pragmas, json_extract, its rowid.
SQLITE_ONLY = re.compile(r"\bMATCH\b|\bbm25\(|json_extract|\bPRAGMA\b|\bvec0\b|sqlite_master|"
                         r"\browid\b|\btext_factory\b")

# db/ functions with SQLite-only SQL and no Postgres sibling yet: a Postgres store fails in
# them. The store, search, embedding, dream, export and import paths have none; these are
# the SQLite-file tools (loading sqlite-vec, the damage check, export's rescue of a damaged
# file), which a server's store does not need. migrations.py is SQLite's own step list (Postgres has
# db/postgres/migrations.py), so it is not scanned.
NOT_SCANNED = {"migrations.py"}
NOT_YET_ON_POSTGRES = {
    "connection.py": {"_vec_extension_path", "file_damage"},
    "queries.py": {"readable_memory_rows", "readable_relation_rows"},
    # VACUUM of the file, called by SQLite's migrations and fts.compact_after_bulk_add's SQLite body.
    "space.py": {"reclaim_space"},
}


def test_nothing_above_db_knows_which_backend_it_runs_on():
    leaks = {path: sorted({m.group().strip() for m in BACKEND_ONLY.finditer(source)})
             for path, source in modules_above_db().items() if BACKEND_ONLY.search(source)}
    assert leaks == {}


def test_the_scan_sees_a_module_that_asks_for_the_backend():
    for line in ("from llmem.db.backend import is_postgres", "from .db.postgres import fts",
                 "import psycopg", "if store.db.backend == 'postgres':", "from ..db import postgres"):
        assert BACKEND_ONLY.search(line), line


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _lines(source: str) -> list[bytes]:
    """The source's lines as the parser numbers them (split at \\n, \\r\\n and \\r only), in UTF-8,
    the unit of a node's column offsets."""
    return [line.encode() for line in io.StringIO(source, newline="").readlines()]


def _segment(lines: list[bytes], node: ast.AST) -> str:
    """ast.get_source_segment(source, node) from lines split once: it splits the whole source
    again on every call (~2 s of CPU for this scan of db/)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset].decode()
    return b"".join([lines[first][node.col_offset:], *lines[first + 1:last],
                     lines[last][:node.end_col_offset]]).decode()


def _per_backend(node: ast.FunctionDef) -> bool:
    return any(getattr(d, "id", None) == "per_backend" for d in node.decorator_list)


def test_every_per_backend_function_has_its_postgres_sibling_with_the_same_parameters():
    import importlib

    checked = 0
    for path in sorted(DB.glob("*.py")):
        for name, node in _functions(path).items():
            if not _per_backend(node):
                continue
            sqlite_side = getattr(importlib.import_module(f"llmem.db.{path.stem}"), name).__wrapped__
            sibling = getattr(importlib.import_module(f"llmem.db.postgres.{path.stem}"), name)
            assert list(inspect.signature(sibling).parameters) == list(inspect.signature(sqlite_side).parameters), name
            checked += 1
    assert checked >= 9


def test_sqlite_only_sql_in_db_is_per_backend_or_listed_as_not_yet_on_postgres():
    found: dict[str, set[str]] = {}
    for path in sorted(DB.glob("*.py")):
        if path.name in NOT_SCANNED:
            continue
        lines = _lines(path.read_text())
        for name, node in _functions(path).items():
            statements = node.body[1:] if ast.get_docstring(node) is not None else node.body
            decorators = "".join(_segment(lines, d) for d in node.decorator_list)
            body = decorators + "".join(_segment(lines, st) for st in statements)
            code = re.sub(r"#.*", "", body)  # comments may name them
            if SQLITE_ONLY.search(code) and not _per_backend(node):
                found.setdefault(path.name, set()).add(name)
    assert found == NOT_YET_ON_POSTGRES, (
        "a db/ function with SQLite-only SQL: mark it @per_backend with a sibling of the same name in "
        "db/postgres/ (or list it in NOT_YET_ON_POSTGRES, which says what Postgres cannot do yet)")
