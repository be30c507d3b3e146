"""The huey side of llmem: the queue instance, thin task wrappers, periodic jobs, the consumer."""
