"""Session events from file change to handled event: the watcher, the event rows, their handlers, detached runs."""
