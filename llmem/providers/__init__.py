"""The services llmem calls out to: embedders (Ollama, OpenAI-compatible, local) and the chat LLM."""
