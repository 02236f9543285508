"""What problems and strategies share: the Problem contract, the thought tree, the operations a strategy
calls.

Imports only `treesearch.common` and `treesearch.viz`; never the engine, the cache or a model."""
