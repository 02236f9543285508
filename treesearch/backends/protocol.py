"""The engine interface: what a search asks of a model backend, and what it gets back.

`Backend` is the protocol the Searcher and the verifier call. Two backends implement it: the
local engine (`treesearch.engine.local.Engine`: torch + transformers, with KV sharing, ASKS, CGEE
Level 2 and cache budgets) and `treesearch.backends.server.ServerEngine` (any OpenAI-compatible server;
its own prefix cache does the sharing). A backend names the features it has in `features`; a
config asking for one it lacks fails at once through `require_features`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from treesearch.common.errors import ConfigError

# Features that need the model's insides (a local engine has them all).
FEATURES = ("asks", "cgee_layer_exit", "cache_budget", "kv_map")

Handle = Any  # where a context ends in a backend's cache (local engine: (Segment, used tokens)); opaque


@dataclass
class Generation:
    """One generated continuation."""

    text: str  # decoded output, cut before the first stop string
    token_ids: list[int]  # every generated token id (the stop string's tokens included)
    logprobs: list[float]  # log p of each generated token under the model (untempered)
    finish: str  # "stop", "eos" or "length"
    prompt_tokens: int
    reused_tokens: int
    handle: Handle | None = None  # where the context (prompt + fed-back tokens) ends in the cache
    asks_ref: int | None = None  # ASKS: index (in this call's prompts) of the prompt whose K/V it attached to
    asks_sigma: float | None = None  # ASKS gate value when the prompt had a reference (attached or not)
    offsets: list[tuple[int, int]] | None = None  # character range of each token in text (servers give it)

    @property
    def confidence(self) -> float:
        """Geometric-mean probability of the generated tokens."""
        return math.exp(sum(self.logprobs) / len(self.logprobs)) if self.logprobs else 0.0


@dataclass
class Score:
    """Probabilities of a set of labels after a prompt."""

    probs: dict[str, float]  # renormalised over the labels
    raw: dict[str, float]  # probability of each label (its token sequence) over the whole vocabulary
    layers_run: int
    reused_tokens: int = 0
    handle: Handle | None = None
    asks_ref: int | None = None  # ASKS: index (in this call's prompts) of the prompt whose K/V it attached to
    asks_sigma: float | None = None


ExitRule = Callable[[int, Any], Any]  # (layer, label probs [B, n_labels]) -> bool or bool tensor [B]


@runtime_checkable
class Backend(Protocol):
    """The calls a search makes of an engine. Owners are thought-tree node ids: a backend with a
    cache keeps what an owner holds until `release(owner)`; one without treats them as no-ops."""

    name: str  # the model's name (CGEE calibrations are looked up by it)
    num_layers: int  # layers of a full scoring pass (a server reports 1)
    features: frozenset[str]  # which of FEATURES this backend has
    stats: Any  # treesearch.common.stats.Stats of the current search

    def generate(
        self,
        prompts: Sequence[str],
        sampling: Any = None,
        *,
        seeds: Sequence[int] | None = None,
        owners: Sequence[Hashable] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt (a prompt repeated is sampled again with its own seed)."""

    def score(
        self,
        prompts: Sequence[str],
        labels: Sequence[str],
        *,
        owners: Sequence[Hashable] | None = None,
        exit_rule: ExitRule | None = None,
    ) -> list[Score]:
        """Probability of each label right after each prompt."""

    def tokenize(self, text: str) -> list[int]:
        """Token ids of text as this backend's model reads it."""

    def token_offsets(self, generation: Generation) -> list[tuple[int, int]]:
        """Character range in generation.text of each generated token."""

    def remember_generation(self, prompt: str, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        """prompt + the generation's text has ids prompt_ids + token_ids (for chain-style prompts)."""

    def new_search(self) -> None:
        """Start the counters and ownership of a new search."""

    def set_priority(self, fn: Callable[[Hashable], float | None] | None) -> None:
        """Owner -> eviction priority (RSBCM omega); backends without a budget ignore it."""

    def acquire(self, owner: Hashable, handle: Handle | None) -> None: ...

    def release(self, owner: Hashable) -> None: ...

    def pin_owner(self, owner: Hashable) -> None: ...


def require_features(backend: Backend, config: Any) -> None:
    """Fail at once, in one line, when the config asks for something the backend cannot do; the
    message says what to change (or to use the local engine, which has every feature)."""
    wanted = []
    if getattr(config, "kv_sharing", None) == "asks":
        wanted.append(("asks", "kv_sharing='asks'", "use kv_sharing='exact' (--kv exact)"))
    if getattr(config, "cache_budget", None) is not None:
        wanted.append(("cache_budget", "cache_budget", "leave cache_budget unset (--cache-budget)"))
    if getattr(config, "cgee", False) and getattr(config, "min_layer", None) not in (None,):
        wanted.append(("cgee_layer_exit", "cgee with min_layer (CGEE Level 2)", "leave min_layer unset"))
    missing = [(what, fix) for feat, what, fix in wanted if feat not in backend.features]
    if missing:
        has = ", ".join(sorted(backend.features)) or "none of " + ", ".join(FEATURES)
        raise ConfigError(
            f"{type(backend).__name__} does not support {', '.join(w for w, _ in missing)} (it has "
            f"{has}): {'; '.join(f for _, f in missing)}, or run the local engine "
            "(treesearch.load_model()), which has them all"
        )
