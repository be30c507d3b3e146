"""The seeds' error taxonomy for self_assessment memories (binding): category → what it covers."""

TAXONOMY: dict[str, str] = {
    "NULL_SAFETY": "Missing null/None/undefined checks before property access or method calls",
    "ERROR_HANDLING": "Missing try/except, bare except, swallowed errors, unhandled promise rejections",
    "OFF_BY_ONE": "Boundary errors, wrong loop bounds, fencepost errors",
    "RACE_CONDITION": "Concurrency issues, async/await problems, missing locks",
    "AUTH_BYPASS": "Missing auth checks, SSRF, injection vulnerabilities, security oversights",
    "DATA_INTEGRITY": "Stale derived fields, out-of-sync caches/embeddings/indexes, source-of-truth divergence",
    "MISSING_VERIFICATION": "Skipped test steps, unverified outputs, assumed-it-works",
    "EDGE_CASE": "Unhandled empty input, unexpected types, boundary values",
    "PERFORMANCE": "N+1 queries, unnecessary recomputation, memory leaks",
    "DESIGN": "Architectural issues, wrong abstraction level, coupling problems",
    "REVIEW_PASSED": "Clean review with no findings — positive outcome for tracking purposes",
}
CATEGORIES = tuple(TAXONOMY)
# Outcomes worth tracking that are not mistakes: they never become behavioural insights.
POSITIVE_CATEGORIES = frozenset({"REVIEW_PASSED"})
ERROR_CATEGORIES = tuple(c for c in CATEGORIES if c not in POSITIVE_CATEGORIES)
