"""The model work of the local engine's steps, over the cache manager and the forward below it:
forwards over cached chains, each row's new K/V written into an open segment the store hands out
before the forward (ASKS's pre-pass: a buffer reserved first), evicted K/V made resident again
(recomputed from its nearest cached ancestor, as a prefill), planning a batch (cached prefixes,
runs several rows share computed once, ASKS), a score row's prompt sealed in place, and turning
a finished row into its `Generation`. The scheduler holds one; the cache never calls up into it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from treesearch.backends.protocol import Generation
from treesearch.cache.kvstore import Chain, Segment
from treesearch.cache.manager import CacheManager, Handle, Row
from treesearch.cache.shared_runs import find_shared_runs
from treesearch.common.config import RKSCConfig
from treesearch.common.errors import CacheBudgetError
from treesearch.common.stats import Stats, distinct
from treesearch.engine.forward import Forward, cut_at_stop
from treesearch.engine.ledger import SearchLedger
from treesearch.engine.running import Call, GenRow
from treesearch.engine.tokens import TokenMemory
from treesearch.models.model import LanguageModel
from treesearch.policies import asks


class Runner:
    """Runs the model for one engine's steps and keeps what it computes in the cache."""

    def __init__(
        self,
        lm: LanguageModel,
        config: RKSCConfig,
        cache: CacheManager,
        forward: Forward,
        gate: asks.Gate,
        tokens: TokenMemory,
        searches: SearchLedger,
    ) -> None:
        self.lm = lm
        self.config = config
        self.cache = cache
        self.forward = forward
        self.asks = gate
        self.tokens = tokens
        self.searches = searches

    # -- forwards -------------------------------------------------------------------------------------
    def prefill_rows(
        self,
        chains: list[Chain],
        news: list[list[int]],
        starts: list[int],
        charge: list[Stats],
        *,
        held: list[int],
        **kw: Any,
    ):
        """One forward of each row's new tokens over its cached chain (ASKS's pre-pass). Its
        buffer is counted against the budget first and appended to `held`, which the caller
        unreserves."""
        need = len(news) * max(len(t) for t in news) * self.lm.kv_bytes_per_token
        self.cache.reserve(need)
        held.append(need)
        prefixes = [self.cache.prefix(c) for c in chains]
        return self.forward.prefill(prefixes, news, starts, extra=0, want_logits=False, charge=charge, **kw)

    def compute(
        self, chains: list[Chain], news: list[list[int]], starts: list[int], charge: list[Stats]
    ) -> list[torch.Tensor]:
        """Each row's new K/V (shared runs, recomputation), written by one forward into open
        segments the store hands out (`open_segments`) and returned as tensors: the segments are
        closed here and the caller stores the tensors (`refill`, `insert`), counted there again."""
        store = self.cache.store
        segs = self.open_segments([len(t) for t in news], chains)
        try:
            prefixes = [self.cache.prefix(c) for c in chains]
            sinks = [(s.kv, 0) for s in segs]
            self.forward.prefill_into(prefixes, news, starts, sinks, charge, want_logits=False)
            return [s.kv for s in segs]
        finally:
            for s in segs:
                store.close(s)

    def make_resident(self, chain: Chain, charge: Stats | None = None) -> None:
        make_resident(self.cache, self.compute, chain, charge)

    # -- planning a batch -------------------------------------------------------------------------------
    def plan_rows(self, rows: list[Row]) -> None:
        """Plan rows admitted together: cached prefixes, shared runs (computed once), ASKS."""
        if not self.config.shares:
            return
        prepare_rows(self.cache, self.compute, rows)
        if self.config.kv_sharing == "asks":
            held: list[int] = []
            try:
                self.asks.attach(
                    rows, AsksCache(self), lambda *a, **kw: self.prefill_rows(*a, held=held, **kw)
                )
            finally:
                for n in held:
                    self.cache.unreserve(n)

    # -- a row's own K/V in the store ----------------------------------------------------------------------
    def chunk(self, n: int) -> torch.Tensor:
        """A zeroed K/V tensor of n token slots [L, 2, Hkv, n, d]: an open segment's buffer."""
        lm = self.lm
        return torch.zeros(
            lm.num_layers, 2, lm.num_kv_heads, n, lm.head_dim, dtype=lm.dtype, device=lm.device
        )

    def open_segments(self, sizes: list[int], chains: list[Chain]) -> list[Segment]:
        """Open segments in the store of these sizes (tokens) for rows that read these chains,
        which their forward writes (`Forward.prefill_into`): the store's answer, all or none
        (`KVStore.open_rows`), before any of the chains is recomputed; else CacheBudgetError,
        nothing held."""
        store = self.cache.store
        segs = store.open_rows(sizes, self.chunk, chains)
        if segs is None:
            raise store.no_room(sum(sizes) * store.bytes_per_token + store.missing_bytes(chains))
        return segs

    def seal_prompts(self, rows: list[Row], segs: list[Segment], full: Sequence[bool]) -> list[Handle | None]:
        """Cache each full row's new prompt K/V where its forward wrote it: its segment sealed into
        the tree (`CacheManager.seal_kv`, the tree `store_kv` would make), else (the tree holds
        some of it already, or would keep only its first blocks) what `store_kv` keeps of it; a row
        cut short by CGEE keeps none. Every segment not sealed is closed. Returns the ends."""
        cache, store = self.cache, self.cache.store
        ends: list[Handle | None] = [None] * len(rows)
        for b, (r, seg) in enumerate(zip(rows, segs)):
            if self.config.shares and full[b]:
                free_only = not r.must_store
                end = cache.seal_kv(r.ids, r.matched, [seg], free_only=free_only, charge=r.stats)
                if end is None:
                    kv = seg.kv[:, :, :, : seg.used]
                    end = cache.store_kv(r.ids, r.matched, kv, free_only=free_only, charge=r.stats)
                ends[b] = end
                cache.count_prompt(end, r.search)
            if seg.id in store.open_segments:
                store.close(seg)
        return ends

    # -- results ------------------------------------------------------------------------------------------
    def generation(self, g: GenRow) -> Generation:
        """The result of a generate row that has ended; remembers its tokens, tags its owner."""
        text = self.lm.tokenizer.decode(g.gens, skip_special_tokens=True)
        self.tokens.remember_generation(g.prompt, g.row.ids, g.gens)
        self.searches.saw(g.stats, g.row.ids + g.gens[:-1])
        g.stats.generated_tokens += len(g.gens)
        if g.owner is not None and g.handle is not None:
            self.cache.tag_owners([g.handle], [g.owner])
        assert g.finish is not None
        return Generation(
            text=cut_at_stop(text, g.sampling.stop),
            token_ids=g.gens,
            logprobs=g.logps,
            finish=g.finish,
            prompt_tokens=len(g.row.ids),
            reused_tokens=g.reused_n,
            handle=g.handle,
            asks_ref=g.asks_ref,
            asks_sigma=g.asks_sigma,
        )

    def finish_call(self, call: Call) -> None:
        """A call's last row is done: its searches' distinct-token counts and K/V peaks."""
        charge = distinct(call.charge)
        for st in charge:
            st.unique_tokens = self.searches.unique(st)
        self.cache.report_peak(charge)


# -- model work the cache plans and the runner's compute does (module functions: tests give them a stand-in)
Compute = Callable[
    [list[Chain], list[list[int]], list[int], list[Stats]], list[torch.Tensor]
]  # -> K/V per row


def make_resident(cache: CacheManager, compute: Compute, chain: Chain, charge: Stats | None = None) -> None:
    """Make each chain segment resident up to the tokens the chain uses, recomputing what is
    missing from its nearest cached ancestor (counted as recomputed in charge)."""
    charge = charge or cache.stats
    for i, (seg, used) in enumerate(chain):
        have = seg.resident_len
        if have >= used:
            continue
        prefix = list(chain[:i]) + ([(seg, have)] if have else [])
        new = compute([prefix], [list(seg.tokens[have:used])], [seg.start + have], [charge])[0]
        charge.recomputed_tokens += used - have
        cache.store.refill(seg, torch.cat([seg.kv, new], dim=3) if have else new)


def hold_rows(cache: CacheManager, compute: Compute, rows: list[Row]) -> None:
    """Pin the rows' chains for the step and make them resident; a bare row's cut counts as recomputed."""
    for r in rows:
        cache.pin(r.chain)
    for r in rows:
        make_resident(cache, compute, r.chain, r.stats)
    for r in rows:
        (r.stats or cache.stats).recomputed_tokens += r.cut


def prepare_rows(cache: CacheManager, compute: Compute, rows: list[Row]) -> None:
    """Look every row up and compute shared runs once."""
    for r in rows:
        r.prepass = 0
    cache.lookup(rows)
    share_runs(cache, compute, rows)


def share_runs(cache: CacheManager, compute: Compute, rows: list[Row]) -> None:
    """Compute once the new-token runs that several rows start with (a few-shot template's tail
    the cache does not hold yet), store them, then look the rows up again. It saves work and is
    never needed: where the budget has no room for the runs' blocks and their forward's buffer
    (beside what running rows hold), each row computes its own."""
    store = cache.store
    while True:
        runs = find_shared_runs(rows, cache.share_min_tokens, cache.stats)
        if not runs:
            return
        for run in runs:
            cache.pin(run.chain)
        need = sum(store.tokens_bytes(len(run.new)) for run in runs)
        buffer = len(runs) * max(len(run.new) for run in runs) * store.bytes_per_token  # the forward's
        if not store.can_hold(need + buffer):  # no room for the shared runs: each row computes its own
            return
        try:
            for run in runs:
                make_resident(cache, compute, run.chain, run.charge)
            kvs = compute(
                [r.chain for r in runs],
                [r.new for r in runs],
                [r.start for r in runs],
                [r.charge for r in runs],
            )
        except CacheBudgetError:  # no room after all (making the contexts resident took it)
            return
        for kv, run in zip(kvs, runs):
            cache.insert(run.ids, run.start, kv, charge=run.charge)
        cache.lookup(rows)
        for run in runs:  # the row that computed a shared run did not reuse it
            run.first.prepass += len(run.new)


class AsksCache:
    """The cache as ASKS's pre-pass uses it (`treesearch.policies.asks.Gate.attach`): pins, the
    free-room test, insert, lookup, and residency that recomputes evicted K/V through the runner."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.cache = runner.cache

    def pin(self, chain: Chain) -> None:
        self.cache.pin(chain)

    def fits_free(self, token_runs: list[int]) -> bool:
        return self.cache.fits_free(token_runs)

    def insert(self, ids: list[int], start: int, kv: Any, **kw: Any) -> Handle:
        return self.cache.insert(ids, start, kv, **kw)

    def lookup(self, rows: list[Row]) -> None:
        self.cache.lookup(rows)

    def ensure_resident(self, chain: Chain, *, charge: Stats | None = None) -> None:
        self.runner.make_resident(chain, charge)
