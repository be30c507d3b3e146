"""Store-wide commands: init, config, stats, metrics, embed, doctor (export and import: cli/exchange.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .choices import config_adapter_choice
from .output import bounded_int, http_url, json_option, print_json, progress_bar


@click.command()
@click.option("--ollama-url", callback=http_url, help="Ollama URL for embeddings and the LLM (default http://localhost:11434).")
@click.option("--adapter", type=config_adapter_choice(),
              help="Session adapter (default: auto-detected).")
@click.option("--embedder", type=click.Choice(["auto", "builtin", "ollama", "openai", "local", "none"]),
              default="auto", show_default=True,
              help="Embedding provider to write. auto, on a first init: ollama when Ollama answers "
                   "with an embedding model, else builtin (in-process, offline); an existing "
                   "config keeps its own.")
@click.option("--store", "store_url", metavar="URL",
              help="Where the memory store lives: sqlite:///PATH (the default: db_path), or "
                   "postgresql://USER@HOST:PORT/DATABASE for a PostgreSQL server with pgvector.")
@json_option("Print the outcome as JSON.")
@click.pass_obj
def init(app, ollama_url, adapter, embedder, store_url, as_json):
    """Create the config and the store, detect the session adapter and the embedder."""
    from ..config import render_example, validate_mapping
    from ..paths import write_private_text
    from ..setup.doctor import detect_adapter_name, llm_status, pick_embedder

    config = app.config
    file = config.source or (Path(app._config_path) if app._config_path else config.paths.config_file)
    values = config.as_dict()
    overrides = {}
    if ollama_url:
        overrides[("embedding", "base_url")] = ollama_url.rstrip("/")
        overrides[("llm", "base_url")] = ollama_url.rstrip("/")
    if adapter:
        overrides[("session", "adapter")] = adapter
    if store_url:
        overrides[("store", "url")] = store_url
    if embedder == "auto" and config.source is None:
        embedder, _ = pick_embedder(config, ollama_url)
    if embedder != "auto":
        overrides[("embedding", "provider")] = embedder
        if embedder != values["embedding"]["provider"]:
            overrides[("embedding", "model")] = None  # the old provider's model means nothing to the new one
    changed = any(values[a][b] != v for (a, b), v in overrides.items())
    config_written = False
    if config.source is None or changed:
        new_values = json.loads(json.dumps(values))
        for (section, key), value in overrides.items():
            new_values[section][key] = value
        new_values, _ = validate_mapping(new_values, str(file))  # never write a config we would reject
        write_private_text(file, render_example(values=new_values))
        config_written = True
        app.__dict__.pop("config", None)
        app._config_path = str(file)
    config = app.config
    from ..redact import masked_url

    shown_store = masked_url(str(config.store_location))
    on_server = shown_store != str(config.db_path)
    store_existed = on_server or config.db_path.exists()
    stats = app.store.stats()
    detected = detect_adapter_name(config)
    embedder_status = app.embedder.status()
    llm = llm_status(config)
    outcome = {
        "config": str(file), "config_written": config_written,
        "store": shown_store, "store_created": not store_existed,
        "adapter": config.session.adapter, "detected_adapter": detected,
        "embedder": embedder_status, "llm": llm, "sqlite_vec": stats["sqlite_vec"],
    }
    if as_json:
        print_json(outcome)
        return
    click.echo(f"config:   {file} ({'written' if config_written else 'unchanged'})")
    if on_server:
        click.echo(f"store:    {shown_store} ({stats['memories']} memories, pgvector)")
    else:
        click.echo(f"store:    {config.db_path} ({'created' if not store_existed else 'exists'}, "
                   f"{stats['memories']} memories, sqlite-vec {stats['sqlite_vec']})")
    click.echo(f"adapter:  {outcome['adapter']} (detected: {detected})")
    if embedder_status["status"] == "ok":
        verb = "loads" if embedder_status["provider"] in ("builtin", "local") else "answers"
        click.echo(f"embedder: {embedder_status['provider']} {embedder_status['model']} {verb} "
                   f"({embedder_status['dim']} dimensions)")
    elif embedder_status["status"] == "disabled":
        click.echo("embedder: none (search is FTS-only; `llmem init --embedder builtin` works offline)")
    else:
        click.echo(f"embedder: {embedder_status['provider']} unavailable — {embedder_status['error']}")
        if embedder_status.get("hint"):
            click.echo(f"          hint: {embedder_status['hint']}")
        click.echo("          memories are still stored; search is FTS-only until it "
                   + ("loads" if embedder_status["provider"] in ("builtin", "local") else "answers"))
    if llm["provider"] == "agent":
        click.echo(f"llm:      agent {llm['agent']} " + (f"({llm['executable']}): `{llm['command']}` per slice"
                                                       if llm["status"] == "ok" else f"unavailable — {llm['error']}"))
    elif llm["status"] == "ok":
        click.echo(f"llm:      {llm['provider']} {llm['model']} available")
    elif llm["status"] == "disabled":
        click.echo("llm:      none (extraction and introspection use heuristics)")
    elif llm["status"] == "model_missing":
        pull = f" — `ollama pull {llm['model']}`" if llm["provider"] == "ollama" else ""
        click.echo(f"llm:      {llm['provider']} answers but has no model {llm['model']}{pull}")
    else:
        click.echo(f"llm:      {llm['provider']} unavailable — {llm['error']}")
        click.echo("          extraction falls back to heuristics until it answers")


@click.command()
@json_option()
@click.pass_obj
def stats(app, as_json):
    """Counts of memories by type and state, embeddings, relations, store size."""
    from ..providers.llm import usage_summary

    data = app.store.stats()
    data["llm"] = usage_summary(app.store)
    if as_json:
        print_json(data)
        return
    click.echo(f"memories:  {data['memories']} ({data['valid']} valid, {data['invalidated']} invalidated, "
               f"{data['promoted']} promoted)")
    for mtype, count in data["by_type"].items():
        click.echo(f"  {mtype:<16}{count}")
    click.echo(f"relations: {data['relations']}")
    click.echo(f"embedded:  {data['embedded']} ({data['pending_embedding']} pending) "
               f"model={data['embedding_model'] or '-'} dim={data['embedding_dim'] or '-'}")
    click.echo(f"recalls:   {data['recall_events']}")
    click.echo(f"store:     {data['db_path']} ({data['db_bytes'] / 1e6:.1f} MB, sqlite-vec {data['sqlite_vec']})")
    llm = data["llm"]
    click.echo(f"llm:       {llm['tokens_today']} tokens today, {llm['tokens_total']} in total ({llm['calls']} calls)")
    for task, used in llm["by_task"].items():
        click.echo(f"  {task:<16}{used['today']} today, {used['total']} total")


@click.command()
@click.option("--pending", "mode", flag_value="pending", default=True, help="Embed memories without a current vector (default).")
@click.option("--all", "mode", flag_value="all", help="Re-embed every valid memory.")
@json_option("Print the outcome as JSON.")
@click.pass_obj
def embed(app, mode, as_json):
    """Embed memories that have no vector yet (or all of them)."""
    from ..errors import UsageError
    from ..vectors import embed_pending, pending_query

    if not app.embedder.available:
        raise UsageError("no embedder is configured (embedding.provider: none)",
                         hint="set embedding.provider in config.yaml")
    pending = pending_query(app.store, app.embedder.identity, everything=(mode == "all")).count()
    with progress_bar("Embedding", pending, show=not as_json) as progress:
        count = embed_pending(app.store, app.embedder, everything=(mode == "all"), progress=progress.to)
    if as_json:
        print_json({"embedded": count, "model": app.embedder.identity})
    else:
        click.echo(f"Embedded {count} memories with {app.embedder.identity}")


@click.command()
@click.option("--sample", type=bounded_int(10), default=2000, show_default=True,
              help="Memories sampled for the similarity figures.")
@json_option()
@click.pass_obj
def metrics(app, sample, as_json):
    """Embedding quality: coverage, similarity spread, near-duplicates, recall activity."""
    from ..setup.doctor import embedding_metrics

    data = embedding_metrics(app.store, app.config, sample=sample)
    if as_json:
        print_json(data)
        return
    for line in _readable(data):
        click.echo(line)


def _readable(data: dict, indent: int = 0) -> list[str]:
    """Metric lines a person reads: labels in words, "-" for none, nested groups indented."""
    lines = []
    for key, value in data.items():
        label = " " * indent + str(key).replace("_", " ") + ":"
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            lines.append(label)
            lines.extend(_readable(value, indent + 2))
            continue
        if isinstance(value, dict):
            shown = ", ".join(f"{v} {str(k).replace('_', ' ')}" for k, v in value.items()) or "none"
        elif value is None:
            shown = "-"
        elif key == "coverage":
            shown = f"{value:.1%}"
        else:
            shown = str(value)
        lines.append(f"{label:<32}{shown}")
    return lines


@click.command()
@json_option()
@click.pass_obj
def doctor(app, as_json):
    """Check the config, store, sqlite-vec, embedder, LLM and agent stores."""
    from ..setup.doctor import run_doctor

    report = run_doctor(app)
    if as_json:
        print_json(report)
    else:
        for check in report["checks"]:
            mark = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}[check["status"]]
            click.echo(f"[{mark}] {check['name']}: {check['detail']}")
    if any(c["status"] == "fail" for c in report["checks"]):
        sys.exit(1)


@click.group("config")
def config_group():
    """Show or check the configuration."""


@config_group.command("show")
@json_option()
@click.pass_obj
def config_show(app, as_json):
    """Print the effective configuration (file values over defaults) and resolved paths."""
    import yaml

    from ..redact import masked_url

    config = app.config
    resolved = {"config_file": str(config.source or config.paths.config_file),
                "store": masked_url(str(config.store_location)),
                "db_path": str(config.db_path), "queue_path": str(config.queue_path),
                "log_dir": str(config.log_dir), "diary_path": str(config.diary_path)}
    # A password in store.url or queue.url is never printed.
    values = config.as_dict()
    for section in ("store", "queue"):
        values[section]["url"] = masked_url(values[section]["url"])
    if as_json:
        print_json({"values": values, "paths": resolved})
        return
    click.echo(f"# source: {config.source or 'defaults (no config file)'}")
    click.echo(yaml.safe_dump(values, sort_keys=False, allow_unicode=True).rstrip())
    click.echo("# resolved paths")
    for key, value in resolved.items():
        click.echo(f"#   {key}: {value}")


@config_group.command("check")
@json_option("Print the outcome as JSON (also when invalid).")
@click.pass_obj
def config_check(app, as_json):
    """Validate the config file: exit 2 with the reason when it is invalid."""
    from ..errors import ConfigError

    try:
        config = app.config  # raises ConfigError (exit 2) on an invalid value; warnings are logged
    except ConfigError as exc:
        if not as_json:
            raise
        from ..paths import default_paths

        print_json({"file": app._config_path or str(default_paths().config_file), "valid": False,
                    "error": exc.message, "hint": exc.hint, "warnings": []})
        sys.exit(exc.exit_code)
    file = str(config.source) if config.source else None
    if as_json:
        print_json({"file": file, "valid": True, "error": None, "hint": None,
                    "warnings": list(config.warnings)})
        return
    click.echo(f"{file or 'no config file: defaults'}: valid"
               + (f" ({len(config.warnings)} warning(s))" if config.warnings else ""))
