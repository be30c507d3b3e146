"""One module per agent, each defining `AGENT` (adapters/agent.py `Agent`); registry.py lists them."""
