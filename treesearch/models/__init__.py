"""Loading models: the default SmolLM2 GGUF, dummy-weight models of real shapes, the `LanguageModel`
wrapper, and the data they need (tokenizer, configs)."""
