"""DREAMS.md: the readable side of dreaming, one managed block per phase, and the optional
per-phase reports `dreaming/<phase>/YYYY-MM-DD.md`, both beside the diary.

Each run rewrites the blocks of the phases it ran in place, between their markers: a block
is never written twice, and every byte outside the blocks stays as the user left it. A file
whose markers are damaged (a begin without its end, a block twice) is not touched: the run
says so instead of guessing which text is the user's. Everything inside is escaped Markdown
(narrate.md), so no memory text can forge or close a marker.

These files, the diary and the reports are for people: none of them is ever promotion
material (only memories in the store are promoted). The grounded backfill lane, which reads
dated `YYYY-MM-DD.md` notes, recognises them by these names and skips them.
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from pathlib import Path

from ..errors import LlmemError
from .artefacts import REPORTS_DIR  # written here, recognised there: one name
from .narrate import PHASE_TITLES, PhaseStory

DREAMS_FILE = "DREAMS.md"
DREAMS_FILE_LOWER = "dreams.md"  # an existing lower-case file is used instead, as the design allows
PHASES = ("light", "rem", "deep")
HEAD = ("# Dreams\n\nWhat llmem's dreaming found and did, one block per phase. Each `llmem dream --apply` "
        "rewrites the blocks between the `llmem:dreams` markers; write your own notes outside them. "
        "Nothing here, in the dream diary or in the dreaming/ reports is ever promoted to MEMORY.md.\n")


class DamagedBlocks(LlmemError):
    """DREAMS.md holds a marker without its partner, or a block twice."""


def dreams_path(config) -> Path:
    folder = config.diary_path.parent
    lower = folder / DREAMS_FILE_LOWER
    upper = folder / DREAMS_FILE
    # On a case-insensitive filesystem both names are the one file: keep the canonical name.
    if lower.exists() and not upper.exists():
        return lower
    return upper


def report_path(config, phase: str, day: str) -> Path:
    return config.diary_path.parent / REPORTS_DIR / phase / f"{day}.md"


def marker(phase: str, edge: str) -> str:
    return f"<!-- llmem:dreams {phase} {edge} -->"


def when(ts: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(ts, zone).strftime("%Y-%m-%d %H:%M %Z").strip()


def day_of(ts: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(ts, zone).strftime("%Y-%m-%d")


def story_lines(story: PhaseStory) -> list[str]:
    """The narrative (with who wrote it) and the facts, as Markdown lines."""
    lines: list[str] = []
    if story.narrative:
        by = "the plain template" if story.narrated_by == "template" else story.narrated_by
        lines += [story.narrative, "", f"_Narrative: {by}._", ""]
    elif story.narrated_by:
        lines += [f"_Narrative: {story.narrated_by}._", ""]
    lines += [f"- {fact}" for fact in story.facts]
    return lines


def block(phase: str, run_line: str | None, story: PhaseStory | None) -> str:
    """One managed block, markers included."""
    lines = [marker(phase, "begin"), f"## {PHASE_TITLES[phase]}", ""]
    if story is None:
        lines.append("_No run of this phase yet._")
    else:
        lines += [f"_{run_line}_", "", *story_lines(story)]
    lines.append(marker(phase, "end"))
    return "\n".join(lines) + "\n"


def rewrite(existing: str | None, blocks: dict[str, str]) -> str:
    """The file with each given phase's block replaced in place (or added when absent)."""
    if existing is None:
        return HEAD + "".join("\n" + blocks.get(p, block(p, None, None)) for p in PHASES)
    text = existing
    for phase in PHASES:
        if phase not in blocks:
            continue
        begin, end = marker(phase, "begin"), marker(phase, "end")
        begins, ends = text.count(begin), text.count(end)
        if begins == ends == 0:
            text = text + ("" if text.endswith("\n") or not text else "\n") + "\n" + blocks[phase]
            continue
        start, stop = text.find(begin), text.find(end)
        if begins != 1 or ends != 1 or stop < start:
            raise DamagedBlocks(f"DREAMS.md has a damaged {PHASE_TITLES[phase]} block "
                                f"({begins} begin and {ends} end markers)",
                                hint=f"keep exactly one `{begin}` … `{end}` pair, or delete both")
        stop += len(end)
        if text[stop:stop + 1] == "\n":
            stop += 1
        text = text[:start] + blocks[phase] + text[stop:]
    return text


def report_text(existing: str | None, phase: str, day: str, heading: str, story: PhaseStory) -> str:
    """A day's report for a phase, with this run's section added at the end."""
    base = existing if existing else f"# {PHASE_TITLES[phase]}: {day}\n"
    return base.rstrip("\n") + "\n\n" + f"## {heading}\n\n" + "\n".join(story_lines(story)) + "\n"
