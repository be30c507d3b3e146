"""`python -m llmem` runs the CLI."""

from llmem.cli import main

main()
