#!/usr/bin/env python3
"""What episodes cost on real conversations: the LoCoMo dev split written as Copilot sessions
(speaker A the user, speaker B the agent), each extracted with the real extraction path into a
store with episodes and one without (no LLM, no embedder): whole (a backfill) or, with
`--live`, one exchange at a time (an idle after each reply). Prints per store: extraction time
per session (p50, total), episodes per session, the store's vacuumed size, and what the
episodes cost beside the text they hold (goal ≤ 3×). The data file is never part of the
project's tree: pass its path (the run is skipped cleanly when it is absent). Example:
    python bench/episodes.py --data PATH/locomo-dev.json
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from session_writers import append_lines, copilot_line, copilot_session  # noqa: E402

from llmem.db import packed_text  # noqa: E402


def write_sessions(data: list, state_dir: Path) -> tuple[list[tuple[object, list[list[str]]]], int, int]:
    """One Copilot session per LoCoMo session, its lines grouped by exchange (a user turn and
    the replies after it); (sessions, turns, bytes of turn text). Nothing is written yet."""
    sessions, turns, text_bytes = [], 0, 0
    for sample in data:
        conversation = sample["conversation"]
        speaker_a = conversation["speaker_a"]
        for key, value in conversation.items():
            if not key.startswith("session_") or not isinstance(value, list):
                continue
            session = copilot_session(state_dir, cwd=f"/work/{sample['sample_id']}")
            exchanges: list[list[str]] = []
            for turn in value:
                text = turn["text"]
                turns += 1
                text_bytes += len(text.encode("utf-8"))
                if turn["speaker"] == speaker_a:
                    exchanges.append([copilot_line("user.message", {"content": text})])
                else:
                    if not exchanges:
                        exchanges.append([])
                    exchanges[-1].append(copilot_line("assistant.message", {
                        "messageId": turn["dia_id"], "content": text, "toolRequests": []}))
            sessions.append((session, exchanges))
    return sessions, turns, text_bytes


def vacuumed_size(db_path: Path, *, without_episodes: bool = False) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "copy.db"
        with sqlite3.connect(db_path) as conn:
            conn.execute("VACUUM INTO ?", (str(copy),))
        if without_episodes:
            conn = packed_text.connect(copy)  # the FTS delete trigger reads episodes' packed text
            conn.execute("DELETE FROM memory WHERE source = 'episode'")
            # FTS5 keeps deleted rows' postings until its segments merge: rebuild it as if
            # the episodes had never been indexed.
            conn.execute("INSERT INTO memory_fts(memory_fts) VALUES ('rebuild')")
            conn.commit()
            conn.execute("VACUUM")
            conn.close()
        return copy.stat().st_size


def run(data: list, home: Path, episodes: bool, live: bool = False) -> dict:
    """`live`: each session is written and extracted one exchange at a time (an idle after each
    reply, as `llmem run` reads a session); else written whole, then extracted (a backfill)."""
    state_dir = home / "state"
    state_dir.mkdir(parents=True)
    sessions, turns, text_bytes = write_sessions(data, state_dir)
    llmem_home = home / "llmem"
    llmem_home.mkdir()
    (llmem_home / "config.yaml").write_text(
        "embedding:\n  provider: none\nllm:\n  provider: none\n"
        f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
        + ("" if episodes else "capture:\n  episodes: false\n"))
    os.environ["LLMEM_HOME"] = str(llmem_home)
    from llmem.app import App
    from llmem.capture.extract import extract_session

    app = App()
    seconds, per_session = [], []
    for session, exchanges in sessions:
        slices = exchanges if live else [[line for exchange in exchanges for line in exchange]]
        added = 0
        for lines in slices:
            append_lines(session.events_path, *lines)
            started = time.perf_counter()
            report = extract_session(app, session.id)
            seconds.append(time.perf_counter() - started)
            added += report.episodes_added
        per_session.append(added)
    db = app.store.db
    stored, held = db.execute_sql("SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(llmem_text(content) AS BLOB))), 0) "
                                  "FROM memory WHERE source = 'episode'").fetchone()
    db_path = Path(db.database)
    app.close()
    full = vacuumed_size(db_path)
    without = vacuumed_size(db_path, without_episodes=True)
    return {"episodes_on": episodes, "live": live, "sessions": len(sessions), "turns": turns,
            "turn_text_bytes": text_bytes, "extractions": len(seconds),
            "extract_s_p50": round(statistics.median(seconds), 4), "extract_s_total": round(sum(seconds), 2),
            "episodes": stored, "episode_text_bytes": held,
            "episodes_per_session": {"p50": statistics.median(per_session), "max": max(per_session)},
            "store_bytes": full, "episode_bytes": full - without,
            "episode_cost_x": round((full - without) / max(1, held), 2),
            "store_vs_turn_text_x": round(full / max(1, text_bytes), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "locomo-dev.json")
    parser.add_argument("--live", action="store_true",
                        help="Extract after every exchange (as `llmem run` reads a session), not once per session.")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"skipped: no data file at {args.data} (pass --data PATH)")
        return
    data = json.loads(args.data.read_text(encoding="utf-8"))
    figures = []
    for episodes in (False, True):
        with tempfile.TemporaryDirectory(prefix="llmem-bench-episodes-") as home:
            figures.append(run(data, Path(home), episodes, live=args.live))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
