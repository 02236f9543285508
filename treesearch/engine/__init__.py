"""The local engine: the only code that runs the model (forward, the fast decode step, labels, tokens,
the per-search ledger). Imports cache, policies, models and the backend protocol."""
