"""The `llmem` console entry point and `python -m llmem`: a hook (or OpenCode's context) is
answered by a resident llmem when one is alive (hookclient.py, stdlib only), anything else and
any failure by the click CLI."""

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["hook"], ["context"]):
        from llmem.hookclient import run_hook

        try:
            answered = run_hook(args)
        except Exception:  # whatever went wrong here, the CLI still answers the hook
            answered = False
        if answered:
            sys.exit(0)
    from llmem.cli import main as cli_main

    cli_main(args)


if __name__ == "__main__":
    main()
