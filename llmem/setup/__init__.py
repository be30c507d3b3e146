"""Putting llmem on a machine: the agents' plugin and hooks files, systemd user units, doctor's checks."""
