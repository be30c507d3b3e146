"""Accuracy of the no-LLM correction classifier on the labelled set.

Runs llmem.capture.heuristics.classify_correction over tests/fixtures/corrections.yaml (user
corrections and agent-mistake statements, each with the kind of memory it should become and,
for a self_assessment, its taxonomy category) and prints the accuracy (overall, per batch and
for the held-out third), a confusion table of expected × predicted kinds, the per-category
results, the false lessons (a statement that should not be a self_assessment classified as one,
or one in the wrong category) and every miss. An item is right when the kind matches and, for
a self_assessment, the category too. The newest `blind-*` batch was scored once, before any
rule saw it: its figure is the one to expect on new wording (see the set's header).

    .venv/bin/python bench/heuristics.py [--batch NAME] [--held-out] [--set FILE]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import yaml

from llmem.capture.heuristics import KINDS, classify_correction

DEFAULT_SET = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "corrections.yaml"


def load(path: Path, batch: str | None = None, held_out: bool = False) -> list[dict]:
    items = yaml.safe_load(path.read_text(encoding="utf-8"))
    if batch:
        items = [i for i in items if i.get("batch") == batch]
    if held_out:
        items = [i for i in items if i.get("held_out")]
    return items


def evaluate(items: list[dict]) -> dict:
    """Each item's verdict, whether it is right, and the totals."""
    rows = []
    for item in items:
        verdict = classify_correction(item["text"])
        right = verdict.kind == item["kind"] and (
            item["kind"] != "self_assessment" or verdict.category == item.get("category"))
        rows.append({"item": item, "kind": verdict.kind, "category": verdict.category, "right": right})
    correct = sum(r["right"] for r in rows)
    false_lessons = [r for r in rows if r["kind"] == "self_assessment" and not r["right"]]
    return {"rows": rows, "correct": correct, "total": len(rows),
            "accuracy": correct / len(rows) if rows else 0.0, "false_lessons": false_lessons}


def _share(rows: list[dict]) -> str:
    right = sum(r["right"] for r in rows)
    return f"{right}/{len(rows)} = {right / len(rows):.1%}" if rows else "0/0"


def _label(kind: str, category: str | None) -> str:
    return f"{kind}/{category}" if kind == "self_assessment" else kind


def report(result: dict, out=sys.stdout) -> None:
    rows = result["rows"]
    print(f"accuracy: {_share(rows)}", file=out)
    batches = sorted({r["item"].get("batch") for r in rows if r["item"].get("batch")})
    if len(batches) > 1:
        for batch in batches:
            print(f"  batch {batch}: {_share([r for r in rows if r['item'].get('batch') == batch])}", file=out)
    held = [r for r in rows if r["item"].get("held_out")]
    if held and len(held) < len(rows):
        print(f"  held out while the rules were written: {_share(held)}", file=out)
    print(f"false lessons (a self_assessment that should not be, or in the wrong category): "
          f"{len(result['false_lessons'])}", file=out)

    kinds = [k for k in KINDS if any(r["item"]["kind"] == k or r["kind"] == k for r in rows)]
    confusion = Counter((r["item"]["kind"], r["kind"]) for r in rows)
    width = max(len(k) for k in kinds) + 2
    print("\nconfusion (rows: expected kind, columns: predicted kind)", file=out)
    print(" " * width + "".join(k[:10].rjust(11) for k in kinds), file=out)
    for expected in kinds:
        cells = "".join(str(confusion.get((expected, p), 0) or ".").rjust(11) for p in kinds)
        print(expected.ljust(width) + cells, file=out)

    per_category: Counter[str] = Counter()
    per_category_right: Counter[str] = Counter()
    for r in rows:
        if r["item"]["kind"] == "self_assessment":
            per_category[r["item"]["category"]] += 1
            per_category_right[r["item"]["category"]] += r["right"]
    if per_category:
        print("\nself_assessment categories (right/total)", file=out)
        for category in sorted(per_category):
            print(f"  {category:<22}{per_category_right[category]}/{per_category[category]}", file=out)

    misses = [r for r in rows if not r["right"]]
    print(f"\nmisses ({len(misses)})", file=out)
    for r in misses:
        expected = _label(r["item"]["kind"], r["item"].get("category"))
        got = _label(r["kind"], r["category"])
        batch = r["item"].get("batch")
        held_mark = f" [{batch}]" if batch else ""
        print(f"  expected {expected}, got {got}{held_mark}: {r['item']['text']}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", type=Path, default=DEFAULT_SET, help="labelled YAML file")
    parser.add_argument("--batch", help="only the items of this batch (first, fresh, blind-1, blind-2)")
    parser.add_argument("--held-out", action="store_true", help="only the held-out third")
    args = parser.parse_args(argv)
    report(evaluate(load(args.set, args.batch, args.held_out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
