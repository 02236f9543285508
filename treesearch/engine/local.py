"""The local engine: batched generation and label scoring with a transformers model, every forward
starting from the longest cached prefix (`kv_sharing="exact"`) or from scratch ("off").

One call works in three phases:
1. prepare: tokenize (`treesearch.engine.tokens`: known texts keep their ids, so a chain-style prompt
   built from an earlier prompt and its generation gets exactly those ids), look each row up in
   the cache (`treesearch.cache.manager`) and check the budget; at admission the scheduler plans
   it (`treesearch.engine.plan`, no forward): looked up again, a run of new tokens an earlier row
   shares computed by that row first, ASKS's pre-pass (`treesearch.policies.asks`), its K/V
   allocated from the store; the runner (`treesearch.engine.runner`) then recomputes what its
   chain lost to eviction;
2. prefill: each row's remaining prompt tokens in padded batches (`treesearch.engine.forward`), at
   most `config.step_tokens` a scheduler step (`treesearch.engine.scheduler`), attending over its
   cached chain and earlier parts in place (`treesearch.cache.attention`);
3. decode (generate only): one token per row per step until EOS, a stop string or max tokens.
The K/V of each row's new prompt tokens and of its fed-back generated tokens is kept (exact
mode), so a child's context never recomputes its parent's. All K/V a forward writes is counted
against the cache budget before it is allocated (open segments in the store; the decode step's
one token a row reserved with them), so `stats.peak_kv_bytes` (the store's blocks plus the running
buffers, the most K/V held at once) stays within the budget.

Searches: one after another (`new_search`, counted in `self.stats`), or several at once, each
with its own `Stats` (`begin_search` / `end_search`), whose rows may share one call (`stats=`
per prompt): each row's work is counted in its own search's Stats.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from treesearch.backends.protocol import FEATURES, Generation, Score
from treesearch.cache.kvstore import KVStore
from treesearch.cache.manager import CacheManager, Handle, Row
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.errors import ContextTooLongError, ProblemDefinitionError
from treesearch.common.seeds import stable_seed
from treesearch.common.stats import Stats, distinct, per_row
from treesearch.engine.forward import Forward
from treesearch.engine.labels import first_tokens_differ, label_sequences
from treesearch.engine.ledger import SearchLedger
from treesearch.engine.runner import Runner
from treesearch.engine.running import Call, GenRow, ScoreRow
from treesearch.engine.scheduler import Scheduler, rule_key, seeded
from treesearch.engine.tokens import TokenMemory, label_token_ids
from treesearch.models.model import LanguageModel
from treesearch.policies import asks
from treesearch.policies.cgee import token_offsets
from treesearch.policies.rsbcm import Priority


class Engine:
    """Runs a `LanguageModel` over many branches, sharing K/V as `config.kv_sharing` says."""

    def __init__(
        self,
        lm: LanguageModel,
        config: RKSCConfig | None = None,
        *,
        max_batch: int = 32,
        share_min_tokens: int = 8,
    ) -> None:
        self.lm = lm
        self.config = config or RKSCConfig()
        self.max_batch = max_batch
        self.stats = Stats()
        self.forward = Forward(
            lm, fast_decode=self.config.fast_decode, pack_own_runs=self.config.cache_budget is None
        )
        self.cache = CacheManager(
            lm.kv_bytes_per_token, self.config, self.stats, share_min_tokens=share_min_tokens
        )
        self.asks = asks.Gate(self.config.asks_alpha, self.config.asks_tau)
        self.tokens = TokenMemory(lm.tokenizer)
        self.searches = SearchLedger()
        self.name = lm.name
        self.num_layers = lm.num_layers
        self.features = frozenset(FEATURES)
        self.runner = Runner(lm, self.config, self.cache, self.forward, self.asks, self.tokens, self.searches)
        self.scheduler = Scheduler(self.runner, max_rows=max_batch, step_tokens=self.config.step_tokens)
        self._calls = 0

    @property
    def store(self) -> KVStore:
        return self.cache.store

    @property
    def eos_ids(self) -> set[int]:
        """Token ids that end a generation (the forward pass reads them)."""
        return self.forward.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: set[int]) -> None:
        self.forward.eos_ids = set(ids)

    @property
    def asks_log(self) -> list[dict]:
        """Every ASKS gate decision since the last `new_search`: sigma, attached, tokens reused."""
        return self.asks.log

    # -- tokens ----------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of text; a text that extends a known text keeps the known ids."""
        return self.tokens.tokenize(text)

    def remember_generation(self, prompt: str, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        """prompt + the decoded generation has the ids prompt_ids + token_ids. Called after every
        generation; `Searcher.resume` calls it to give a fresh engine the same tokenization memory."""
        self.tokens.remember_generation(prompt, prompt_ids, token_ids)

    def label_token_ids(self, labels: Sequence[str]) -> list[int]:
        return label_token_ids(self.lm.tokenizer, labels)

    def token_offsets(self, generation: Generation) -> list[tuple[int, int]]:
        """Character range in generation.text of each generated token."""
        return token_offsets(self.lm.tokenizer, generation.token_ids)

    # -- searches and owners ---------------------------------------------------------------------
    def new_search(self) -> None:
        """Start the counters and ownership of a new search, keeping from the cache only the K/V
        of the last search's prompts (few-shot templates and prompt heads that the next search's
        prompts start with); generations and older entries are forgotten, so memory stays bounded
        by one search. Results never depend on what is cached; only prefill and reuse counts do."""
        self.cache.new_search(last=self.searches.end(self.stats))
        self.stats.reset()
        self.asks.log = []
        self._calls = 0

    def begin_search(self) -> Stats:
        """A search that runs beside others on this engine: returns the Stats its work is counted
        in (pass it as `stats=` to generate and score)."""
        return self.searches.begin()

    def end_search(self, stats: Stats) -> None:
        """The search counted in `stats` is over and has released its owners: the cache forgets
        what neither its prompts nor the live searches' prompts ran through."""
        key = self.searches.end(stats)
        if key is not None:
            self.cache.end_search(key, live=self.searches.live_keys())

    def set_priority(self, fn: Priority | None) -> None:
        """Install owner -> omega (see `treesearch.policies.rsbcm`); the Searcher passes score/(depth+1)."""
        self.cache.set_priority(fn)

    def acquire(self, owner: Any, handle: Handle | None) -> None:
        """`owner` holds the K/V of the context ending at `handle` (no-op for None)."""
        if self.config.shares:
            self.cache.acquire(owner, handle)

    def release(self, owner: Any) -> None:
        """`owner` lets go of every context it holds; blocks no one holds become free (evicted first)."""
        self.cache.release(owner)

    def pin_owner(self, owner: Any) -> None:
        """Protect the prompts of this owner's calls (e.g. the root node's prompt template; not its
        generations) until `release(owner)`: always cached when computed, evicted after everything
        else (RSBCM's protected tier), never pinned."""
        self.cache.protect(owner)

    # -- public operations -----------------------------------------------------------------------
    @property
    def lock(self) -> Any:  # held while a step runs; hold it to touch the engine from another thread
        return self.scheduler.lock

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        sampling: Sampling | None = None,
        *,
        seeds: Sequence[int] | None = None,
        owners: Sequence[Any] | None = None,
        stats: Stats | Sequence[Stats] | None = None,
    ) -> list[Generation]:
        """Generate one continuation per prompt (repeat a prompt for several samples). stats: where
        each prompt's work is counted (one Stats, or one per prompt; default the engine's). The
        rows join the scheduler's running batch; this returns when the last of them is done."""
        sampling = sampling or Sampling()
        if not prompts:
            return []
        with self.lock:
            charge = per_row(len(prompts), stats, self.stats)
            self._calls += 1
            for st in distinct(charge):
                st.generate_calls += 1
            if seeds is None:
                seeds = [stable_seed(sampling.seed, self._calls, i) for i in range(len(prompts))]
            rows = self._rows(prompts, owners, charge, sampling.max_new_tokens)
            call = Call("generate", len(rows), charge=charge)
            items = [
                GenRow(
                    call, i, prompts[i], r, sampling, seeded(seeds[i]), None if owners is None else owners[i]
                )
                for i, r in enumerate(rows)
            ]
        return self.scheduler.submit(call, items)

    @torch.no_grad()
    def score(
        self,
        prompts: Sequence[str],
        labels: Sequence[str],
        *,
        owners: Sequence[Any] | None = None,
        exit_rule: Callable[[int, torch.Tensor], Any] | None = None,
        stats: Stats | Sequence[Stats] | None = None,
    ) -> list[Score]:
        """Probabilities of each label right after each prompt: its whole token sequence's
        (`treesearch.engine.labels`), renormalised over the labels; one forward pass, plus one more for
        the tokens after the first of multi-token labels. Score calls of several searches with the
        same labels and an equivalent exit rule share a forward.

        exit_rule(layer, label_probs [B, n_labels]) -> True stops the pass after that layer (CGEE);
        a pass cut short stores no K/V. A rule that returns a bool tensor [B] decides per row: the
        rows marked True stop there (their Score has that layers_run and stores no K/V), and the
        rule is called next with the survivors only, in the same order (see
        `treesearch.policies.cgee.LayerExit`).
        """
        if not prompts:
            return []
        seqs = label_sequences(self.lm.tokenizer, labels)
        if not first_tokens_differ(seqs):
            exit_rule = None  # the logit lens cannot tell labels apart by their first token: run in full
        with self.lock:
            charge = per_row(len(prompts), stats, self.stats)
            self._calls += 1
            for st in distinct(charge):
                st.score_calls += 1
            rows = self._rows(prompts, owners, charge, 0)
            key = (tuple(labels), None if exit_rule is None else rule_key(exit_rule))
            args = {"labels": list(labels), "seqs": seqs, "exit_rule": exit_rule}
            call = Call("score", len(rows), charge=charge, key=key, args=args)
            items = [ScoreRow(call, i, r, None if owners is None else owners[i]) for i, r in enumerate(rows)]
        return self.scheduler.submit(call, items)

    # -- phases ----------------------------------------------------------------------------------
    def _rows(
        self, prompts: Sequence[str], owners: Sequence[Any] | None, charge: list[Stats], extra: int
    ) -> list[Row]:
        """The call's rows, tokenized and checked, looked up and checked against the budget."""
        rows = [
            Row(ids=self.tokenize(p), stats=st, search=self.searches.key(st))
            for p, st in zip(prompts, charge)
        ]
        for r, owner in zip(rows, owners or []):
            r.must_store = self.cache.protected(owner)
        for r, p in zip(rows, prompts):
            if not r.ids:
                raise ProblemDefinitionError("an empty prompt was given; prompts need at least one token")
            if len(r.ids) + extra > self.lm.max_context:
                raise ContextTooLongError(
                    f"prompt of {len(r.ids)} tokens + {extra} new tokens exceeds the model's context of "
                    f"{self.lm.max_context}; shorten the prompt or lower max_new_tokens (prompt starts "
                    f"{p[:60]!r})"
                )
        if self.config.shares:
            self.cache.lookup(rows)
        self.cache.check_budget(rows, extra, fail=not self.scheduler.rows_held())
        return rows
