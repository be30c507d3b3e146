"""Small server-rendered SVG charts for the viewer's pages: bars per day (stacked by series,
with an optional limit line) and a coverage bar. No script, no library, nothing fetched.

Every label and title is escaped here (markupsafe.escape) before it joins the markup; the
numbers are formatted by us. The result is Markup so that templates insert it as is — it is
built only from escaped text and our own numbers, never from a stored string taken raw.
The CSP allows SVG presentation attributes (fill=, x=, width=), so no style attribute is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup, escape

from .. import svg

# Colour-blind-safe palette (Okabe–Ito), one per series in order.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#999999")
LIMIT_COLOUR = "#b3261e"


@dataclass
class Series:
    name: str
    values: list[float]  # one per label


def _number(value: float) -> str:
    value = float(value)
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    return str(int(value)) if value.is_integer() else f"{value:.2f}"


def bars_by_day(labels: list[str], series: list[Series], *, title: str, limit: float | None = None,
                limit_name: str = "limit", width: int = 720, height: int = 220) -> Markup:
    """Vertical bars, one per label (a day), the series stacked; `limit` draws a line across."""
    left, right, top_pad, bottom = 48, 10, 26, 44
    legend = [(one.name, PALETTE[i % len(PALETTE)]) for i, one in enumerate(series)]
    if limit:
        legend.append((f"{limit_name} {_number(limit)}", LIMIT_COLOUR))
    # The legend wraps onto more rows rather than run past the right edge (eight memory types
    # do not fit on one row of 720): the chart grows by a row each, the plot keeps its height.
    legend_rows = svg.legend_rows(legend, left, width - right, LEGEND_CHAR)
    height += LEGEND_ROW * (len(legend_rows) - 1)
    plot_w, plot_h = width - left - right, height - top_pad - bottom - LEGEND_ROW * (len(legend_rows) - 1)
    base_y = top_pad + plot_h
    totals = [sum(s.values[i] for s in series) for i in range(len(labels))]
    top = svg.nice_top(max([*totals, limit or 0, 0]))
    slot = plot_w / max(1, len(labels))
    bar_w = max(1.0, slot * 0.78)
    out = [svg.svg_root(title, width, height, css_class="chart"), f"<title>{escape(title)}</title>"]
    for fraction in (0, 0.5, 1):
        y = base_y - plot_h * fraction
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                   f'stroke="#d9e0e7" stroke-width="1"/>'
                   f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
                   f'fill="#5d6b7a">{_number(top * fraction)}</text>')
    for i, label in enumerate(labels):
        x = left + i * slot + (slot - bar_w) / 2
        y = base_y
        for index, one in enumerate(series):
            value = one.values[i]
            if value <= 0:
                continue
            h = plot_h * value / top
            y -= h
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                       f'fill="{PALETTE[index % len(PALETTE)]}"><title>{escape(label)} '
                       f'{escape(one.name)}: {_number(value)}</title></rect>')
    # Day labels: at most ~8 so they never overlap, counted back from the last day (always named).
    step = max(1, -(-len(labels) // 8))
    for i, label in enumerate(labels):
        if (len(labels) - 1 - i) % step == 0:
            x = left + i * slot + slot / 2
            out.append(f'<text x="{x:.1f}" y="{base_y + 14}" text-anchor="middle" font-size="11" '
                       f'fill="#5d6b7a">{escape(label[5:] if len(label) == 10 else label)}</text>')
    if limit:
        y = base_y - plot_h * limit / top
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                   f'stroke="{LIMIT_COLOUR}" stroke-width="1.5" stroke-dasharray="6 4">'
                   f'<title>{escape(limit_name)}: {_number(limit)}</title></line>')
    first_row_y = height - 14 - LEGEND_ROW * (len(legend_rows) - 1)
    for row_index, row in enumerate(legend_rows):
        y = first_row_y + LEGEND_ROW * row_index
        for x, name, colour in row:
            out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colour}"/>'
                       f'<text x="{x + 14}" y="{y + 9}" font-size="11" fill="#1d2530">'
                       f'{escape(name)}</text>')
    out.append(f'<text x="{left}" y="14" font-size="13" font-weight="600" fill="#1d2530">'
               f'{escape(title)}</text></svg>')
    return Markup("".join(out))


LEGEND_ROW = 16  # pixels per legend row
LEGEND_CHAR = 7  # pixels a legend character takes at font-size 11 (generous: never clipped)


def coverage_bar(part: int, whole: int, *, title: str, width: int = 720) -> Markup:
    """One horizontal bar: `part` of `whole` filled, with the share written beside it."""
    share = part / whole if whole else 0.0
    bar_w = width - 140
    label = f"{part} of {whole} ({share:.0%})" if whole else "nothing to cover"
    return Markup(
        svg.svg_root(title, width, 46, css_class="chart", label=label) + f"<title>{escape(title)}</title>"
        f'<text x="0" y="14" font-size="13" font-weight="600" fill="#1d2530">{escape(title)}</text>'
        f'<rect x="0" y="22" width="{bar_w}" height="16" fill="#edf1f5"/>'
        f'<rect x="0" y="22" width="{bar_w * share:.1f}" height="16" fill="{PALETTE[2]}"/>'
        f'<text x="{bar_w + 8}" y="35" font-size="12" fill="#1d2530">{escape(label)}</text></svg>')
