"""Which engine a benchmark run uses: our local engine over the loaded model, or an OpenAI-compatible
server (the `server` mode: `treesearch bench game24 --modes exact,server --base-url URL`).

The workloads take "a model" and build their engine with `engine_for`, so the same workload code
runs on both: a `LanguageModel` gets a fresh local `Engine` under the mode's config; a backend
(`treesearch.backends.server.ServerEngine`) is used as it is, its counters reset. The server mode's config
is plain exact sharing: the server's own prefix cache does the sharing, and its counters come
from the server's `usage` (see `treesearch.backends.server`).
"""

from __future__ import annotations

from typing import Any

from treesearch.common.config import RKSCConfig, Sampling


def engine_for(model: Any, config: RKSCConfig) -> Any:
    """The engine a run uses: a new local Engine for a LanguageModel, else the backend itself
    (counters reset by `new_search`)."""
    from treesearch.models.load import LanguageModel

    if isinstance(model, LanguageModel):
        from treesearch.engine.local import Engine

        return Engine(model, config)
    model.new_search()
    return model


def server_notes(backend: Any) -> list[str]:
    """What the server mode's row means."""
    return [
        f"ServerEngine {backend.base_url} model {backend.model}: one HTTP request per row, at most "
        f"{backend.max_concurrency} at a time",
        "server counters from usage: prefill = prompt - cached tokens, reused = cached tokens (0 where the "
        "server does not report them, e.g. llama.cpp), decode = completion tokens - rows; no unique tokens "
        "or KV bytes",
        "sampled decisions (temperature > 0) differ from ours by RNG, not by model: compare agreement on "
        "greedy workloads (game24)",
    ]


def warm_up_server(backend: Any) -> None:
    """One small generate + score call (connection, the server's own warm-up) before timing."""
    backend.generate(["Warm up: count 1 2 3"] * 2, Sampling(max_new_tokens=4))
    backend.score(["Warm up: is 2 + 2 = 4? Reply yes or no.\nReply:"], [" yes", " no"])
    backend.new_search()
