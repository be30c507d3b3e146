"""The labelled corpus of secret shapes (tests/fixtures/secrets/corpus.yaml), filled in.

Each placeholder of the corpus ({A:32}, {H:40}, ...) becomes random characters from a seeded
generator, and the «marks» around each secret are taken out: what is left is the text to plant
and the list of secrets that must never come out of llmem.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from pathlib import Path

import yaml

CORPUS_FILE = Path(__file__).parent / "fixtures" / "secrets" / "corpus.yaml"
_ALPHABETS = {
    "A": string.ascii_letters + string.digits,
    "H": "0123456789abcdef",
    "U": string.ascii_uppercase + string.digits,
    "B": string.ascii_letters + string.digits + "+/",
    "L": string.ascii_lowercase,
    "D": string.digits,
}
_PLACEHOLDER = re.compile(r"\{([AHUBLD]):(\d+)\}")
_MARKED = re.compile(r"«(.*?)»", re.DOTALL)


@dataclass(frozen=True)
class PlantedSecret:
    kind: str
    text: str  # the line to plant, marks removed
    secrets: tuple[str, ...]  # what must be gone from every output


def _fill(text: str, rng: random.Random) -> str:
    def one(match: re.Match) -> str:
        alphabet, length = _ALPHABETS[match.group(1)], int(match.group(2))
        chars = [rng.choice(alphabet) for _ in range(length)]
        if match.group(1) in "AUB" and length > 1:
            chars[rng.randrange(length)] = rng.choice(string.digits)  # some formats need a digit
        return "".join(chars)

    return _PLACEHOLDER.sub(one, text)


def load_corpus(seed: int = 2020) -> tuple[list[PlantedSecret], list[str]]:
    """(every planted secret, every near-miss) of the corpus."""
    data = yaml.safe_load(CORPUS_FILE.read_text(encoding="utf-8"))
    rng = random.Random(seed)
    planted = []
    for entry in data["secrets"]:
        filled = _fill(entry["text"], rng)
        secrets = tuple(_MARKED.findall(filled))
        assert secrets, f"corpus entry {entry['kind']} marks no secret"
        planted.append(PlantedSecret(entry["kind"], _MARKED.sub(r"\1", filled), secrets))
    return planted, list(data["near_misses"])


def leaks(secrets, haystack: str) -> list[str]:
    """The secrets found in `haystack`, whole or either half of one (of 8 characters or more):
    a secret cut through (at a text's 500th character, say) still leaks what is left of it."""
    found = []
    for secret in secrets:
        half = len(secret) // 2
        parts = [secret] + ([secret[:half], secret[half:]] if half >= 8 else [])
        if any(part in haystack for part in parts):
            found.append(secret)
    return found


def all_secrets(planted: list[PlantedSecret]) -> list[str]:
    return [secret for entry in planted for secret in entry.secrets]
