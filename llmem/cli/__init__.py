"""The llmem command line: a thin click layer over the library.

Only click and the stdlib are imported at start-up; each command imports what it needs, so
`llmem --help` and hooks start fast. Library errors are turned into messages here, once.
"""

from __future__ import annotations

import logging
import sys

import click

from .. import __version__
from ..errors import LlmemError

_state = {"verbose": False}


# Every command, in the order `llmem --help` lists them: name -> (module, attribute).
# Modules are imported only when their command runs (or --help lists them), so a hook pays
# for its own command alone.
COMMANDS = {
    "init": ("admin", "init"),
    "add": ("memory", "add"),
    "get": ("memory", "get"),
    "list": ("memory", "list_memories"),
    "update": ("memory", "update"),
    "invalidate": ("memory", "invalidate"),
    "correct": ("memory", "correct"),
    "delete": ("memory", "delete"),
    "history": ("memory", "history"),
    "search": ("search", "search"),
    "stats": ("admin", "stats"),
    "export": ("exchange", "export"),
    "import": ("exchange", "import_memories"),
    "import-native": ("exchange", "import_native"),
    "share": ("team", "share"),
    "store": ("team", "store_group"),
    "metrics": ("admin", "metrics"),
    "embed": ("admin", "embed"),
    "doctor": ("admin", "doctor"),
    "config": ("admin", "config_group"),
    "context": ("session", "context"),
    "hook": ("session", "hook"),
    "install": ("install", "install_group"),
    "introspect": ("introspect", "introspect"),
    "learn": ("introspect", "learn"),
    "track-review": ("introspect", "track_review"),
    "mcp": ("mcp", "mcp"),
    "run": ("pipeline", "run"),
    "watch": ("pipeline", "watch"),
    "worker": ("pipeline", "worker"),
    "enqueue": ("pipeline", "enqueue"),
    "queue": ("pipeline", "queue"),
    "logs": ("pipeline", "logs"),
    "dream": ("dream", "dream_group"),
    "promote": ("dream", "promote"),
    "promote-explain": ("dream", "promote_explain"),
    "backfill": ("dream", "backfill"),
    "ui": ("ui", "ui"),
}


class LlmemGroup(click.Group):
    """Loads each command's module on first use; lists commands in the table's order."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name in self.commands:
            return self.commands[name]
        if name not in COMMANDS:
            return None
        import importlib

        module_name, attribute = COMMANDS[name]
        command = getattr(importlib.import_module(f"{__name__}.{module_name}"), attribute)
        if name == "install":  # the pipeline adds its systemd units to the agents' installers
            from .pipeline import install_systemd

            command.add_command(install_systemd)
        self.add_command(command, name)
        return command


@click.group(cls=LlmemGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmem")
@click.option("-v", "--verbose", is_flag=True, help="Log more and show tracebacks on errors.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="LLMEM_CONFIG",
              help="Config file (default: ~/.config/llmem/config.yaml or $LLMEM_HOME/config.yaml).")
@click.pass_context
def cli(ctx, verbose, config_path):
    """llmem: local-first long-term memory for AI coding agents."""
    from ..app import App

    _state["verbose"] = verbose
    # Hooks fail open: whatever escapes the hook itself (its log on a full disk, closing the
    # store) must not fail the agent's turn either.
    _state["fail_open"] = ctx.invoked_subcommand == "hook"
    _setup_stderr_logging(verbose)
    ctx.obj = _state["app"] = App(config_path=config_path)
    ctx.call_on_close(ctx.obj.close)


def _setup_stderr_logging(verbose: bool) -> None:
    root = logging.getLogger("llmem")
    if any(getattr(h, "_llmem_stderr", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler._llmem_stderr = True
    handler.setFormatter(logging.Formatter("llmem: %(levelname)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)




def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn every failure into a message and an exit code."""
    import os

    # Whatever llmem creates (stores, queue, WAL files, logs, reports) is the user's alone.
    os.umask(0o077)
    _state.update(app=None, fail_open=False)  # tests run main() many times in one process
    try:
        cli.main(args=argv, prog_name="llmem", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        # A hook's bad command line (a stale hook after an upgrade) fails open too: for Claude
        # Code and Codex, exit 2 is a blocking error fed back to the model on every turn.
        if _state["fail_open"] or _names_the_hook(exc):
            _fail_open(exc)
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:
        if _state["fail_open"]:
            _fail_open(exc)
        if isinstance(exc, LlmemError):
            _fail(exc)
        translated = _store_failure(exc)
        if translated is not None:
            _fail(translated)
        if _state["verbose"]:
            import traceback

            traceback.print_exc()
        click.echo(f"Error: unexpected failure: {exc.__class__.__name__}: {exc}", err=True)
        click.echo("  hint: run again with -v for the traceback", err=True)
        sys.exit(1)
    sys.exit(0)


def _fail_open(exc: Exception) -> None:
    """One stderr line and exit 0: a hook's failure never fails the agent."""
    try:
        if _state["verbose"]:
            import traceback

            traceback.print_exc()
        if isinstance(exc, click.ClickException):
            text = (f"bad command line: {exc.format_message()} "
                    "(a hook from another version? run `llmem install <agent>` again)")
            _log_to_hooks_log(text)  # the agent may never show stderr: `llmem logs` will
        else:
            said = exc if isinstance(exc, LlmemError) else _store_failure(exc)
            text = said.message if said is not None else f"{exc.__class__.__name__}: {exc}"
        click.echo(f"llmem hook failed, the agent goes on: {' '.join(text.split())[:300]}", err=True)
    except Exception:  # stderr itself is gone: nothing more to say
        pass
    sys.exit(0)


def _log_to_hooks_log(text: str) -> None:
    """A line in hooks.log, as the hook itself logs its failures (best effort)."""
    app = _state.get("app")
    if app is None:
        return
    from .session import _hook_logging

    undo, _ = _hook_logging(app)
    try:
        logging.getLogger("llmem.hooks").error("hook failed: %s", text)
    finally:
        undo()


def _names_the_hook(exc: click.ClickException) -> bool:
    """Whether a usage error was raised while parsing `llmem hook`'s own arguments."""
    ctx = getattr(exc, "ctx", None)
    return ctx is not None and ctx.info_name == "hook"


def _fail(exc: LlmemError) -> None:
    if _state["verbose"]:
        import traceback

        traceback.print_exc()
    click.echo(f"Error: {exc.message}", err=True)
    if exc.hint:
        click.echo(f"  hint: {exc.hint}", err=True)
    sys.exit(exc.exit_code)


def _store_failure(exc: Exception) -> LlmemError | None:
    """A SQLite error met while the command ran, said as what it means for the store."""
    from ..errors import failed_in_queue, queue_failure, store_failure

    app = _state.get("app")
    try:
        db_path = app.config.db_path if app is not None else None
        queue_path = app.config.queue_path if app is not None else None
    except Exception:  # the config itself is broken: that was reported already
        db_path = queue_path = None
    if queue_path is not None and failed_in_queue(exc):
        return queue_failure(exc, queue_path)  # queue.db, not memory.db
    return store_failure(exc, db_path) if db_path is not None else None
