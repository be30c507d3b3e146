"""The no-LLM extractor: explicit statements a user makes, and the error signals of a session.

What a user says in so many words ("remember …", "I prefer …", "we decided …", "always …",
"no, use X instead") is worth keeping even when no LLM is configured or reachable. These
rules are deliberately narrow: a missed statement costs less than a memory made of noise.
Pure functions over text and transcript messages; nothing here touches the store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Confidence of what the user stated in so many words (seeds: 0.9+ for stated facts).
STATED = 0.9
STATED_EXPLICITLY = 0.95  # "remember …": the user asked for it to be kept

MIN_CHARS = 8
MAX_CHARS = 400


@dataclass
class Candidate:
    """A memory proposed by an extractor, before deduplication."""

    type: str
    content: str
    summary: str | None = None
    confidence: float = 0.7
    supersedes: list[str] = field(default_factory=list)
    rule: str = "llm"
    message_id: str | None = None


_CODE_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_INLINE_NOISE = re.compile(r"^\s*(?:>|\$|#!|\|)")
# Sentence ends: . ! ? followed by space, or a line break. Dots inside file names and
# versions (handler.py, 3.11) are not followed by a space, so they do not split.
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")

_FILLER = r"(?:(?:ok(?:ay)?|so|also|and|but|btw|hey|please|pls|fyi|note|oh|well)[,:]?\s+)*"

_RULES: list[tuple[str, re.Pattern[str], str, float]] = []


def _rule(name: str, regex: str, memory_type: str, confidence: float = STATED) -> None:
    _RULES.append((name, re.compile(r"^\s*" + _FILLER + regex, re.IGNORECASE), memory_type, confidence))


# Order matters: the first rule that matches a sentence wins.
_rule("remember", r"(?:please\s+)?(?:remember|note|keep in mind|don'?t forget|never forget)"
      r"(?:\s+(?:that|this|:))?[:,]?\s+(?P<body>.+)", "fact", STATED_EXPLICITLY)
_rule("correction_instead", r"no[,.!]?\s+(?:(?:you should|please|just)\s+)?(?P<body>(?:use|call|run|do|try|put|keep|write|prefer)\s.+?\binstead\b.*)",
      "procedure")
_rule("correction_wrong", r"(?:no[,.!]?\s+)?(?:that'?s|that is|this is|you'?re|you are|it'?s)\s+(?:wrong|incorrect|not right|not correct|not how)[,.:;!]?\s*(?P<body>.+)",
      "fact")
_rule("correction_actually", r"(?:no[,.!]\s+)?actually[,]?\s+(?P<body>(?:the|it|we|this|that|you)\b.+)", "fact")
_rule("instead", r"(?P<body>(?:use|call|run|prefer)\s.+?\binstead of\b.+)", "procedure")
_rule("prefer", r"(?P<body>(?:i|we)(?:'d|\s+would)?\s+(?:really\s+|also\s+|usually\s+|strongly\s+)?(?:prefer|rather|like to|like using|always like|don'?t like|do not like|hate|want you to always|want you to never)\s.+)",
      "preference")
_rule("decided", r"(?P<body>(?:we|i)(?:'ve| have)?\s+(?:decided|agreed|settled on|chose|chosen|are going with|'re going with|will go with|'ll go with)\b.+)",
      "decision")
_rule("decision", r"(?:decision|decided)\s*:\s*(?P<body>.+)", "decision")
_rule("lets_go_with", r"(?P<body>let'?s\s+(?:go with|use|stick with|standardi[sz]e on)\s.+)", "decision")
_rule("always_never", r"(?:you\s+(?:should|must)\s+)?(?P<body>(?:always|never|don'?t ever|do not ever)\s.+)", "procedure")

_PREFERENCE_WORDS = re.compile(r"\b(?:prefer|rather|like|dislike|hate)\b", re.IGNORECASE)
_DECISION_WORDS = re.compile(r"\b(?:decided|agreed|we(?:'ll| will) use|going with)\b", re.IGNORECASE)
_DIRECTIVE_WORDS = re.compile(r"^\s*(?:always|never)\b", re.IGNORECASE)
_QUESTION = re.compile(r"\?\s*$")


def _clean(text: str) -> str:
    text = " ".join(text.split()).strip(" \t-–—*•")
    return text[0].upper() + text[1:] if text else text


_FIRST_PERSON = re.compile(
    r"^I(?:'d| would)?\s+(?P<adverb>(?:really|also|usually|generally|strongly)\s+)?"
    r"(?P<verb>prefer|like|hate|want|dislike|rather|don'?t like|do not like|always like)\b",
    re.IGNORECASE)
_THIRD_PERSON = {"prefer": "prefers", "like": "likes", "hate": "hates", "want": "wants",
                 "dislike": "dislikes", "rather": "would rather", "don't like": "doesn't like",
                 "dont like": "doesn't like", "do not like": "does not like",
                 "always like": "always likes"}


def third_person(body: str) -> str:
    """ "I prefer X" → "The user prefers X": an injected memory must not read as the agent's."""
    match = _FIRST_PERSON.match(body)
    if not match:
        return body
    verb = _THIRD_PERSON.get(match.group("verb").lower(), match.group("verb"))
    return f"The user {match.group('adverb') or ''}{verb}{body[match.end():]}"


def statement_sentences(text: str) -> list[str]:
    """The sentences of a user message a rule may look at (code blocks and quotes left out)."""
    text = _CODE_FENCE.sub("\n", text or "")
    out = []
    for line in text.splitlines():
        if _INLINE_NOISE.match(line):
            continue
        for sentence in _SENTENCES.split(line):
            sentence = sentence.strip()
            if MIN_CHARS <= len(sentence) <= MAX_CHARS:
                out.append(sentence)
    return out


def classify_statement(sentence: str) -> Candidate | None:
    """The memory a single user sentence states explicitly, or None."""
    if _QUESTION.search(sentence):
        return None  # "should we always use X?" asks, it does not state
    for name, regex, memory_type, confidence in _RULES:
        match = regex.match(sentence)
        if not match:
            continue
        body = _clean(match.group("body"))
        if len(body) < MIN_CHARS:
            return None
        if name == "remember":
            # "remember that I prefer …" is a preference; "remember: we decided …" a decision.
            if _PREFERENCE_WORDS.search(body):
                memory_type = "preference"
            elif _DECISION_WORDS.search(body):
                memory_type = "decision"
            elif _DIRECTIVE_WORDS.search(body):
                memory_type = "procedure"
        if name.startswith("correction"):
            body = f"Correction from the user: {body}"
        body = third_person(body)
        return Candidate(memory_type, body, confidence=confidence, rule=name)
    return None


def statements(text: str, message_id: str | None = None) -> list[Candidate]:
    """Every explicit statement in one user message's text."""
    found = []
    for sentence in statement_sentences(text):
        candidate = classify_statement(sentence)
        if candidate is not None:
            candidate.message_id = message_id
            found.append(candidate)
    return found


# ---- error signals, for introspection without an LLM ------------------------------------

# Tool output that says something failed (checked on the abbreviated output).
_FAILURE_OUTPUT = re.compile(
    r"Traceback \(most recent call last\)|\b\d+ failed\b|\bFAILED\b|\b\w*(?:Error|Exception):|\bERROR\b|"
    r"exited with exit code [1-9]|exit (?:code|status) [1-9]|command not found|"
    r"No such file or directory|panic:|fatal:")
_EDIT_TOOLS = {"edit", "write", "str_replace", "apply_patch", "patch", "multiedit", "create",
               "str_replace_editor", "replace", "insert"}

# Category keywords, checked in this order on the text around a failure (seed taxonomy).
CATEGORY_KEYWORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("NULL_SAFETY", re.compile(r"NoneType|null pointer|NullPointer|undefined is not|of undefined|of null|is None\b|\bnil\b", re.I)),
    ("RACE_CONDITION", re.compile(r"race|deadlock|database is locked|concurren|await|asyncio|thread", re.I)),
    ("OFF_BY_ONE", re.compile(r"IndexError|out of range|off[- ]by[- ]one|fencepost|out of bounds", re.I)),
    ("AUTH_BYPASS", re.compile(r"unauthori[sz]ed|forbidden|permission denied|\b40[13]\b|injection|ssrf|csrf|auth", re.I)),
    ("DATA_INTEGRITY", re.compile(r"stale|out of sync|cache|migration|integrity|constraint|duplicate", re.I)),
    ("PERFORMANCE", re.compile(r"timed? ?out|timeout|too slow|N\+1|memory leak|out of memory", re.I)),
    ("EDGE_CASE", re.compile(r"empty|edge case|KeyError|ValueError|TypeError|unexpected type", re.I)),
    ("ERROR_HANDLING", re.compile(r"unhandled|uncaught|Traceback|exception|bare except|swallow", re.I)),
    ("MISSING_VERIFICATION", re.compile(r"\bfailed\b|AssertionError|FAILED|test", re.I)),
)


def categorize(text: str, default: str = "MISSING_VERIFICATION") -> str:
    """The taxonomy category whose keywords the text mentions first."""
    for category, regex in CATEGORY_KEYWORDS:
        if regex.search(text or ""):
            return category
    return default


@dataclass
class ErrorSignal:
    """Something that went wrong in a session: a failed tool call, a correction, a retry."""

    kind: str  # tool_failure | correction | retry
    text: str
    message_id: str | None = None


def _tool_failed(call) -> bool:
    if call.status == "error":
        return True
    return bool(_FAILURE_OUTPUT.search(call.output or ""))


def error_signals(messages) -> list[ErrorSignal]:
    """Failures the agent caused, user corrections and retries, in transcript order.

    A failing command before the agent changed anything is usually the reported bug being
    reproduced, not a mistake; only failures after an edit count (and tool errors always).
    """
    signals: list[ErrorSignal] = []
    edited = False
    failed_inputs: set[str] = set()
    for message in messages:
        if message.kind != "message":
            continue
        if message.role == "user" and not message.synthetic:
            for candidate in statements(message.text, message.id):
                if candidate.rule.startswith("correction"):
                    signals.append(ErrorSignal("correction", candidate.content, message.id))
            continue
        if message.error:
            signals.append(ErrorSignal("tool_failure", message.error[:300], message.id))
        for call in message.tool_calls:
            key = f"{call.name}:{call.input!r}"[:500]
            if call.name.lower() in _EDIT_TOOLS:
                edited = True
            if not _tool_failed(call):
                continue
            detail = (call.output or call.status or "").strip()
            if key in failed_inputs:
                signals.append(ErrorSignal("retry", f"{call.name} failed again: {detail[:200]}", message.id))
            elif call.status == "error" or edited:
                signals.append(ErrorSignal("tool_failure", f"{call.name} failed: {detail[:300]}", message.id))
            failed_inputs.add(key)
    return signals
