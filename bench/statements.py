"""Precision, recall and type accuracy of the no-LLM statement heuristics, and their speed.

Runs each user message of tests/fixtures/statements.yaml through the extractor's heuristic
path (`capture/extract.py` `_heuristic_candidates`, which reads the user's lines with
`capture/heuristics.py` `statements`) and compares the memories it proposes with the labels:

- precision: proposed memories that stand for a labelled statement / all proposed;
- recall: labelled statements that got a memory / all labelled statements;
- type accuracy: of the statements found, those proposed with their labelled type;
- typed precision / typed recall: the same, counting a memory only when its type is right.

Figures are given for the tuning part and the held-out third (never tuned on). `--baseline
REV` also scores the heuristics.py of git revision REV in the same run, on the same set, for
a before/after table. Then the throughput on a long transcript (sentences per second), since
the heuristics run on every idle slice.

    .venv/bin/python bench/statements.py [--baseline REV] [--show-held-out] [--set FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import yaml

from llmem.capture import extract
from llmem.capture import heuristics as current

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SET = ROOT / "tests" / "fixtures" / "statements.yaml"
PARTS = ("tuning", "held-out")


def load(path: Path = DEFAULT_SET) -> list[dict]:
    items = yaml.safe_load(path.read_text(encoding="utf-8"))
    for item in items:
        labels = item["type"] if isinstance(item["type"], list) else [item["type"]]
        item["expected"] = [t for t in labels if t != "none"]
        item["part"] = "held-out" if item.get("held_out") else "tuning"
    return items


def module_at(revision: str):
    """heuristics.py as it was at a git revision, imported as a module of its own."""
    source = subprocess.run(["git", "show", f"{revision}:llmem/capture/heuristics.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="llmem-heuristics-"))
    path = folder / "heuristics_at_revision.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("heuristics_at_revision", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@contextmanager
def reading_with(module):
    """The extractor's heuristic path, reading with `module`'s `statements`."""
    saved = extract.statements
    extract.statements = module.statements
    try:
        yield
    finally:
        extract.statements = saved


def proposed(item: dict) -> list:
    line = extract.SliceLine("m1", item.get("role", "user"), item["text"],
                             f"{item.get('role', 'user')}: {item['text']}")
    return extract._heuristic_candidates([line])


def evaluate(items: list[dict], module=current) -> dict:
    """Per part (and per batch): counts, the figures, and each item's proposed memories."""
    with reading_with(module):
        rows = [(item, proposed(item)) for item in items]
    result = {}
    batches = sorted({i.get("batch") for i in items if i.get("batch")})
    for part in PARTS + ("all",) + tuple(f"batch {b}" for b in batches):
        chosen = [(i, c) for i, c in rows
                  if part == "all" or i["part"] == part or part == f"batch {i.get('batch')}"]
        labelled = sum(len(i["expected"]) for i, _ in chosen)
        made = sum(len(c) for _, c in chosen)
        found = sum(min(len(i["expected"]), len(c)) for i, c in chosen)
        typed = sum(sum((Counter(i["expected"]) & Counter(x.type for x in c)).values()) for i, c in chosen)
        result[part] = {
            "items": len(chosen), "labelled": labelled, "proposed": made, "found": found, "typed": typed,
            "precision": found / made if made else 1.0,
            "recall": found / labelled if labelled else 1.0,
            "type_accuracy": typed / found if found else 1.0,
            "typed_precision": typed / made if made else 1.0,
            "typed_recall": typed / labelled if labelled else 1.0,
            "rows": chosen,
        }
    return result


def _pct(x: float) -> str:
    return f"{x:6.1%}"


def print_table(results: dict[str, dict], out=sys.stdout) -> None:
    print(f"{'heuristics':<14}{'part':<10}{'items':>6}{'stmts':>6}{'made':>6}"
          f"{'precision':>11}{'recall':>8}{'type acc':>10}{'typed P':>9}{'typed R':>9}", file=out)
    for name, result in results.items():
        for part in PARTS:
            r = result[part]
            print(f"{name:<14}{part:<10}{r['items']:>6}{r['labelled']:>6}{r['proposed']:>6}"
                  f"{_pct(r['precision']):>11}{_pct(r['recall']):>8}{_pct(r['type_accuracy']):>10}"
                  f"{_pct(r['typed_precision']):>9}{_pct(r['typed_recall']):>9}", file=out)
    last = results[list(results)[-1]]
    batches = [k for k in last if k.startswith("batch ")]
    if len(batches) > 1:
        print(f"\n{list(results)[-1]}, by batch (see the set's header)", file=out)
        for key in batches:
            r = last[key]
            print(f"  {key[6:]:<22}{r['items']:>6}{r['labelled']:>6}{r['proposed']:>6}{_pct(r['precision']):>11}"
                  f"{_pct(r['recall']):>8}{_pct(r['type_accuracy']):>10}", file=out)


def print_misses(result: dict, parts: tuple[str, ...], out=sys.stdout) -> None:
    for part in parts:
        wrong = [(i, c) for i, c in result[part]["rows"]
                 if Counter(i["expected"]) != Counter(x.type for x in c)]
        print(f"\nwrong on {part} ({len(wrong)})", file=out)
        for item, candidates in wrong:
            got = [f"{c.type}[{c.rule}]: {c.content}" for c in candidates] or ["nothing"]
            print(f"  expected {item['expected'] or 'none'}: {item['text']!r}", file=out)
            for line in got:
                print(f"      got {line}", file=out)


def long_transcript(items: list[dict], messages: int = 6000) -> list[str]:
    """User messages of a long session: the set's messages, a pasted log and a code block now
    and then, cycled to `messages` turns."""
    log_lines = "\n".join(f"2026-11-30 10:{i % 60:02d}:00 INFO worker-{i % 4} handled job {i} in {i % 97} ms"
                          for i in range(40))
    code = "```python\n" + "\n".join(f"def handler_{i}(request):\n    return {{'ok': True, 'n': {i}}}"
                                      for i in range(20)) + "\n```"
    texts = [i["text"] for i in items]
    out = []
    for n in range(messages):
        text = texts[n % len(texts)]
        if n % 50 == 0:
            text = f"Here is the log:\n{log_lines}\nWhy does it stall?"
        elif n % 50 == 25:
            text = f"This is what I have so far:\n{code}\nI prefer small handlers like these."
        out.append(text)
    return out


def throughput(items: list[dict], module=current, runs: int = 3) -> dict:
    """The best of `runs` passes of `module.statements` over a long transcript (the machine is
    shared: the best pass is the one least disturbed). Sentences are counted the same way for
    every module, so the rates compare."""
    messages = long_transcript(items)
    sentences = sum(len(current.statement_sentences(m)) for m in messages)
    seconds = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        found = sum(len(module.statements(m)) for m in messages)
        seconds = min(seconds, time.perf_counter() - started)
    chars = sum(len(m) for m in messages)
    return {"messages": len(messages), "sentences": sentences, "chars": chars, "seconds": seconds,
            "found": found, "sentences_per_second": sentences / seconds, "mb_per_second": chars / seconds / 1e6}


def print_throughput(name: str, t: dict, out=sys.stdout) -> None:
    print(f"{name:<14}{t['messages']} messages, {t['sentences']} sentences, {t['chars'] / 1e6:.2f} MB "
          f"in {t['seconds']:.3f} s: {t['messages'] / t['seconds']:,.0f} messages/s, "
          f"{t['sentences_per_second']:,.0f} sentences/s, {t['mb_per_second']:.2f} MB/s, "
          f"{t['found']} memories proposed", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", type=Path, default=DEFAULT_SET, help="labelled YAML file")
    parser.add_argument("--baseline", metavar="REV", help="also score heuristics.py at this git revision")
    parser.add_argument("--show-held-out", action="store_true",
                        help="list the held-out misses too (only once the rules stand)")
    parser.add_argument("--no-misses", action="store_true", help="print the figures only")
    args = parser.parse_args(argv)
    items = load(args.set)
    modules = {}
    if args.baseline:
        modules[f"at {args.baseline[:10]}"] = module_at(args.baseline)
    modules["current"] = current
    results = {name: evaluate(items, module) for name, module in modules.items()}
    print(f"statements set: {len(items)} messages, "
          f"{sum(len(i['expected']) for i in items)} labelled statements\n")
    print_table(results)
    print("\nthroughput on a long transcript")
    for name, module in modules.items():
        print_throughput(name, throughput(items, module))
    if not args.no_misses:
        print_misses(results["current"], PARTS if args.show_held_out else ("tuning",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
