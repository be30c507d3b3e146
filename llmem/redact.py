"""Replace secrets in text with `[REDACTED:<kind>]` markers before it goes anywhere else."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache, lru_cache

MARKER = "[REDACTED:{kind}]"

# A value that is already a marker must not be redacted (and counted) a second time.
_NOT_A_MARKER = r"(?!\[REDACTED)"

# Names whose assigned value is a secret (`api_key=…`, `"token": "…"`, `GITHUB_TOKEN: …`).
# The name may end a longer one after `_`, `.` or `-` (GITHUB_TOKEN, db.password); a trailing
# \b keeps `tokens`, `token_count` and `max_tokens` out.
_SECRET_NAMES = (
    r"api[_-]?key|apikey|access[_-]?key(?:[_-]?id)?|secret[_-]?key|secret[_-]?access[_-]?key|"
    r"client[_-]?secret|auth[_-]?token|access[_-]?token|refresh[_-]?token|id[_-]?token|"
    r"session[_-]?token|private[_-]?key(?:[_-]?id)?|secret|token|credentials?"
)
_PASSWORD_NAMES = r"password|passwd|passphrase|pwd"
_ASSIGN = r"""["']?\s*(?:=|:|=>)\s*"""
# Quoted values: anything up to the closing quote. Unquoted values: one run of non-space,
# and (see _looks_secret) only if it does not look like code such as `os.environ[...]`.
_QUOTED_VALUE = (
    r"""(?P<q>["'])(?P<secret>""" + _NOT_A_MARKER + r"""(?:(?!(?P=q))[^\n]){4,}?)(?P=q)"""
)
_BARE_VALUE = r"(?P<bare>" + _NOT_A_MARKER + r"""[^\s"',;)\]}>]{4,})"""


@dataclass(frozen=True)
class SecretPattern:
    """One kind of secret: a regex whose `secret`/`bare` group (or whole match) is replaced."""

    kind: str
    regex: re.Pattern[str]
    # Lower-case literals, one of which must occur in the text for the regex to be worth running.
    hints: tuple[str, ...] = ()


def _pattern(kind: str, regex: str, flags: int = 0, hints: tuple[str, ...] = ()) -> SecretPattern:
    return SecretPattern(kind, re.compile(regex, flags), hints)


def _starts_word(prefix_length: int) -> str:
    """Lookbehind placed after a literal prefix: the prefix does not continue a longer word.

    Python's regex engine scans fast for a pattern that begins with a literal, but not for
    one that begins with \\b; so the boundary is checked after the prefix instead of before.
    """
    return rf"(?<![A-Za-z0-9_].{{{prefix_length}}})"


_ASSIGNED_VALUE = _ASSIGN + r"(?:" + _QUOTED_VALUE + r"|" + _BARE_VALUE + r")"

# Order matters: spans that may contain other secrets first, specific token formats before the
# generic `name = value` rules, so each secret is counted once under its most precise kind.
@cache
def builtin_patterns() -> tuple[SecretPattern, ...]:
    """The built-in secret patterns, compiled on first use: opening the store imports this
    module, and a hook that only reads should not pay ~5 ms compiling them."""
    return (
        _pattern("private", r"<private>.*?(?:</private>|\Z)", re.DOTALL | re.IGNORECASE),
        _pattern(
            "private_key",
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?"
            r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
            re.DOTALL,
        ),
        _pattern("anthropic_key", r"sk-ant-" + _starts_word(7) + r"[A-Za-z0-9]{2,}-[A-Za-z0-9_-]{20,}"),
        _pattern(
            "openai_key",
            r"sk-" + _starts_word(3)
            + r"(?:proj-|svcacct-|admin-|None-)?(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{20,}",
        ),
        _pattern("github_token", r"gh[pousr]_" + _starts_word(4) + r"[A-Za-z0-9]{36,255}\b"),
        _pattern("github_token", r"github_pat_" + _starts_word(11) + r"[A-Za-z0-9_]{22,255}\b"),
        _pattern("gitlab_token", r"glpat-" + _starts_word(6) + r"[A-Za-z0-9_-]{20,}"),
        _pattern(
            "aws_access_key",
            r"A(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])" + _starts_word(4) + r"[A-Z0-9]{16}\b",
        ),
        _pattern(
            "aws_secret_key",
            r"(?i:aws)[A-Za-z0-9_.-]{0,30}?(?i:secret)[A-Za-z0-9_.-]{0,30}?"
            r"""["']?\s*(?:=|:|=>)\s*["']?(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])""",
            hints=("aws",),
        ),
        _pattern("gcp_api_key", r"AIza" + _starts_word(4) + r"[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"),
        _pattern("gcp_oauth_token", r"ya29\." + _starts_word(5) + r"[0-9A-Za-z_-]{20,}"),
        _pattern("gcp_client_secret", r"GOCSPX-" + _starts_word(7) + r"[0-9A-Za-z_-]{20,}"),
        _pattern(
            "azure_key",
            r"(?i:AccountKey|SharedAccessKey|SharedSecret)\s*=\s*(?P<secret>[A-Za-z0-9+/]{20,}={0,2})",
            hints=("accountkey", "sharedaccesskey", "sharedsecret"),
        ),
        _pattern(
            "azure_sas_signature",
            r"sig=(?<![A-Za-z0-9]sig=)(?P<secret>[A-Za-z0-9%+/]{20,}(?:%3D|=)*)",
        ),
        _pattern(
            "azure_client_secret",
            r"(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])",
            hints=("q~",),
        ),
        _pattern("slack_token", r"xox[abposr]-" + _starts_word(5) + r"[A-Za-z0-9-]{10,}"),
        _pattern(
            "slack_webhook",
            r"https://hooks\.slack\.com/(?:services|workflows)/(?P<secret>[A-Za-z0-9/_-]{20,})",
        ),
        _pattern(
            "stripe_key",
            r"(?<![A-Za-z0-9_])[sr]k_(?:live|test)_[0-9A-Za-z]{16,}\b",
            hints=("k_live_", "k_test_"),
        ),
        _pattern("stripe_webhook_secret", r"whsec_" + _starts_word(6) + r"[0-9A-Za-z]{24,}\b"),
        _pattern("npm_token", r"npm_" + _starts_word(4) + r"[A-Za-z0-9]{36}\b"),
        _pattern("huggingface_token", r"hf_" + _starts_word(3) + r"[A-Za-z0-9]{30,}\b"),
        _pattern("sendgrid_key", r"SG\." + _starts_word(3) + r"[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
        _pattern(
            "jwt",
            r"eyJ" + _starts_word(3) + r"[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        ),
        # scheme://user:password@host (the scheme itself does not matter).
        _pattern(
            "url_credentials",
            r"://[^\s:/?#@'\"]+:(?P<secret>" + _NOT_A_MARKER + r"[^\s/?#@'\"]+)@",
        ),
        _pattern(
            "bearer_token",
            r"\b(?i:bearer)\s+(?P<secret>" + _NOT_A_MARKER + r"[A-Za-z0-9._~+/-]{16,}=*)",
            hints=("bearer",),
        ),
        _pattern(
            "basic_auth",
            r"(?i:authorization)[\"']?\s*[:=]\s*[\"']?(?i:basic)\s+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})",
            hints=("authorization",),
        ),
        _pattern(
            "password",
            # No boundary before `password`: PGPASSWORD, DBPASSWORD are passwords too.
            r"(?:(?i:password|passwd|passphrase)|(?<![A-Za-z0-9])(?i:pwd))\b" + _ASSIGNED_VALUE,
            hints=("pass", "pwd"),
        ),
        _pattern(
            "generic_secret",
            r"(?<![A-Za-z0-9])(?i:" + _SECRET_NAMES + r")\b" + _ASSIGNED_VALUE,
            hints=("key", "token", "secret", "credential"),
        ),
        _pattern(
            "password",
            # Command-line flags: `--password hunter2` (`-p` is too ambiguous to include).
            r"--(?i:" + _PASSWORD_NAMES + r"|token|api-key|secret)\s+(?P<bare>"
            + _NOT_A_MARKER + r"[^\s\"'-][^\s\"']{3,})",
        ),
    )  # fmt: skip

_CODE_LIKE = re.compile(r"[A-Za-z_]+(?:\.[A-Za-z_]+)*")
_PATH_LIKE = re.compile(r"(?:~|\.{1,2})?/[\w.-]+(?:/[\w.-]*)*")
_PLACEHOLDER_VALUES = frozenset({"none", "null", "nil", "true", "false", "undefined", "redacted"})


def _looks_secret(value: str) -> bool:
    """Whether an unquoted assigned value is data rather than code or a placeholder."""
    if value.lower() in _PLACEHOLDER_VALUES or value.startswith(("$", "%", "<", "{", "*")):
        return False
    # `password = user_password`, `token: config.token`, `secret=get_secret()`,
    # `token: Optional[str]`: code, not data.
    if _CODE_LIKE.fullmatch(value) or "(" in value or "[" in value:
        return False
    # `credentials: ~/.aws/credentials`: a path is not the secret itself.
    return not _PATH_LIKE.fullmatch(value)


def _looks_secret_quoted(value: str) -> bool:
    stripped = value.strip()
    if stripped.lower() in _PLACEHOLDER_VALUES or stripped.startswith(("$", "<", "{", "%(")):
        return False
    # "xxxx", "****", "...." are placeholders in docs and examples.
    return len(set(stripped)) > 2


@dataclass(frozen=True)
class RedactionResult:
    """Redacted text, how many secrets were replaced, and how many of each kind."""

    text: str
    count: int
    by_kind: dict[str, int] = field(default_factory=dict)


@lru_cache(maxsize=64)
def compile_patterns(patterns: tuple[str, ...]) -> tuple[SecretPattern, ...]:
    """Compile config `redaction` patterns once; a bad one raises ValueError naming it."""
    compiled = []
    for number, source in enumerate(patterns, start=1):
        try:
            compiled.append(SecretPattern("custom", re.compile(source)))
        except re.error as error:
            raise ValueError(f"redaction pattern #{number} is not a valid regex: {error}") from None
    return tuple(compiled)


def _replace_all(pattern: SecretPattern, text: str, tally: Counter[str]) -> str:
    marker = MARKER.format(kind=pattern.kind)

    def substitute(match: re.Match[str]) -> str:
        groups = match.re.groupindex
        if "bare" in groups and match.group("bare") is not None:
            if not _looks_secret(match.group("bare")):
                return match.group(0)
            span = match.span("bare")
        elif "secret" in groups and match.group("secret") is not None:
            if "q" in groups and not _looks_secret_quoted(match.group("secret")):
                return match.group(0)
            span = match.span("secret")
        else:
            span = match.span()
        if span[0] == span[1]:
            return match.group(0)
        tally[pattern.kind] += 1
        start = match.start()
        whole = match.group(0)
        return whole[: span[0] - start] + marker + whole[span[1] - start :]

    return pattern.regex.sub(substitute, text)


def redact(text: str, extra_patterns: Iterable[str | re.Pattern[str]] = ()) -> RedactionResult:
    """Replace every secret in `text`; the result counts them and never holds them."""
    if not text:
        return RedactionResult(text or "", 0, {})
    tally: Counter[str] = Counter()
    lowered = text.lower()
    for pattern in builtin_patterns():
        if pattern.hints and not any(hint in lowered for hint in pattern.hints):
            continue
        text = _replace_all(pattern, text, tally)
    for pattern in _custom_patterns(extra_patterns):
        text = _replace_all(pattern, text, tally)
    return RedactionResult(text, sum(tally.values()), dict(tally))


def _custom_patterns(
    extra_patterns: Iterable[str | re.Pattern[str]],
) -> tuple[SecretPattern, ...]:
    extra = tuple(extra_patterns)
    if not extra:
        return ()
    if all(isinstance(item, str) for item in extra):
        return compile_patterns(extra)
    return tuple(
        SecretPattern("custom", item if isinstance(item, re.Pattern) else re.compile(item))
        for item in extra
    )


_SEPARATOR = "\n\u241e\u241e\n"  # cannot occur in a secret
_SECRET_KEY_HINTS = ("pass", "pwd", "key", "token", "secret", "credential", "authorization")


@dataclass(frozen=True)
class Redactor:
    """Redaction as a config's `redaction` section sets it, for every text that leaves llmem
    (embedder, LLM) or is stored; applying it twice changes nothing (markers are skipped)."""

    enabled: bool = True
    patterns: tuple[str, ...] = ()

    @classmethod
    def from_section(cls, section: dict | None) -> Redactor:
        """The redactor of a `redaction:` config section (None: built-in patterns, enabled)."""
        if section is None:
            return cls()
        return cls(bool(section.get("enabled", True)), tuple(section.get("patterns") or ()))

    def text(self, value: str) -> str:
        if not self.enabled or not value or not isinstance(value, str):
            return value
        return redact(value, self.patterns).text

    def tree(self, value):
        """JSON-like data with every string redacted, and every value whose key names a secret
        (`{"password": "hunter2"}` is `password: hunter2` written as data)."""
        if not self.enabled:
            return value
        strings: list[str] = []
        _gather(value, strings)
        redacted = iter(self._batch(strings))
        return self._rebuild(value, redacted)

    def _batch(self, texts: list[str]) -> list[str]:
        # One pass over the joined texts instead of one per text: metadata holds many short
        # strings, and each pass runs every pattern. A match that swallows a separator (an
        # unclosed <private> block) changes the count; then each text goes on its own.
        if not texts:
            return []
        if not any(_SEPARATOR.strip() in text for text in texts):
            pieces = self.text(_SEPARATOR.join(texts)).split(_SEPARATOR)
            if len(pieces) == len(texts):
                return pieces
        return [self.text(text) for text in texts]

    def _rebuild(self, value, redacted):
        if isinstance(value, str):
            return next(redacted)
        if isinstance(value, list | tuple):
            return [self._rebuild(item, redacted) for item in value]
        if not isinstance(value, dict):
            return value
        out = {}
        for key, item in value.items():
            key = next(redacted) if isinstance(key, str) else key
            item = self._rebuild(item, redacted)
            out[key] = item if isinstance(item, dict | list) else self._pair_value(key, item)
        return out

    def _pair_value(self, key, item):
        # Only a key that names a secret turns its value into one (the built-in rules' hints).
        if not isinstance(key, str) or not any(hint in key.lower() for hint in _SECRET_KEY_HINTS):
            return item
        try:
            pair = json.dumps({key: item}, ensure_ascii=False)
        except (TypeError, ValueError):
            return item
        redacted = self.text(pair)
        if redacted == pair:
            return item
        try:
            parsed = json.loads(redacted)
        except ValueError:  # an unquoted value (a number) replaced by a marker
            return MARKER.format(kind="secret")
        if isinstance(parsed, dict) and len(parsed) == 1:
            return next(iter(parsed.values()))
        return MARKER.format(kind="secret")


def _gather(value, strings: list[str]) -> None:
    """Every string of JSON-like data (keys too), in the order Redactor._rebuild visits them."""
    if isinstance(value, str):
        strings.append(value)
    elif isinstance(value, list | tuple):
        for item in value:
            _gather(item, strings)
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                strings.append(key)
            _gather(item, strings)
