"""The search command."""

from __future__ import annotations

import click

from .memory import TYPE_CHOICE
from .output import (
    PROJECT,
    TEXT,
    json_option,
    limit_option,
    memory_line,
    notice,
    print_json,
    superseded_note,
    terminal_text,
)


@click.command()
@click.argument("query", nargs=-1, required=True, type=TEXT)
@limit_option("Results (default: search.limit, 10).")
@click.option("--type", "-t", "memory_type", type=TYPE_CHOICE, help="Only this type.")
@click.option("--project", type=PROJECT, help="This project's memories and the global ones (a folder: its repository).")
@click.option("--fts-only", is_flag=True, help="Keyword search only (no embedder needed).")
@click.option("--semantic-only", is_flag=True, help="Embedding search only (needs an embedder).")
@click.option("--valid-only", is_flag=True, help="Drop expired and superseded memories too.")
@click.option("--include-invalid", is_flag=True, help="Include invalidated memories.")
@click.option("--related", is_flag=True, help="Add memories one relation away from the results.")
@click.option("--explain", is_flag=True, help="Show every score component.")
@click.option("--min-relevance", type=click.FloatRange(0, 1), default=None,
              help="Leave out hits below this relevance, 0 to 1 (default: search.min_relevance; 0 shows all).")
@click.option("--no-track", is_flag=True, help="Do not record access (for benchmarks).")
@json_option("Print results as JSON.")
@click.pass_obj
def search(app, query, limit, memory_type, project, fts_only, semantic_only, valid_only,
           include_invalid, related, explain, min_relevance, no_track, as_json):
    """Search memories (hybrid FTS5 + vectors, fused by RRF and reranked)."""
    app.reads_only()  # recalls are recorded when the store can be written
    from ..errors import UsageError
    from ..search import is_episode
    from ..store import memory_to_dict

    text = " ".join(query).strip()
    if not text:
        raise UsageError("the search query is empty", hint='llmem search "what to find"')
    if fts_only and semantic_only:
        raise UsageError("--fts-only and --semantic-only exclude each other")
    opts = app.search_options(
        limit=limit, mode="fts" if fts_only else "semantic" if semantic_only else "hybrid",
        memory_type=memory_type, project=project, include_invalid=include_invalid,
        valid_only=valid_only, related=related, track=not no_track, min_relevance=min_relevance)
    if fts_only:
        result = _fts_searcher(app).search(text, opts)
    else:
        result = app.searcher().search(text, opts)
    if result.notice:
        notice(result.notice)
    if explain and result.semantic_query:
        notice(f"embedded query (words most memories share left out): {result.semantic_query!r}")
    if as_json:
        rows = []
        for hit in result.hits:
            row = memory_to_dict(hit.memory)
            row["score"] = round(hit.score, 6)
            row["relevance"] = round(hit.relevance, 4)
            row["superseded_by"] = hit.superseded_by
            row["episode"] = is_episode(hit.memory)
            if hit.via:
                row["via"] = hit.via
            if explain:
                row["explain"] = hit.explain()
            rows.append(row)
        print_json(rows)
        return
    if not result.hits:
        click.echo(f"Nothing relevant: no memory reached relevance {opts.min_relevance:g}"
                   + (" (--min-relevance 0 shows the closest)." if opts.min_relevance > 0 else "."), err=True)
    for hit in result.hits:
        line = memory_line(hit.memory, hit.score) + superseded_note(hit)
        click.echo(line + (f"  (via {hit.via})" if hit.via else ""))
        if explain:
            parts = hit.explain()
            click.echo(terminal_text("          " + "  ".join(f"{k}={_fmt(v)}" for k, v in parts.items())))


def _fts_searcher(app):
    # --fts-only must work without touching the embedder (it may be slow or absent).
    from ..search import Searcher

    return Searcher(app.store, None)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)
