"""Session commands: context (what an agent is given), hook (lifecycle events)."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading

import click

from ..pipeline.kinds import EventKind
from .choices import adapter_choice, hook_format_choice
from .output import PROJECT, bounded_int, http_url, json_option, json_text

ADAPTER_CHOICE = adapter_choice()
HOOK_LOG = "hooks.log"

log = logging.getLogger("llmem.hooks")
# Set by cli/resident.py while a resident llmem answers a hook in this thread: the hook's
# stdin, stdout and stderr are the client's (io objects), and hooks.log is the resident's.
served = threading.local()


def _echo(text: str, err: bool = False) -> None:
    """click.echo, or into the resident's reply buffers when the hook is served."""
    streams = getattr(served, "streams", None)
    if streams is None:
        click.echo(text, err=err)
    else:
        streams[2 if err else 1].write(f"{text}\n")


@click.command()
@click.option("--session-id", help="The agent's session id (its title and recent text guide the search).")
@click.option("--compacting", is_flag=True, help="The block for a compaction: decisions and state to keep.")
@click.option("--max-tokens", type=bounded_int(50), help="Token budget (default: context.max_tokens, 1500).")
@click.option("--project", type=PROJECT, help="Project (a folder: its repository) whose memories to include (default: the session's).")
@click.option("--adapter", type=ADAPTER_CHOICE, help="Read the session with this adapter (default: session.adapter).")
@click.option("--explain", is_flag=True, help="Say why each line is in (section, relevance, signal) "
              "and what was left out for the budget (after the block; with --json, under \"explain\").")
@json_option("Print the block and the ids in it as JSON.")
@click.pass_obj
def context(app, session_id, compacting, max_tokens, project, adapter, explain, as_json):
    """Print the memory context block injected into a session."""
    from ..context import assemble_context, explain_text

    app.reads_only()  # recalls are recorded when the store can be written
    _lexical_when_fresh(app)
    if session_id:
        from ..adapters import resolve_adapter

        # An id no present store knows is an error here (exit 1), not a block without it.
        adapter = resolve_adapter(app.config, session_id, adapter).name
    block = assemble_context(app, session_id, compacting=compacting, max_tokens=max_tokens,
                             project=project, adapter_name=adapter)
    if as_json:
        _echo(json_text(block.as_dict(explain=explain)))
        return
    _echo(block.text)
    if explain:
        _echo("\n" + explain_text(block.explanation))


def _lexical_when_fresh(app) -> None:
    """A hook or context answered by a process of its own searches with FTS alone (see
    App.query_embeddings) unless context.embed_without_resident; one served by a resident
    llmem, whose model is loaded, embeds."""
    if getattr(served, "streams", None) is None:
        app.in_hook = True  # and a server store's short connect timeout: it fails open in budget
        try:
            app.query_embeddings = bool(app.config.context.embed_without_resident)
        except Exception:  # a broken config is reported by the command itself
            app.query_embeddings = False


# ---- hooks -----------------------------------------------------------------------------

def _hook_logging(app):
    """Send llmem's log to hooks.log and keep stderr for the hook's one line; returns an undo."""
    if getattr(served, "streams", None) is not None:  # the resident logs to hooks.log already
        return (lambda: None), served.log_path
    from ..logconfig import file_handler as own_log_file
    from ..paths import default_paths, ensure_private_dir

    root = logging.getLogger("llmem")
    quiet = [(h, h.level) for h in root.handlers if getattr(h, "_llmem_stderr", False)]
    for handler, _ in quiet:
        handler.setLevel(logging.CRITICAL + 1)
    old_level = root.level
    try:
        settings = app.config.logging
        log_dir = app.config.log_dir
    except Exception:  # a broken config is reported by the hook itself; log where we can
        from ..config import Config

        settings, log_dir = Config().logging, default_paths().log_dir
    file_handler = None
    try:
        ensure_private_dir(log_dir)
        # Rotated by hand: logging.handlers (and the socket module it pulls in) costs a
        # hook ~10 ms of start-up on every agent turn.
        _rotate_if_big(log_dir / HOOK_LOG, settings.max_bytes, settings.backups)
        level = getattr(logging, settings.level, logging.INFO)
        # Opened without following a planted symlink; a failed write (full disk) costs the line only.
        file_handler = own_log_file(log_dir / HOOK_LOG, level)
        root.addHandler(file_handler)
        root.setLevel(min(old_level or logging.WARNING, level))
    except OSError as exc:  # e.g. a symlink planted as hooks.log: refused, and said once per hook
        _echo(f"llmem hook: not logging to {log_dir / HOOK_LOG}: {exc.strerror or exc}", err=True)
        file_handler = None

    def undo():
        if file_handler is not None:
            root.removeHandler(file_handler)
            file_handler.close()
        root.setLevel(old_level)
        for handler, level in quiet:
            handler.setLevel(level)

    return undo, (log_dir / HOOK_LOG) if file_handler else None


def _rotate_if_big(path, max_bytes: int, backups: int) -> None:
    """hooks.log → hooks.log.1 → … once it passes max_bytes (a race between hooks is harmless)."""
    import os

    try:
        if path.stat().st_size < max_bytes:
            return
        for number in range(backups - 1, 0, -1):
            older = path.with_name(f"{path.name}.{number}")
            if older.exists():
                os.replace(older, path.with_name(f"{path.name}.{number + 1}"))
        if backups > 0:
            os.replace(path, path.with_name(f"{path.name}.1"))
        else:
            path.unlink()
    except OSError:
        pass


def _read_hook_input(argument: str | None = None) -> dict:
    """The JSON an agent hook gets: the PAYLOAD argument when given (Codex's `notify` appends
    it to the command), else stdin (Copilot CLI, Codex hooks); {} when there is none."""
    if argument is not None:
        text, where = argument, "the PAYLOAD argument"
    elif getattr(served, "streams", None) is not None:
        text, where = served.streams[0] or "", "the hook input on stdin"
    elif sys.stdin is None or sys.stdin.isatty():
        return {}
    else:
        text, where = sys.stdin.read(), "the hook input on stdin"
    if not text.strip():
        return {}
    from ..errors import UsageError

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{where} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where} is not a JSON object")
    return data


def _hook_agent(adapter: str | None):
    """The unit that reads the hook's JSON: the agent `--adapter` names (as every hook
    `llmem install` writes does), else one that reads nothing from it."""
    from ..adapters.agent import Agent
    from ..adapters.registry import agent_names, get_agent

    return get_agent(adapter) if adapter in agent_names() else Agent()


def _summary(result: dict) -> str:
    steps = ", ".join(f"{name} {info['result'] if isinstance(info['result'], str) else 'done'}"
                      for name, info in result["steps"].items())
    return f"{result['kind']} {result['session_id']}: {steps}"


def _one_line(value, limit: int = 300) -> str:
    from ..errors import LlmemError

    if isinstance(value, LlmemError):
        text = value.message + (f" (hint: {value.hint})" if value.hint else "")
    elif isinstance(value, Exception):
        text = f"{value.__class__.__name__}: {value}"
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@click.command()
@click.option("--type", "kind", type=click.Choice([kind.value for kind in EventKind]), required=True, help="The lifecycle moment.")
@click.option("--session-id", help="The agent's session id (default: sessionId of the JSON on stdin).")
@click.option("--project", type=PROJECT, help="Project (a folder: its repository) of the session (default: the transcript's, or cwd on stdin).")
@click.option("--sync", is_flag=True, help="Run the work inline and wait for it (default: enqueue for the worker).")
@click.option("--detach", is_flag=True, help="Return at once; the work runs in a background process.")
@click.option("--model", help="LLM model for extraction and introspection (default: llm.model).")
@click.option("--base-url", callback=http_url, help="LLM server URL (default: llm.base_url).")
@click.option("--adapter", type=ADAPTER_CHOICE, help="Read the session with this adapter (default: session.adapter).")
@click.option("--format", "fmt", type=hook_format_choice(), default="text", show_default=True,
              help="text, json, or an agent's name: answer as that agent's hooks expect (the session-start "
              "context in the JSON it reads; nothing for other events).")
# Internal: the session's run lock a worker-less hook hands to the process it detaches.
@click.option("--run-lock-fd", type=bounded_int(3, 2**31 - 1), hidden=True)
@click.argument("payload", required=False)
@click.pass_context
def hook(ctx, kind, session_id, project, sync, detach, model, base_url, adapter, fmt, run_lock_fd, payload):
    """Run a session lifecycle hook. Fails open: errors are logged, exit code is 0.

    PAYLOAD: the hook's JSON as one argument instead of stdin (Codex's `notify` appends it).
    """
    from ..paths import AGENT_CALL_ENV, is_agent_call_dir

    if os.environ.get(AGENT_CALL_ENV):
        return  # the agent runs for llmem itself (llm.provider: agent): no session of the user's
    app = ctx.obj
    fmt = _answer_format(fmt)
    if kind == "created":
        app.reads_only()  # SessionStart injects the context even on a full disk
    _lexical_when_fresh(app)
    undo, log_path = _hook_logging(app)
    turn_began = None
    try:
        try:
            if not session_id:
                hook_input = _read_hook_input(payload)
                if is_agent_call_dir(hook_input.get("cwd")):
                    log.debug("hook %s in llmem's own agent call: nothing to do", kind)
                    return
                if hook_input.get("agent_id"):
                    # Claude Code or Codex fires the hook inside a subagent: the subagent is not
                    # the session, and what it finds reaches the parent's transcript
                    # (ARCHITECTURE.md, "Subagents are not users").
                    log.debug("hook %s inside subagent %s: nothing to do", kind, hook_input["agent_id"])
                    return
                session_id = (hook_input.get("sessionId") or hook_input.get("session_id")
                              or hook_input.get("thread-id"))
                agent = _hook_agent(adapter)
                if isinstance(session_id, str) and agent.hook_without_transcript(hook_input, session_id, app.config):
                    log.debug("hook %s: %s keeps no transcript of %s: nothing to do", kind, agent.label, session_id)
                    return
                turn_began = agent.hook_turn_began(hook_input)
                if not project and isinstance(hook_input.get("cwd"), str) and hook_input["cwd"]:
                    from ..paths import project_key

                    project = project_key(hook_input["cwd"])
            if not session_id:
                from ..errors import UsageError

                raise UsageError("no session id: pass --session-id, or the hook's JSON on stdin or as PAYLOAD")
            from ..adapters.base import validate_session_id

            validate_session_id(session_id)
            from ..pipeline.routing import HookCall, dispatch_hook
            from .queueing import submit_event

            call = HookCall(kind, session_id, project=project, adapter=adapter, model=model,
                            base_url=base_url, turn_began=turn_began)
            config_path = ctx.find_root().params.get("config_path")
            result = dispatch_hook(app, call, submit=submit_event, sync=sync, detach=detach,
                                   config_path=config_path, run_lock_fd=run_lock_fd,
                                   compaction_block=_prints_block(kind, fmt))
        except Exception as exc:
            log.error("hook %s %s failed: %s", kind, session_id or "-", exc,
                      exc_info=not _is_expected(exc))
            where = f" (log: {log_path})" if log_path else ""
            _echo(f"llmem hook {kind}: {_one_line(exc)}{where}", err=True)
            if kind == "created":
                _print_result(kind, _from_cache(project, {"errors": [str(exc)]}), fmt)
            return
        if kind == "created":
            result = _from_cache(project, result)
        if result["errors"]:
            more = f" (+{len(result['errors']) - 1} more)" if len(result["errors"]) > 1 else ""
            where = f"; log: {log_path}" if log_path else ""
            _echo(f"llmem hook {kind}: {_one_line(result['errors'][0])}{more}{where}", err=True)
        from ..pipeline.routing import status_line

        status = status_line(result)
        if status:
            _echo(f"llmem hook {kind}: {status}", err=True)
        _print_result(kind, result, fmt)
    finally:
        undo()


def _from_cache(project: str | None, result: dict) -> dict:
    """A session start's block is kept for the project; one that could not be built (the
    store unreachable, or unreadable) is the project's last kept block."""
    from ..context_cache import last_block, remember_block

    if result.get("context"):
        remember_block(project, result["context"])
        return result
    cached = last_block(project) if result.get("errors") else None
    if cached:
        log.warning("session start: the context block could not be built; the last one kept for "
                    "this project is given")
        _echo("llmem hook created: the context is the last one kept on this machine", err=True)
        return {**result, "context": cached}
    return result


def _is_expected(exc: Exception) -> bool:
    from ..errors import LlmemError

    return isinstance(exc, LlmemError)


def _prints_block(kind: str, fmt: str) -> bool:
    """Whether _print_result prints the context block of a `kind` hook in this format.

    Claude Code and Codex ignore what a PreCompact hook prints, and Copilot's preCompact reads
    no answer: building the compaction block for them (~100 ms) would only delay the agent.
    OpenCode's plugin reads it from the text format.
    """
    return fmt in ("text", "json") or kind == "created"


def _print_agent_reply(unit, kind: str, context: str | None) -> None:
    """The unit's JSON answer, its context cut to what the agent carries unspilled. Only a
    SessionStart answers with context: context.py (~10 ms to import) is loaded for it alone,
    since Stop fires every turn."""
    if kind == "created" and context and unit.context_cap:
        from ..context import cut_block

        context = cut_block(context, unit.context_cap)
    reply = unit.hook_reply(kind, context)
    if reply:
        _echo(json.dumps(reply, ensure_ascii=False))


def _ran_inline(result: dict) -> bool:
    from ..pipeline.routing import status_line

    return status_line(result) is None


def _answer_format(fmt: str) -> str:
    """text, json, or the name of an agent that answers in a format of its own: `--format`
    naming an agent whose hooks read text (OpenCode's plugin) is text."""
    if fmt in ("text", "json"):
        return fmt
    from ..adapters.registry import get_agent

    return get_agent(fmt).hook_format or "text"


def _print_result(kind: str, result: dict, fmt: str) -> None:
    try:
        if fmt not in ("text", "json"):
            from ..adapters.registry import get_agent

            _print_agent_reply(get_agent(fmt), kind, result.get("context"))
        elif fmt == "json":
            _echo(json_text(result))
        elif kind in ("created", "compacting"):
            if result.get("context"):  # stdout is the agent's input: the block or nothing
                _echo(result["context"])
        elif _ran_inline(result):  # queued or detached: the line on stderr says so
            _echo(_summary(result))
    except BrokenPipeError:  # the agent stopped reading: nothing to fail about
        pass
