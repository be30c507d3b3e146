"""The no-LLM extractor: explicit statements a user makes, corrections, and the error signals
of a session.

What a user says in so many words ("remember …", "I prefer …", "we decided …", "always …",
"no, use X instead") is worth keeping even when no LLM is configured or reachable. These
rules are deliberately narrow: a missed statement costs less than a memory made of noise.

A correction by the user becomes what it states — a fact, preference, procedure, decision or
a wrong → right pair — never a made-up lesson. Only a statement that names a recognisable
class of mistake (a None that crashed, a missing lock, an N+1 query) becomes a
self_assessment, and then in the seeds' category, never a generic one.
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

# The memory kinds a correction can become ("learn": a procedure holding a wrong → right pair).
KINDS = ("fact", "preference", "procedure", "decision", "learn", "self_assessment", "none")


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
    metadata: dict = field(default_factory=dict)
    # Whose words (llmem/trust.py: trust_of_role for a transcript message); None: the source's.
    trust: str | None = None

    @property
    def kind(self) -> str:
        """The memory type, or "learn" for a procedure that holds a wrong → right pair."""
        return "learn" if "wrong" in self.metadata and "right" in self.metadata else self.type


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
_rule("decided", r"(?P<body>(?:we|i)(?:'ve|'re|'ll|\s+have|\s+are|\s+will)?\s+(?:decided|agreed|settled on|chose|chosen|opted|going with|go with)\b.+)",
      "decision")
_rule("decision", r"(?:decision|decided)\s*:\s*(?P<body>.+)", "decision")
_rule("lets_go_with", r"(?P<body>let'?s\s+(?:go with|use|stick with|standardi[sz]e on)\s.+)", "decision")
_rule("always_never", r"(?:you\s+(?:should|must)\s+)?(?P<body>(?:always|never|don'?t ever|do not ever)\s.+)", "procedure")

_PREFERENCE_WORDS = re.compile(r"\b(?:prefer|rather|like|dislike|hate)\b", re.IGNORECASE)
_DECISION_WORDS = re.compile(r"\b(?:decided|agreed|we(?:'ll| will) use|going with)\b", re.IGNORECASE)
_DIRECTIVE_WORDS = re.compile(r"^\s*(?:always|never)\b", re.IGNORECASE)
_TO_VERB = re.compile(r"^to\s+(?=[a-z])", re.IGNORECASE)  # "remember to run …": a step
_QUESTION = re.compile(r"\?\s*$")
_INSTEAD_OF = re.compile(r"^(?P<right>.+?)\s+instead of\s+(?P<wrong>.+?)[.!]*$", re.IGNORECASE)


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


def learn_pair(wrong: str, right: str, rule: str, confidence: float = STATED) -> Candidate:
    """A wrong → right correction as `llmem learn` stores it: a procedure, the pair in metadata."""
    wrong = " ".join(wrong.split()).strip(" -–—*•").rstrip(".!;,")
    right = _clean(right).rstrip(".!;,")
    return Candidate("procedure", f"Do: {right}\nInstead of: {wrong}", summary=right,
                     confidence=confidence, rule=rule, metadata={"wrong": wrong, "right": right})


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
            elif _TO_VERB.match(body):
                memory_type, body = "procedure", _clean(_TO_VERB.sub("", body))
        if name in ("correction_instead", "instead"):
            pair = _INSTEAD_OF.match(body)
            if pair:
                return learn_pair(pair.group("wrong"), pair.group("right"), name, confidence)
        if name.startswith("correction"):
            if len(body.split()) < 3 or _ABOUT_THE_TALK.match(body):
                return None  # "that's wrong, try again" says nothing to keep
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


# ---- the error taxonomy from wording ---------------------------------------------------------

# Each category has two kinds of cue. A defect cue names a mistake by itself ("N+1",
# "swallowed the exception", "race", "NoneType"); a topic cue only says what a text is about
# ("cache", "thread", "empty", "null") and counts as a mistake only beside a trouble word.
# Score: 2 per distinct defect term, 1 per distinct topic term; ties go to CATEGORY_ORDER.
_I = re.IGNORECASE
_DEFECT = 2
_TOPIC = 1


def _cues(*pairs: tuple[int, str] | tuple[int, str, int]) -> tuple[tuple[int, re.Pattern[str]], ...]:
    return tuple((pair[0], re.compile(pair[1], pair[2] if len(pair) > 2 else _I)) for pair in pairs)


CATEGORY_CUES: dict[str, tuple[tuple[int, re.Pattern[str]], ...]] = {
    "NULL_SAFETY": _cues(
        (_DEFECT, r"NoneType|null ?pointer|NullPointer|NullReference|null reference|nil pointer|nil map|"
                  r"nil dereference|segfault|(?:of|is|was|be|are|were|returns?|returned) (?:undefined|null|nil)\b|"
                  r"undefined is not|cannot read propert(?:y|ies)|is not an object|unwrap\(\) on|null[- ]check|"
                  r"None[- ]check|(?:check|guard)(?:ing|ed|s)? (?:for|against) (?:None|null|nil|undefined|missing)|"
                  r"optional chaining|null-?safe|(?:can|may|might|could|sometimes) (?:return|be|give|yield|come back)s? "
                  r"(?:nothing|none|null|nil|undefined|no (?:value|result|row|user|object|match|record))"),
        (_TOPIC, r"\bNone\b(?! of\b)", 0),
        (_TOPIC, r"\b(?:null|nil|undefined|nullable|optional|unset|uninitiali[sz]ed)\b|has no attribute|"
                 r"\bmissing (?:on|for|in) some\b|(?:wasn'?t|isn'?t|aren'?t|weren'?t|not|never) (?:been )?"
                 r"(?:set|filled(?: in)?|initiali[sz]ed|provided|populated|defined|loaded|present)\b|"
                 r"\b(?:doesn'?t|don'?t|does not|do not) (?:have|exist)\b"),
    ),
    "ERROR_HANDLING": _cues(
        (_DEFECT, r"bare except|except:\s*pass|swallow(?:s|ed|ing)?|unhandled|uncaught|"
                  r"(?:never|not|isn'?t|wasn'?t|aren'?t|weren'?t) (?:being )?(?:caught|handled|checked for errors)|"
                  r"without (?:a |any )?(?:try|catch|error handling|log line|error message|logging)|no (?:try|error handling)|"
                  r"(?:fails?|failing|failed) silently|silently (?:ignor|fail|drop|continu)\w*|"
                  r"(?:errors?|exceptions?|failures?) (?:are |is |were |was |get |gets )?(?:\w+ )?(?:ignored|discarded|eaten|dropped|"
                  r"lost|hidden|only logged)|ignor(?:e|es|ed|ing) (?:the |its |any )?(?:errors?|exceptions?|return (?:code|value)|"
                  r"exit (?:code|status)|failures?)|return (?:value|code) (?:is )?(?:not checked|unchecked|ignored)|"
                  r"(?:report(?:s|ed|ing)?|return(?:s|ed|ing)?|claim(?:s|ed)?) (?:success|ok|200|true)\b.{0,40}\b"
                  r"(?:even though|although|while|but)\b|(?:crash|die)s? instead of|instead of (?:catching|handling|retrying)|"
                  r"(?:takes|brings|took|brought) (?:the whole|everything|all of|the entire) \w+ down|"
                  r"kills? the (?:worker|process|consumer|server|service|app)|error handling|"
                  r"(?:no|without|missing) (?:a )?\.?catch\b|catch(?:es|ing)? (?:every|all|any) (?:exceptions?|errors?)|"
                  r"catch-all|(?:catch|except) (?:Exception|Throwable|BaseException)\b"),
        (_TOPIC, r"\b(?:exceptions?|catch(?:es|ing)?|try/except|try/catch|rejections?|retry(?:ing)?|"
                 r"error (?:code|message)|re-?raise|vanish\w*|disappear\w*|malformed request)\b|\b50[0-4]\b"),
    ),
    "OFF_BY_ONE": _cues(
        (_DEFECT, r"off[- ]by[- ]one|fencepost|IndexError|index out of range|out of bounds|"
                  r"one past the end|one (?:too many|too few|short|extra)|\b(?:one|1) (?:more|less|fewer) than\b|"
                  r"(?:drops?|dropped|skips?|skipped|miss(?:es|ed)?|loses?|lost|omits?|omitted|left out|leaves out|"
                  r"cuts? off|excludes?|excluded|repeats?|repeated|duplicat\w+|shows? twice)\b[^.;]{0,30}?\b(?:last|first|final)\b|(?:last|first|final) (?:one|item|element|row|"
                  r"page|line|day|entry|record|char(?:acter)?|byte|index)\b.{0,40}\b(?:missing|dropped|skipped|lost|excluded)|"
                  r"\b1[01]\d(?:\.\d+)?\s?%|range\(1,|(?:zero|one|0|1)-(?:based|indexed)|\b(?:<=|>=) len\("),
        (_TOPIC, r"\b(?:inclusive|exclusive|loop bounds?|upper bound|lower bound|end (?:date|index|bound)|"
                 r"len\([^)]*\)\s*[-+]\s*1|range\(|last (?:item|element|row|page|day)|final day|"
                 r"stops? (?:one|early)|at the end|boundary)\b"),
    ),
    "RACE_CONDITION": _cues(
        (_DEFECT, r"\brace(?: condition)?\b|deadlock|database is locked|(?:isn'?t|not|wasn'?t|never) atomic|"
                  r"at the same time|at once|concurrent(?:ly)?|concurrency|simultaneous\w*|interleav\w*|"
                  r"read-modify-write|lost update|double[- ](?:booking|booked|charge|charged|submit|spend|processing)|"
                  r"(?:forgot|forget|forgetting) to await|not awaited|never awaited|"
                  r"without (?:a |any )?(?:lock|await|mutex|transaction)|thread-?unsafe|not thread-?safe|"
                  r"(?:two|several|multiple|both) (?:workers|processes|requests|jobs|threads|clients|coroutines|tasks|"
                  r"users|instances|replicas)|(?:come|comes|came|arrive|arrives|arrived|run|runs|ran) in (?:together|parallel)|"
                  r"while (?:the |another |a |an )?\w+ (?:is|was|are|were) (?:still )?\w+ing\b|"
                  r"without (?:any )?(?:coordination|synchroni[sz]ation)|uncoordinated|unsynchroni[sz]ed|"
                  r"before (?:the |it |its )?\w+ (?:finished|completed|was (?:written|committed|done))"),
        (_TOPIC, r"\b(?:threads?|locks?|locking|mutex|semaphore|await|async|coroutines?|parallel|atomic\w*|"
                 r"transaction|flaky|in-flight|intermittent\w*|sometimes|twice|same (?:number|id|row|slot|seat|job))\b"),
    ),
    "AUTH_BYPASS": _cues(
        (_DEFECT, r"\b(?:ssrf|csrf|xss|idor|injection|path traversal|privilege escalation)\b|"
                  r"(?:no|missing|without|skips?) (?:any )?(?:auth\w*|permission|access|ownership|owner|signature|"
                  r"csrf|token) (?:check|verification|validation)|"
                  r"without (?:verifying|checking|validating) (?:the |its )?(?:signature|token|auth\w*|permissions?|owner|session|user)|"
                  r"any(?:one| user| body|body)(?: who is)?(?: logged[- ]in| authenticated)? can\b|"
                  r"(?:everyone|another user|other users|other people|other tenants|other customers)'?s?\b|"
                  r"by (?:editing|changing|guessing|swapping|incrementing) the (?:id|user ?id|url)|"
                  r"(?:api ?key|secret|token|password|credential)s? (?:is |are |gets? |was |were )?(?:printed|logged|exposed|"
                  r"committed|visible|shown|leaked|sent|stored in plain ?text|in (?:the )?(?:logs?|url|repo|frontend))|"
                  r"leak(?:s|ed)? (?:the |a )?(?:api )?(?:key|token|password|secret)|plain ?text passwords?|"
                  r"hard-?coded (?:secret|password|key|token|credential)s?|169\.254\.169\.254|unsanitized|unescaped|"
                  r"raw html|innerhtml|dangerouslysetinnerhtml|script tags?|<script|(?:not|never|without) "
                  r"(?:escap|sanitiz|validat)\w*|never expires?|works for (?:any|every) (?:account|user)"),
        (_TOPIC, r"\b(?:auth|authenticat\w+|authori[sz]\w+|permissions?|unauthori[sz]ed|forbidden|admin|signature|"
                 r"credentials?|passwords?|secrets?|api ?keys?|tokens?|security|vulnerab\w*|sanitiz\w*|escap\w+|"
                 r"untrusted|40[13])\b"),
    ),
    "DATA_INTEGRITY": _cues(
        (_DEFECT, r"\bstale\b|out[- ]of[- ]sync|out[- ]of[- ]date|outdated|source of truth|"
                  r"(?:isn'?t|not|never|wasn'?t|aren'?t|weren'?t) (?:being |been )?"
                  r"(?:updated|invalidated|refreshed|rebuilt|reindexed|re-?embedded|recomputed|synced|decremented|"
                  r"incremented|touched|kept in sync)|"
                  r"never (?:invalidat|updat|refresh|rebuil|decrement|increment|touch)\w*|(?:doesn'?t|does not|didn'?t) "
                  r"(?:decrement|increment|update|invalidate|refresh|rebuild|reindex|touch)|no longer match|"
                  r"inconsisten\w*|diverge\w*|drift\w*|orphan\w*|dangling|data loss|lost data|corrupt\w*|"
                  r"still (?:shows?|has|holds?|returns?|is|says) the old|until (?:i |you |we |it )?restart|"
                  r"(?:delet|remov|renam|mov|updat)\w* (?:a |an |the )?\w+ (?:leaves|left|keeps|kept)\b|left behind|leftovers?|"
                  r"(?:wrong|incorrect|outdated|old) (?:totals?|counts?|numbers?|sums?|balances?|figures?)"),
        (_TOPIC, r"\b(?:cache[ds]?|caching|index(?:es)?|embeddings?|derived|denormali[sz]ed|counters?|counts?|totals?|"
                 r"integrity|constraint|duplicates?|migration|mismatch\w*|copy|copies|the old (?:one|name|value|text|data|content)|"
                 r"old (?:name|value|text|data|content))\b"),
    ),
    "MISSING_VERIFICATION": _cues(
        (_DEFECT, r"\b(?:never|didn'?t|did not|without|not|haven'?t|hadn'?t|has never|have never|wasn'?t|weren'?t|"
                  r"isn'?t|aren'?t|was never|were never) (?:actually |even |once )?"
                  r"(?:been )?(?:run|ran|running|test|tested|testing|verif(?:y|ied|ying)|tried|trying|compil\w+|built|building|"
                  r"execut\w+|reproduc\w+|confirm\w*|check(?:ed|ing)? (?:it|that|the (?:output|result|logs?|page)|what))\b|"
                  r"\buntested\b|assum(?:e|ed|ing) (?:it|that it|this) (?:works?|worked|pass\w*)|"
                  r"(?:said|claimed|told me|reported|assured me|promised|marked|declared|called)\b.{0,60}\b"
                  r"(?:works?|worked|pass(?:es|ed)?|done|fixed|green|complete|finished)\b|"
                  r"did you (?:even )?(?:run|test|try|check)|doesn'?t even (?:import|compile|build|run|start|parse|load)|"
                  r"\bCI is (?:red|failing)|skip(?:ped|s)? (?:the )?(?:tests?|checks?|verification|ci)\b"),
        (_TOPIC, r"\b(?:verif\w+|tests? suite|the tests?|CI|syntax error)\b"),
    ),
    "EDGE_CASE": _cues(
        (_DEFECT, r"edge case|corner case|ZeroDivision\w*|divi(?:de|sion) by zero|zero-length|"
                  r"empty (?:list|string|input|file|array|dict|result|cart|response|body|query|set|page|folder|"
                  r"directory|table|name|value|field|line|collection|order|basket)|"
                  r"(?:has|have|with) no (?:items|rows|entries|elements|results|lines)|"
                  r"negative (?:numbers?|values?|quantit\w+|amounts?|prices?|ids?|sizes?)|"
                  r"(?:just|only|all) (?:spaces|whitespace|blanks?)|february 29|feb(?:ruary)? 29|29(?:th)? (?:of )?feb\w*|leap (?:year|day)|"
                  r"when (?:the |a |an )?\w+ is (?:empty|zero|blank|missing|negative|too long|very large|huge|null)|"
                  r"(?:fewer|more|extra|missing) (?:columns|fields|items|arguments|elements|values|cells) than|"
                  r"exactly (?:\d+|the (?:limit|maximum|minimum))|at the (?:limit|maximum|minimum)"),
        (_TOPIC, r"\b(?:empty|blank|zero|negative|emoji\w*|unicode|non-ascii|special characters?|whitespace|spaces|"
                 r"overflow|NaN|very long|too long|unexpected type|KeyError|TypeError|ValueError|missing key|malformed|"
                 r"invalid input|daylight saving|DST|time ?zones?|single (?:item|element|character))\b"),
    ),
    "PERFORMANCE": _cues(
        (_DEFECT, r"\bN\s?\+\s?1\b|one query (?:per|for each|in a loop)|quer(?:y|ies) (?:per|inside|in) (?:a |the |each )?"
                  r"(?:row|item|loop|record|iteration)|(?:too|very|really|painfully|extremely|far too|way too) slow|"
                  r"quadratic|O\(n\^?2\)|O\(n²\)|exponential time|memory leak|leak(?:s|ing)? memory|"
                  r"memory (?:keeps )?grow\w*|\bOOM\b|out of memory|takes (?:\d+|several|many|a few)? ?(?:seconds|minutes|forever|ages)|"
                  r"(?:recomput|recalculat|re-?read|re-?fetch|re-?compil|re-?load|re-?pars)\w* .{0,40}(?:inside|in|on) "
                  r"(?:the|a|every|each) (?:loop|call|request|render|iteration)|"
                  r"(?:again|every time|each time|repeatedly) (?:on|for|in) (?:each|every) (?:call|request|render|iteration|row)|"
                  r"(?:entire|whole) (?:file|table|dataset|log|database) into memory|"
                  r"loads? (?:all|every|the whole|the entire) (?:\d+k? )?\w+ (?:just )?to (?:show|display|render|count|use|find|get)|"
                  r"hot path|(?:each|every) (?:keystroke|keypress|scroll|mouse ?move|frame)|"
                  r"(?:sort|query|quer|fetch|load|read|pars|compil|comput|calculat|allocat|open|connect)\w* "
                  r"(?:inside|in|within) (?:the|a|each|every) (?:loop|iteration)"),
        (_TOPIC, r"\b(?:slow\w*|latency|recomput\w*|recalculat\w*|inefficient|timeouts?|timed out|cpu|"
                 r"into memory|in a loop|inside the loop|every (?:request|call|iteration|render)|\d+k (?:rows|items|records)|"
                 r"debounc\w*|throttl\w*)\b"),
    ),
    "DESIGN": _cues(
        (_DEFECT, r"wrong abstraction|leaky abstraction|tight(?:ly)? coupl\w*|circular (?:import|dependenc\w+)|"
                  r"god (?:object|class)|kitchen[- ]sink|separation of concerns|single responsibility|mix(?:es|ing|ed)? "
                  r"(?:concerns|responsibilities|layers)|(?:don'?t|doesn'?t|do not|does not) belong (?:together|here|in)|"
                  r"copy-?past\w*|duplicated (?:logic|code|validation)|belongs? (?:in|to) the \w+ (?:layer|module|service|class|package)|"
                  r"(?:talks?|goes|reaches) (?:straight|directly) (?:to|into) (?:the )?(?:sql|database|db)|over-?engineer\w*|"
                  r"spaghetti|imports? (?:the |a )?\w+ (?:module|package|layer)? ?just to|"
                  r"\bnow (?:depends on|imports|knows about|talks to)\b|(?:their|its) own way|"
                  r"the same \w+(?: \w+)? (?:in|across) (?:\w+ )?(?:places|modules|files|services|views)"),
        (_TOPIC, r"\b(?:abstraction|coupl\w+|layer(?:ing)?|architecture|responsibilit\w+|module boundar\w+|"
                 r"knows about|refactor\w*|design|concerns|dependency direction)\b"),
    ),
}
# Category order for ties: the more specific classes first.
CATEGORY_ORDER = ("NULL_SAFETY", "RACE_CONDITION", "OFF_BY_ONE", "AUTH_BYPASS", "DATA_INTEGRITY",
                  "PERFORMANCE", "EDGE_CASE", "ERROR_HANDLING", "DESIGN", "MISSING_VERIFICATION")

# Words that say something went wrong; a topic cue becomes a mistake only beside one of them.
_TROUBLE = re.compile(
    r"\b(?:errors?|bugs?|buggy|exceptions?|crash\w*|fail\w*|broke|broken|break(?:s|ing)?|blew up|blows? up|"
    r"wrong|mistakes?|regression|traceback|panic\w*|forg[eo]t\w*|miss(?:ed|es|ing)?|incorrect(?:ly)?|"
    r"flaky|leak\w*|never|didn'?t|did not|doesn'?t|does not|isn'?t|wasn'?t|aren'?t|can'?t|cannot|won'?t|"
    r"without|no longer|hole|drops?|dropped|lost|loses?|skip(?:s|ped)?|dies|died|killed|hangs?|hung|"
    r"timed out|timeout|accept(?:s|ed)|oops|sorry|should have|shouldn'?t have|instead of|throws?|raises?|"
    r"syntax error|chok\w+|crawl\w*|drown\w*|freez\w+|stuck|rejected|flips?|flipping)\b", re.IGNORECASE)


# A statement of a mistake is short; a pasted log or transcript is read only this far.
SCAN_CHARS = 4000


def _scored(text: str) -> tuple[dict[str, int], bool]:
    text = (text or "")[:SCAN_CHARS]
    scores: dict[str, int] = {}
    defect = False
    for category, cues in CATEGORY_CUES.items():
        for weight, regex in cues:
            terms = {m.group(0).lower() for m in regex.finditer(text)}
            if terms:
                scores[category] = scores.get(category, 0) + weight * len(terms)
                defect = defect or weight == _DEFECT
    return scores, defect


def categorize(text: str) -> str | None:
    """The taxonomy category a text of trouble names, or None when it names no class of mistake.

    A topic alone ("the cache", "a thread") is not a mistake: it needs a trouble word beside it.
    There is no default: a generic failure is no lesson in any category.
    """
    scores, defect = _scored(text)
    if not scores or not (defect or _TROUBLE.search((text or "")[:SCAN_CHARS])):
        return None
    best = max(scores.values())
    return next(c for c in CATEGORY_ORDER if scores.get(c) == best)


# ---- corrections: what a user's "no, …" states ------------------------------------------------

# Openings that mark a correction; what follows them is what the user says is true.
_CORRECTION_MARK = re.compile(
    r"^(?:no+(?!\s+(?:worries|problem|rush|need|thanks|idea|way|matter)\b)|nope|nah|wrong|incorrect|not quite|not really|not exactly|actually|in fact|correction|"
    r"careful|hold on|wait|"
    r"(?:that|this|it)(?:'s| is| was) (?:not (?:right|true|correct|it|how [\w ]+ works?)|wrong|incorrect|false|"
    r"a mistake|backwards)|you(?:'re| are) (?:wrong|mistaken|confused)|(?:that|it) isn'?t (?:right|true|correct))"
    r"\b[\s,.:;!—–-]*", re.IGNORECASE)
_LEAD = re.compile(r"^(?:(?:ok(?:ay)?|so|also|and|but|btw|hey|hmm+|um+|fyi|note|oh|well|sorry|please|pls|just)"
                   r"\b[,:]?\s+)+", re.IGNORECASE)

# Base-form verbs that open an instruction ("Run the tests with …").
_IMPERATIVE = (r"(?:run|use|start|stop|call|add|put|keep|write|check|bump|set|install|commit|push|deploy|open|"
               r"avoid|build|test|pin|import|name|prefix|wrap|pass|return|log|store|read|create|delete|remove|"
               r"rename|drain|restart|update|upgrade|document|follow|ask|tag|format|lint|rebase|squash|merge|"
               r"source|export|activate|load|launch|restore|generate|regenerate|clear|reset|configure|enable|"
               r"disable|mock|seed|migrate|catch|raise|validate|escape|sanitize|guard|lock|await|close|free|"
               r"cache|invalidate|refresh|rebuild|reindex|sort|limit|paginate|batch|split|move|go|switch|stick|"
               r"pick|choose|prefer|try|make|be|let|put|target|point|send|reply|answer|explain|mention|include|"
               r"leave|skip|ignore|drop|handle|do)")
_IMPERATIVE_START = re.compile(rf"^(?:please\s+|just\s+|also\s+)?{_IMPERATIVE}\b", re.IGNORECASE)

# Wrong → right pairs, in the order they are tried; each names its `wrong` and `right` parts.
_PAIRS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(regex, re.IGNORECASE)) for name, regex in (
    ("pair_instead", rf"^(?P<right>(?:please\s+|just\s+)?{_IMPERATIVE}\b.+?)\s+instead of\s+(?P<wrong>.+)$"),
    ("pair_rather", rf"^(?P<right>(?:please\s+|just\s+)?{_IMPERATIVE}\b.+?)\s+rather than\s+(?P<wrong>.+)$"),
    ("pair_replace", r"^(?:please\s+)?(?:replace|swap|substitute)\s+(?P<wrong>.+?)\s+(?:with|for|by)\s+(?P<right>.+)$"),
    ("pair_switch", r"^(?:please\s+)?(?:switch|move|migrate|change)\s+from\s+(?P<wrong>.+?)\s+to\s+(?P<right>.+)$"),
    ("pair_dont_do", r"^(?:please\s+)?(?:don'?t|do not|stop|quit|avoid|never)\s+(?P<wrong>[^,;:]+?)\s*[,;:—–]+\s*"
                     r"(?:but\s+|instead\s*,?\s*|rather\s*,?\s*)?(?P<right>\S+(?:\s+\S+)+)$"),
    ("pair_do_dont", rf"^(?P<right>(?:please\s+|just\s+)?{_IMPERATIVE}\b[^,;]+?)\s*[,;]\s*(?:and\s+|but\s+)?"
                     r"(?:don'?t|do not|never|not)\s+(?P<wrong>.+)$"),
    ("pair_not_x", r"^not\s+(?!quite\b|really\b|exactly\b|true\b|right\b|correct\b|that\b|this\b|sure\b)"
                   r"(?P<wrong>[^,:;—–]+?)\s*[,:;—–]+\s*(?:but\s+)?(?P<right>\S+(?:\s+\S+)+)$"),
    ("pair_x_not_y", r"^(?P<right>[^,;]+?),\s*(?:and\s+)?not\s+(?P<wrong>[^,;]+?)$"),
    ("pair_you_did", r"^you(?:'ve| have)?\s+(?P<wrong>(?:used|wrote|called|put|added|named|set|picked|chose|imported|"
                     r"passed|returned|created|changed|edited|moved|installed|pointed|saved|stored|sent|"
                     r"hard-?coded|wrote)\b.+?)\s*[,;]\s*(?:but\s+)?(?P<right>.+?\b(?:should|must|needs? to|"
                     r"has to|have to|(?:is|are) supposed to|go(?:es)? (?:in|into|to)|belongs? (?:in|to)|"
                     r"lives? in|(?:is|are) meant to|ought to)\b.+)$"),
))

_DECISION_ANYWHERE = re.compile(
    r"\b(?:we|i)(?:'ve|'re|'ll|\s+have|\s+are|\s+will)?\s+(?:decided|agreed|settled on|chose|chosen|opted|"
    r"going with|go with)\b|^let'?s\s+(?:go with|use|stick with|standardi[sz]e on)\b|^decision\s*:", re.IGNORECASE)
_PREFERENCE_ANYWHERE = re.compile(
    r"\b(?:i|we)(?:'d|\s+would)?\s+(?:really\s+|also\s+|usually\s+|much\s+|strongly\s+|generally\s+)?"
    r"(?:prefer|rather|like|love|hate|dislike|don'?t like|do not like|can'?t stand|want you to (?:always|never))\b|"
    r"\bmy preference is\b|\bi(?:'m| am) not a fan of\b", re.IGNORECASE)
_MUST = re.compile(r"\b(?:you|we)\s+(?:always\s+)?(?:have to|must|need to|should|are supposed to|ought to)\b"
                   r"(?!\s+have\b)|^(?:make sure|be sure|remember)\s+(?:to|that)\b|^(?:always|never)\b|"
                   r"^(?:please\s+)?(?:don'?t|do not)\s+\w+", re.IGNORECASE)
# What the user meant to say about the conversation itself, not about the world.
_ABOUT_THE_TALK = re.compile(
    r"^(?:try|do it|redo|look|think|read|start over|fix it|undo|again|please|that'?s not what|this (?:doesn'?t|"
    r"isn'?t)|it (?:doesn'?t|isn'?t) (?:work|right)|not what|what i|i (?:meant|said|asked|wanted)|you misunderstood)",
    re.IGNORECASE)
# Something specific: a name, a number, a path or an identifier (not only common words).
_SPECIFIC = re.compile(r"\d|[_/`]|\w\.\w|\w-\w|\(\)|[a-z][A-Z]|(?<!^)(?<![.!?]\s)\b[A-Z][a-zA-Z]+")


@dataclass
class Verdict:
    """What a correction or a mistake statement becomes without an LLM."""

    kind: str  # one of KINDS
    category: str | None = None  # for a self_assessment: the taxonomy category
    candidates: list[Candidate] = field(default_factory=list)  # the memories it states


def _strip_lead(sentence: str) -> tuple[str, bool]:
    """The sentence without leading filler and correction marks, and whether a mark was there."""
    marked = False
    text = sentence.strip()
    while True:
        before = text
        text = _LEAD.sub("", text)
        mark = _CORRECTION_MARK.match(text)
        if mark and mark.end() < len(text):
            text, marked = text[mark.end():], True
        if text == before:
            return text.strip(), marked


def _states_something(body: str) -> bool:
    words = body.split()
    return len(words) >= 4 and not _ABOUT_THE_TALK.match(body) and bool(_SPECIFIC.search(body))


def _correction_statement(sentence: str) -> Candidate | None:
    """The broader reading of a sentence known to be a correction (of plain chat, only its
    wrong → right pairs are trusted: "run the tests" in a request is no procedure to keep)."""
    if _QUESTION.search(sentence):
        return None
    core, marked = _strip_lead(sentence)
    core = core.rstrip(" .!")
    if len(core) < MIN_CHARS:
        return None
    if _DECISION_ANYWHERE.search(core):
        return Candidate("decision", _clean(core), confidence=STATED, rule="correction_decision")
    if _PREFERENCE_ANYWHERE.search(core):
        body = third_person(_clean(core))
        if not body.startswith("The user"):
            body = f"The user's preference: {body}"
        return Candidate("preference", body, confidence=STATED, rule="correction_preference")
    for name, regex in _PAIRS:
        match = regex.match(core)
        if match and len(match.group("right").split()) + len(match.group("wrong").split()) >= 2:
            right = match.group("right")
            if name == "pair_replace":
                right = f"use {right}"
            return learn_pair(match.group("wrong"), right, name)
    if (_MUST.search(core) or _IMPERATIVE_START.match(core)) and len(core.split()) >= 3 \
            and not _ABOUT_THE_TALK.match(core):
        if categorize(core) and not _IMPERATIVE_START.match(core):
            return None  # "you should have checked for None": a mistake, not a step
        return Candidate("procedure", _clean(core) + ".", confidence=STATED, rule="correction_procedure")
    if marked and _states_something(core) and not categorize(core):
        return Candidate("fact", f"Correction from the user: {_clean(core)}.", confidence=STATED,
                         rule="correction_fact")
    return None


def classify_correction(text: str) -> Verdict:
    """Read a user's correction, or a statement of a mistake, as the memory it amounts to.

    What it states (a fact, preference, procedure, decision or wrong → right pair) wins over a
    self_assessment; a self_assessment needs a recognisable category; anything else is "none".
    """
    stripped = (text or "").strip()
    sentences = statement_sentences(text) or ([stripped] if MIN_CHARS <= len(stripped) <= MAX_CHARS else [])
    found: list[Candidate] = []
    for sentence in sentences:
        candidate = classify_statement(sentence)
        if candidate is not None and candidate.rule in ("correction_wrong", "correction_actually") \
                and categorize(candidate.content):
            candidate = None  # "that's wrong, the parser crashes on empty input" tells of a mistake
        if candidate is None:
            candidate = _correction_statement(sentence)
        if candidate is not None:
            found.append(candidate)
    if found:
        return Verdict(found[0].kind, candidates=found)
    category = categorize(text)
    if category is not None:
        return Verdict("self_assessment", category)
    return Verdict("none")


def is_correction(text: str) -> bool:
    """Whether a user message corrects the agent ("no, …", "that's wrong: …", "use X instead of Y")."""
    for sentence in statement_sentences(text):
        _, marked = _strip_lead(sentence)
        named = classify_statement(sentence)
        if named is None:
            broad = _correction_statement(sentence)
            named = broad if broad is not None and broad.kind == "learn" else None
        if marked or (named is not None and (named.rule.startswith("correction") or named.kind == "learn")):
            return True
    return False


# The agent owning up in its own words: "I forgot to …", "my mistake", "I should have …".
_ADMISSION = re.compile(r"^\s*(?:(?:oops|sorry|ah|right|you'?re right)[,!.:]?\s+)*(?:i\s+(?:forgot|missed|didn'?t|did not|"
                        r"never|overlooked|introduced|broke|assumed|should have|should've|wrongly|accidentally)|"
                        r"my (?:mistake|bad|fault|change|edit|fix)\b)", re.IGNORECASE)

_FAILURE_OUTPUT = re.compile(
    r"Traceback \(most recent call last\)|\b\d+ failed\b|\bFAILED\b|\b\w*(?:Error|Exception):|\bERROR\b|"
    r"exited with exit code [1-9]|exit (?:code|status) [1-9]|command not found|"
    r"No such file or directory|panic:|fatal:")
_EDIT_TOOLS = {"edit", "write", "str_replace", "apply_patch", "patch", "multiedit", "create",
               "str_replace_editor", "replace", "insert"}
_ADDRESSED = re.compile(r"\b(?:you|your|you'?ve|you'?re)\b", re.IGNORECASE)


@dataclass
class ErrorSignal:
    """A mistake seen in a session, in a taxonomy category: a failed tool call after an edit, a
    retry of a failed call, a user saying what went wrong, the agent admitting it."""

    kind: str  # tool_failure | retry | correction | admission
    text: str
    category: str
    message_id: str | None = None


def _tool_failed(call) -> bool:
    if call.status == "error":
        return True
    return bool(_FAILURE_OUTPUT.search(call.output or ""))


def error_signals(messages) -> list[ErrorSignal]:
    """Mistakes of the agent a session shows, each in the category its wording names.

    A failing command before the agent changed anything is usually the reported bug being
    reproduced, not a mistake; only failures after an edit count (and tool errors always).
    Likewise a user's description of a bug counts only once the agent has edited something or
    when it is addressed to the agent. Whatever names no category is left out: "the tests
    failed" teaches nothing in particular, and a generic lesson would be a false one.
    """
    signals: list[ErrorSignal] = []
    edited = False
    failed_inputs: set[str] = set()

    def add(kind: str, text: str, message_id) -> None:
        category = categorize(text)
        if category is not None:
            signals.append(ErrorSignal(kind, text, category, message_id))

    for message in messages:
        if message.kind != "message":
            continue
        if message.role == "user":
            if not message.synthetic and (edited or _ADDRESSED.search(message.text or "")):
                verdict = classify_correction(message.text or "")
                if verdict.kind == "self_assessment":
                    add("correction", " ".join((message.text or "").split())[:300], message.id)
            continue
        if message.role == "assistant":
            for sentence in statement_sentences(message.text or ""):
                if _ADMISSION.match(sentence):
                    add("admission", sentence[:300], message.id)
        if message.error:
            add("tool_failure", message.error[:300], message.id)
        for call in message.tool_calls:
            key = f"{call.name}:{call.input!r}"[:500]
            if call.name.lower() in _EDIT_TOOLS:
                edited = True
            if not _tool_failed(call):
                continue
            detail = (call.output or call.status or "").strip()
            if key in failed_inputs:
                add("retry", f"{call.name} failed again: {detail[:200]}", message.id)
            elif call.status == "error" or edited:
                add("tool_failure", f"{call.name} failed: {detail[:300]}", message.id)
            failed_inputs.add(key)
    return signals


def stated_corrections(messages) -> list[Candidate]:
    """What the user's corrections in a session state: facts, preferences, steps, wrong → right pairs."""
    found: list[Candidate] = []
    for message in messages:
        if message.kind != "message" or message.role != "user" or message.synthetic:
            continue
        if not is_correction(message.text or ""):
            continue
        for candidate in classify_correction(message.text or "").candidates:
            candidate.message_id = message.id
            found.append(candidate)
    return found
