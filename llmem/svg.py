"""The pieces every SVG chart of llmem is made of, for the viewer's charts (ui/charts.py) and
the dream report (dream/report.py): the root element, a round axis top, which axis labels fit
and the legend laid out in rows. No script, no library, nothing fetched.

Text given here is escaped here (quotes too: it lands in attributes); numbers are ours.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

LEGEND_SWATCH = 14  # pixels of a legend entry before its text: the 10px swatch and a gap
LEGEND_GAP = 10  # pixels between two legend entries of a row


def escape(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def svg_root(title: str, width: int, height: float, *, css_class: str = "", label: str = "") -> str:
    """The opening <svg> tag of a chart, named for screen readers by its title (and `label`)."""
    named = escape(title) + (f": {escape(label)}" if label else "")
    cls = f' class="{css_class}"' if css_class else ""
    return (f'<svg{cls} role="img" aria-label="{named}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">')


def nice_top(value: float) -> float:
    """The axis top: the smallest of 1, 2, 2.5, 5 × 10^k at or above `value`."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= value:
        scale *= 10
    while scale > value:
        scale /= 10
    for step in (1, 2, 2.5, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale


def label_step(labels: Sequence[str], slot: float, char_px: float) -> int:
    """Label every `step`-th of these axis labels, centred in slots `slot` wide, so that the
    widest (at `char_px` a character) never reaches its neighbour."""
    widest = max((len(label) for label in labels), default=0) * char_px
    return max(1, math.ceil(widest / slot)) if slot > 0 else 1


def legend_width(name: str, char_px: float) -> float:
    """The width of one legend entry: its swatch, the gap, its text."""
    return LEGEND_SWATCH + char_px * len(name)


def legend_rows(legend: Sequence[tuple[str, str]], left: float, right_edge: float,
                char_px: float) -> list[list[tuple[float, str, str]]]:
    """(x, name, colour) of each (name, colour) legend entry, in rows that end before
    `right_edge` (a chart grows by a row rather than clip its legend)."""
    rows: list[list[tuple[float, str, str]]] = [[]]
    x = left
    for name, colour in legend:
        if rows[-1] and x + legend_width(name, char_px) > right_edge:
            rows.append([])
            x = left
        rows[-1].append((x, name, colour))
        x += legend_width(name, char_px) + LEGEND_GAP
    return rows
