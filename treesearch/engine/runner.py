"""The model work of the local engine's steps: the runner executes a step's plan
(`treesearch.engine.plan.StepPlan`), which the scheduler made without running the model. Evicted
K/V the step reads made resident first (recomputed from its nearest cached ancestor, as an
ordinary uncached prefill into an open segment of its own), ASKS's pre-pass, the prefill parts
(each written into its row's fill in the store) and the decode step (each row's new K/V written
into its open segment); every byte they write was allocated while planning. It also seals a
score row's prompt in place and turns a finished row into its `Generation`. The scheduler holds
one; the cache never calls up into it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from treesearch.backends.protocol import Generation
from treesearch.cache.attention import BatchKV
from treesearch.cache.kvstore import Chain, Segment
from treesearch.cache.manager import CacheManager, Handle, Row
from treesearch.common.config import RKSCConfig
from treesearch.common.stats import Stats, distinct
from treesearch.engine.decoder import decoder_for
from treesearch.engine.forward import Forward, cut_at_stop
from treesearch.engine.ledger import SearchLedger
from treesearch.engine.plan import AsksPass, Part, StepPlan
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

    def recompute(self, plan: StepPlan) -> None:
        """The evicted parts of every chain the plan reads, made resident (their room was counted
        when the plan's segments were allocated: `KVStore.open_rows`)."""
        for chain, charge in plan.reads:
            self.make_resident(chain, charge)

    def run_asks(self, p: AsksPass) -> None:
        """ASKS's pre-pass: one forward of each row in `p.order` up to `p.ends` into its open
        segment, capturing every layer's output; its K/V kept in the tree (sealed in place, else
        a copy of what fits), then the gate's decisions (`treesearch.policies.asks.Gate.decide`).
        The rows wait for the next step: each pins the chain it will read there (`Row.held`)."""
        rows, order, cache = p.rows, p.order, self.cache
        hidden: list[torch.Tensor] = []
        news = [rows[i].ids[rows[i].matched : p.ends[i]] for i in order]
        self.forward.prefill_into(
            [cache.prefix(rows[i].chain) for i in order],
            news,
            [rows[i].matched for i in order],
            [(s.kv, 0) for s in p.segs],
            [_stats(rows[i]) for i in order],
            want_logits=False,
            capture=hidden,
        )
        kvs = [s.kv for s in p.segs]
        handles = {}
        for i, seg, new in zip(order, p.segs, news):
            seg.used = len(new)
            handles[i] = self.keep(rows[i].ids[: p.ends[i]], rows[i].matched, seg, _stats(rows[i]))
        self.asks.decide(rows, p.pairs, order, hidden, kvs, handles, cache)
        before = {i: rows[i].matched for i in order}
        cache.lookup([rows[i] for i in order])
        for i in order:
            r, it = rows[i], p.items[i]
            ref = None if r.asks_ref is None else p.items[r.asks_ref]
            it.row.asks_ref = None if ref is None or ref.call is not it.call else ref.index
            it.row.asks_sigma = r.asks_sigma
            it.row.prepass = p.ends[i] - before[i]  # computed by the pre-pass, not reused
            cache.store.pin(r.chain)
            it.row.held.append(r.chain)

    def keep(self, ids: list[int], start: int, seg: Segment, charge: Stats) -> Handle:
        """Cache the K/V of ids[start:] that an open segment holds: sealed where it is, else a copy
        of what fits (the segment closed)."""
        cache = self.cache
        end = cache.seal_kv(ids, start, [seg], free_only=False, charge=charge)
        if end is None:
            end = cache.store_kv(ids, start, seg.kv[:, :, :, : seg.used], free_only=True, charge=charge)
            cache.store.close(seg)
        return end

    def prefill(self, parts: list[Part]) -> torch.Tensor:
        """The plan's prefill parts in one forward, each written straight into its row's fill
        after its earlier parts (`Forward.prefill_into`); returns their last logits [B, V]."""
        cache = self.cache
        rows = [pt.row for pt in parts]
        plans: list[Row] = [g.plan for g in rows]  # type: ignore[misc]
        fills: list[Segment] = [g.fill for g in rows]  # type: ignore[misc]
        starts = [p.matched + g.filled for g, p in zip(rows, plans)]
        logits = self.forward.prefill_into(
            [cache.prefix(p.chain) + g.own_runs() for g, p in zip(rows, plans)],
            [p.ids[s : s + pt.n] for p, s, pt in zip(plans, starts, parts)],
            starts,
            [(f.kv, f.used) for f in fills],
            [g.stats for g in rows],
        )
        for g, f, pt in zip(rows, fills, parts):
            f.used += pt.n
            g.filled += pt.n
        return logits

    def decode(self, rows: list[GenRow]) -> torch.Tensor:
        """One decode step: each row's last token through one forward over its chain and its own
        open segments; its new K/V written into its last open segment (the step's one-token
        buffer is each row's, counted since its admission). Returns the logits [B, V]."""
        lm, fwd, cache = self.lm, self.forward, self.cache
        if fwd.decoder is not None and fwd.decoder.stale(lm.model):  # a weight changed in place
            fwd.decoder = decoder_for(lm.model)
        batch = BatchKV(lm.num_layers, len(rows), lm.num_kv_heads, lm.head_dim, 1, lm.dtype, lm.device)
        batch.set_prefixes([cache.prefix(g.pinned) + g.own_runs() for g in rows])
        logits = fwd.step(
            batch,
            [g.gens[-1] for g in rows],
            [len(g.context) - 1 for g in rows],
            0,
            [g.stats for g in rows],
        )
        for b, g in enumerate(rows):
            g.write(batch.k[:, b, :, 0], batch.v[:, b, :, 0])
        return logits

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


# -- recomputation (module functions: tests give them a stand-in for the forward)
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


def _stats(r: Row) -> Stats:
    assert r.stats is not None  # the engine's rows always carry their search's Stats
    return r.stats
