"""The hook routing policy: where a hook's work runs — inline, queued for the worker, or detached.

`llmem hook` (cli/session.py) parses the agent's call into one `HookCall` and hands it here;
the resident (cli/resident.py) runs that same command, so both route by this one policy. The
call carries the session id, project and adapter once, down to whichever path runs the work.
The queue is the CLI's (cli/queueing.py is the library's one door to huey): the caller hands
in its `submit`, so this module stays below the CLI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("llmem.hooks")

# submit(app, adapter, session_id, kind, since=...) -> event id (cli/queueing.py submit_event)
Submit = Callable[..., int]


@dataclass(frozen=True)
class HookCall:
    """One lifecycle hook, as the agent called it: what happened to which session."""

    kind: str
    session_id: str
    project: str | None = None
    adapter: str | None = None  # the adapter named on the command line (None: resolve it)
    model: str | None = None  # per-hook LLM overrides, which a queued event does not carry
    base_url: str | None = None
    # When the turn the hook is about began (epoch s): the same moment already recorded since
    # then (Codex tells a turn's end to its Stop hook and to notify) is not queued again.
    turn_began: float | None = None


def dispatch_hook(app, call: HookCall, *, submit: Submit, sync=False, detach=False,
                  config_path=None, run_lock_fd=None, compaction_block=True) -> dict:
    """Decide how a hook's work runs: inline (--sync, and `created`), queued, or detached.

    By default the event is recorded in the store and enqueued for the worker (`submit`), so
    the agent waits only for that. A compacting hook still prints its compaction block inline.
    With no worker alive (none seen for a few minutes), or with per-hook --model/--base-url
    (which a queued event does not carry), the work runs in a detached process instead: one
    per session at a time, later hooks coalesce into it (llmem.pipeline.detached).
    `compaction_block=False` skips that block when nobody reads it.
    """
    kind, session_id = call.kind, call.session_id

    def run_inline(run_kind):
        from .handlers import handle_session_event

        return handle_session_event(app, run_kind, session_id, adapter_name=call.adapter,
                                    model=call.model, base_url=call.base_url,
                                    project=call.project, fail_open=True).as_json()

    if sync and run_lock_fd is not None and kind != "created":
        from .detached import run_coalesced

        return run_coalesced(app.config, kind, session_id, run_lock_fd, run_inline)
    if sync or kind == "created":
        return run_inline(kind)
    result = {"kind": kind, "session_id": session_id, "steps": {}, "errors": []}
    if detach or call.model or call.base_url or not _worker_alive(app):
        from .detached import start_detached

        hook_args = []
        for flag, value in (("--project", call.project), ("--adapter", call.adapter),
                            ("--model", call.model), ("--base-url", call.base_url)):
            if value:
                hook_args += [flag, value]
        how, pid = start_detached(app.config, kind, session_id, hook_args, config_path)
        result[how] = pid
    else:
        from ..adapters import resolve_adapter

        # Recorded under the agent that owns the session, so the worker reads the right store.
        owner = resolve_adapter(app.config, session_id, call.adapter).name
        result["event_id"] = submit(app, owner, session_id, kind, since=call.turn_began)
    log.info("%s %s: %s", kind, session_id, status_line(result))
    if kind == "compacting" and compaction_block:
        from ..context import build_context

        result["context"] = build_context(app, session_id, compacting=True, project=call.project,
                                          adapter_name=call.adapter)
    return result


def status_line(result: dict) -> str | None:
    """What a hook that did not run its work inline did with it (None when it ran inline)."""
    if "event_id" in result:
        return f"queued as event {result['event_id']}"
    if "detached" in result:
        return f"running in the background (pid {result['detached']})"
    if "coalesced" in result:
        pid = result["coalesced"]
        return ("joined the background run already going for this session"
                + (f" (pid {pid})" if pid else ""))
    return None


def _worker_alive(app) -> bool:
    from .events import worker_seen_recently

    return worker_seen_recently(app.store)
