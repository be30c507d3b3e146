"""`python -m workers [-w N]`: the huey consumer, same as `llmem worker`."""

import sys

from llmem.cli import main

main(["worker", *sys.argv[1:]])
