"""The `llmem` console entry point and `python -m llmem`: a hook, OpenCode's context or a search
is answered by a resident llmem when one is alive (hookclient.py, stdlib only), anything else
and any failure by the click CLI."""

import sys

# The commands on the paths someone waits for (every agent turn, a search, an MCP server's
# start), which only ever open the configured store and queue.
_LEAN_COMMANDS = {"hook", "context", "search", "mcp"}
# huey imports redis-py at its own import when installed, used or not (~40 ms of CPU in a
# fresh process here, 2× `python -c pass`): left out of a process whose queue is not on
# Redis. (peewee's drivers are kept out of its import in llmem/__init__.py, for every process.)
_QUEUE_DRIVERS = ("redis",)


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C while the CLI's modules still load (its first ~0.1 s), before click and the
        # commands handle it: a quiet stop with the shell's code for SIGINT, not a traceback.
        sys.exit(130)


def _main(argv: list[str] | None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    from llmem.hookclient import FORWARDED, run_hook  # stdlib only, and small

    if args[:1] and args[0] in FORWARDED:
        try:
            if args[0] == "mcp":  # an agent's MCP server, relayed to a resident (stdlib only too)
                from llmem.mcprelay import relay

                answered = relay(args)
            else:
                answered = run_hook(args)
        except Exception:  # whatever went wrong here, the CLI still answers the hook
            answered = False
        if answered:
            sys.exit(0)
    if argv is None:  # a process of its own (tests call main() in theirs, with argv)
        skip_unused_drivers(args)
    from llmem.cli import main as cli_main

    if argv is None and args[:1] and args[0] in FORWARDED and "--sync" not in args:
        _exit_when_done(cli_main, args)
    cli_main(args)


def _exit_when_done(cli_main, args: list[str]) -> None:
    """Run the CLI, then end the process at once: tearing down an interpreter that imported
    the CLI, peewee and the store's models costs a hook ~25 ms of CPU (≈1× `python -c pass`)
    after its answer is out. Only for the per-turn commands, whose work is done when the CLI
    returns (their store is closed by then; `--sync`, a whole extraction, exits normally);
    stdio and the log handlers are flushed first."""
    import os

    code: int = 0
    try:
        cli_main(args)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # sys.exit("message"): said on stderr, exit 1, as the interpreter does
            print(exc.code, file=sys.stderr)
            code = 1
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the agent stopped reading: nothing to fail about
            pass
    os._exit(code)


def _command_and_config(args: list[str]) -> tuple[str | None, str | None]:
    """The command `llmem args` runs and its --config (None: not given), read past the global
    options the way click will (cli/__init__.py `cli`)."""
    config_path, index = None, 0
    while index < len(args):
        word = args[index]
        if word in ("-v", "--verbose"):
            index += 1
        elif word == "--config":
            config_path = args[index + 1] if index + 1 < len(args) else None
            index += 2
        elif word.startswith("--config="):
            config_path = word.split("=", 1)[1]
            index += 1
        elif word.startswith("-"):
            return None, None  # --help, --version, an unknown option: the CLI says
        else:
            return word, config_path
    return None, None


def skip_unused_drivers(args: list[str]) -> list[str]:
    """Keep huey from importing the Redis driver in a process of `_LEAN_COMMANDS` whose
    config names no Redis queue: it is marked absent in sys.modules before anything imports
    it, as if it were not installed. Returns the drivers left out. A config that does not load
    leaves everything as it is (the CLI reports it)."""
    command, config_path = _command_and_config(args)
    if command not in _LEAN_COMMANDS:
        return []
    try:
        import logging

        from llmem.config import load_config

        # Its warnings (an unknown key) are the CLI's to say, once, when it loads the config.
        config_log = logging.getLogger("llmem.config")
        was_disabled, config_log.disabled = config_log.disabled, True
        try:
            config = load_config(config_path)
        finally:
            config_log.disabled = was_disabled
        on_redis = bool(config.queue.url)
    except Exception:
        return []
    skipped = []
    for name in () if on_redis else _QUEUE_DRIVERS:
        if name not in sys.modules:
            sys.modules[name] = None  # `import name` raises ImportError, as when absent
            skipped.append(name)
    return skipped


if __name__ == "__main__":
    main()
