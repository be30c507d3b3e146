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


class LlmemGroup(click.Group):
    """Lists commands in the order they were added (the README's order), not alphabetically."""

    def list_commands(self, ctx):
        return list(self.commands)


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
    _setup_stderr_logging(verbose)
    ctx.obj = App(config_path=config_path)
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


def _register() -> None:
    from . import admin, memory, search

    for command in (
        admin.init, memory.add, memory.get, memory.list_memories, memory.update,
        memory.invalidate, memory.delete, search.search, admin.stats, admin.export,
        admin.import_memories, admin.metrics, admin.embed, admin.doctor, admin.config_group,
    ):
        cli.add_command(command)
    from . import dream

    for command in (dream.dream_group, dream.promote, dream.promote_explain, dream.backfill):
        cli.add_command(command)
    from . import session

    for command in (session.context, session.hook, session.install_group):
        cli.add_command(command)
    from . import pipeline

    for command in (pipeline.run, pipeline.watch, pipeline.worker, pipeline.enqueue,
                    pipeline.queue, pipeline.logs):
        cli.add_command(command)
    install = cli.commands.get("install")
    if install is not None:
        install.add_command(pipeline.install_systemd)

    from . import introspect

    for command in (introspect.introspect, introspect.learn, introspect.track_review):
        cli.add_command(command)

_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn every failure into a message and an exit code."""
    try:
        cli.main(args=argv, prog_name="llmem", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except LlmemError as exc:
        if _state["verbose"]:
            import traceback

            traceback.print_exc()
        click.echo(f"Error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"  hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:
        if _state["verbose"]:
            import traceback

            traceback.print_exc()
        click.echo(f"Error: unexpected failure: {exc.__class__.__name__}: {exc}", err=True)
        click.echo("  hint: run again with -v for the traceback", err=True)
        sys.exit(1)
    sys.exit(0)
