"""`ServerEngine`: the engine protocol (`treesearch.backends.protocol.Backend`) over an OpenAI-compatible
server's `/v1/completions` (vLLM, SGLang, llama.cpp). The search, tree, strategies, views and
bench stay ours; the server's own prefix cache does the exact sharing.

    from treesearch import Searcher, ServerEngine
    from treesearch.tasks.game24 import Game24
    engine = ServerEngine("http://127.0.0.1:8000/v1", "Qwen/Qwen2.5-7B-Instruct")
    result = Searcher(engine, Game24()).solve("4 5 6 10")

What each call sends (one HTTP request per row, sent concurrently, at most `max_concurrency` at a
time, so the server can batch them):
- generate: `prompt`, `max_tokens` = sampling.max_new_tokens, `temperature`, `top_p`, `stop`,
  `seed` (the row's own, so a sampled row is reproducible where the server honours seeds) and
  `logprobs=1`. Under greedy decoding the copies of one prompt in a call are one request whose
  answer serves every copy: greedy copies are identical, so this is what `n` = copies would
  give, without the repeated decoding (and vLLM refuses n > 1 under greedy). Sampled copies stay
  one request each, so that each keeps its own seed (one request with `n` would share one seed).
  Each Generation gets the server's per-token log-probabilities (`logprobs`, untempered on vLLM
  and llama.cpp) and each token's character range in its text (`offsets`), so CGEE Level 1 works
  per child (`Searcher` reads them through `token_offsets`). `token_ids` are the ids where the
  server gives them (llama.cpp's server), else empty: the OpenAI layout has token strings only
  (nothing in a search needs a server's ids). `finish` is "length", or "stop" where the server
  reports a stop string (vLLM: stop_reason; llama.cpp's server: the stop string's tokens left out
  of its logprobs), else "eos".
- score: `max_tokens=1`, `temperature=0`, `logprobs=top_logprobs` (default 20): the next token's
  top-k log-probabilities. A label's probability is that of its first token (the local engine
  scores whole label sequences), found in the top-k by the token's text (llama.cpp's server reads
  `logprobs` as its `n_probs`). A label whose first token is not in the top-k gets the floor
  probability min(`label_floor`, smallest top-k probability) (default floor 1e-6: never above a
  listed token), counted in `stats.label_floor_hits`; `Score.probs` is renormalised
  over the labels, so it is always a distribution.
Sampling is plain temperature / top-p, as in the local engine. llama.cpp servers default to more
(top-k 40, min-p 0.05, llama-cpp-python a repeat penalty of 1.1, which changes greedy output), so
when `/v1/models` says the server is llama.cpp (`owned_by` "llamacpp", or llama-cpp-python's "me"),
neutral values are sent (`LLAMA_CPP_NEUTRAL`), and llama.cpp's own server (`llama-server`) also gets
`cache_prompt` (each slot keeps its prompt's K/V for the next request that shares the prefix);
`extra_body` adds or overrides fields of every request. Tokenizing uses the server's own endpoint
(llama.cpp and vLLM: /tokenize, see `server_tokens`).

Counters (`stats`, from each answer's `usage`; one request = one model call):
- prefill_tokens = usage.prompt_tokens - cached; reused_tokens = cached, where cached =
  usage.prompt_tokens_details.cached_tokens (vLLM with prefix caching, SGLang and llama-server
  report it; llama-cpp-python does not, so there everything counts as prefill);
- decode_tokens = usage.completion_tokens - choices (the last token of a row is never fed back, as
  in the local engine); generated_tokens = usage.completion_tokens; unique_tokens and peak_kv_bytes 0.
Features: none of `treesearch.backends.protocol.FEATURES` (no ASKS, CGEE Level 2, cache budgets or kv_map):
`Searcher` refuses a config asking for one at once. `num_layers` = 1 (a score is one full pass).
Times: `times()` gives the HTTP round trips' durations and llama.cpp's own `timings` (prompt and
generation tokens and milliseconds, summed over answers), see `request_clock`.
Answers are read in `treesearch.backends.completions`, tokens asked in `server_tokens`, the server
identified in `server_models`; `request_pool` sends the requests of a call concurrently.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from treesearch.backends import completions
from treesearch.backends.completions import check_prompt, label_probs, token_char_offsets
from treesearch.backends.protocol import Generation, Score
from treesearch.backends.request_clock import ClientTimes
from treesearch.backends.request_pool import RequestPool
from treesearch.backends.server_models import (
    LLAMA_CPP_NEUTRAL,
    LLAMA_CPP_OWNERS,
    first_model,
    list_models,
    request_defaults,
)
from treesearch.backends.server_tokens import TOKENIZE_ENDPOINTS, NoTokenizeEndpoint, ServerTokenizer
from treesearch.common.config import Sampling
from treesearch.common.errors import ConfigError, ProblemDefinitionError, ServerError
from treesearch.common.seeds import stable_seed
from treesearch.common.stats import Stats, distinct, per_row

__all__ = [
    "LLAMA_CPP_NEUTRAL",
    "LLAMA_CPP_OWNERS",
    "TOKENIZE_ENDPOINTS",
    "NoTokenizeEndpoint",
    "ServerEngine",
    "label_probs",
    "token_char_offsets",
]


class ServerEngine:
    """The engine protocol over an OpenAI-compatible server (see the module docstring).

    base_url: the server's root or /v1 URL. model: the served model's name (None: the first model
    `/v1/models` lists). api_key: sent as a bearer token (the CLI reads TREESEARCH_API_KEY or
    OPENAI_API_KEY). timeout: seconds to wait for a connection or an answer; retries / backoff:
    see `treesearch.backends.http`. max_concurrency: requests in flight at once. max_context: the
    model's context in tokens, if known: the Searcher then prunes branches that do not fit (it
    tokenizes their prompts through the server); None leaves the check to the server.
    logprobs: ask for each generated token's log-probability (children's confidences, CGEE Level
    1). False skips them: faster on llama-cpp-python, whose Python code sorts the whole vocabulary
    for every generated token to give them; every confidence is then 0 (Level 1 never skips)."""

    num_layers = 1
    features: frozenset[str] = frozenset()

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 300.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_concurrency: int = 8,
        top_logprobs: int = 20,
        label_floor: float = 1e-6,
        max_context: int | None = None,
        extra_body: dict | None = None,
        logprobs: bool = True,
    ) -> None:
        from treesearch.backends.http import ServerClient

        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency={max_concurrency}; use at least 1 request at a time")
        if not 0 < label_floor < 1:
            raise ConfigError(f"label_floor={label_floor}; use a small probability such as 1e-6")
        if top_logprobs < 1:
            raise ConfigError(
                f"top_logprobs={top_logprobs}; use at least 1 (20 is what vLLM allows by default)"
            )
        self.client = ServerClient(
            base_url,
            api_key=api_key,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_connections=max_concurrency,
        )
        self.base_url = base_url
        self.max_concurrency = max_concurrency
        self.top_logprobs = top_logprobs
        self.label_floor = label_floor
        self.max_context = max_context
        self.extra_body = dict(extra_body or {})
        self.logprobs = logprobs
        self.stats = Stats()
        self._lock = threading.Lock()
        self.pool = RequestPool(max_concurrency)
        self._calls = 0
        self._models: list[dict] | None = None
        self._sampling_extra: dict | None = None
        self.model = model if model is not None else first_model(self.client, self._list_models())
        self.tokens = ServerTokenizer(self.client, self.model)
        self.name = self.model  # CGEE calibrations are looked up by this name

    def __repr__(self) -> str:
        return f"ServerEngine({self.base_url!r}, {self.model!r})"

    def close(self) -> None:
        """Close the connections and the request threads (the engine cannot be used afterwards)."""
        self.pool.close()
        self.client.close()

    def __enter__(self) -> ServerEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- generate ------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str],
        sampling: Sampling | None = None,
        *,
        seeds: Sequence[int] | None = None,
        owners: Sequence[Hashable] | None = None,
        stats: Stats | Sequence[Stats] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt, the requests sent concurrently (see the module docstring).
        stats: where each prompt's usage is counted (one per prompt when searches share the call)."""
        sampling = sampling or Sampling()
        if not prompts:
            return []
        prompts = [check_prompt(p) for p in prompts]
        charge = per_row(len(prompts), stats, self.stats)
        self._extra()  # asks /v1/models once, before the requests go out in parallel
        self._calls += 1
        for st in distinct(charge):
            st.generate_calls += 1
        if seeds is None:
            seeds = [stable_seed(sampling.seed, self._calls, i) for i in range(len(prompts))]
        jobs: list[tuple[str, int, list[int]]] = []  # (prompt, seed, rows it answers)
        if sampling.temperature == 0:  # greedy copies of a prompt are identical: one request
            first: dict[str, int] = {}
            for i, p in enumerate(prompts):
                if p in first:
                    jobs[first[p]][2].append(i)
                else:
                    first[p] = len(jobs)
                    jobs.append((p, seeds[i], [i]))
        else:
            jobs = [(p, s, [i]) for i, (p, s) in enumerate(zip(prompts, seeds))]
        answers = self.pool.map(lambda job: self._complete(job[0], job[1], sampling, charge[job[2][0]]), jobs)
        out: list[Generation | None] = [None] * len(prompts)
        for (_, _, rows), gen in zip(jobs, answers):
            for k, row in enumerate(rows):
                out[row] = (
                    gen
                    if k == 0
                    else dataclasses.replace(
                        gen, logprobs=list(gen.logprobs), offsets=list(gen.offsets or [])
                    )
                )
        return out  # type: ignore[return-value]

    def _complete(self, prompt: str, seed: int, sampling: Sampling, stats: Stats) -> Generation:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed & 0x7FFFFFFF,
            **self._extra(),
        }
        if self.logprobs:
            body["logprobs"] = 1
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        data = self._post_completion(body)
        choices = data.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            raise ServerError(
                f"POST {self.client.root}/v1/completions answered no choice for a prompt of "
                f"{len(prompt)} characters; check the server's log",
                url=self.client.root,
            )
        prompt_tokens, completion_tokens, cached = self._count(data, 1, stats)
        return completions.generation(choices[0], sampling, prompt_tokens, cached, completion_tokens)

    # -- score ---------------------------------------------------------------------------------------
    def score(
        self,
        prompts: Sequence[str],
        labels: Sequence[str],
        *,
        owners: Sequence[Hashable] | None = None,
        exit_rule: Any = None,
        stats: Stats | Sequence[Stats] | None = None,
    ) -> list[Score]:
        """Probability of each label's first token right after each prompt, from the server's top-k
        next-token log-probabilities (one request per prompt, concurrent). `exit_rule` is ignored:
        a server runs every layer (layers_run = num_layers = 1)."""
        if not prompts:
            return []
        prompts = [check_prompt(p) for p in prompts]
        keys = [self.label_key(lab) for lab in labels]
        if len(set(keys)) != len(keys):
            raise ProblemDefinitionError(
                f"labels {list(labels)} do not start with distinct tokens (first tokens {keys}); pick words "
                "whose "
                "first token differs, e.g. with a leading space: ' sure', ' likely', ' impossible'"
            )
        charge = per_row(len(prompts), stats, self.stats)
        self._extra()
        self._calls += 1
        for st in distinct(charge):
            st.score_calls += 1
        return self.pool.map(
            lambda job: self._score_one(job[0], list(labels), keys, job[1]), list(zip(prompts, charge))
        )

    def _score_one(self, prompt: str, labels: list[str], keys: list[str], stats: Stats) -> Score:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": self.top_logprobs,
            **self._extra(),
        }
        data = self._post_completion(body)
        choice = (data.get("choices") or [{}])[0]
        top = completions.top_logprobs(choice.get("logprobs"))
        _, _, cached = self._count(data, 1, stats)
        raw, floored = label_probs(top, labels, keys, self.label_floor)
        with self._lock:
            stats.label_floor_hits += floored
        tot = sum(raw.values())
        probs = {lab: v / tot for lab, v in raw.items()}
        return Score(probs=probs, raw=raw, layers_run=1, reused_tokens=cached)

    def label_key(self, label: str) -> str:
        """The text of the label's first token, as the server names tokens in top_logprobs: the label
        itself when it is one token (or the server cannot tokenize), else the longest prefix of the
        label that tokenizes to the label's first token alone."""
        return self.tokens.label_key(label)

    # -- tokens --------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of text as the server's model reads it (no BOS), from the server's tokenize
        endpoint (vLLM and llama.cpp: /tokenize, SGLang: /v1/tokenize, llama-cpp-python:
        /extras/tokenize). A server without one raises ServerError (NoTokenizeEndpoint)."""
        return self.tokens.tokenize(text)

    def token_offsets(self, generation: Generation) -> list[tuple[int, int]]:
        """Character range in generation.text of each generated token (from the server's answer)."""
        return list(generation.offsets or [])

    def remember_generation(self, prompt: str, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        """No-op: the server tokenizes each prompt itself."""

    # -- search bookkeeping (a server keeps its own cache: nothing to own, pin or evict) -------------
    def new_search(self) -> None:
        """Start the counters of a new search."""
        self.stats = Stats()
        self._calls = 0

    def begin_search(self) -> Stats:
        return Stats()  # a search beside others (solve_many): its requests are counted here

    def end_search(self, stats: Stats) -> None:
        """No-op: nothing is cached here."""

    def set_priority(self, fn: Callable[[Hashable], float | None] | None) -> None:
        """No-op: no cache budget, so no eviction order."""

    def acquire(self, owner: Hashable, handle: Any) -> None:
        """No-op: the server's cache has no owners."""

    def release(self, owner: Hashable) -> None:  # no-op, as acquire
        pass

    def pin_owner(self, owner: Hashable) -> None:  # no-op, as acquire
        pass

    # -- plumbing ------------------------------------------------------------------------------------
    def times(self) -> ClientTimes:
        """HTTP round trips so far and llama.cpp's summed `timings` (`request_clock`); never reset:
        take the difference of two (`ClientTimes.since`) to time one run."""
        return self.client.clock.snapshot()

    def _post_completion(self, body: dict) -> dict:
        _, data = self.client.post("/v1/completions", body)
        self.client.clock.add_timings(data)
        if not isinstance(data, dict):
            raise ServerError(
                f"POST {self.client.root}/v1/completions answered {str(data)[:200]!r}, not a completion; "
                "is base_url an OpenAI-compatible server?",
                url=self.client.root,
            )
        return data

    def _count(self, data: dict, choices: int, s: Stats) -> tuple[int, int, int]:
        """Add one answer's usage to the counters; returns (prompt, completion, cached prompt) tokens."""
        prompt, completion, cached = completions.usage_counts(data)
        with self._lock:
            s.model_calls += 1
            s.prefill_tokens += prompt - cached
            s.reused_tokens += cached
            s.decode_tokens += max(0, completion - choices)
            s.generated_tokens += completion
        return prompt, completion, cached

    def _extra(self) -> dict:
        """Fields added to every completion request (`server_models.request_defaults`)."""
        if self._sampling_extra is None:
            self._sampling_extra = request_defaults(self._list_models(), self.extra_body)
        return self._sampling_extra

    def _list_models(self) -> list[dict]:
        if self._models is None:
            self._models = list_models(self.client)
        return self._models
