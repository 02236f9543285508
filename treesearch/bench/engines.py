"""Which engine a benchmark run uses: our local engine over the loaded model, or an OpenAI-compatible
server (the `server` mode: `treesearch bench game24 --modes exact,server --base-url URL`).

The workloads take "a model" and build their engine with `engine_for`, so the same workload code
runs on both: a `LanguageModel` gets a fresh local `Engine` under the mode's config; a backend
(`treesearch.backends.server.ServerEngine`) is used as it is, its counters reset. The server mode's config
is plain exact sharing: the server's own prefix cache does the sharing, and its counters come
from the server's `usage` (see `treesearch.backends.server`). A server run also records the client's
times (`timed_run`: the run's time outside any HTTP round trip, llama.cpp's own `timings`), which
the report prints under the table (`server_times_lines`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from treesearch.bench.results import RunResult
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
        "server does not report them, e.g. llama-cpp-python), decode = completion tokens - rows; no unique "
        "tokens or KV bytes",
        "sampled decisions (temperature > 0) differ from ours by RNG, not by model: compare agreement on "
        "greedy workloads (game24)",
    ]


def warm_up_server(backend: Any) -> None:
    """One small generate + score call (connection, the server's own warm-up) before timing."""
    backend.generate(["Warm up: count 1 2 3"] * 2, Sampling(max_new_tokens=4))
    backend.score(["Warm up: is 2 + 2 = 4? Reply yes or no.\nReply:"], [" yes", " no"])
    backend.new_search()


def timed_run(backend: Any, run: Callable[[], RunResult]) -> RunResult:
    """run(), and for a server backend its client times over the run in `RunResult.server`
    (`treesearch.backends.request_clock.outside`: HTTP round trips, the time outside them, llama.cpp's
    timings)."""
    times = getattr(backend, "times", None)
    if times is None:
        return run()
    from treesearch.backends.request_clock import outside

    before = times()
    result = run()
    result.server = outside(times().since(before), result.wall_s)
    return result


def server_times_lines(modes: dict[str, dict]) -> list[str]:
    """One line per mode with client times (server modes): our time outside the HTTP round trips, and
    llama-server's own prompt / generation tokens per second beside the local engine's tokens."""
    lines = []
    ours = next((e for n, e in modes.items() if n.startswith("exact") and e.get("computed_tokens")), None)
    for name, e in modes.items():
        t = e.get("server_times")
        if not t:
            continue
        share = t["outside_share"]
        line = (
            f"- {name}: {t['requests']} HTTP round trips, in flight {t['busy_s']:.2f} s of the run's "
            f"{t['wall_s']:.2f} s; outside them (our own code) {t['outside_s']:.2f} s = "
            f"{100 * share if share is not None else 0:.1f}% of the run"
            + (f", {t['outside_per_request_ms']:.2f} ms per request" if t["outside_per_request_ms"] else "")
        )
        if t["timed"]:
            line += (
                f"; llama-server's timings: prompt {t['prompt_n']} tokens at "
                f"{t['server_prompt_per_second'] or 0:.0f} tok/s, generation {t['predicted_n']} tokens at "
                f"{t['server_predicted_per_second'] or 0:.1f} tok/s (per request, as each slot reports), "
                f"{(t['prompt_n'] + t['predicted_n']) / t['wall_s'] if t['wall_s'] else 0:.0f} tokens "
                "evaluated per second of the run"
            )
        lines.append(line)
    if lines and ours is not None and ours.get("wall_s"):
        lines.append(
            f"- ours (exact): {ours['computed_tokens']} tokens computed (prefill + decode) = "
            f"{ours['computed_tokens'] / ours['wall_s']:.0f} per second of its run (the bench does not time "
            "prefill and decode apart)"
        )
    return ["", "Server client times:"] + lines if lines else []
