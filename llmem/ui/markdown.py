"""The small Markdown llmem itself writes (proposed-changes.md: headings, paragraphs, bullet and
check lists, code fences, `code` and **bold**), as HTML for the viewer.

The text is hostile (it quotes memories, and the file may be edited by hand), so every piece
of it is escaped first and only our own tags are put around it: no raw HTML, no links, no
images. HTML comments (llmem's `<!-- llmem:… -->` markers) are machinery, not text: left out.
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_HEADING = re.compile(r"(#{1,6})\s+(.*)")
_CHECK = re.compile(r"[-*+]\s+\[([ xX])\]\s+(.*)")
_BULLET = re.compile(r"[-*+]\s+(.*)")
_NUMBERED = re.compile(r"\d+[.)]\s+(.*)")
_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def _inline(text: str) -> str:
    """One line's text, escaped, with `code` and **bold** marked up."""
    out = str(escape(text))
    out = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", out)
    return _BOLD.sub(lambda m: f"<strong>{m.group(1)}</strong>", out)


def render_markdown(text: str, *, heading_shift: int = 1) -> Markup:
    """`text` as HTML blocks; a heading of n `#` becomes <h{n + heading_shift}> (the page's
    own headings stay above it: in a proposal card, `##` is the card's <h3>, `###` an <h4>)."""
    html: list[str] = []
    paragraph: list[str] = []
    items: list[str] = []
    list_tag = ""
    code: list[str] | None = None

    def flush() -> None:
        nonlocal list_tag
        if paragraph:
            html.append("<p>" + " ".join(_inline(line) for line in paragraph) + "</p>")
            paragraph.clear()
        if items:
            html.append(f"<{list_tag}>" + "".join(items) + f"</{list_tag}>")
            items.clear()
            list_tag = ""

    def add_item(tag: str, body: str) -> None:
        nonlocal list_tag
        if paragraph or (list_tag and list_tag != tag):
            flush()
        list_tag = tag
        items.append(f"<li>{body}</li>")

    for raw in _COMMENT.sub("", text).splitlines():
        line = raw.strip()
        if code is not None:
            if line.startswith("```"):
                html.append("<pre><code>" + str(escape("\n".join(code))) + "</code></pre>")
                code = None
            else:
                code.append(raw)
            continue
        if line.startswith("```"):
            flush()
            code = []
        elif not line:
            flush()
        elif heading := _HEADING.fullmatch(line):
            flush()
            level = min(6, len(heading.group(1)) + heading_shift)
            html.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif check := _CHECK.fullmatch(line):
            box = "☑" if check.group(1) in "xX" else "☐"
            add_item("ul", f"{box} {_inline(check.group(2))}")
        elif bullet := _BULLET.fullmatch(line):
            add_item("ul", _inline(bullet.group(1)))
        elif numbered := _NUMBERED.fullmatch(line):
            add_item("ol", _inline(numbered.group(1)))
        else:
            if items:
                flush()
            paragraph.append(line)
    if code is not None:  # a fence never closed: still shown, as code
        html.append("<pre><code>" + str(escape("\n".join(code))) + "</code></pre>")
    flush()
    return Markup("".join(html))
