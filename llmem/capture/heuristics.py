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
# A plain sentence of how things are ("the nightly job exports orders to S3"), read with no cue
# word: stated by the user, but the reading is a guess from its shape.
UNCUED = 0.8

MIN_CHARS = 8
MAX_CHARS = 400
# What a person types in one message, at most; past it is pasted material (a log, a file), and
# reading on would only cost time on every idle slice (a 50 MB paste took minutes).
STATEMENT_CHARS = 20_000

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
# Lines of a pasted log or stack trace: a timestamp or log level first, a traceback's frames,
# an exception line ("ValueError: …"), a JS stack frame.
_LOG_LINE = re.compile(
    r"^\s*(?:\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\[?\d\d:\d\d:\d\d\b|\[?(?:DEBUG|INFO|WARN(?:ING)?|ERROR|FATAL|"
    r"CRITICAL|TRACE)\b|Traceback \(most recent call last\)|File \"[^\"]+\", line \d+|at [\w.<>$]+ \(|"
    r"[\w.]*(?:Error|Exception|Warning)(?::|$)|E\s{2,}|\s{4,}\S)")
_LIST_MARK = re.compile(r"^\s*(?:[-*+•]|\d{1,2}[.)])\s+(?:\[[ xX]\]\s+)?")
# Sentence ends: . ! ? followed by space, or a line break. Dots inside file names and
# versions (handler.py, 3.11) are not followed by a space, so they do not split.
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
# Someone else's words inside the user's message: "…" spans of two words or more.
_QUOTED = re.compile(r"\"[^\"\n]*\s[^\"\n]*\"|“[^”\n]*\s[^”\n]*”")

# Openers that carry nothing: acknowledgements, discourse markers, politeness.
_FILLER = (r"(?:(?:ok(?:ay)?|so|also|and|but|btw|by the way|hey|please|pls|fyi|oh|well|hmm+|um+|yes|yeah|yep|"
           r"sure|right|alright|great|cool|nice|perfect|thanks|thank you|sounds good|got it|no|honestly|"
           r"personally|frankly|generally|in general|overall|one more thing|another thing|plus|then|"
           r"anyway)(?:[,:!.]+\s*|\s+|\s*[—–-]\s*))*")

# Base-form verbs that open an instruction ("Run the tests with …").
_IMPERATIVE = (r"(?:run|use|start|stop|call|add|put|keep|write|check|bump|set|install|commit|push|deploy|open|"
               r"avoid|build|test|pin|import|name|prefix|wrap|pass|return|log|store|read|create|delete|remove|"
               r"rename|drain|restart|update|upgrade|document|follow|ask|tag|format|lint|rebase|squash|merge|"
               r"source|export|activate|load|launch|restore|generate|regenerate|clear|reset|configure|enable|"
               r"disable|mock|seed|migrate|catch|raise|validate|escape|sanitize|guard|lock|await|close|free|"
               r"cache|invalidate|refresh|rebuild|reindex|sort|limit|paginate|batch|split|move|go|switch|stick|"
               r"pick|choose|prefer|try|make|be|let|put|target|point|send|reply|answer|explain|mention|include|"
               r"leave|skip|ignore|drop|handle|do)")
# Verbs a standing rule ("always …", "never …", "before X, …") opens with: the imperatives and
# the verbs of things one must not do to code.
_RULE_VERB = (r"(?:" + _IMPERATIVE[3:-1] + r"|touch|edit|change|modify|force-push|hard-?code|expose|print|rely|"
              r"assume|trust|bypass|silence|amend|throw|swallow|block|query|ship|release|vendor|copy|verify|"
              r"review|quote|comment|annotate|type|retry|roll|reach|sign|emit|squash|work|wait|bundle|"
              r"double-check|back up|backup|give|prefix|suffix|review|keep|tag|open)")
# A tool, language, service or format named: a word with a digit, a path, a dotted or dashed
# or camel-cased name, a capitalised word past the first, or one of the names commonly written
# in lower case. A statement that names nothing specific is usually about the talk itself.
_SPECIFIC = re.compile(r"\d|[_/`]|\w\.\w|\w-\w|\(\)|[a-z][A-Z]|(?<!^)(?<![.!?]\s)\b[A-Z][a-zA-Z]+")
_LOWERCASE_NAMES = frozenset({
    "pnpm", "npm", "yarn", "bun", "deno", "node", "uv", "pip", "pipx", "poetry", "pdm", "conda",
    "hatch", "pytest", "unittest", "nose", "tox", "nox", "ruff", "black", "isort", "flake8", "pylint",
    "mypy", "pyright", "eslint", "prettier", "biome", "jest", "vitest", "mocha", "cypress",
    "playwright", "selenium", "docker", "podman", "kubectl", "kubernetes", "helm", "terraform",
    "ansible", "pulumi", "nginx", "caddy", "apache", "sqlite", "postgres", "postgresql", "mysql",
    "mariadb", "redis", "memcached", "mongodb", "mongo", "kafka", "rabbitmq", "celery", "rq", "sidekiq",
    "django", "flask", "fastapi", "starlette", "rails", "laravel", "spring", "express", "nestjs",
    "nextjs", "react", "vue", "svelte", "angular", "htmx", "alpine", "jquery", "tailwind", "bootstrap",
    "webpack", "vite", "esbuild", "rollup", "parcel", "babel", "typescript", "javascript", "python",
    "rust", "golang", "go", "java", "kotlin", "swift", "ruby", "php", "elixir", "haskell", "scala",
    "graphql", "grpc", "rest", "protobuf", "json", "yaml", "toml", "csv", "markdown", "git", "github",
    "gitlab", "bitbucket", "jenkins", "circleci", "sentry", "datadog", "grafana", "prometheus", "linux",
    "macos", "windows", "tabs", "spaces", "snake_case", "camelcase", "kebab-case", "orms", "orm", "sql",
    "nosql", "monorepo", "microservices", "tdd", "bdd", "ci", "cd", "sqlalchemy", "alembic", "prisma",
    "drizzle", "knex", "sequelize", "typeorm", "pandas", "numpy", "polars", "pydantic", "attrs",
    "dataclasses", "f-strings", "asyncio", "trio", "httpx", "requests", "aiohttp", "zod", "joi", "vim",
    "emacs", "neovim", "vscode",
})


_LETTER_NAME = re.compile(r"(?<!^)\b(?!I\b|A\b)[A-Z]\b")  # "option B", "plan C"


def _names_something(text: str, *, mid_sentence: bool = False) -> bool:
    """Whether `text` names something specific; `mid_sentence`: its first word is no sentence
    opening, so a capital there marks a name too ("… going with Supabase")."""
    if mid_sentence:
        text = "x " + text
    if _SPECIFIC.search(text) or _LETTER_NAME.search(text) or "@" in text:
        return True
    return any(word.strip(".,;:!()'").lower() in _LOWERCASE_NAMES for word in text.split())


# ---- what is no statement, whatever its wording -----------------------------------------------

_QUESTION = re.compile(r"\?\s*$")
_ASKS = re.compile(
    rf"^{_FILLER}(?:(?:can|could|would|will|should|shall|do|does|did|is|are|was|were|have|has|may|"
    r"what|why|how|which|who|whom|whose|where|any idea|is there)\s|(?:please\s+)?(?:explain|tell me|show me|"
    r"help me|let me know|walk me through)\b)|\b(?:can|could|would|will) you\b", re.IGNORECASE)
# Maybe, might, I think, what if, if we went with: a thought, not a statement.
_HEDGED = re.compile(
    r"\b(?:maybe|perhaps|probably|possibly|might|not sure|unsure|i think|i guess|i suppose|i wonder|"
    r"i believe|wondering|was thinking|were thinking|thinking (?:about|of)|considering|no idea|seems like|"
    r"kind of|sort of|if i were|would be nice|in theory|hypothetically|what if|suppose|supposing|imagine|"
    r"let'?s say|say we|assuming|(?:if|when) (?:we|i|you) (?:were|went|used|had|did|chose|switched|picked)\b|"
    r"would (?:it|that|this) be|could be)\b", re.IGNORECASE)
# A cue denied or put in the past: "I never said we should …", "we haven't decided".
_NEGATED = re.compile(
    r"\b(?:never said|didn'?t (?:say|mean|decide|agree)|did not (?:say|mean|decide)|don'?t think|do not think|"
    r"haven'?t (?:decided|agreed|chosen|picked|settled)|have not (?:decided|agreed|chosen)|not decided|"
    r"undecided|not saying|nobody|no one|used to|not anymore)\b", re.IGNORECASE)
# Now and soon, not always: what holds today is no memory ("the tests are failing again").
_TRANSIENT = re.compile(
    r"\b(?:today|tonight|tomorrow|yesterday|this (?:morning|afternoon|evening|week)|right now|"
    r"at the moment|again|lunch|a break|in an hour|in a (?:minute|sec|second|bit)|note to self|"
    r"nice work|good job|great job|well done|lol|haha)\b", re.IGNORECASE)
# Someone else's words: "the docs say: …", "you said we decided …", "the customer said …".
_ATTRIBUTED = re.compile(
    r"\b(?:says?|said|wrote|writes|suggested|suggests|recommend(?:s|ed)|mention(?:s|ed)|printed|prints|"
    r"replied|answered|told (?:me|us))\b", re.IGNORECASE)


def _not_a_statement(sentence: str) -> bool:
    return bool(_QUESTION.search(sentence) or _ASKS.search(sentence) or _HEDGED.search(sentence)
                or _NEGATED.search(sentence) or _TRANSIENT.search(sentence)
                or _ATTRIBUTED.search(sentence))


# What a cue points at when it points back at the talk: "I like that", "let's go with your
# second suggestion", "always do that", "we're using the wrong endpoint".
_VAGUE_OBJECT = re.compile(
    r"^(?:it(?!\s+when\b)|that|this|these|those|them|so|how you|what you|where (?:this|you|it)|your|yours|"
    r"the way you|the idea|the name|the new|the same|the other|the (?:first|second|third|last) (?:one|option|"
    r"suggestion|approach|version)|whatever|one of|either|a lot|lots|too|up|the wrong|way too|more|less)\b",
    re.IGNORECASE)


def _clean(text: str) -> str:
    text = " ".join(text.split()).strip(" \t-–—*•,;:")
    return text[0].upper() + text[1:] if text else text


# ---- the first person made third: a memory injected later must not read as the agent's ------

_PRONOUN_VERB = re.compile(
    r"^(?P<adverbs>(?:\s+(?:really|also|usually|generally|strongly|always|never|typically|normally|"
    r"honestly|much|very|definitely|absolutely|just|mostly))*)\s*(?P<verb>'m|'d|'ve|am|would|have|"
    r"can'?t|cannot|don'?t|do not|\w[\w-]*)(?P<tail>\b.*)$", re.IGNORECASE | re.DOTALL)
_IRREGULAR = {"'m": "is", "am": "is", "'d": "would", "would": "would", "'ve": "has", "have": "has",
              "can't": "can't", "cant": "can't", "cannot": "cannot", "don't": "doesn't", "dont": "doesn't",
              "do not": "does not", "rather": "would rather", "was": "was", "go": "goes", "do": "does"}


def _third_singular(verb: str) -> str:
    low = verb.lower()
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    if re.search(r"(?:s|sh|ch|x|z|o)$", low):
        return verb + "es"
    if re.search(r"[^aeiou]y$", low):
        return verb[:-1] + "ies"
    return verb + "s"


def third_person(body: str) -> str:
    """ "I prefer X" → "The user prefers X": an injected memory must not read as the agent's."""
    if re.match(r"^my preference is\b", body, re.IGNORECASE):
        return "The user's preference is" + body[len("my preference is"):]
    match = re.match(r"^I(?P<rest>(?:'m|'d|'ve)?\b.*)$", body, re.DOTALL)
    if not match:
        return body
    verb = _PRONOUN_VERB.match(match.group("rest"))
    if not verb:
        return body
    tail = re.sub(r"\bmy\b", "their", verb.group("tail"))
    conjugated = _third_singular(verb.group("verb"))
    return f"The user{verb.group('adverbs')} {conjugated}{tail}"


# ---- the rules --------------------------------------------------------------------------------

_RULES: list[tuple[str, re.Pattern[str], str, float]] = []


def _rule(name: str, regex: str, memory_type: str, confidence: float = STATED) -> None:
    _RULES.append((name, re.compile(r"^\s*" + _FILLER + regex, re.IGNORECASE | re.DOTALL), memory_type,
                   confidence))


_SCOPE = r"(?:(?:for|in|on|with) (?:my |our |all |most |any )?[\w .+#/-]{2,40}?,?\s+)?"
_HABIT_VERB = (r"(?:use|uses|reach for|go with|pick|choose|start with|keep|put|name|write|format|structure|"
               r"test|deploy|squash|rebase|work with|work in|prefer|like|run|add|document|type|pin|avoid)")

# Order matters: the first rule that matches a clause wins.
_rule("remember", r"(?:please\s+)?(?:remember|note|keep in mind|(?:don'?t|never) forget(?=\s+(?:that|to)\b|\s*:))"
      r"(?:\s+(?:that|this|:))?[:,]?\s+(?P<body>.+)", "fact", STATED_EXPLICITLY)
_rule("context", r"(?:fyi|heads[- ]up|just so you know|for context|for the record|for reference|context|"
      r"background|note)\s*[,:—–-]?\s+(?P<body>.+)", "fact")
_rule("correction_instead", r"no[,.!]?\s+(?:(?:you should|please|just)\s+)?(?P<body>(?:use|call|run|do|try|put|keep|write|prefer)\s.+?\binstead\b.*)",
      "procedure")
_rule("correction_wrong", r"(?:no[,.!]?\s+)?(?:that'?s|that is|this is|you'?re|you are|it'?s)\s+(?:wrong|incorrect|not right|not correct|not how)[,.:;!]?\s*(?P<body>.+)",
      "fact")
_rule("correction_actually", r"(?:no[,.!]\s+)?actually[,]?\s+(?P<body>(?:the|it|we|this|that|you)\b.+)", "fact")
_rule("instead", r"(?P<body>(?:use|call|run|prefer)\s.+?\binstead of\b.+)", "procedure")
_rule("dont_like_it", rf"(?P<body>(?:please\s+)?(?:don'?t|do not|never)\s+{_RULE_VERB}\b[^,;]{{3,80}}[,;]\s*"
      r"i\s+(?:really\s+)?(?:don'?t like|do not like|hate|can'?t stand|dislike|find)\s+(?:it|them|that|those)\b.*)",
      "preference")
_rule("habit", rf"(?P<body>{_SCOPE}i\s+(?:always|usually|generally|typically|normally|never|tend to|mostly)\s+"
      rf"{_HABIT_VERB}\b.+)", "preference")
_rule("scoped_habit", r"(?P<body>when(?:ever)?\s+i(?:'m| am)?\s+(?:work|working|write|writing|build|building|"
      r"start|starting|code|coding|do|doing)\s+(?:on\s+|in\s+|with\s+)?(?P<scope>[^,]{3,60}?),?\s+i\s+"
      rf"(?:always|usually|generally|typically|tend to|like to|prefer to)\s+{_HABIT_VERB}\b.+)", "preference")
_rule("prefer", r"(?P<body>(?:i|we)(?:'d|\s+would)?\s+(?:really\s+|also\s+|usually\s+|strongly\s+|much\s+|"
      r"generally\s+|definitely\s+|still\s+)*(?:prefer|rather|like to|like using|like|love|always like|"
      r"don'?t like|do not like|dislike|hate|can'?t stand|cannot stand|enjoy|don'?t mind|care about|"
      r"want you to always|"
      r"want you to never)\s(?P<object>.+))", "preference")
_rule("fan", r"(?P<body>(?:(?:(?:i'?m|i am)\s+)?(?:not\s+)?(?:a\s+)?(?:big\s+|huge\s+)?fan of|"
      r"(?:i'?m|i am)\s+(?:(?:a bit|quite|very|a lot|much|far|way)\s+)?(?:more\s+|most\s+)?(?:partial to|"
      r"comfortable with|happier with|happiest with|productive with|at home with|used to|allergic to)|"
      r"my (?:preference|go-to|default) is|i find|i'?ve found)\s(?P<object>.+))", "preference")
_rule("want_built", r"(?P<body>i\s+want\s+(?:the|our|this)\s+[\w -]{2,30}?\s+(?:written|built|done|implemented|made)\s+"
      r"(?:in|with|on|using)\s+(?P<object>.+))", "decision")
_rule("want_type", r"(?P<body>i\s+(?:want|like)\s+(?!you\b|to\b|it\b|this\b|that\b|them\b|an?\b|the\b|some\b|more\b|"
      r"my\b|your\b)(?P<object>[\w`/-]+(?:\s+[\w`/-]+){0,4}?(?:,|\s+(?:on|in|for|with|everywhere|ideally|"
      r"always|under|over|by default)\b).*))", "preference")
_rule("want_use", r"(?P<body>i\s+(?:want|'d like|would like|need)\s+to\s+(?:use|build (?:it|this|the \w+) "
      r"(?:with|on|in))\s+(?P<object>.+))", "decision")
_rule("decided", rf"(?P<body>{_SCOPE}(?:we|i)(?:'ve|'re|'ll|\s+have|\s+are|\s+will)?\s+(?:decided|agreed|settled on|chose|"
      r"chosen|opted|picked|going with|go with|went with|standardi[sz]ed on|stick(?:ing)? with|switched|"
      r"moved|migrated|ditched|dropped|replaced|adopted|moving|migrating|switching|porting|rewriting)\b\s*"
      r"(?:that\s+|to\s+|on\s+)?(?P<object>.+))", "decision")
_rule("decision", r"(?:decision|decided)\s*:\s*(?P<body>.+)", "decision")
_rule("going_with", r"(?P<body>going with\s.+)", "decision")
_rule("we_will", rf"(?P<body>{_SCOPE}(?:going forward,?\s+|from now on,?\s+)?(?:we|i)(?:'ll|\s+will|"
      r"(?:'re|\s+are|'m|\s+am)\s+(?:not\s+)?going to)\s+(?:not\s+)?(?!need\b|have\b|see\b|talk\b|figure\b|look\b|check\b|"
      r"think\b|try\b|discuss\b|wait\b|know\b|get\b|find\b|revisit\b|deal\b|be\b|probably\b|maybe\b)[a-z]+"
      r"(?:\s+(?:with|to|on|for))?\s+(?P<object>.+))", "decision")
_rule("will_be", r"(?P<body>(?:the|our|all|every)\s+[\w .-]{2,40}?\s+will\s+(?:be|stay|remain|live|use|go|ship|run|"
      r"keep|move|target|support)\b\s*(?P<object>.+))", "decision")
_rule("standing_we", r"(?P<body>(?:going forward|from now on|moving forward|from here on)[,:]?\s+we\s+(?:use|"
      r"write|keep|store|go with|stick with|deploy|name|put)\s+(?P<object>.+))", "decision")
_rule("dropping", r"(?P<body>we(?:'re|\s+are)\s+(?:dropping|removing|deprecating|sunsetting|ending)\s+"
      r"(?:support for\s.+|.+?\bsupport\b.*))", "decision")
_rule("plan", r"(?P<body>(?:the|our)\s+plan\s+is\s+to\s+(?:use|go with|move to|switch to|adopt|migrate to|keep|"
      r"build|run|deploy)\s.+)", "decision")
_rule("lets_go_with", r"(?P<body>let'?s\s+(?:go with|use|stick with|standardi[sz]e on|keep|make|skip|drop|"
      r"move|switch|migrate|adopt|put|host|ship|store|name|call|target|support|pick|choose)\s+(?P<object>.+))",
      "decision")
_rule("always_never", rf"(?:you\s+(?:should|must)\s+)?(?P<body>(?:always|never|don'?t ever|do not ever)\s+"
      rf"(?:(?:also|just|first|please)\s+)?{_RULE_VERB}\b\s*(?P<object>.*))", "procedure")
_rule("standing", rf"(?P<body>(?:from now on|going forward|moving forward|in (?:the )?future|as a rule|by default|"
      rf"in this (?:repo|project|codebase))[,:]?\s+(?:please\s+|always\s+)?{_RULE_VERB}\b\s*(?P<object>.+))",
      "procedure")
_rule("when_then", r"(?P<body>(?:before|after|when(?:ever)?|every time|each time|once|if|to)\s+[^,;]{3,80}?,\s*"
      r"(?:then\s+|also\s+|always\s+|please\s+|just\s+|first\s+)*(?!(?:i|we|you|it|the|a|an|this|that|they|there|"
      r"he|she|can|could|would|will|is|are|was|were|do|does|did|should|may|might|must|my|our|your|its|their|"
      r"if|when|so|and|but|or|then|let|lets|let's|maybe|not|no|yes|ok|thanks|just|please)\b)[a-z]+\b\s*(?P<object>.+))",
      "procedure")
_rule("prefer_do", r"(?P<body>(?:please\s+)?(?:prefer|favou?r|default to|stick to|opt for|avoid|lean towards)\s+"
      r"(?P<object>.+))", "procedure")
_rule("imperative_standing", rf"(?P<body>(?:please\s+)?{_RULE_VERB}\b(?P<object>[^?]+?)\b(?:before (?:every|each|any|"
      r"an?|merging|committing|pushing|releasing|opening|deploying|tagging|shipping|you|we)\b|after (?:every|each|any|"
      r"merging|committing|pushing|changing|editing|adding|touching)\b|on every\b|for every\b|every (?:time|commit|"
      r"push|pr|release|merge|deploy)\b|whenever\b|by default\b|as a rule\b|,\s*(?:never|always)\b|"
      r"in (?:this|the|our) (?:repo|codebase|project)\b|everywhere\b|across the (?:codebase|repo|project)\b).*)",
      "procedure")
_rule("style_every", r"(?P<body>(?:please\s+)?(?:document|name|type|annotate|prefix|suffix|test|log|wrap|validate|"
      r"sanitize|escape|pin|sign|format|lint|comment|version|tag)\s+(?:every|each|all|any)\s+(?P<object>.+))",
      "procedure")
_rule("should_rule", r"(?P<body>(?!(?:the|this|that|these|those|it|its|i|you|we|they|there|here)\b)"
      r"(?:(?:all|every|each|any|new|our)\s+)?(?:[a-z][\w-]*\s+){0,3}"
      r"(?:[a-z][\w-]*s|pr|code|config|everything|anything)\s+(?:should|must|need to|needs to|have to|has to)\s+"
      r"(?:always\s+|never\s+|all\s+)?(?:be|follow|use|go|live|have|include|stay|start|end|match|pass|get|"
      r"come|run|target|work|cover|mention|reference|point)\b\s*(?P<object>.+))", "procedure")
_rule("convention", r"(?P<body>(?:our|the|my)\s+(?:convention|rule|policy|standard|practice|norm|workflow|"
      r"process|habit)(?:\s+here)?\s+is\s+(?:to|that)\s+(?P<object>.+))", "procedure")
_rule("make_sure", rf"(?P<body>(?:make sure|be sure|ensure)\s+(?:that\s+)?(?:you\s+|to\s+|we\s+)?"
      rf"(?:always\s+)?{_RULE_VERB}\b.+?\b(?:before|after|when(?:ever)?|every|each|any time)\b.+)", "procedure")
_rule("stack_we", r"(?P<body>we(?:'re|\s+are)\s+(?:currently\s+|now\s+|still\s+)?(?:using|on|running|"
      r"deploying (?:to|on|with)|built on|hosted on)\s+(?P<object>.+))", "fact")
_rule("we_use", r"(?P<body>(?:we|our team)\s+(?:use|deploy|host|ship|release|run|build|store|keep|follow|"
      r"rely on)\s+(?:(?:to|on|with|from|in|via)\s+)?(?P<object>.+))", "fact")
_rule("team_is", r"(?P<body>we(?:'re|\s+are)\s+an?\s+(?:[\w-]+\s+){0,3}(?:team|company|startup|shop|"
      r"agency|org|organisation|organization)\b.*)", "fact")
_rule("label_value", r"(?P<body>(?:tech\s+)?(?:stack|infra(?:structure)?|hosting|database|db|ci|cd|runtime|"
      r"language|framework|frontend|backend|deploys?|deployment|auth|queue|cache|monitoring|logging)\s*:\s*"
      r"(?P<object>.+))", "fact")
_rule("project_is", r"(?P<body>(?:(?:the|this|our)\s+[\w .-]{1,40}?|prod|production|staging|dev|ci)\s+(?:uses|"
      r"is written in|are written in|is built with|is built on|are built with|runs on|run on|runs in|runs with|"
      r"is deployed (?:to|on)|deploys to|is hosted (?:on|at)|lives in|live in|listens on|is at|"
      r"reads (?:its |their )?\w+ from|targets|is keyed on|is partitioned by|is owned by|are owned by|"
      r"is read-only|issues|expires? after|depends on|talks to|is an?|"
      r"(?:is|are) (?:only )?(?:reachable|accessible|available|exposed|private|public|behind|internal)|is (?=(?-i:[A-Z0-9`])))\s*(?P<object>.*))",
      "fact")

_rule("present_fact", r"(?P<body>(?:(?:the|our|all)\s+)?(?!(?:it|this|that|these|those|i|you|we|they|he|she|there|"
      r"here|which|what|who|everything|nothing|something|someone|nobody|for|in|on|at|with|if|when|as|to|from|"
      r"by|after|before|then|let|lets|let's|please|thanks|why|how|no|not|only|just|also|" + _RULE_VERB[3:-1] +
      r"|replace|swap|substitute|fix|refactor|convert|extract|inline|simplify|clean|tidy|quit|fetch|show|"
      r"find|look|see|get|give|tell|send|ping|mark|bring|turn|hook|wire|plug|hide|render|print|parse|"
      r"handle|process|compute|rewrite|revert|undo|redo|ship|speed|slow|cut|trim|strip|bump|lower|raise)\b)"
      r"(?:[\w.-]+\s+){0,3}?[\w.-]+\s+"
      r"(?!is\b|was\b|does\b|needs\b|wants\b|asks\b|expects\b|says\b|seems\b|looks\b|keeps\b|gets\b|"
      r"fails\b|crashes\b|breaks\b|hangs\b|throws\b|returns\b|shows\b|takes\b|thinks\b|feels\b)"
      r"(?:[a-z]+s|go|use|run|live|talk|come|depend|have|(?:is|are)\s+(?:\w+ed|built|written|run|kept|held|"
      r"driven|done|made|set|sent|hidden|given|taken|rebuilt|shown))\s+(?P<object>.+))", "fact", UNCUED)

# Words of trouble or change: a sentence of the present tense that holds one reports a bug or a
# moment ("the tests fail on CI", "the build is still red"), not how the project is.
_BUG_REPORT = re.compile(
    r"\b(?:bug|bugs|broken|fail\w*|crash\w*|wrong|problems?|slow|flaky|complain\w*|off|"
    r"missing|stuck|hang\w*|timeouts?|times out|leak\w*|down|40\d|50\d|exceptions?|traceback|undefined|null|"
    r"empty|blank|weird|strange|odd|instead of|doesn'?t|don'?t|isn'?t|aren'?t|won'?t|can'?t|cannot|never|"
    r"not (?:working|loading|running|responding|found|set|defined|there)|"
    r"no longer|anymore|still|yet|now|again|sometimes|randomly)\b", re.IGNORECASE)

_PREFERENCE_WORDS = re.compile(r"\b(?:prefer|rather|like|dislike|hate)\b", re.IGNORECASE)
_DECISION_WORDS = re.compile(r"\b(?:decided|agreed|we(?:'ll| will) use|going with)\b", re.IGNORECASE)
_DIRECTIVE_WORDS = re.compile(r"^\s*(?:always|never)\b", re.IGNORECASE)
_TO_VERB = re.compile(r"^to\s+(?=[a-z])", re.IGNORECASE)  # "remember to run …": a step
_INSTEAD_OF = re.compile(r"^(?P<right>.+?)\s+instead of\s+(?P<wrong>.+?)[.!]*$", re.IGNORECASE)
# "pytest, not unittest" and "use pnpm, not npm": the choice and what it replaces.
_X_NOT_Y = re.compile(r"^\s*" + _FILLER + r"(?P<right>[^,;:?]{2,60}?),\s*(?:and\s+)?not\s+(?P<wrong>[^,;:?]{2,60}?)"
                      r"(?P<scope>,\s*(?:for|in|on|with|when)\s[^,;:?]{2,60})?[.!]*$", re.IGNORECASE)
_NOT_A_CHOICE = re.compile(r"^(?:it|it'?s|that|this|those|these|they|i|i'?m|you|we|he|she|there|here|the bug|"
                           r"no|yes|ok|okay|not|now|but|and|or|so|just|only|our|my|your)\b|"
                           r"\b(?:is|are|was|were|isn'?t|aren'?t)\b|'s\b|'re\b", re.IGNORECASE)
_IMPERATIVE_OPENING = re.compile(rf"^(?:please\s+|just\s+|always\s+)?{_IMPERATIVE}\s", re.IGNORECASE)


_X_OVER_Y = re.compile(r"^\s*" + _FILLER + r"(?P<right>[^,;:?]{2,40}?)\s+over\s+(?P<wrong>[^,;:?]{2,40}?)"
                       r"(?:,?\s*please)?[.!]*$", re.IGNORECASE)


def _x_not_y(clause: str) -> Candidate | None:
    match = _X_NOT_Y.match(clause) or _X_OVER_Y.match(clause)
    if not match:
        return None
    right, wrong = match.group("right").strip(), match.group("wrong").strip()
    if _NOT_A_CHOICE.match(right) or _NOT_A_CHOICE.match(wrong) or _VAGUE_OBJECT.match(wrong):
        return None
    if match.re is _X_OVER_Y and re.search(r"\b(?:it|this|that|them|everything|to|there)\b", f"{right} {wrong}",
                                           re.IGNORECASE):
        return None  # "move it over to the left": no choice named
    if _IMPERATIVE_OPENING.match(right) and match.re is _X_NOT_Y:
        return learn_pair(wrong, right + (match.group("scope") or ""), "x_not_y")
    if len(right.split()) > 3 or len(wrong.split()) > 4:
        return None
    if not re.match(r"^\S+[A-Z0-9]", right):  # "Tabs" opens the sentence; "PostgreSQL" is a name
        right = right[0].lower() + right[1:]
    scope = match.groupdict().get("scope") or ""
    body = (f"The user prefers {right}, not {wrong}{scope}." if match.re is _X_NOT_Y
            else f"The user prefers {right} over {wrong}.")
    return Candidate("preference", body, summary=f"{_clean(right)} over {wrong}", confidence=STATED,
                     rule="x_not_y")


# Rules whose object must name something specific ("we're using Postgres 15", not "we're using
# the wrong endpoint"); and rules whose object must not point back at the talk.
_NEEDS_A_NAME = frozenset({"want_use", "we_will", "stack_we", "we_use", "project_is", "context", "decided",
                           "lets_go_with", "going_with", "plan", "want_built", "will_be", "standing_we",
                           "label_value", "present_fact"})
_NEEDS_AN_OBJECT = frozenset({"prefer", "fan", "want_use", "we_will", "stack_we", "we_use", "lets_go_with",
                              "always_never", "standing", "decided", "project_is", "want_type", "want_built",
                              "will_be", "standing_we", "prefer_do", "style_every", "should_rule", "convention",
                              "label_value", "present_fact", "imperative_standing"})
_CUE = re.compile(
    r"^(?:i|we|you|my|our|the|this|prod|production|staging|dev|ci)\b(?:'\w+)?(?:\s+(?:really|also|usually|"
    r"strongly|much|generally|definitely|still|currently|now|team|\w+ing|should|must|would|'d|have|are|will|"
    r"is|'re|'ll|'ve))*\s+\w+(?:\s+(?:to|on|with|for|of|in|from|using))?\s+", re.IGNORECASE)
_ASKED_OF_THE_AGENT = re.compile(
    r"^(?:i|we)(?:\s+|(?='))(?:want|'d like|would like|need)\s+(?:you\s+to\s+(?!always|never)|to\s+(?:know|understand|see|"
    r"check|find out|learn|ask|make sure|try|figure|look))", re.IGNORECASE)
# A whole sentence that only speaks of the code in front of us: "use a set here".
_HERE_AND_NOW = re.compile(r"\b(?:here|in this (?:file|function|pr|diff|commit|change|method|class|test))\b",
                           re.IGNORECASE)


def _object_of(name: str, match: re.Match, body: str) -> str:
    if "object" in match.groupdict() and match.group("object") is not None:
        return match.group("object")
    cue = _CUE.match(body)
    return body[cue.end():] if cue else body


def _summary(content: str) -> str | None:
    """A short form of a long memory: its first clause, at most 80 characters."""
    if len(content) <= 80:
        return None
    first = re.split(r"(?<=\w)[,;:—–]\s|\s(?:because|so that|since|which)\s", content, maxsplit=1)[0]
    if len(first) > 80:
        first = first[:80].rsplit(" ", 1)[0] + "…"
    return first.rstrip(" .")


def _classify_clause(clause: str, uncued: bool = False) -> Candidate | None:
    """The memory one clause states explicitly by its rules, or None (`uncued`: also a plain
    sentence of how things are, with no cue word)."""
    if _ASKED_OF_THE_AGENT.match(re.sub(r"^\s*" + _FILLER, "", clause, flags=re.IGNORECASE)):
        return None
    for name, regex, memory_type, confidence in _RULES:
        if name == "present_fact":
            pair = _x_not_y(clause)  # "tabs, not spaces" is a choice, whatever it looks like
            if pair is not None or not uncued:
                return pair
        match = regex.match(clause)
        if not match:
            continue
        body = _clean(match.group("body"))
        if len(body) < MIN_CHARS:
            return None
        if name in ("remember", "context"):
            inner = _classify_clause(body, uncued)
            if inner is not None and inner.type != "fact":  # "remember: we decided …" is a decision
                inner.confidence = max(inner.confidence, confidence)
                return inner
            if name == "context" and (not _names_something(body) or re.match(r"^i\b|^i'", body, re.I)):
                return None
            # "remember that I prefer …" is a preference; "remember: we decided …" a decision.
            if _PREFERENCE_WORDS.search(body):
                memory_type = "preference"
            elif _DECISION_WORDS.search(body):
                memory_type = "decision"
            elif _DIRECTIVE_WORDS.search(body):
                memory_type = "procedure"
            elif _TO_VERB.match(body):
                memory_type, body = "procedure", _clean(_TO_VERB.sub("", body))
        what = _object_of(name, match, body).strip()
        if name in _NEEDS_AN_OBJECT and (not what or _VAGUE_OBJECT.match(what)):
            return None
        if name in ("present_fact", "project_is", "will_be", "should_rule") and _BUG_REPORT.search(body):
            return None  # "the worker crashes on empty input": a bug report, not how things are
        if name in _NEEDS_A_NAME and not (_names_something(body) if name in ("project_is", "context", "team_is")
                                          else _names_something(what, mid_sentence=True)):
            return None
        if name == "when_then" and re.match(r"^if\b", body, re.IGNORECASE) and not _names_something(what):
            return None  # "if it fails again, tell me": a one-off, not a rule
        if name in ("present_fact", "project_is", "will_be", "should_rule") and categorize(body):
            return None  # "the report runs one SELECT per user": a class of mistake, told
        if name in ("want_use", "we_will", "lets_go_with", "always_never", "standing") \
                and _HERE_AND_NOW.search(what):
            return None  # "I want to use a set here": about this change, not the project
        if name in ("correction_instead", "instead"):
            pair = _INSTEAD_OF.match(body)
            if pair:
                return learn_pair(pair.group("wrong"), pair.group("right"), name, confidence)
        if name.startswith("correction"):
            if len(body.split()) < 3 or _ABOUT_THE_TALK.match(body):
                return None  # "that's wrong, try again" says nothing to keep
            body = f"Correction from the user: {body}"
        if name == "scoped_habit":
            body = _scoped_habit(match)
        body = _third_person_after_scope(body)
        return Candidate(memory_type, body, summary=_summary(body), confidence=confidence, rule=name)
    return None


def _third_person_after_scope(body: str) -> str:
    """third_person, also past a leading scope: "For side projects I tend to use SQLite" →
    "For side projects, the user tends to use SQLite"."""
    if re.match(r"^I\b|^my preference", body, re.IGNORECASE):
        return third_person(body)
    scoped = re.match(r"^(?P<scope>(?:for|in|on|with)\s[^,]{2,40}?),?\s+(?P<rest>I\b.*)$", body, re.DOTALL)
    if not scoped:
        return body
    rest = third_person(scoped.group("rest"))
    return f"{scoped.group('scope')}, the user{rest[len('The user'):]}" if rest.startswith("The user") else body


def _scoped_habit(match: re.Match) -> str:
    """ "When I work on Python projects I always use uv" → "When working on Python projects, the
    user always uses uv" (the scope kept: it says when the preference holds)."""
    body = _clean(match.group("body"))
    scope = match.group("scope").strip()
    habit = re.search(r"\bi\s+(?P<rest>(?:always|usually|generally|typically|tend to|like to|prefer to)\s.+)$",
                      body, re.IGNORECASE)
    rest = third_person("I " + habit.group("rest"))[len("The user "):]
    return f"When working on {scope}, the user {rest}"


# Where one sentence holds several statements: "Fix the test, and btw I prefer f-strings".
_CLAUSE_BREAK = re.compile(
    r"\s*(?:;|\s[—–-]\s|:\s|,\s*(?:and|but|so|also|plus|btw|by the way|oh and)\s|,\s*(?=(?:i|we|always|never|"
    r"let'?s)\s))\s*", re.IGNORECASE)


def statement_sentences(text: str) -> list[str]:
    """The sentences of a user message a rule may look at (code blocks, quotes, pasted logs and
    list marks left out)."""
    text = _CODE_FENCE.sub("\n", text or "")
    out = []
    in_trace = False
    for line in text.splitlines():
        if not line.strip():
            in_trace = False
            continue
        if "Traceback (most recent call last)" in line:
            in_trace = True
        if in_trace or _INLINE_NOISE.match(line) or _LOG_LINE.match(line):
            continue
        line = _QUOTED.sub(" … ", _LIST_MARK.sub("", line))
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


def classify_statement(sentence: str, *, uncued: bool = False) -> Candidate | None:
    """The memory a single user sentence states explicitly, or None: the sentence as a whole,
    else the first of its clauses that does ("Fix the test, and btw I prefer f-strings").

    `uncued`: also read a plain present-tense sentence of how things are ("the nightly job
    exports orders to S3") as a fact. Chat (`statements`) does; a correction, where such a
    sentence usually tells of the mistake, and the dream's dated notes do not.
    """
    if _not_a_statement(sentence):
        return None  # "should we always use X?" asks, "maybe we use X" muses: neither states
    found = _classify_clause(sentence, uncued)
    if found is not None:
        return found
    clauses = _CLAUSE_BREAK.split(sentence)
    for clause in clauses[1:]:
        if len(clause) >= MIN_CHARS:
            found = _classify_clause(clause, uncued)
            if found is not None:
                return found
    return None


# Lines that announce a list of the user's ways, rules or facts: "A few things about how I work:".
_LEAD_INS: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (memory_type, re.compile(r"^\s*" + _FILLER + "(?:" + regex + r")[^:]{0,12}:\s*(?P<rest>.*)$", re.IGNORECASE), prefix)
    for memory_type, regex, prefix in (
        ("preference", r"(?:(?:a few|some|a couple of|few)\s+)?(?:things|notes|words)?\s*(?:about|on)?\s*"
                       r"(?:here'?s\s+|this is\s+)?how i (?:like to |prefer to |usually )?(?:work|code|do things|"
                       r"write code)|my (?:preferences|conventions|style|workflow|habits|ground rules)|"
                       r"things i (?:like|prefer|care about)|(?:my )?preferences", "How the user likes to work"),
        ("procedure", r"(?:(?:a few|some)\s+)?(?:ground |house |the )?(?:rules|conventions|guidelines)"
                      r"(?:\s+(?:for|in|of)\s+(?:this|the|our)\s+(?:repo|project|codebase|team|code))?", None),
        ("fact", r"(?:(?:a bit of|some|a little)\s+)?(?:context|background|facts?|info(?:rmation)?|notes?)\s+"
                 r"(?:about|on)\s+(?:the|this|our)\s+(?:project|repo|codebase|app|setup|stack|system|service)|"
                 r"(?:our|the) (?:stack|setup)", "About the project"),
    ))
_INLINE_ITEMS = re.compile(r"\s*(?:,\s*(?:and\s+)?|;\s*|\s+and\s+(?=[^,]*$))\s*", re.IGNORECASE)


def _lead_in(line: str) -> tuple[str, str, str] | None:
    """(memory type, prefix, the rest of the line) when a line announces a list."""
    for memory_type, regex, prefix in _LEAD_INS:
        match = regex.match(line)
        if match:
            head = _clean(line[:match.start("rest")]).rstrip(":")
            return memory_type, prefix or head, match.group("rest")
    return None


def _list_item(item: str, memory_type: str, prefix: str) -> Candidate | None:
    """One item of a list the user announced: what it states by itself, else the list's kind."""
    item = _clean(_LIST_MARK.sub("", item)).rstrip(".")
    if len(item.split()) < 2 or len(item) < 6 or _not_a_statement(item):
        return None
    found = classify_statement(item, uncued=True)
    if found is not None:
        return found
    if memory_type == "preference" and (_IMPERATIVE_OPENING.match(item + " ") or _DIRECTIVE_WORDS.match(item)):
        memory_type = "procedure"
    if memory_type == "procedure" and not (_IMPERATIVE_OPENING.match(item + " ") or _DIRECTIVE_WORDS.match(item)
                                            or re.match(r"^(?:no|don'?t|do not)\s", item, re.IGNORECASE)):
        return None  # a rule is said as an instruction
    lowered = item[0].lower() + item[1:] if not re.match(r"^[A-Z]{2}|^\w+[A-Z]", item) else item
    return Candidate(memory_type, f"{prefix}: {lowered}.", summary=_clean(item), confidence=STATED,
                     rule=f"list_{memory_type}")


def statements(text: str, message_id: str | None = None) -> list[Candidate]:
    """Every explicit statement in one user message's text: its sentences and clauses, and the
    items of a list it announces ("a few things about how I work: …")."""
    found: list[Candidate] = []
    body = _CODE_FENCE.sub("\n", (text or "")[:STATEMENT_CHARS])
    listing: tuple[str, str] | None = None
    pasted = False  # the lines after "here is what you suggested:" are not the user's words
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            listing, pasted = None, False
            continue
        if pasted:
            continue
        if listing is not None and _LIST_MARK.match(raw):
            candidate = _list_item(line, *listing)
            if candidate is not None:
                found.append(candidate)
            continue
        listing = None
        lead = _lead_in(line) if len(line) <= MAX_CHARS else None
        if lead is not None:
            memory_type, prefix, rest = lead
            listing = (memory_type, prefix)
            for item in (_INLINE_ITEMS.split(rest.strip().rstrip(".")) if rest.strip() else []):
                candidate = _list_item(item, memory_type, prefix)
                if candidate is not None:
                    found.append(candidate)
            continue
        if line.endswith(":") and _ATTRIBUTED.search(line):
            pasted = True
            continue
        for sentence in statement_sentences(raw):
            candidate = classify_statement(sentence, uncued=True)
            if candidate is not None:
                found.append(candidate)
    for candidate in found:
        candidate.message_id = message_id
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


# Statement rules that read a sentence's plain wording, with no cue of their own: in a
# correction, a wrong → right pair read from the same sentence says more.
_READINGS = frozenset({"project_is", "stack_we", "we_use", "decided", "we_will", "context", "lets_go_with",
                       "going_with", "will_be", "standing_we", "label_value", "team_is", "x_not_y"})


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
        if candidate is not None and candidate.rule == "present_fact":
            candidate = None  # "the report runs a SELECT per user": in a correction, a mistake told
        broad = _correction_statement(sentence)
        if candidate is None or (broad is not None and broad.kind == "learn" and candidate.rule in _READINGS):
            # "Stop using moment.js, we switched to date-fns": in a correction the pair is the point
            candidate = broad
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
