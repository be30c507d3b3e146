"""Read-only checks behind `llmem doctor`, `llmem metrics` and adapter detection in `init`."""

from __future__ import annotations

import os
from typing import Any


def detect_adapter_name(config) -> str:
    """What `session.adapter` reads on this machine: under auto, every agent found ("none" if none)."""
    configured = config.session.adapter
    if configured != "auto":
        return configured
    from ..adapters.resolve import present_agents

    return ", ".join(present_agents(config)) or "none"


def _check(name: str, status: str, detail: str, **extra) -> dict[str, Any]:
    return {"name": name, "status": status, "detail": detail, **extra}


def llm_status(config) -> dict[str, Any]:
    """Is the chat LLM reachable, and does it have the configured model? Never raises."""
    import httpx

    section = config.llm
    if section.provider == "none":
        return {"provider": "none", "status": "disabled"}
    if section.provider == "agent":
        from ..providers.agent_cli import agent_status

        return agent_status(config)
    base = section.base_url.rstrip("/")
    try:
        with httpx.Client(timeout=3.0, trust_env=False) as client:
            if section.provider == "ollama":
                reply = client.get(base + "/api/tags")
                reply.raise_for_status()
                names = {m.get("name") for m in reply.json().get("models", [])}
                model = section.model
                present = model in names or f"{model}:latest" in names
            else:
                path = "/models" if base.endswith("/v1") else "/v1/models"
                key = os.environ.get(section.api_key_env, "")
                reply = client.get(base + path, headers={"Authorization": f"Bearer {key}"} if key else None)
                reply.raise_for_status()
                present = section.model in {m.get("id") for m in reply.json().get("data", [])}
    except Exception as exc:
        return {"provider": section.provider, "model": section.model, "status": "unavailable",
                "error": f"{exc.__class__.__name__}: {exc}"[:200]}
    return {"provider": section.provider, "model": section.model,
            "status": "ok" if present else "model_missing"}


def pick_embedder(config, base_url: str | None = None) -> tuple[str, dict[str, Any]]:
    """The embedding provider a fresh `llmem init` writes, and the probe that decided it:
    ollama when Ollama at `base_url` embeds with its model, else builtin (in-process, offline)."""
    from ..providers import DEFAULT_MODELS
    from ..providers.embedders import OllamaEmbedder

    url = base_url or config.embedding.base_url
    probe = OllamaEmbedder(DEFAULT_MODELS["ollama"], url, 3.0, 1)
    try:
        answer = probe.status()
    finally:
        probe.close()
    return ("ollama" if answer["status"] == "ok" else "builtin"), answer


def embedder_check(app) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the embedder's status, doctor's check line): which embedder is in use, and whether it
    loads (the built-in one) or answers (a server)."""
    embedder = app.embedder.status()
    where = app.embedder.describe() if hasattr(app.embedder, "describe") else None
    if embedder["status"] == "ok":
        verb = "loads" if embedder["provider"] in ("builtin", "local") else "answers"
        detail = f"{embedder['provider']} {embedder['model']} {verb} ({embedder['dim']}-d)"
        check = _check("embedder", "ok", detail + (f", {where}" if where else ""))
    elif embedder["status"] == "disabled":
        check = _check("embedder", "warn", "none configured: search is FTS-only "
                       "(embedding.provider: builtin works offline, in-process)")
    else:
        hint = f" ({embedder['hint']})" if embedder.get("hint") else ""
        check = _check("embedder", "warn", f"{embedder['provider']}: {embedder['error']}{hint} — search is "
                       "FTS-only and memories wait for `llmem embed --pending`")
    return embedder, check


def _agent_llm_check(llm: dict[str, Any], store) -> dict[str, Any]:
    """llm.provider: agent — the command it runs, whether the CLI is on PATH, and today's cost
    against the budget (no call is made: it would cost tokens)."""
    import peewee as pw

    from ..providers.llm import tokens_spent

    budget = llm["daily_token_budget"]
    spent = tokens_spent(store) if store is not None else None
    cost = ("tokens today unknown" if spent is None else f"{spent} tokens today"
            + (f" of the {budget} a day llm.daily_token_budget allows" if budget else " (no llm.daily_token_budget)"))
    per_call = None
    if store is not None:
        LlmUsage = store.models.LlmUsage
        calls, tokens = (LlmUsage.select(pw.fn.COUNT(LlmUsage.id),
                                         pw.fn.SUM(LlmUsage.prompt_tokens + LlmUsage.completion_tokens))
                         .where(LlmUsage.provider == "agent").tuples().get())
        if calls:
            per_call = round((tokens or 0) / calls)
            cost += f"; {per_call} tokens a call on average over {calls} agent calls"
    if llm["status"] != "ok":
        return _check("llm", "warn", f"agent: {llm['error']} — extraction uses heuristics; {cost}",
                      command=llm["command"], tokens_today=spent, daily_token_budget=budget,
                      tokens_per_call=per_call)
    return _check("llm", "warn" if budget and spent is not None and spent >= budget else "ok",
                  f"agent {llm['agent']} ({llm['executable']}): runs `{llm['command']}` once per chunk of each idle or ending slice; "
                  f"{cost}; sign-in is not checked (a call costs tokens)",
                  command=llm["command"], tokens_today=spent, daily_token_budget=budget,
                  tokens_per_call=per_call)


def run_doctor(app) -> dict[str, Any]:
    """Every health check, as data: {"checks": [...], "sqlite_vec": ..., "embedder": ...}."""
    from ..db.connection import driver
    from ..db.queries import probe_write

    checks = []
    config = app.config
    source = str(config.source) if config.source else "no config file (defaults)"
    checks.append(_check("config", "warn" if config.warnings else "ok",
                         source + (f"; {len(config.warnings)} warning(s): " + "; ".join(config.warnings)
                                   if config.warnings else "")))
    store_ok = True
    try:
        stats = app.store.stats()
        probe_write(app.store.db)
        checks.append(_check("store", "ok", f"{config.db_path} writable, {stats['memories']} memories"))
    except Exception as exc:
        store_ok = False
        checks.append(_check("store", "fail", f"{config.db_path}: {getattr(exc, 'message', exc)}"))
    sqlite_vec = "unavailable"
    if store_ok:
        db = app.store.db
        sqlite_vec = "loaded" if db.vec_loaded else "unavailable"
        module = driver()
        detail = (f"sqlite-vec loaded ({module.__name__}, SQLite {module.sqlite_version})"
                  if db.vec_loaded else f"sqlite-vec unavailable ({db.vec_error}); vector search uses numpy")
        checks.append(_check("sqlite_vec", "ok" if db.vec_loaded else "warn", detail))
    embedder, check = embedder_check(app)
    checks.append(check)
    llm = llm_status(config)
    if llm["provider"] == "agent":
        checks.append(_agent_llm_check(llm, app.store if store_ok else None))
    elif llm["status"] == "ok":
        checks.append(_check("llm", "ok", f"{llm['provider']} {llm['model']} available"))
    elif llm["status"] == "disabled":
        checks.append(_check("llm", "warn", "none configured: extraction uses heuristics"))
    elif llm["status"] == "model_missing":
        checks.append(_check("llm", "warn", f"{llm['provider']} answers but has no model {llm['model']}"
                             + (f" — `ollama pull {llm['model']}`" if llm["provider"] == "ollama" else "")))
    else:
        checks.append(_check("llm", "warn", f"{llm['provider']}: {llm['error']} — extraction falls back to heuristics"))
    adapter = detect_adapter_name(config)
    checks.append(_check("adapter", "ok" if adapter != "none" else "warn",
                         f"{config.session.adapter} → {adapter}"))
    from .agents import agent_status, installable_agents

    for agent in installable_agents():
        checks.append(_agent_check(agent_status(config, agent)))
    existing = config.queue_path.parent  # the queue's folder is made on first use
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    writable = os.access(existing, os.W_OK)
    from ..db.connection import file_damage

    damage = file_damage(config.queue_path) if config.queue_path.is_file() else None
    if damage:
        checks.append(_check("queue", "fail", f"{config.queue_path} is damaged ({damage}); "
                             "`llmem queue --reset` rebuilds it from the store's event rows"))
    else:
        checks.append(_check("queue", "ok" if writable else "fail", f"{config.queue_path}"
                             + ("" if writable else " is not writable")))
    if store_ok:
        from ..dream.lock import stale_lock

        stale = stale_lock(app.store.db)
        checks.append(_check("locks", "warn" if stale else "ok", (
            f"the dream lock is held by process {stale.get('pid')} on {stale.get('host')}, which is gone "
            f"(run {stale.get('run_id')}); the next dream takes it over, "
            "`llmem queue --clear-stale-locks` removes it now") if stale else "no stale locks"))
    services = _service_states()
    if services:
        active = [n for n, s in services.items() if s == "active"]
        checks.append(_check("services", "ok" if active else "warn",
                             ", ".join(f"{n}: {s}" for n, s in services.items())))
    return {"checks": checks, "sqlite_vec": sqlite_vec, "embedder": embedder, "llm": llm,
            "adapter": adapter, "ok": all(c["status"] != "fail" for c in checks)}


def _agent_check(status: dict[str, Any]) -> dict[str, Any]:
    """One line per agent: detected, hooks installed, MCP registered; a warning when the
    agent is here and llmem is not wired into it."""
    agent = status["agent"]
    said = [f"detected ({status['store']})" if status["detected"] else "not detected"]
    trust = status.get("hook_trust")
    if status["error"]:
        said.append(status["error"])
    else:
        from .agents import RECIPES

        hooks = RECIPES[agent].owned_part  # what llmem wires its moments through: a plugin or hooks
        said.append(_trust_said(trust) if trust else f"{hooks} installed" if status["hooks"] else f"no {hooks}")
        if "notify" in status:  # an agent that also runs a notify program (Codex)
            said.append("notify set" if status["notify"] else "no notify")
        said.append("MCP registered" if status["mcp"] else "MCP not registered")
        if status.get("mcp_env_missing"):
            said[-1] += f" without {', '.join(status['mcp_env_missing'])} as set here"
    missing = status["error"] or not (status["hooks"] and status["mcp"]) or bool(status.get("mcp_env_missing"))
    warn = status["detected"] and missing
    detail = "; ".join(said) + (f" — `llmem install {agent}`" if warn and not status["error"] else "")
    extra = {k: status[k] for k in ("detected", "hooks", "mcp")}
    if trust:  # Codex: installed hooks that Codex does not run yet are a warning of their own
        extra["hooks_approved"] = not (trust["pending"] or trust["disabled"])
        warn = warn or not extra["hooks_approved"]
    return _check(agent, "warn" if warn or status["error"] else "ok", detail, **extra)


def _trust_said(trust: dict[str, list[str]]) -> str:
    """Codex's hooks: installed, and whether Codex runs them (agents.codex_hook_trust)."""
    total = sum(len(events) for events in trust.values())
    said = "hooks installed"
    if not trust["pending"] and not trust["disabled"]:
        return said + " and approved in Codex"
    if len(trust["pending"]) == total:
        return said + ", not yet approved — run /hooks in Codex"
    if trust["pending"]:
        said += f", {total - len(trust['pending'])} of {total} approved — run /hooks in Codex"
    if trust["disabled"]:
        said += f", {', '.join(trust['disabled'])} switched off in /hooks"
    return said


def _service_states() -> dict[str, str]:
    from ..errors import LlmemError
    from .systemd import systemctl

    states = {}
    for unit in ("llmem-watch.service", "llmem-worker.service", "llmem-dream.timer"):
        try:
            out = systemctl("is-active", unit, timeout=3)
        except LlmemError:  # no systemctl, or it does not answer: nothing to report
            return {}
        states[unit] = out.stdout.strip() or "unknown"
    return states


def embedding_metrics(store, config, sample: int = 2000) -> dict[str, Any]:
    """Coverage of the vectors, spread of similarities and near-duplicates in a sample."""
    import numpy as np

    from ..db import vec
    from ..db.queries import recall_counts_by_origin

    stats = store.stats()
    model, dim = vec.index_state(store.db)
    out: dict[str, Any] = {
        "model": model, "dim": dim, "valid_memories": stats["valid"], "embedded": stats["embedded"],
        "coverage": round(stats["embedded"] / stats["valid"], 4) if stats["valid"] else None,
        "stale_or_missing": stats["pending_embedding"],
    }
    if model:
        vectors = vec.sample_vectors(store.db, model, sample)
        if len(vectors) >= 2:
            matrix = np.stack(vectors)
            sims = matrix @ matrix.T
            np.fill_diagonal(sims, np.nan)
            nearest = np.nanmax(sims, axis=1)
            upper = sims[np.triu_indices(len(vectors), k=1)]
            threshold = config.dream.similarity_threshold
            out.update({
                "sampled": len(vectors),
                "mean_pairwise_cosine": round(float(np.nanmean(upper)), 4),
                "nearest_neighbour_cosine_p50": round(float(np.median(nearest)), 4),
                "nearest_neighbour_cosine_p95": round(float(np.percentile(nearest, 95)), 4),
                "near_duplicate_pairs": int((upper >= threshold).sum()),
                "near_duplicate_threshold": threshold,
            })
    out["recalls"] = {origin: {"results": n, "distinct_queries": q}
                      for origin, n, q in recall_counts_by_origin(store.db)}
    return out
