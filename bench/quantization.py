#!/usr/bin/env python3
"""recall@10 of the stored vector encoding against exact float32, on real MiniLM vectors.

Documents: the LoCoMo dev split's turns and windows of 2, 3, 4 and 6 consecutive turns (the
passages episodes pack short turns into), and the coding sessions' messages; queries: their
questions. All embedded with the built-in embedder (a few minutes on an idle machine; cached in
--cache). Prints recall@10 of: llmem's stored encoding (int8 and a scale, db/vec.py, scanned
as db/vector_file.py scans it), float16, the int8 scan's top 20 rescored exactly, and the vector
file's prefilter (centred principal components in int8, their best candidates rescored from the
int8 rows) with its candidates at 1% of the rows, as a file of 100k rows passes on, and at
this file's own count (db/vector_file.py's PREFILTER_* constants). Example:
    python bench/quantization.py --cache /tmp/quant-vectors.npz
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmem.db import vec, vector_file  # noqa: E402

LOCOMO = ROOT.parent.parent / "shared" / "data" / "locomo-dev.json"
CODING = ROOT / "bench" / "data" / "coding"
K = 10


def texts(locomo: Path) -> tuple[list[str], list[str]]:
    documents, questions = [], []
    for sample in json.loads(locomo.read_text(encoding="utf-8")):
        conversation = sample["conversation"]
        keys = sorted((k for k in conversation if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k.split("_")[1]))
        for key in keys:
            turns = [f"{t['speaker']}: {t['text']}" for t in conversation[key]]
            documents += turns
            for width in (2, 3, 4, 6):
                step = 1 if width < 6 else 2
                documents += ["\n\n".join(turns[i:i + width]) for i in range(0, len(turns) - width + 1, step)]
        questions += [qa["question"] for qa in sample["qa"]]
    for path in sorted(CODING.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for session in doc.get("sessions") or []:
            for step in session["turns"]:
                documents += [step["user"]] + ([step["assistant"]] if step.get("assistant") else [])
        questions += [q["ask"] for q in doc.get("questions") or []]
    return list(dict.fromkeys(documents)), list(dict.fromkeys(questions))


def embedded(locomo: Path, cache: Path | None) -> tuple[np.ndarray, np.ndarray]:
    if cache and cache.exists():
        saved = np.load(cache)
        return saved["docs"], saved["qs"]
    from llmem.providers.builtin import BuiltinEmbedder

    documents, questions = texts(locomo)
    print(f"embedding {len(documents)} documents and {len(questions)} questions", flush=True)
    embedder = BuiltinEmbedder()
    started = time.perf_counter()
    docs = np.asarray(embedder.embed_documents(documents), dtype=np.float32)
    qs = np.stack([embedder.embed_query(q) for q in questions]).astype(np.float32)
    print(f"embedded in {time.perf_counter() - started:.0f} s", flush=True)
    if cache:
        np.savez(cache, docs=docs, qs=qs)
    return docs, qs


def top(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argpartition(-scores, k - 1)[:k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", type=Path, default=LOCOMO)
    parser.add_argument("--cache", type=Path, help="Where to keep the embedded vectors (.npz).")
    args = parser.parse_args()
    docs, qs = embedded(args.locomo, args.cache)
    docs = vec.normalize(docs)
    qs = vec.normalize(qs)
    ints, scales = vec.split_rows(vec.compact_blobs(docs), docs.shape[1])
    half = docs.astype(np.float16).astype(np.float32)
    stored, f16, rescored = [], [], []
    for q in qs:
        truth = set(top(docs @ q, K))
        scan = vector_file._scores(ints, scales, np.ascontiguousarray(q))
        stored.append(len(truth & set(top(scan, K))) / K)
        f16.append(len(truth & set(top(half @ q, K))) / K)
        candidates = top(scan, 2 * K)
        exact = docs[candidates] @ q
        rescored.append(len(truth & set(candidates[np.argsort(-exact)[:K]])) / K)
    print(f"{len(docs)} documents, {len(qs)} questions, {docs.shape[1]}-d, recall@{K} against exact float32:")
    print(f"  {f'stored encoding (int8 + scale, {docs.shape[1] + 4} bytes)':<44} {np.mean(stored):.4f}")
    print(f"  {f'float16 ({2 * docs.shape[1]} bytes)':<44} {np.mean(f16):.4f}")
    print(f"  {f'int8 top {2 * K} rescored in float32':<44} {np.mean(rescored):.4f}")
    prefilter_recall(docs, qs, ints, scales)


def prefilter_recall(docs, qs, ints, scales) -> None:
    """recall@10 and @50 of the vector file's prefilter against exact float32 and against an
    exact scan of the stored rows, built on these rows whatever their count."""
    vector_file.PREFILTER_MIN_ROWS = 0  # the file's rule leaves a store this small without one
    components = vector_file._components(ints, scales, docs.shape[1])
    if components is None:
        print("  prefilter: none (its components hold too little of these vectors' variance)")
        return
    basis = components[0]
    rows, row_scales = vector_file._project(ints, scales, components)
    empty = np.empty(0, dtype=np.int64)
    stored = ints.astype(np.float32) * scales[:, None]
    pdims = basis.shape[1]
    least_of_file = vector_file.PREFILTER_MIN_CANDIDATES
    lead_rows, lead_dims, lead_share = (vector_file.PREFILTER_LEAD_MIN_ROWS, vector_file.PREFILTER_LEAD_DIMS,
                                        vector_file.PREFILTER_LEAD_SHARE)
    cases = [("1% of the rows, as at 100k", 0, None), ("this file's own count", least_of_file, None),
             (f"1%, first pass {lead_dims} dims passing {lead_share:.0%}, as at 1M", 0, (lead_dims, lead_share))]
    for label, least, lead in cases:
        vector_file.PREFILTER_MIN_CANDIDATES = least
        vector_file.PREFILTER_LEAD_MIN_ROWS = lead_rows if lead is None else 0
        if lead is not None:
            vector_file.PREFILTER_LEAD_DIMS, vector_file.PREFILTER_LEAD_SHARE = lead
        count = vector_file.candidate_count(len(docs))
        # Split as a file of this count would be under this case's settings.
        view = vector_file.Snapshot(np.arange(len(docs)), ints, scales,
                                    vector_file.split_prefilter(basis, rows, row_scales), empty,
                                    np.empty((0, docs.shape[1]), dtype=np.float32), None, 0)
        found: dict[str, list[float]] = {"f32@10": [], "stored@10": [], "stored@50": []}
        for q in qs:
            got = [s for s, _ in vector_file.Scores(view, np.ascontiguousarray(q), vector_file.Cores(free=True)).best(50)]
            found["f32@10"].append(len(set(top(docs @ q, K)) & set(got[:K])) / K)
            found["stored@10"].append(len(set(top(stored @ q, K)) & set(got[:K])) / K)
            found["stored@50"].append(len(set(top(stored @ q, 50)) & set(got)) / 50)
        print(f"  prefilter {pdims} int8 dims, {count} candidates ({label}): recall@10 "
              f"{np.mean(found['f32@10']):.4f} against float32, {np.mean(found['stored@10']):.4f} against "
              f"the stored rows (recall@50 {np.mean(found['stored@50']):.4f})")


if __name__ == "__main__":
    main()
