"""SQLite-only SQL stays inside llmem/db/ (ARCHITECTURE.md, "Where a PostgreSQL + pgvector
backend plugs in"): above db/, code calls db/ functions, so a second backend is a module
beside db/'s, not a hunt through the tree.

The scan reads each module with ast: a call of `execute_sql` or `json_extract` anywhere,
and FTS5, sqlite-vec and pragma words inside string literals. Docstrings, comments and
names may still speak of them (a hit's `bm25` score is part of the search output).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Calls that hand SQL text or an SQLite function to the database.
SQL_CALLS = {"execute_sql", "json_extract"}
# SQLite-only words in SQL text: FTS5's MATCH and bm25(), json_extract, pragmas, vec0.
SQL_WORDS = re.compile(r"\bMATCH\b|\bbm25\(|json_extract|\bPRAGMA\b|\bvec0\b")

# Modules above db/ that may keep SQLite SQL, each with why.
ALLOWED = {
    "llmem/adapters/opencode.py": "reads OpenCode's own opencode.db, which is SQLite whatever llmem's store is",
    "llmem/errors.py": "a message telling the user how to check memory.db with the sqlite3 tool, not a query",
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def sqlite_sql(source: str) -> list[str]:
    """Where a module's code uses SQLite-only SQL: 'line: what'."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in SQL_CALLS:
                found.append((node.lineno, f"calls {name}"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings and (word := SQL_WORDS.search(node.value))):
            found.append((node.lineno, f"{word.group()} in {node.value[:60]!r}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def modules_above_db() -> dict[str, str]:
    """{path: source} of every module of llmem (outside llmem/db/) and workers."""
    return {str(path.relative_to(ROOT)): path.read_text()
            for top in ("llmem", "workers") for path in sorted((ROOT / top).rglob("*.py"))
            if path.relative_to(ROOT).parts[:2] != ("llmem", "db")}


def test_sqlite_sql_stays_in_db():
    leaks = {path: where for path, source in modules_above_db().items()
             if path not in ALLOWED and (where := sqlite_sql(source))}
    assert leaks == {}, "move this SQL behind a function in llmem/db/"


def test_every_allowed_module_still_needs_it():
    sources = modules_above_db()
    assert [path for path in ALLOWED if not sqlite_sql(sources.get(path, ""))] == []


def test_the_scan_sees_each_kind_of_leak():
    source = '''
"""A docstring may say MATCH, bm25() and PRAGMA."""
import peewee as pw

def leaky(db, Memory):
    db.execute_sql("SELECT 1")
    pw.fn.json_extract(Memory.metadata, "$.category")
    sql = f"SELECT rowid FROM memory_fts WHERE memory_fts MATCH {1}"
    weights = "bm25(memory_fts, 1.0)"
    pragma = "PRAGMA journal_mode"
    table = "CREATE VIRTUAL TABLE v USING vec0(embedding float[3])"
    return hit.fts_bm25  # a name and a comment: MATCH
'''
    assert [line.split(":")[0] for line in sqlite_sql(source)] == ["6", "7", "8", "9", "10", "11"]
