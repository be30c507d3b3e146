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
    r"session[_-]?token|private[_-]?key(?:[_-]?id)?|secret[_-]?key[_-]?base|encryption[_-]?key|"
    r"signing[_-]?key|master[_-]?key|hmac[_-]?key|client[_-]?key[_-]?data|secret|token|credentials?"
)
_PASSWORD_NAMES = r"password|passwd|passphrase|pwd"
# Horizontal space only around the sign: in `token:\n  access_token: …` the child key is not
# the parent's value (the child line is matched on its own).
_ASSIGN = r"""["']?[ \t]*(?:=|:|=>)[ \t]*"""
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
    regex: re.Pattern[str]  # (or a _LazyRegex, which compiles on first use)
    # Lower-case literals, one of which must occur in the text for the regex to be worth running.
    hints: tuple[str, ...] = ()
    # How an unquoted (`bare`) value is judged: "code" (a value that reads as code, such as
    # `user_password` or `os.environ[...]`, stays), "line_end" (as "code", but a plain word
    # that ends its line or follows `NAME=`/`--name=` is a password too: `password: swordfish`),
    # "value" (the position says it is a value, `mysql -pX`: only placeholders stay), "prose"
    # (a word after "my password is": ordinary words stay).
    bare_check: str = "code"


class _LazyRegex:
    """A regex compiled on its first use: a text holding none of a pattern's hints never pays
    for compiling it (a hook that logs one line would otherwise compile every pattern)."""

    def __init__(self, source: str, flags: int):
        self.source, self.flags = source, flags
        self._compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str):
        if self._compiled is None:
            self._compiled = re.compile(self.source, self.flags)
        return getattr(self._compiled, name)


_LITERAL_HEAD = re.compile(r"[A-Za-z0-9_-]{2,}")


def _pattern(kind: str, regex: str, flags: int = 0, hints: tuple[str, ...] = (),
             bare_check: str = "code") -> SecretPattern:
    # A regex that starts with a literal (`dop_v1_`, `sk-`, `eyJ`) can only match where that
    # literal is: it is the pattern's hint when none is given.
    head = _LITERAL_HEAD.match(regex)
    if not hints and head and not flags & re.IGNORECASE:
        hints = (head.group(0).lower(),)
    return SecretPattern(kind, _LazyRegex(regex, flags), hints, bare_check)


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
        _pattern("pypi_token", r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}", hints=("pypi-",)),
        _pattern("digitalocean_token", r"do[opr]_v1_" + _starts_word(7) + r"[a-f0-9]{64}\b"),
        _pattern("databricks_token", r"dapi" + _starts_word(4) + r"[a-f0-9]{32}(?:-\d+)?\b"),
        _pattern("terraform_token", r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_-]{60,}",
                 hints=("atlasv1",)),
        _pattern("pulumi_token", r"pul-" + _starts_word(4) + r"[a-f0-9]{40}\b"),
        _pattern("vault_token", r"hv[sbr]\." + _starts_word(4) + r"[A-Za-z0-9_-]{24,}"),
        _pattern(
            "discord_webhook",
            r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/"
            r"(?P<secret>[A-Za-z0-9_-]{60,})",
            hints=("discord",),
        ),
        _pattern("telegram_bot_token", r"(?<![0-9])\d{8,10}:AA[A-Za-z0-9_-]{33}(?![A-Za-z0-9_-])",
                 hints=(":aa",)),
        _pattern("twilio_key", r"SK" + _starts_word(2) + r"[0-9a-fA-F]{32}\b"),
        _pattern("mailgun_key", r"key-" + _starts_word(4) + r"(?=[a-zA-Z]*\d)[0-9a-zA-Z]{32}\b"),
        _pattern("mailchimp_key", r"(?<![0-9a-f])[0-9a-f]{32}-us\d{1,2}\b", hints=("-us",)),
        _pattern("shopify_token", r"shp(?:at|ss|ca|pa)_" + _starts_word(6) + r"[a-fA-F0-9]{32}\b"),
        _pattern("square_token", r"sq0(?:atp|csp)-" + _starts_word(7) + r"[0-9A-Za-z_-]{22,}"),
        _pattern("atlassian_token", r"ATATT3" + _starts_word(6) + r"[A-Za-z0-9_=-]{100,}"),
        _pattern("linear_key", r"lin_api_" + _starts_word(8) + r"[A-Za-z0-9]{40}\b"),
        _pattern("notion_token", r"ntn_" + _starts_word(4) + r"[A-Za-z0-9]{40,}\b"),
        _pattern("postman_key", r"PMAK-" + _starts_word(5) + r"[a-f0-9]{24}-[a-f0-9]{34}\b"),
        _pattern("grafana_token", r"glsa_" + _starts_word(5) + r"[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}\b"),
        _pattern("grafana_token", r"glc_" + _starts_word(4) + r"[A-Za-z0-9+/]{32,}={0,2}"),
        _pattern("newrelic_key", r"NRAK-" + _starts_word(5) + r"[A-Z0-9]{27}\b"),
        _pattern("age_secret_key", r"AGE-SECRET-KEY-1[0-9A-Z]{58}"),
        _pattern(
            "jwt",
            r"eyJ" + _starts_word(3) + r"[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        ),
        # scheme://user:password@host (the scheme itself does not matter).
        _pattern(
            "url_credentials",
            r"://[^\s:/?#@'\"\[\]]*:(?P<secret>" + _NOT_A_MARKER + r"[^\s/?#@'\"]+)@",
        ),
        # https://TOKEN@host: a long user part with a digit is a token, not a user name.
        _pattern(
            "url_credentials",
            r"(?i:https?|git|ssh)://(?P<secret>" + _NOT_A_MARKER
            + r"(?=[A-Za-z0-9_.~-]*\d)[A-Za-z0-9_.~-]{20,})@",
            # Its scheme, case-blind, gives sre no literal to scan for: tried at every
            # character, it was a third of an import's redaction (100k rows: 0.66 s).
            hints=("://",),
        ),
        _pattern(
            "bearer_token",
            r"\b(?i:bearer)\s+(?P<secret>" + _NOT_A_MARKER + r"[A-Za-z0-9._~+/-]{16,}=*)",
            hints=("bearer",),
        ),
        _pattern(
            "bearer_token",
            r"(?i:authorization)[\"']?[ \t]*[:=][ \t]*[\"']?(?i:token)[ \t]+"
            r"(?P<secret>" + _NOT_A_MARKER + r"[A-Za-z0-9._~+/-]{16,}=*)",
            hints=("authorization",),
        ),
        _pattern(  # a registry login in Docker's config.json
            "basic_auth",
            r"\"auth\"[ \t]*:[ \t]*\"(?P<secret>[A-Za-z0-9+/]{16,}={0,2})\"",
            hints=('"auth"',),
        ),
        _pattern(
            "basic_auth",
            r"(?i:authorization)[\"']?\s*[:=]\s*[\"']?(?i:basic)\s+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})",
            hints=("authorization",),
        ),
        _pattern(
            "password",
            # A Kubernetes env entry: the name says secret, the next line's value holds it.
            # (The name's test is a lookahead: written inline, sre took ~10 ms to compile it.)
            r"(?i:name)[ \t]*:[ \t]*[\"']?(?=[A-Za-z0-9_.-]*(?i:password|passwd|secret|token|api_?key|"
            r"access_?key|private_?key|credentials?|_pass|_pwd)[\"' \t\r\n])[A-Za-z0-9_.-]+[\"']?[ \t]*"
            r"\r?\n[ \t]*(?:-[ \t]+)?(?i:value)" + _ASSIGNED_VALUE,
            hints=("value",), bare_check="line_end",
        ),
        _pattern(
            "password",
            # No boundary before `password`: PGPASSWORD, DBPASSWORD are passwords too; `pass`
            # only as the end of a longer name (DB_PASS, smtp.pass), never the English word.
            r"(?:(?i:password|passwd|passphrase)|(?<![A-Za-z0-9])(?i:pwd)|(?<=[_.])(?i:pass))\b"
            + _ASSIGNED_VALUE,
            hints=("pass", "pwd"), bare_check="line_end",
        ),
        _pattern(
            "password",
            # `mysql -pX` (the value glued to -p; `-p` alone asks at a prompt).
            r"\b(?:mysql\w*|mariadb\w*)\b[^\n]*?[ \t]-p(?P<bare>" + _NOT_A_MARKER
            + r"""[^\s"'-][^\s"']*)""",
            hints=("mysql", "mariadb"), bare_check="value",
        ),
        _pattern(
            "password",
            # `docker login -p X`, `sshpass -p X`
            r"(?:\b(?:docker|podman|nerdctl)[ \t]+login\b[^\n]*?[ \t]-p|\bsshpass[ \t]+-p)[ \t]*"
            r"(?P<bare>" + _NOT_A_MARKER + r"""[^\s"'-][^\s"']*)""",
            hints=("login", "sshpass"), bare_check="value",
        ),
        _pattern(
            "password",
            # curl -u user:pass, curl --user 'user:pass'
            r"""\bcurl\b[^\n]*?[ \t](?:-u|--user)[ \t]*["']?[^\s:'"]+:(?P<bare>"""
            + _NOT_A_MARKER + r"""[^\s'"]+)""",
            hints=("curl",), bare_check="value",
        ),
        _pattern(
            "password",
            # ~/.netrc: machine HOST login USER password PASS
            r"\bmachine[ \t]+\S+[ \t]+(?:login[ \t]+\S+[ \t]+)?password[ \t]+(?P<bare>"
            + _NOT_A_MARKER + r"\S+)",
            hints=("machine",), bare_check="value",
        ),
        _pattern(
            "password",
            # SQL: CREATE USER … WITH PASSWORD '…', IDENTIFIED BY '…'
            r"(?i:\bwith[ \t]+(?:encrypted[ \t]+)?password|\bidentified[ \t]+by)[ \t]+" + _QUOTED_VALUE,
            hints=("password", "identified"),
        ),
        _pattern(
            "password",
            # Chat: "my password is swordfish", "the wifi password is X", "the passphrase for
            # the key was X".
            r"(?i:\b(?:my|the|our|your|his|her|their)[ \t]+(?:[\w-]+[ \t]+){0,2}?"
            r"(?:password|passphrase|passcode|passwd|pin)(?:[ \t]+(?:for|of|to|on)[ \t]+(?:the[ \t]+)?"
            r"[\w.-]+)?[ \t]+(?:is|was)[ \t]*:?[ \t]+)[\"'`]?(?P<bare>" + _NOT_A_MARKER
            + r"[^\s\"'`<>]*[^\s\"'`<>.,;:!?)])",
            hints=("pass", "pin"), bare_check="prose",
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
            bare_check="value",
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


# Plain words after `password:` that are code or schema, not a password.
_NOT_A_PASSWORD = frozenset({
    "str", "string", "bytes", "text", "int", "bool", "any", "secretstr", "optional", "required",
    "password", "passwd", "passphrase", "secret", "token", "value", "empty", "unset", "changeit",
})
# Words after "my password is" that go on talking about the password rather than saying it.
_PROSE_WORDS = frozenset({
    "in", "on", "at", "the", "a", "an", "not", "no", "stored", "saved", "kept", "set", "wrong",
    "incorrect", "correct", "right", "too", "still", "now", "being", "required", "optional",
    "missing", "empty", "expired", "changed", "reset", "same", "different", "secret", "hidden",
    "encrypted", "hashed", "long", "short", "weak", "strong", "valid", "invalid", "also", "only",
    "just", "what", "that", "this", "there", "here", "unknown", "known", "case", "sensitive",
    "needed", "shown", "visible", "given", "sent", "rotated", "managed", "synced", "written",
    "somewhere", "either", "neither", "used", "protected", "random", "generated",
})
_PLAIN_WORD = re.compile(r"[A-Za-z]{4,}")
# What may follow a plain-word password on its line: nothing, or the end of a clause.
_LINE_END = re.compile(r"[ \t]*(?:[,;][ \t]|\.?[ \t]*(?:\r?\n|\Z))")


def _bare_is_secret(check: str, match: re.Match[str]) -> bool:
    """Whether the unquoted value a pattern matched is a secret, as its `bare_check` says."""
    value = match.group("bare")
    if check == "value":
        return value.lower() not in _PLACEHOLDER_VALUES and not value.startswith(("$", "%", "<", "{", "*"))
    if check == "prose":
        return len(value) >= 4 and value.lower() not in _PROSE_WORDS and not value.startswith(("$", "<", "{"))
    if _looks_secret(value):
        return True
    if check != "line_end" or not _PLAIN_WORD.fullmatch(value) or value.lower() in _NOT_A_PASSWORD:
        return False
    # A plain word is a password where nothing else could be meant: it ends the line
    # (`password: swordfish`), or the name is an environment variable or a flag set with `=`
    # (`PGPASSWORD=swordfish psql`, `--password=letmein`).
    if _LINE_END.match(match.string, match.end("bare")):
        return True
    head = match.group(0)[: match.start("bare") - match.start()]
    flag = match.string[max(match.start() - 2, 0): match.start()] == "--"
    return head.endswith("=") and (flag or re.fullmatch(r"[A-Z0-9_]+=", head) is not None)


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
            if not _bare_is_secret(pattern.bare_check, match):
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
    def from_section(cls, section) -> Redactor:
        """The redactor of a `redaction:` config section (None: built-in patterns, enabled)."""
        if section is None:
            return cls()
        return cls(section.enabled, section.patterns)

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

    def texts(self, values: list[str]) -> list[str]:
        """`text` of each value, in one pass over them all (an import's thousands of rows)."""
        return self._batch(values) if self.enabled else list(values)

    def trees(self, values: list) -> list:
        """`tree` of each value, with one pass over the strings of them all."""
        if not self.enabled:
            return list(values)
        strings: list[str] = []
        for value in values:
            _gather(value, strings)
        redacted = iter(self._batch(strings))
        return [self._rebuild(value, redacted) for value in values]

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


def masked_url(url):
    """`url` with the password of its user part shown as `***` (a store URL in `config show`,
    an error, a log line); any other value is returned as it is."""
    from urllib.parse import urlsplit, urlunsplit

    if not isinstance(url, str) or "://" not in url:
        return url
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed port or netloc: mask everything before the host
        head, at, host = url.partition("://")[2].rpartition("@")
        return url if not at else url.split("://")[0] + "://***@" + host
    if password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
