"""The K/V a running generate row holds, against the budget: admission (one allocation: its fill
and first decode chunk open segments in the store, its token of a decode step reserved; its
chain pinned), its fill sealed in place when its prompt is in, a bigger open segment as it
generates, sealing them in place when it ends, the preemption order, and giving it all back
(`treesearch.engine.scheduler` decides when)."""

from __future__ import annotations

from treesearch.cache.kvstore import Chain
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

    def hold(self, g: GenRow, p: Row, reads: list[Chain]) -> bool:
        """Admit a row: one all-or-none allocation from the store (`KVStore.open_rows`) of its own
        K/V, beside the chains the step reads (`reads`) and its own made resident: its fill (an
        open segment of every uncached token of its context, prefilled now or in later steps),
        its first decode chunk (an open segment of a block) and its token of the decode step's
        buffer (reserved), so an admitted row can always take its next step (a row admitted into
        the last free bytes and then unable to step would preempt itself, be readmitted the same
        way, and never progress). Its chain is pinned from here until it leaves; its evicted
        parts are recomputed by the runner before the step's forwards. False: no room, nothing
        changed."""
        store = self.cache.store
        bpt = store.bytes_per_token
        new = len(p.ids) - p.matched  # at least 1: a lookup leaves a token to compute
        first = self.chunk_tokens(g)
        sizes = [new, first] if first else [new]
        segs = store.open_rows(sizes, self.runner.chunk, [*reads, p.chain], reserve=bpt)
        if segs is None:  # what running rows read leaves too little room: wait
            return False
        store.pin(p.chain)
        g.plan, g.pinned, g.filled, g.fill = p, p.chain, 0, segs[0]
        g.chunks, g.step_bytes = segs[1:], bpt
        return True

    def chunk_tokens(self, g: GenRow) -> int:
        """Slots of its next decode chunk: a block, or what is left of its fed tokens."""
        left = g.sampling.max_new_tokens - max(1, len(g.gens))  # fed tokens still to come
        return max(0, min(self.cache.store.block_size, left))

    def regrow(self, g: GenRow) -> bool:
        """Replace a full row's decode chunks with one open segment that holds their tokens and
        room for a block more: its generated K/V stays one run, so a step's attention reads it in
        one product per layer, not one per block. Copying costs a few MB over a row's life, and
        only the step that copies holds old and new at once. False, nothing changed, when the
        budget has no free room for the copy (the row then grows by a block, which may evict)."""
        extra = self.chunk_tokens(g)  # a block, or what is left of its fed tokens
        if not g.chunks or extra <= 0:
            return False
        store = self.cache.store
        new = store.open(sum(s.used for s in g.chunks) + extra, self.runner.chunk, evict=False)
        if new is None:
            return False  # only in free room: a copy is worth no cached block's eviction
        for seg in g.chunks:
            new.kv[:, :, :, new.used : new.used + seg.used] = seg.kv[:, :, :, : seg.used]
            new.used += seg.used
            store.close(seg)
        g.chunks = [new]
        return True

    def rank(self, g: GenRow) -> tuple:
        """Preemption order, lowest first: omega (RSBCM; LRU: none), then the latest admitted."""
        if self.config.eviction == "lru":
            return (-g.order,)
        return (self.cache.owner_omega(g.owner), -g.order)

    def free(self, g: GenRow) -> None:
        """Give back an admitted row's K/V: its token of the decode step, its open segments
        (closed; what was sealed stays in the tree, evictable once unpinned), its pins."""
        cache = self.cache
        cache.unreserve(g.step_bytes)
        for seg in ([g.fill] if g.fill is not None else []) + g.chunks:
            cache.store.close(seg)
        g.fill, g.chunks, g.step_bytes, g.filled = None, [], 0, 0
        cache.store.unpin(g.pinned)
        g.pinned = []

    def no_room(self, g: GenRow) -> CacheBudgetError:
        store = self.cache.store
        return CacheBudgetError(
            f"cache_budget={store.budget} bytes cannot run this call: what running rows read holds "
            f"{store.pinned_bytes()} bytes and one row needs at least "
            f"{self.cache.need_bytes([g.row], g.sampling.max_new_tokens)} bytes with them; "
            "raise --cache-budget or run fewer searches at once"
        )

    def seal_prompt(self, g: GenRow) -> Handle | None:
        """A row's context is fully prefilled: seal its fill into the tree where it is (no copy),
        when the store may keep all of it as `store_kv` would (a protected owner's prompt may
        evict owned K/V for that, the rest only what no owner holds), and pin it for the row,
        which reads it from its chain from here on. Returns where its context ends in the tree,
        or None, nothing changed (the fill stays the row's own run), where it cannot be sealed:
        the tree holds some of these tokens already (a row of the same step sealed them first),
        or the budget has no such room."""
        p, fill = g.plan, g.fill
        assert p is not None and fill is not None and fill.used == len(p.ids) - p.matched
        end = self.cache.seal_kv(p.ids, p.matched, [fill], free_only=not p.must_store, charge=g.stats)
        if end is None:
            return None
        self.cache.store.pin([end])
        g.pinned, g.fill = [*g.pinned, end], None
        return end

    def store_prompt(self, g: GenRow) -> Handle:
        """Cache a first admission's prompt: sealed in place (`seal_prompt`), else, where the tree
        holds part of it or a copy would keep only its first blocks, a copy of what `store_kv`
        keeps (the row goes on reading its fill); count it for its search and hold a protected
        owner's."""
        r = g.plan
        assert r is not None
        end = self.seal_prompt(g)
        if end is None:
            assert g.fill is not None
            kv = g.fill.kv[:, :, :, : g.fill.used]
            try:
                end = self.cache.store_kv(r.ids, r.matched, kv, free_only=not r.must_store, charge=r.stats)
            except CacheBudgetError:  # no room beside the running rows: kept as tokens, recomputed if needed
                end = self.cache.store_kv(r.ids, r.matched, kv, free_only=True, charge=r.stats)
        self.cache.count_prompt(end, r.search)
        self.cache.hold_prompt(end, g.owner)
        return end

    def seal(self, g: GenRow, ctx: list[int], start: int) -> Handle | None:
        """An ending row whose decode chunks hold exactly the K/V of ctx[start:] (its fill, if
        unsealed, none of them): cache it where it is (`CacheManager.seal_kv`); None where that
        cannot be done without a copy."""
        if sum(s.used for s in g.chunks) != len(ctx) - start:
            return None
        end = self.cache.seal_kv(ctx, start, g.chunks, charge=g.stats)
        if end is not None:
            g.chunks = []
        return end
