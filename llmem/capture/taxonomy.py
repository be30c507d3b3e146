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

# metadata `source` of a self_assessment the no-LLM heuristics made (the memory's own source
# column stays "introspection"): a guess from wording, weaker evidence than a stated one.
HEURISTIC = "heuristic"


def is_heuristic(metadata: dict | None) -> bool:
    """Whether a self_assessment was made by the heuristics (metadata source: heuristic)."""
    return isinstance(metadata, dict) and metadata.get("source") == HEURISTIC


def enough_evidence(assessments) -> bool:
    """Whether (metadata, session_id) pairs of one category's self_assessments make a lesson.

    Heuristic guesses alone count only when they come from two sessions or more; one stated
    assessment (by hand, by an LLM, by a review) is enough on its own. Guesses from a single
    session are one misreading away from a false lesson.
    """
    sessions: set[str] = set()
    for metadata, session_id in assessments:
        if not is_heuristic(metadata):
            return True
        if session_id:
            sessions.add(session_id)
    return len(sessions) >= 2
