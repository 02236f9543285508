"""What a search asks of a model backend (the protocol) and the OpenAI-compatible server engine
with its HTTP client. Needs no torch."""
