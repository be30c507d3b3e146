"""Turning transcripts into memories: extraction, the no-LLM heuristics, the error taxonomy, introspection."""
