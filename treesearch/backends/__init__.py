"""What a search asks of a model backend (the protocol), the call merger for many searches, and the
OpenAI-compatible server engine with its HTTP client. Needs no torch."""
