"""What the commands share: option types and callbacks, JSON printing, short tables, memory cards."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..text import one_line

# Bounds of the integer options: far above any real use, far below SQLite's 64-bit integers
# (`--limit 9223372036854775807` overflowed inside the query).
MAX_COUNT = 1_000_000
MAX_ROW_ID = 2**63 - 1


def bounded_int(minimum: int = 1, maximum: int = MAX_COUNT) -> click.IntRange:
    """The type of every integer option: out of range is a usage error stating both bounds."""
    return click.IntRange(minimum, maximum)


def json_option(help: str = "Print as JSON."):
    """`--json` (into `as_json`), spelled once for every command that can print JSON."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def limit_option(help: str | None = None, default: int | None = None):
    """`--limit`/`-n` (into `limit`), a bounded count; a default is shown in the help."""
    shown = {"default": default, "show_default": True} if default is not None else {}
    return click.option("--limit", "-n", type=bounded_int(), help=help, **shown)


class UnicodeText(click.ParamType):
    """Text that can be stored: bytes that are not UTF-8 reach Python as lone surrogates
    (`llmem add -c $'\\xff'`), which SQLite refuses deep inside a write."""

    name = "text"

    def convert(self, value, param, ctx):
        problem = unstorable(value)
        if problem:
            self.fail(problem, param, ctx)
        return value


TEXT = UnicodeText()


class ProjectText(UnicodeText):
    """A project: a folder means the project it belongs to (paths.project_key: its
    repository's remote, else its root), anything else is taken as a project key as given
    (`github.com/acme/api`, or a path from another machine)."""

    name = "project"

    def convert(self, value, param, ctx):
        from pathlib import Path

        from ..paths import project_key

        value = super().convert(value, param, ctx)
        return project_key(value) if value and Path(value).expanduser().is_dir() else value


PROJECT = ProjectText()


def unstorable(value: Any) -> str | None:
    """Why `value` (text, or JSON data) cannot be stored and read back, or None."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                                allow_nan=False)
    except ValueError:
        return "holds NaN or infinity, which JSON cannot carry"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"is not valid UTF-8 text: it holds {text[exc.start]!r}, a lone surrogate "
                "(a byte that does not decode, or a \\ud800-\\udfff escape)")
    return None


def print_json(data: Any) -> None:
    click.echo(json_text(data))


def json_text(data: Any) -> str:
    """What print_json prints."""
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)


# Control characters (C0 but tab and newline, DEL, C1) and the bidi overrides: a memory's text
# comes from transcripts and tool output, and printed raw `\x1b]0;pwned\x07` retitles the
# terminal, `\x1b[2J` clears it, `\r` or U+202E hide what the line really says.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_text(text: str) -> str:
    """`text` safe to print for a human: each control character shown as an escape (`\\x1b`)."""
    return _TERMINAL_UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                else f"\\u{ord(m.group()):04x}", text)


def short(text: str, width: int = 80) -> str:
    return one_line(terminal_text(one_line(text)), width)


def memory_line(memory, score: float | None = None) -> str:
    """One line per memory: id prefix, type, confidence, content."""
    flags = ""
    if memory.invalidated_at:
        flags = " [invalid]"
    elif memory.promoted_at:
        flags = " [core]"
    from ..search import kind_label  # an episode says so, and whose words it holds

    lead = f"{memory.id[:8]}  {kind_label(memory):<15} {memory.confidence:.2f}"
    if score is not None:
        lead += f"  {score:.3f}"
    return f"{lead}  {short(memory.content, 90)}{flags}"


def superseded_note(hit) -> str:
    """The label of a search hit another memory replaced (empty when none did)."""
    successor = getattr(hit, "superseded_by", None)
    return f"  [superseded by {successor[:8]}]" if successor else ""


class Progress:
    """Where a long command is: the library calls back with counts (it never prints), the
    command moves this bar; without a terminal there is no bar and the calls do nothing."""

    def __init__(self, bar=None):
        self.bar = bar
        self.done = 0

    def to(self, done: int) -> None:
        """`done` steps are finished in all."""
        if self.bar is not None and done > self.done:
            self.bar.update(done - self.done)
        self.done = max(self.done, done)

    def advance(self, steps: int = 1) -> None:
        self.to(self.done + steps)


@contextmanager
def progress_bar(label: str, total: int, *, show: bool = True) -> Iterator[Progress]:
    """A progress bar on stderr for `total` steps, drawn only when stderr is a terminal (and
    `show`, false for --json): piped or redirected, a command prints no progress at all."""
    if not show or total <= 0 or not sys.stderr.isatty():
        yield Progress()
        return
    with click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True,
                           show_eta=True) as bar:
        yield Progress(bar)


def notice(message: str) -> None:
    click.echo(f"llmem: {message}", err=True)


def parse_json_object(text: str | None, flag: str) -> dict | None:
    """A JSON object given on the command line, or a usage error naming the flag."""
    from ..errors import UsageError

    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag} is not valid JSON: {exc}", hint=f"""example: {flag} '{{"key": "value"}}'""") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object", hint=f"""example: {flag} '{{"key": "value"}}'""")
    problem = unstorable(value)
    if problem:
        raise UsageError(f"{flag} {problem}")
    return value


def http_url(ctx, param, value: str | None) -> str | None:
    """Option callback: the value is an http(s) URL with a host (never file:, ftp:, …)."""
    if value is None:
        return None
    from ..config import check_http_url

    try:
        return check_http_url(value).rstrip("/")
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an http:// or https:// URL ({exc})",
                                 ctx=ctx, param=param) from None
