"""Human-readable outputs in Markdown: the dream diary entry (MEMORY.md: memory_md.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..times import utc_minute
from .narrate import md

if TYPE_CHECKING:
    from .narrate import PhaseStory
    from .outcome import DreamOutcome

DIARY_HEAD = "# Dream diary\n\nWhat `llmem dream` noticed and did, newest last.\n"

_EFFECT = {"decreasing": "effective", "stable": "not yet effective", "increasing": "ineffective"}


def _narrative(stories: dict[str, PhaseStory] | None, phase: str) -> list[str]:
    story = (stories or {}).get(phase)
    if story is None or not story.narrative:
        return []
    by = "template" if story.narrated_by == "template" else story.narrated_by
    return [f"{story.narrative} _({by})_", ""]


def diary_entry(outcome: DreamOutcome, stories: dict[str, PhaseStory] | None = None) -> str:
    """One diary entry covering every phase that ran, each opening with its narrative when it
    had one, ending with `### Calibration`."""
    title = f"run {outcome.run_id}" if outcome.run_id else "preview"
    lines = [f"## Dream {title}: {utc_minute(outcome.started_at)}", ""]
    counts = outcome.action_counts()
    light = outcome.light
    if light is not None:
        lines += ["### Light", "", *_narrative(stories, "light")]
        if light.skipped:
            lines.append(f"- Skipped the comparison: {md(light.skipped)}.")
        elif light.since is None:
            lines.append(f"- First run: compared all {light.changed} embedded memories with each other "
                         f"in {light.seconds:.1f} s.")
        else:
            lines.append(f"- Compared {light.changed} memories changed since {utc_minute(light.since)} against "
                         f"{light.compared_with} embedded memories in {light.seconds:.1f} s.")
        lines.append(f"- {len(light.near_duplicates)} near-duplicate pairs, {len(light.exact_duplicates)} "
                     f"exact-duplicate groups, {len(light.auto_links)} auto-link candidates.")
        lines += [f"- {md(note)}" for note in light.notes]
        lines.append("")
    rem = outcome.rem
    if rem is not None:
        lines += ["### REM", "", *_narrative(stories, "rem")]
        lines.append("- Memories by type: " + (", ".join(f"{t} {n}" for t, n in rem.type_counts.items()) or "none"))
        if rem.themes:
            lines.append("- Themes: " + ", ".join(f"{md(t['term'])} ({t['memories']})" for t in rem.themes))
        if rem.clusters:
            lines.append(f"- Clusters: {len(rem.clusters)} (largest {rem.clusters[0]['size']})")
        for category, info in rem.categories.items():
            noun = "memory" if info["count"] == 1 else "memories"
            lines.append(f"- {info['count']} self_assessment {noun} about {category}")
        for insight in rem.insights:
            tiers = ", ".join(str(t) for t in insight["tiers"]) or "none new (already proposed)"
            lines.append(f"- Insight {insight['key']}: tiers {tiers}")
        lines.append("")
    if outcome.deep is not None:
        lines += ["### Deep", "", *_narrative(stories, "deep")]
        deep_counts = counts.get("deep", {})
        lines.append("- " + (", ".join(f"{k} {v}" for k, v in sorted(deep_counts.items())) or "nothing to do"))
        for candidate in outcome.deep.promote[:10]:
            lines.append(f"- Promoted {candidate.memory_id[:8]} (score {candidate.score:.2f}): "
                         f"{md(candidate.content, 90)}")
        lines.append("")
    if rem is not None:
        lines += ["### Calibration", ""]
        if not rem.calibration:
            lines.append("- No behavioural insight to calibrate yet.")
        for item in rem.calibration:
            if not item["status"]:
                lines.append(f"- {item['category']}: not calibrated ({item['reason']})")
                continue
            side = "per_day" if item["metric"] == "error_rate" else "mean_iterations"
            unit = "/day" if side == "per_day" else " iterations"
            lines.append(f"- {item['category']}: {item['status']}, {_EFFECT[item['status']]} "
                         f"({item['metric']}: {item['before'][side]}{unit} before → {item['after'][side]}{unit} after)")
        lines.append(f"- Stale procedures: {rem.stale_total} ({len(rem.stale_procedures)} newly flagged)")
        lines.append("")
    return "\n".join(lines) + "\n"


def append_entry(existing: str | None, entry: str) -> str:
    base = existing if existing else DIARY_HEAD
    return base.rstrip("\n") + "\n\n" + entry
