"""The HTML dream report: one self-contained file, inline CSS and SVG, no script, no network.

Every piece of text that comes from the store goes through `esc` (svg.escape: html.escape with quotes);
the Content-Security-Policy forbids scripts, images and any fetch as a second line of defence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import svg
from ..times import utc_second
from .text import one_line

if TYPE_CHECKING:
    from .outcome import DreamOutcome

ROWS = 200  # rows per table
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; script-src 'none'; form-action 'none'"
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666}.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:1.5em}
.card{border:1px solid #e3e3e3;border-radius:6px;padding:1em;background:#fafafa}
table{border-collapse:collapse;width:100%;font-size:13px}td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}code{font-size:12px;color:#555}.pill{display:inline-block;padding:0 6px;border-radius:8px;background:#e8eef7;font-size:12px}
.decreasing{color:#2e7d32}.increasing{color:#c62828}.stable{color:#8d6e00}svg text{font:12px system-ui,sans-serif;fill:#333}
"""


esc = svg.escape  # html.escape with quotes, None as ""


def _when(ts: float | None) -> str:
    return utc_second(ts) if ts else "—"


def bar_chart(items: list[tuple[str, float]], title: str, width: int = 480) -> str:
    """Horizontal bars, one per (label, value)."""
    if not items:
        return f"<p class=meta>{esc(title)}: nothing to show.</p>"
    bar_h, gap, label_w = 18, 6, 150
    height = len(items) * (bar_h + gap) + 30
    top = max(v for _, v in items) or 1
    parts = [svg.svg_root(title, width, height), f'<text x="0" y="14" font-weight="bold">{esc(title)}</text>']
    for i, (label, value) in enumerate(items):
        y = 24 + i * (bar_h + gap)
        w = (width - label_w - 60) * (value / top)
        parts.append(f'<text x="0" y="{y + 13}">{esc(label[:22])}</text>'
                     f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{COLORS[i % len(COLORS)]}"/>'
                     f'<text x="{label_w + w + 4:.1f}" y="{y + 13}">{esc(_num(value))}</text>')
    parts.append("</svg>")
    return "".join(parts)


AXIS_CHAR = 7.5  # pixels a character of the report's 12px chart text takes, generously
LEGEND_ROW = 16  # pixels per legend row


def grouped_chart(labels: list[str], series: list[tuple[str, list[float]]], title: str,
                  width: int = 480, height: int = 220) -> str:
    """Vertical bars: for each label, one bar per series (e.g. before / after)."""
    if not labels or not series:
        return f"<p class=meta>{esc(title)}: nothing to show.</p>"
    top = max((v for _, values in series for v in values), default=0) or 1
    plot_h, base_y, left = height - 70, height - 40, 30
    slot = (width - left - 10) / len(labels)
    bar_w = max(2.0, slot * 0.8 / len(series))
    # The legend wraps onto more rows below the plot rather than overlap (long series names).
    legend = svg.legend_rows([(name, COLORS[si % len(COLORS)]) for si, (name, _) in enumerate(series)],
                             left, width - 10, AXIS_CHAR)
    legend_y = height - 16
    height += LEGEND_ROW * (len(legend) - 1)
    parts = [svg.svg_root(title, width, height),
             f'<text x="0" y="14" font-weight="bold">{esc(title)}</text>',
             f'<line x1="{left}" y1="{base_y}" x2="{width - 10}" y2="{base_y}" stroke="#999"/>']
    for row_index, row in enumerate(legend):
        y = legend_y + LEGEND_ROW * row_index
        for x, name, color in row:
            parts.append(f'<rect x="{x:g}" y="{y}" width="10" height="10" fill="{color}"/>'
                         f'<text x="{x + svg.LEGEND_SWATCH:g}" y="{y + 9}">{esc(name)}</text>')
    for si, (name, values) in enumerate(series):
        color = COLORS[si % len(COLORS)]
        for li, value in enumerate(values):
            h = plot_h * (value / top)
            x = left + li * slot + slot * 0.1 + si * bar_w
            parts.append(f'<rect x="{x:.1f}" y="{base_y - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="{color}">'
                         f'<title>{esc(labels[li])} {esc(name)}: {esc(_num(value))}</title></rect>')
    # Axis labels centred under their bars, and only every `step`-th when the widest would
    # reach its neighbour (ten "0.0–0.1" bins of a 480-wide chart overlapped one another).
    step = svg.label_step([label[:10] for label in labels], slot, AXIS_CHAR)
    for li, label in enumerate(labels):
        if li % step == 0:
            parts.append(f'<text x="{left + li * slot + slot / 2:.1f}" y="{base_y + 14}" '
                         f'text-anchor="middle">{esc(label[:10])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"


def histogram(values: list[float], bins: int = 10) -> list[int]:
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int(float(v) * bins)))] += 1
    return counts


def memory_texts(store, ids: set[str]) -> dict[str, str]:
    """memory id → content, for the memories a report or a diary story quotes."""
    Memory = store.models.Memory
    ids_list = [i for i in ids if i]
    out: dict[str, str] = {}
    for start in range(0, len(ids_list), 500):
        out.update(Memory.select(Memory.id, Memory.content).where(Memory.id.in_(ids_list[start:start + 500])).tuples())
    return out


def render_report(store, outcome: DreamOutcome) -> str:
    """The whole report as one HTML document."""
    light, rem, deep = outcome.light, outcome.rem, outcome.deep
    pairs = (light.near_duplicates[:ROWS] + light.auto_links[:ROWS]) if light else []
    ids = {p[k] for p in pairs for k in ("a", "b")} | {a.memory_id for a in outcome.actions[:ROWS * 2] if a.memory_id}
    if deep:
        ids |= {c.memory_id for c in deep.promote}
    text = memory_texts(store, ids)
    mode = f"applied, run {outcome.run_id}" if outcome.applied else "preview (nothing was written)"

    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
           '<meta name="referrer" content="no-referrer">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>llmem dream report {esc(_when(outcome.started_at))}</title>",
           f"<style>{CSS}</style></head><body>",
           "<h1>llmem dream report</h1>",
           f'<p class="meta">{esc(_when(outcome.started_at))} · {esc(mode)} · phases: '
           f'{esc(" → ".join(outcome.phases))}</p>']
    for note in outcome.notes:
        out.append(f"<p class=meta>{esc(note)}</p>")

    counts = outcome.action_counts()
    type_counts = rem.type_counts if rem else outcome.type_counts
    before_h, after_h = histogram(outcome.confidence_before), histogram(outcome.confidence_after)
    bins = [f"{i / 10:.1f}–{(i + 1) / 10:.1f}" for i in range(10)]
    out.append("<h2>Overview</h2><div class=grid>")
    out.append(f"<div class=card>{bar_chart(sorted(type_counts.items()), 'Valid memories by type')}</div>")
    out.append("<div class=card>" + grouped_chart(bins, [("before", before_h), ("after", after_h)],
                                                  "Confidence histogram, before and after") + "</div>")
    out.append("<div class=card>" + bar_chart([(p, sum(c.values())) for p, c in counts.items()],
                                              "Actions per phase") + "</div>")
    if rem and rem.calibration:
        cal = [c for c in rem.calibration if c.get("status")]
        out.append("<div class=card>" + grouped_chart(
            [c["category"] for c in cal],
            [("before (per day)", [c["before"]["per_day"] for c in cal]),
             ("after (per day)", [c["after"]["per_day"] for c in cal])],
            "Calibration: error rate before and after each insight") + "</div>")
    out.append("</div>")

    out.append("<h2>Actions</h2><table><tr><th>phase</th><th>kind</th><th>count</th></tr>")
    for phase, kinds in counts.items():
        for kind, n in sorted(kinds.items()):
            out.append(f"<tr><td>{esc(phase)}</td><td>{esc(kind)}</td><td>{n}</td></tr>")
    out.append("</table>")

    if light:
        out.append(f"<h2>Light</h2><p>{light.changed} changed memories compared against {light.compared_with} "
                   f"in {light.seconds:.2f} s; {len(light.near_duplicates)} near-duplicate pairs, "
                   f"{len(light.exact_duplicates)} exact-duplicate groups, {len(light.auto_links)} auto-link candidates.</p>")
        if pairs:
            out.append("<table><tr><th>cosine</th><th>kind</th><th>older</th><th>newer</th></tr>")
            for p in pairs:
                kind = "near-duplicate" if p in light.near_duplicates else "auto-link"
                out.append(f"<tr><td>{p['similarity']:.3f}</td><td>{esc(kind)}</td>"
                           f"<td><code>{esc(p['a'][:8])}</code> {esc(one_line(text.get(p['a']), 160))}</td>"
                           f"<td><code>{esc(p['b'][:8])}</code> {esc(one_line(text.get(p['b']), 160))}</td></tr>")
            out.append("</table>")

    if rem:
        out.append("<h2>REM</h2>")
        if rem.themes:
            out.append("<table><tr><th>theme</th><th>memories</th><th>from</th></tr>")
            for t in rem.themes:
                sources = "<br>".join(f"<code>{esc(s['id'][:8])}</code> {esc(s['text'])}"
                                      for s in t.get("sources", []))
                out.append(f'<tr><td><span class=pill>{esc(t["term"])}</span></td><td>{t["memories"]}</td>'
                           f"<td>{sources}</td></tr>")
            out.append("</table>")
        if rem.categories:
            out.append("<table><tr><th>self_assessment category</th><th>count</th><th>insight tiers</th></tr>")
            tiers = {i["key"]: i["tiers"] for i in rem.insights}
            for category, info in rem.categories.items():
                out.append(f"<tr><td>{esc(category)}</td><td>{info['count']}</td>"
                           f"<td>{esc(', '.join(map(str, tiers.get(category, []))) or '—')}</td></tr>")
            out.append("</table>")
        if rem.calibration:
            out.append("<h3>Calibration</h3><table><tr><th>category</th><th>trend</th><th>metric</th>"
                       "<th>before</th><th>after</th></tr>")
            for c in rem.calibration:
                if not c.get("status"):
                    out.append(f"<tr><td>{esc(c['category'])}</td><td colspan=4>{esc(c.get('reason'))}</td></tr>")
                    continue
                out.append(f"<tr><td>{esc(c['category'])}</td><td class=\"{esc(c['status'])}\">{esc(c['status'])}</td>"
                           f"<td>{esc(c['metric'])}</td><td>{esc(c['before'])}</td><td>{esc(c['after'])}</td></tr>")
            out.append("</table>")
        out.append(f"<p>Stale procedures: {rem.stale_total} ({len(rem.stale_procedures)} newly flagged).</p>")

    if outcome.actions:
        out.append("<h2>Changes</h2><table><tr><th>phase</th><th>kind</th><th>memory</th><th>what</th></tr>")
        for action in outcome.actions[:ROWS * 2]:
            memory = action.memory_id or ""
            out.append(f"<tr><td>{esc(action.phase)}</td><td>{esc(action.kind)}</td>"
                       f"<td><code>{esc(memory[:8])}</code> {esc(one_line(text.get(memory), 100))}</td>"
                       f"<td>{esc(action.text)}</td></tr>")
        if len(outcome.actions) > ROWS * 2:
            out.append(f"<tr><td colspan=4>… and {len(outcome.actions) - ROWS * 2} more</td></tr>")
        out.append("</table>")
    out.append("<p class=meta>Generated by llmem. This file is self-contained and loads nothing.</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
