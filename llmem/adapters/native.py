"""The agents' own instruction and memory files, found and split into notes (pure reading).

Where an agent keeps them is its unit's to say (adapters/agents/<name>.py,
`native_project_paths` / `native_user_paths`: CLAUDE.md and Claude Code's memory folder,
AGENTS.md, Copilot's instructions, the files an opencode.json names); this module keeps what
stays inside its folder and splits each file into notes. Each bullet or paragraph of a file is
one note, with the headings above it as its section. Nothing here writes anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmem.adapters.agent import Agent

# A note shorter than this many words is a label, not something to remember.
MIN_WORDS = 3
MAX_CHARS = 4000


@dataclass(frozen=True)
class NativeFile:
    path: Path
    project: str | None  # None: the user's own file, for every project


@dataclass(frozen=True)
class NativeNote:
    content: str
    type: str
    path: Path
    section: str
    project: str | None


def _existing(paths) -> list[Path]:
    seen, out = set(), []
    for path in paths:
        if path.is_file() and path.resolve() not in seen:
            seen.add(path.resolve())
            out.append(path)
    return out


def files_under(folder: Path, pattern: str) -> list[Path]:
    """The files matching `pattern` under `folder`, sorted (none when it is no folder)."""
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


@dataclass(frozen=True)
class RefusedPath:
    """An `instructions` entry that names a file outside the folder of the config naming it."""

    entry: str
    config: Path
    folder: Path

    def as_dict(self) -> dict:
        return {"entry": self.entry, "config": str(self.config), "folder": str(self.folder)}


def inside(path: Path, folder: Path) -> bool:
    """Whether `path`, every symlink followed, is in `folder`."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def native_files(agent: Agent, home: Path, project_dirs: list[Path], project: str | None,
                 refused: list[RefusedPath] | None = None) -> list[NativeFile]:
    """The instruction/memory files of `agent` that exist: the project's (in each of
    `project_dirs`) and the user's own (under `home`, its `native_home`). Entries of a config
    that name files outside its folder are not read; they are added to `refused`."""
    refused = [] if refused is None else refused
    project_paths = [path for folder in project_dirs for path in agent.native_project_paths(folder, home, refused)]
    user_paths = agent.native_user_paths(home, refused)
    # A file that is a symlink out of its folder is not the project's (nor the user's) file.
    roots = [*project_dirs, home]
    found = [NativeFile(p.resolve(), project) for p in _contained(project_paths, roots, refused)]
    taken = {f.path for f in found}
    found += [NativeFile(p.resolve(), None) for p in _contained(user_paths, [home], refused)
              if p.resolve() not in taken]
    return found


def _contained(paths: list[Path], roots: list[Path], refused: list[RefusedPath]) -> list[Path]:
    """The existing `paths` that stay inside one of `roots`; the others are refused."""
    kept = []
    for path in _existing(paths):
        if any(inside(path, root) for root in roots):
            kept.append(path)
        else:
            refused.append(RefusedPath(str(path), path, path.parent))
    return kept


# ---- splitting a Markdown file into notes --------------------------------------------------

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)(?:[-*+]|\d+[.)])\s+(.*)$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_FRONT_MATTER = re.compile(r"\A---\s*\n.*?\n---\s*\n", re.DOTALL)
_IMPORT_LINE = re.compile(r"^\s*@\S+\s*$")  # an `@path` import line: a pointer, not a note
_RULE_LINE = re.compile(r"^\s*(?:[-*_]\s*){3,}$|^\s*\|?[\s:|-]+\|[\s:|-]*$")


def split_markdown(text: str) -> list[tuple[str, str]]:
    """(section, note) for every bullet and paragraph of a Markdown text; a nested bullet or a
    code block stays with the note above it."""
    text = _COMMENT.sub("", _FRONT_MATTER.sub("", text.replace("\r\n", "\n"), count=1))
    notes: list[tuple[str, str]] = []
    headings: list[tuple[int, str]] = []
    current: list[str] = []
    in_fence = False

    def flush():
        if current:
            note = _clean("\n".join(current))
            if note:
                notes.append((" > ".join(title for _, title in headings), note))
            current.clear()

    for line in text.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
            current.append(line)
            continue
        if in_fence:
            current.append(line)
            continue
        heading = _HEADING.match(line)
        bullet = _BULLET.match(line)
        if heading:
            flush()
            level = len(heading.group(1))
            headings = [h for h in headings if h[0] < level] + [(level, heading.group(2))]
        elif not line.strip() or _RULE_LINE.match(line) or _IMPORT_LINE.match(line):
            flush()
        elif bullet and (not bullet.group(1) or not current):
            flush()
            current.append(line)
        else:
            current.append(line)  # a nested bullet or a continuation line
    flush()
    return notes


def _clean(note: str) -> str | None:
    lines = note.strip("\n").split("\n")
    first = _BULLET.match(lines[0])
    if first:
        lines[0] = first.group(2)
    text = "\n".join(line.rstrip() for line in lines).strip()
    if len(text.split()) < MIN_WORDS or (text.endswith(":") and "\n" not in text):
        return None  # a label, or the lead-in of a list whose items are the notes
    return text[:MAX_CHARS]


_DECISION = re.compile(r"\b(?:we|i)\s+(?:have\s+)?(?:decided|chose|agreed|settled on|went with)\b|^decision\s*:",
                       re.IGNORECASE)
_PREFERENCE = re.compile(r"\b(?:prefer(?:s|red)?|rather than|i like|i dislike|favou?r)\b", re.IGNORECASE)
_PROCEDURE = re.compile(
    r"^(?:always|never|do not|don't|must|use|run|avoid|make sure|ensure|keep|write|add|call|"
    r"check|put|follow|before|after|when)\b|\b(?:must|should|always|never)\b", re.IGNORECASE)


def note_type(text: str) -> str:
    """The memory type an instruction reads as: a decision, a preference, a rule to follow
    (procedure), else a fact about the project."""
    if _DECISION.search(text):
        return "decision"
    if _PREFERENCE.search(text):
        return "preference"
    if _PROCEDURE.search(text):
        return "procedure"
    return "fact"


def read_notes(file: NativeFile) -> list[NativeNote]:
    try:
        text = file.path.read_text(encoding="utf-8-sig", errors="replace")  # a BOM is no text
    except OSError:
        return []
    return [NativeNote(content, note_type(content), file.path, section, file.project)
            for section, content in split_markdown(text)]
