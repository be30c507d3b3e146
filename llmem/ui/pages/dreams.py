"""Dreams: the runs with their counts per phase and undo, the diary (and DREAMS.md), the HTML
report served sandboxed, the proposed changes with accept/reject recorded, and the promotion
candidates with every signal and gate, and promote."""

from __future__ import annotations

import logging
from pathlib import Path

from starlette.responses import HTMLResponse
from starlette.routing import Route

from ...dream import DreamLock, DreamLocked, dream_status, undo_run
from ...dream.dreams_md import dreams_path
from ...dream.journal import action_counts, find_run, new_run_id
from ...dream.promote import ranked_top
from ...dream.review import DECISIONS, list_proposals, record_decision, reviewer
from ...dream.status import change_counts, change_total
from ...errors import UsageError
from ..markdown import render_markdown
from ..web import form, redirect, render, store, viewer

log = logging.getLogger(__name__)

NAV = ("Dreams", "/dreams")

RUNS = 30  # runs listed
CANDIDATES = 50  # promotion candidates listed, best first
TEXT_TAIL = 60_000  # characters of the diary shown (its newest entries are at the end)
# The report is a document of its own with inline CSS: it gets a sandbox (a unique origin,
# no script, no form, no plugin) instead of the pages' policy, and loads nothing.
REPORT_CSP = ("sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; "
              "form-action 'none'; frame-ancestors 'none'; base-uri 'none'")


def _tail(path: Path) -> tuple[str | None, bool]:
    """The end of a text file (None when absent) and whether its start was cut off."""
    if not path.is_file():
        return None, False
    text = path.read_text(encoding="utf-8", errors="replace")
    if len(text) <= TEXT_TAIL:
        return text, False
    return text[-TEXT_TAIL:], True


def dreams_page(request):
    current_store, config = store(request), viewer(request).llmem.config
    DreamRun = current_store.models.DreamRun
    runs = list(DreamRun.select().order_by(DreamRun.started_at.desc()).limit(RUNS))
    # The changes each run made, counted as the CLI's preview and `dream status` count them.
    counts = {run.id: change_counts(run, action_counts(current_store, run.id)) for run in runs}
    # Scored once: the status counts and the list below both come from it; only the
    # candidates that can reach the list or pass the gates are scored (ranked_top).
    ranked = ranked_top(current_store, config.dream, top=CANDIDATES)
    status = dream_status(current_store, config, recent=0, ranked=ranked)
    diary, diary_cut = _tail(config.diary_path)
    # The file the dream writes (it picks DREAMS.md or an existing lower-case dreams.md).
    dreams_md = dreams_path(config)
    dreams_text, dreams_cut = _tail(dreams_md)
    proposals_path = config.paths.proposed_changes_path
    proposals = list_proposals(current_store.db, proposals_path)
    return render(request, "dreams.html", runs=runs, counts=counts, status=status,
                  diary=diary, diary_cut=diary_cut, diary_path=config.diary_path,
                  dreams_md=dreams_md, dreams_text=dreams_text, dreams_cut=dreams_cut,
                  proposals=proposals, proposal_html={p.id: proposal_body(p.text) for p in proposals},
                  proposals_path=proposals_path,
                  candidates=[c.as_dict() for c in ranked.top], candidate_total=ranked.total,
                  ready=status["candidates"]["promotion_ready"],
                  report_file=config.dream.report_path)


def proposal_body(text: str):
    """An entry rendered (its `## ` heading is the card's title already), markers left out."""
    first, _, rest = text.partition("\n")
    return render_markdown(rest if first.startswith("## ") else text)


def undo(request):
    """GET: what undoing the run will do, asked once. POST: undo it, as `llmem dream undo`."""
    current_store = store(request)
    run = find_run(current_store, request.path_params["run_id"])
    if request.method == "GET":
        total = change_total(action_counts(current_store, run.id))
        return render(request, "confirm.html", question=f"Undo {run.kind} run {run.id}?",
                      subject=f"{run.kind} run {run.id}, {run.status}, phases {run.phases or '–'}: "
                              f"{total} journaled change{'' if total == 1 else 's'}",
                      detail="Every memory it changed is restored as it was, what it created is "
                             "removed, its files are put back; a memory or file edited since the "
                             "run is left as it is. Later runs "
                             "that touched the same memories must be undone first.",
                      action=f"/dreams/runs/{run.id}/undo", fields=[], button="Undo this run",
                      back="/dreams")
    try:
        with DreamLock(current_store.db, new_run_id(), what="undo"):
            result = undo_run(current_store, run.id)
    except DreamLocked as exc:
        return redirect(request, "/dreams", f"Not undone: {exc.message}", "error")
    message = (f"Undid run {result.run_id}: {result.restored} memory rows restored, {result.deleted} "
               f"created memories removed, {result.unlinked} relations removed, {result.files} files restored")
    if result.skipped_files:
        message += f"; left as they are (edited since the run): {', '.join(result.skipped_files)}"
    if result.skipped_memories:
        message += (f"; memories edited since the run, left as they are: "
                    f"{', '.join(m[:8] for m in result.skipped_memories)} "
                    f"(`llmem dream undo {result.run_id} --force` restores them)")
    return redirect(request, f"/dreams#run-{result.run_id}", message)


def report(request):
    """The dream report, sandboxed: the file dream.report_path names when it exists (the last
    applied run's), else (or with ?preview=1) a preview of what a dream would do now."""
    from ...dream import run_dream
    from ...dream.report import render_report

    current_store, config = store(request), viewer(request).llmem.config
    path = config.dream.report_path
    if path is not None and path.is_file() and not request.query_params.get("preview"):
        html = path.read_text(encoding="utf-8", errors="replace")
    else:
        # A preview writes nothing and asks no LLM (run_dream without apply only plans).
        html = render_report(current_store, run_dream(current_store, config, apply=False))
    return HTMLResponse(html, headers={"content-security-policy": REPORT_CSP})


def decide(request):
    """Record accept or reject of a proposed change: nothing is applied to any skill."""
    fields = form(request)
    decision = request.path_params["decision"]
    if decision not in ("accept", "reject"):
        raise UsageError(f"unknown decision {decision!r}", hint="accept or reject")
    verdict = DECISIONS[0] if decision == "accept" else DECISIONS[1]
    client = request.client.host if request.client else "?"
    made = record_decision(store(request), viewer(request).llmem.config.paths.proposed_changes_path,
                           fields.get("proposal", ""), verdict,
                           by=f"{reviewer('llmem ui')} from {client}", note=fields.get("note", ""))
    tail = " Nothing was applied: add it to your skill by hand." if verdict == "accepted" else ""
    return redirect(request, f"/dreams#proposal-{made.proposal_id}",
                    f"Recorded: {made.proposal_id} {made.decision}.{tail}")


def promote(request):
    """Promote every candidate past the gates, as `llmem promote --apply` (undo from the runs)."""
    from ...dream.sweep import run_promote

    try:
        outcome = run_promote(store(request), viewer(request).llmem.config, apply=True)
    except DreamLocked as exc:
        return redirect(request, "/dreams", f"Not promoted: {exc.message}", "error")
    if not outcome.applied:
        return redirect(request, "/dreams#promotion", "No memory passes every gate: nothing promoted")
    return redirect(request, f"/dreams#run-{outcome.run_id}",
                    f"Promoted {len(outcome.chosen)} memories to core (run {outcome.run_id}, undo from its row)")


ROUTES = [
    Route("/dreams", dreams_page),
    Route("/dreams/report", report),
    Route("/dreams/runs/{run_id}/undo", undo, methods=["GET", "POST"]),
    Route("/dreams/proposals/{decision}", decide, methods=["POST"]),
    Route("/dreams/promote", promote, methods=["POST"]),
]
