"""The K/V a running generate row holds, against the budget: admission (its chain pinned and
resident, its uncached context and step token reserved, its first open segment in the store), a
bigger open segment as it generates, sealing them in place when it ends, the preemption order,
and giving it all back (`treesearch.engine.scheduler` decides when)."""

from __future__ import annotations

import torch

from treesearch.cache.manager import Handle, Row
from treesearch.common.errors import CacheBudgetError
from treesearch.engine.runner import Runner
from treesearch.engine.running import GenRow


class RowMemory:
    """The budget side of the scheduler's rows, over one engine's cache manager and model."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.cache = runner.cache
        self.config = runner.config
        self.lm = runner.lm

    def hold(self, g: GenRow, p: Row) -> bool:
        """Pin and make resident the row's chain and hold its own K/V: every uncached token of
        its context (prefilled now or in later steps; reserved), its first open segment (a
        decode block, in the store) and its token of a decode step's buffer (reserved), so an
        admitted row can always take its next step (a row admitted into the last free bytes and
        then unable to step would preempt itself, be readmitted the same way, and never progress).
        False: no room (the store says so before any of the chain is recomputed)."""
        cache = self.cache
        store = cache.store
        bpt = store.bytes_per_token
        new = len(p.ids) - p.matched
        first = self.chunk_tokens(g)
        need = (new + first + 1) * bpt
        if not store.fits(need, [p.chain]):  # what running rows read leaves too little room: wait
            return False
        store.pin(p.chain)
        try:
            self.runner.make_resident(p.chain, g.stats)
            cache.reserve(need)
        except CacheBudgetError:
            store.unpin(p.chain)
            return False
        cache.unreserve(first * bpt)  # reserved with the rest, held from here on by its open segment
        seg = store.open(first, self.chunk, evict=False) if first else None
        assert seg is not None or not first, "the room just reserved holds the open segment"
        g.plan, g.pinned, g.filled, g.fill_bytes = p, p.chain, 0, new * bpt
        g.chunks, g.step_bytes = ([seg] if seg is not None else []), bpt
        return True

    def chunk_tokens(self, g: GenRow) -> int:
        """Slots of its next decode chunk: a block, or what is left of its fed tokens."""
        left = g.sampling.max_new_tokens - max(1, len(g.gens))  # fed tokens still to come
        return max(0, min(self.cache.store.block_size, left))

    def regrow(self, g: GenRow) -> bool:
        """Replace a full row's open segments with one that holds their tokens and room for a block
        more, and take its prompt parts in too where it is the last row reading their cohorts (whose
        buffers then go): its own K/V stays one or two runs, so a step's attention reads it in one
        or two products per layer, not one per part and block. Copying costs a few MB over a
        row's life, and only the step that copies holds old and new at once. False, nothing
        changed, when the budget has no free room for the copy (the row then grows by a block,
        which may evict)."""
        extra = self.chunk_tokens(g)  # a block, or what is left of its fed tokens
        if not g.chunks or extra <= 0:
            return False
        last = all(cohort.live == 1 for cohort, _, _ in g.parts)  # else the parts stay where they are
        runs = g.own_runs() if last else [(s.kv, s.used) for s in g.chunks]
        store = self.cache.store
        new = store.open(sum(n for _, n in runs) + extra, self.chunk, evict=False)
        if new is None:
            return False  # only in free room: a copy is worth no cached block's eviction
        for kv, n in runs:
            new.kv[:, :, :, new.used : new.used + n] = kv[:, :, :, :n]
            new.used += n
        for seg in g.chunks:
            store.close(seg)
        if last:
            self._leave_cohorts(g)
        g.chunks = [new]
        return True

    def chunk(self, n: int) -> torch.Tensor:
        lm = self.lm
        return torch.zeros(
            lm.num_layers, 2, lm.num_kv_heads, n, lm.head_dim, dtype=lm.dtype, device=lm.device
        )

    def rank(self, g: GenRow) -> tuple:
        """Preemption order, lowest first: omega (RSBCM; LRU: none), then the latest admitted."""
        if self.config.eviction == "lru":
            return (-g.order,)
        return (self.cache.owner_omega(g.owner), -g.order)

    def free(self, g: GenRow) -> None:
        """Give back an admitted row's K/V: what it reserved and has not prefilled yet, its open
        segments (closed; a row that ended had them sealed first), each cohort's buffer with the
        last row of it, its pins."""
        cache = self.cache
        cache.unreserve(g.fill_bytes + g.step_bytes)
        for seg in g.chunks:
            cache.store.close(seg)
        g.chunks, g.fill_bytes, g.step_bytes, g.filled = [], 0, 0, 0
        self._leave_cohorts(g)
        cache.store.unpin(g.pinned)
        g.pinned = []

    def _leave_cohorts(self, g: GenRow) -> None:
        """The row no longer reads its prompt parts: each cohort's buffer goes with its last row."""
        for cohort, _, _ in g.parts:
            cohort.live -= 1
            if cohort.live == 0:
                self.cache.unreserve(cohort.nbytes)
                cohort.batch = None
        g.parts = []

    def no_room(self, g: GenRow) -> CacheBudgetError:
        store = self.cache.store
        return CacheBudgetError(
            f"cache_budget={store.budget} bytes cannot run this call: what running rows read holds "
            f"{store.pinned_bytes()} bytes and one row needs at least "
            f"{self.cache.need_bytes([g.row], g.sampling.max_new_tokens)} bytes with them; "
            "raise --cache-budget or run fewer searches at once"
        )

    def store_prompt(self, g: GenRow) -> Handle:
        """Cache a generate row's new prompt K/V (a protected owner's must stay cached; the rest only
        where it displaces nothing owned); returns where the prompt ends. The row keeps reading its
        own parts: pinning the cached copy for it would keep optional K/V from being evicted."""
        r = g.plan
        assert r is not None
        kv = g.prompt_kv()
        try:
            end = self.cache.store_kv(r.ids, r.matched, kv, free_only=not r.must_store, charge=r.stats)
        except CacheBudgetError:  # no room beside the running rows: kept as tokens, recomputed if needed
            end = self.cache.store_kv(r.ids, r.matched, kv, free_only=True, charge=r.stats)
        self.cache.count_prompt(end, r.search)
        self.cache.hold_prompt(end, g.owner)
        return end

    def seal(self, g: GenRow, ctx: list[int], start: int) -> Handle | None:
        """An ending row whose open segments hold exactly the K/V of ctx[start:]: cache it where
        it is (`CacheManager.seal_kv`); None where that cannot be done without a copy."""
        if sum(s.used for s in g.chunks) != len(ctx) - start:  # its parts hold some of them
            return None
        end = self.cache.seal_kv(ctx, start, g.chunks, charge=g.stats)
        if end is not None:
            g.chunks = []
        return end
