"""What each phase of a run did, told in plain language: the facts, and a short narrative.

The facts come from the run's outcome and the memories it touched, nothing else. The
narrative is written by the dream model (dream.model, else llm.model) from those facts
alone; sentences that name anything the facts do not are dropped, and when no model
answers (or none is configured) a plain template tells the same facts. Every string here
is Markdown-escaped: memory text and model replies can hold `#`, `<`, backticks or `-->`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..db.fts import STOPWORDS
from ..text import one_line as plain_line
from .report import memory_texts
from .text import distinct_terms, one_line

if TYPE_CHECKING:
    from .outcome import DreamOutcome

log = logging.getLogger(__name__)

PHASE_TITLES = {"light": "Light Sleep", "rem": "REM Sleep", "deep": "Deep Sleep"}
EXCERPT = 90  # characters of a memory quoted in a fact
SHOWN = 3  # examples quoted per kind of finding
MAX_SENTENCES = 4
MAX_CHARS = 700
NARRATIVE_SCHEMA = {"type": "object", "properties": {"entry": {"type": "string"}}, "required": ["entry"]}
NARRATIVE_PROMPT = (
    "You keep the dream diary of a memory system for an AI coding agent. Write a short entry "
    "(2 to 4 plain sentences, past tense, no lists, no headings, no Markdown) about one phase of "
    "tonight's consolidation. Use ONLY the facts and memories given: do not add names, numbers, "
    "causes, advice or anything they do not say. Answer JSON: {\"entry\": \"...\"}.")
# Words a narrative may use without the facts holding them: the telling, not the told.
_NARRATIVE_WORDS_TEXT = """
sleep light rem deep phase phases tonight night dream dreams dreamed dreaming diary entry run runs
memory memories memory's noticed notice found find looked look looking compared compare comparing
sorted sort pair pairs similar nearly almost same alike close closely duplicate duplicates theme
themes recurring recur recurred reflected reflect consolidated consolidation kept keep merged merge
merging promoted promote promotion linked link links decayed decay boosted boost invalidated changed
change changes nothing new quiet calm store stored nearly seemed seem appeared appear together
several handful single pair couple many few more fewer one two three four five six seven eight nine ten
showed shows came come mostly mainly also again still while during since earlier later then first last
time while whole part parts group groups grouped cluster clusters turned turn surfaced surface
idea ideas thread threads pattern patterns repeated repeating repeat item items thing things
afterwards overall meanwhile finally tonight's back main mainly strongest notable worth small large
"""
NARRATIVE_WORDS = frozenset(_NARRATIVE_WORDS_TEXT.split())
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")  # not the digits inside an id
_NAME = re.compile(r"\b[A-Z][A-Za-z]+\b")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]{}#|~!])")
_LINE_START = re.compile(r"^(\s*)([-+=>]|\d+[.)])")


def md(text: str | None, width: int | None = None) -> str:
    """Text made safe inside a Markdown line: one line, HTML-escaped, inline syntax escaped."""
    line = plain_line(text)
    if width is not None:
        line = one_line(line, width)
    line = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    line = _MD_SPECIAL.sub(r"\\\1", line)
    # A line that starts like a list item, a heading underline or a quote would become one.
    return _LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), line)


def quote(text: str | None) -> str:
    return f"“{md(text, EXCERPT)}”"


def theme_line(theme: dict[str, Any]) -> str:
    """One REM theme for a terminal: the term, how many memories, where it came from."""
    sources = theme.get("sources") or [{"id": i, "text": ""} for i in theme.get("examples", [])]
    shown = "; ".join(f"{s['id'][:8]} {one_line(s['text'], 50)}".strip() for s in sources[:2])
    return f"{theme['term']} ({theme['memories']} memories): {shown}"


@dataclass
class PhaseStory:
    """One phase of one run: its facts (already escaped Markdown) and its narrative."""

    phase: str
    facts: list[str] = field(default_factory=list)
    plain: list[str] = field(default_factory=list)  # the same facts unescaped, for the model
    gist: list[str] = field(default_factory=list)  # short sentences without quotes, for the template
    enough: bool = False  # enough material for a narrative
    narrative: str | None = None
    narrated_by: str | None = None  # "model NAME" or "template"


def stories(store, outcome: DreamOutcome) -> dict[str, PhaseStory]:
    """The facts of each phase that ran, with the memories they name."""
    ids: set[str] = set()
    if outcome.light:
        for pair in (outcome.light.near_duplicates[:SHOWN] + outcome.light.auto_links[:SHOWN]):
            ids.update((pair["a"], pair["b"]))
        for group in outcome.light.exact_duplicates[:SHOWN]:
            ids.update(group[:2])
    if outcome.deep:  # only what the facts quote: a big night decays tens of thousands
        ids.update(c.memory_id for c in outcome.deep.promote[:SHOWN])
        for action in outcome.deep.actions.of_kind("merge")[:SHOWN]:
            ids.update(action.detail["ids"])
    text = memory_texts(store, ids)
    out: dict[str, PhaseStory] = {}
    if outcome.light is not None:
        out["light"] = _light_story(outcome, text)
    if outcome.rem is not None:
        out["rem"] = _rem_story(outcome)
    if outcome.deep is not None:
        out["deep"] = _deep_story(outcome, text)
    return out


def plural(n: int, noun: str, many: str | None = None) -> str:
    return f"{n} {noun if n == 1 else (many or noun + 's')}"


def _add(story: PhaseStory, plain: str, escaped: str | None = None) -> None:
    story.plain.append(plain)
    story.facts.append(escaped if escaped is not None else md(plain))


def _light_story(outcome: DreamOutcome, text: dict[str, str]) -> PhaseStory:
    light = outcome.light
    story = PhaseStory("light")
    if light.skipped:
        _add(story, f"Skipped the comparison: {light.skipped}.")
    elif light.since is None:
        _add(story, f"First light sleep: compared all {light.changed} embedded memories with each other.")
    else:
        _add(story, f"Compared {light.changed} memories embedded since the last run with "
                    f"{light.compared_with} embedded memories.")
    found = len(light.near_duplicates) + len(light.exact_duplicates) + len(light.auto_links)
    story.enough = found > 0
    looked = (f"compared {plural(light.changed, 'new or changed memory', 'new or changed memories')} "
              f"with {plural(light.compared_with, 'embedded one')}")
    kinds = [text for n, text in (
        (len(light.near_duplicates), plural(len(light.near_duplicates), "near-duplicate pair")),
        (len(light.exact_duplicates), plural(len(light.exact_duplicates), "group") + " of exact copies"),
        (len(light.auto_links), plural(len(light.auto_links), "related pair"))) if n]
    story.gist.append(f"Light Sleep {looked} and found " + _and(kinds) + ".")
    if not found and not light.skipped:
        _add(story, "Found no near-duplicate, exact duplicate or related pair.")
    for label, pairs in (("say nearly the same", light.near_duplicates), ("are related", light.auto_links)):
        if pairs:
            _add(story, f"{plural(len(pairs), 'pair')} of memories {label}.")
        for pair in pairs[:SHOWN]:
            a, b = text.get(pair["a"], ""), text.get(pair["b"], "")
            _add(story, f"{pair['a'][:8]} “{one_line(a, EXCERPT)}” and {pair['b'][:8]} “{one_line(b, EXCERPT)}” "
                        f"{label} (cosine {pair['similarity']:.2f}).",
                 f"{pair['a'][:8]} {quote(a)} and {pair['b'][:8]} {quote(b)} {label} "
                 f"(cosine {pair['similarity']:.2f}).")
    if light.exact_duplicates:
        _add(story, f"{plural(len(light.exact_duplicates), 'group')} of memories have exactly the same text.")
        for group in light.exact_duplicates[:SHOWN]:
            body = text.get(group[0], "")
            _add(story, f"{len(group)} copies of “{one_line(body, EXCERPT)}”.", f"{len(group)} copies of {quote(body)}.")
    return story


def _rem_story(outcome: DreamOutcome) -> PhaseStory:
    rem = outcome.rem
    story = PhaseStory("rem")
    total = sum(rem.type_counts.values())
    kinds = ", ".join(f"{n} {t}" for t, n in rem.type_counts.items())
    _add(story, f"Looked over {total} valid memories ({kinds})." if total else "The store holds no valid memory yet.")
    for theme in rem.themes[:5]:
        sources = theme.get("sources") or []
        plain_src = "; ".join(f"{s['id'][:8]} “{s['text']}”" for s in sources)
        escaped_src = "; ".join(f"{s['id'][:8]} {quote(s['text'])}" for s in sources)
        _add(story, f"Theme “{theme['term']}” in {theme['memories']} memories: {plain_src}.",
             f"Theme **{md(theme['term'])}** in {theme['memories']} memories: {escaped_src}.")
    for cluster in rem.clusters[:SHOWN]:
        terms = ", ".join(cluster["terms"]) or "no shared word"
        _add(story, f"A cluster of {cluster['size']} close memories around {terms}.")
    for category, info in rem.categories.items():
        _add(story, f"{info['count']} self-assessments about {category}.")
    for insight in rem.insights:
        if insight["tiers"]:
            _add(story, f"Proposed a behavioural insight for {insight['key']} "
                        f"(tiers {', '.join(str(t) for t in insight['tiers'])}) from {insight['count']} self-assessments.")
    if rem.stale_procedures:
        _add(story, f"{len(rem.stale_procedures)} procedures were never used and are now flagged stale.")
    story.enough = bool(rem.themes or rem.clusters or any(i["tiers"] for i in rem.insights) or rem.stale_procedures)
    gist = f"REM Sleep looked over {plural(total, 'memory', 'memories')}"
    if rem.themes:
        top = [f"{t['term']} ({plural(t['memories'], 'memory', 'memories')})" for t in rem.themes[:2]]
        gist += ("; the themes that came back most were " if len(top) > 1 else "; the theme that came back was ")
        gist += " and ".join(top)
    story.gist.append(gist + ".")
    new_insights = [i["key"] for i in rem.insights if i["tiers"]]
    if new_insights:
        story.gist.append(f"It proposed a behavioural insight about {', '.join(new_insights)}.")
    return story


_DONE = {"merge": ("merged {} group of near-duplicates", "merged {} groups of near-duplicates"),
         "dedupe": ("dropped {} group of exact copies", "dropped {} groups of exact copies"),
         "decay": ("let {} idle memory fade a little", "let {} idle memories fade a little"),
         "boost": ("raised the confidence of {} well-used memory", "raised the confidence of {} well-used memories"),
         "invalidate": ("retired {} weak memory", "retired {} weak memories"),
         "link": ("linked {} related pair", "linked {} related pairs"),
         "promote": ("promoted {} memory to MEMORY.md", "promoted {} memories to MEMORY.md")}


def _and(items: list[str]) -> str:
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


def _deep_story(outcome: DreamOutcome, text: dict[str, str]) -> PhaseStory:
    story = PhaseStory("deep")
    counts = outcome.deep.counts()
    total = sum(counts.values())
    verb = "Made" if outcome.applied else "Proposed"
    if not total:
        _add(story, "Nothing to merge, decay, boost, invalidate, link or promote.")
    else:
        parts = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
        _add(story, f"{verb} {plural(total, 'change')}: {parts}.")
    for action in outcome.deep.actions.of_kind("merge")[:SHOWN]:
        members = action.detail["ids"]
        plain = " + ".join(f"“{one_line(text.get(m, ''), 60)}”" for m in members)
        escaped = " + ".join(f"“{md(text.get(m, ''), 60)}”" for m in members)
        _add(story, f"Merged {len(members)} memories: {plain}.", f"Merged {len(members)} memories: {escaped}.")
    for candidate in outcome.deep.promote[:SHOWN]:
        body = text.get(candidate.memory_id, candidate.content)
        _add(story, f"Promoted {candidate.memory_id[:8]} (score {candidate.score:.2f}, {candidate.recalls} recalls): "
                    f"“{one_line(body, EXCERPT)}”.",
             f"Promoted {candidate.memory_id[:8]} (score {candidate.score:.2f}, {candidate.recalls} recalls): "
             f"{quote(body)}.")
    story.enough = total > 0
    done = [_DONE[kind][n != 1].format(n) if kind in _DONE else f"{kind} {n}" for kind, n in sorted(counts.items())]
    story.gist.append(f"Deep Sleep {_and(done)}." if done else "Deep Sleep had nothing to change.")
    return story


# ---- the narrative ------------------------------------------------------------------------


def template(story: PhaseStory) -> str:
    """The plain-language narrative when no model writes one: the phase's first facts told."""
    return " ".join(story.gist)


def grounded(reply: str, material: str) -> str:
    """The sentences of `reply` that say only what `material` says (names, numbers, words)."""
    known_terms = distinct_terms(material)
    known_numbers = set(_NUMBER.findall(material))
    kept = []
    for sentence in _SENTENCE.split(" ".join(reply.split())):
        if not sentence:
            continue
        if any(n not in known_numbers for n in _NUMBER.findall(sentence)):
            continue
        terms = {t for t in distinct_terms(sentence) if t not in STOPWORDS and t not in NARRATIVE_WORDS}
        unknown = terms - known_terms
        # An identifier, path or version the facts do not hold is an invention, not a paraphrase;
        # so is a name (a capitalised word that is neither common nor in the facts).
        if any(re.search(r"[\d_/.]", t) for t in unknown):
            continue
        if {w.lower() for w in _NAME.findall(sentence)} & unknown:
            continue
        # Plain words the facts do not hold are the telling ("came back", "mostly") up to a point.
        if len(unknown) > max(2, len(terms) // 2):
            continue
        kept.append(sentence)
        if len(kept) == MAX_SENTENCES:
            break
    return one_line(" ".join(kept), MAX_CHARS)


class Narrator:
    """Asks the dream model for each phase's entry, falling back as the design says.

    A model that is unavailable (not found, unreachable, failing) is retried once with
    llm.model, and is not asked again in this run. A refusal (401/403: the key or an
    allow-list) is not retried: it is kept in `problems`, which the run's outcome shows,
    and the phases get no model narrative rather than a silent substitute.
    """

    def __init__(self, config, store, *, llm: Any = None):
        self.config, self.store = config, store
        self.problems: list[str] = []
        self.refused = False
        self._given = llm
        dream_model = config.dream.model
        default = config.llm.model
        self.models = [dream_model, default] if dream_model and dream_model != default else [default]
        self._made: dict[str, Any] = {}

    def _llm(self, model: str):
        if self._given is not None:
            return self._given
        if model not in self._made:
            from ..providers.llm import make_llm

            self._made[model] = make_llm(self.config, model=model, store=self.store)
        return self._made[model]

    def narrate(self, story: PhaseStory) -> None:
        if not story.enough:
            return
        text, model = (None, None) if self.refused else self._ask(story)
        if text:
            story.narrative, story.narrated_by = md(text), f"model {model}"
        elif self.refused:
            story.narrated_by = "none: the diary model was refused (see the run's notes)"
        else:
            story.narrative, story.narrated_by = md(template(story)), "template"

    def _ask(self, story: PhaseStory) -> tuple[str | None, str | None]:
        from ..errors import BudgetExhausted, LLMReplyInvalid, LLMUnavailable

        material = "\n".join(f"- {fact}" for fact in story.plain)
        messages = [{"role": "system", "content": NARRATIVE_PROMPT},
                    {"role": "user", "content": f"Phase: {PHASE_TITLES[story.phase]}\nFacts:\n{material}"}]
        while self.models:
            model = self.models[0]
            llm = self._llm(model)
            if llm is None:
                self.models.clear()
                return None, None
            try:
                reply = llm.chat_json(messages, NARRATIVE_SCHEMA, task="dream_diary")
            except LLMUnavailable as exc:
                status = getattr(exc, "status", None)
                if status in (401, 403):
                    self.refused = True
                    self.problems.append(f"diary model {model} was refused ({status}: {exc.message}); "
                                         "not retried with another model, no narrative written")
                    log.warning("dream diary: model %s refused (%s), not retried", model, status)
                    return None, None
                self.problems.append(f"diary model {model} unavailable ({exc.message})"
                                     + ("; retrying once with llm.model" if len(self.models) > 1 else ""))
                log.warning("dream diary: model %s unavailable: %s", model, exc.message)
                self.models.pop(0)
                continue
            except (LLMReplyInvalid, BudgetExhausted) as exc:
                self.problems.append(f"diary model {model} gave no entry ({exc.message}); template used")
                return None, None
            entry = grounded(str((reply or {}).get("entry") or ""), material)
            if not entry:
                self.problems.append(f"diary model {model}'s {PHASE_TITLES[story.phase]} entry named things "
                                     "this run did not do; template used")
                return None, None
            return entry, model
        return None, None

    def close(self) -> None:
        for llm in self._made.values():
            if llm is not None:
                llm.close()
