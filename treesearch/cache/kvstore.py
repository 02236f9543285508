"""The KV store: segments of cached K/V arranged as a token tree, accounted in fixed-size blocks,
owned by tree nodes, and held under a byte budget.

The segments and the tree they form are `treesearch.cache.segment`'s; lookup walks the tree token by
token and returns a *chain*, the (segment, used_tokens) pairs to attend over. Keeping one tensor per
segment (rather than a pool tensor of blocks) is what keeps attention zero-copy: a segment is one
contiguous run of blocks, read in place by one matmul per layer. Which owner holds which segment is
`treesearch.cache.owners`'s `OwnerTable` (this store holds one and answers for it); which segments
may be evicted and in what order is `treesearch.cache.eviction`'s (this store evicts and counts).

Blocks: a segment of n tokens occupies ceil(n / block_size) blocks; it receives that many
consecutive block ids when created (`block_ids`), which it keeps for life. A segment may be
resident for a prefix of its tokens only (`resident_len`: K/V of tokens[:k]), so a budget pays
for the blocks a context uses, not for the whole run it was computed in. Memory is accounted in
whole blocks (the tail block counts whole even when partly filled), and a segment's resident
blocks are evicted together.

Protocol (enforced here with asserts naming the segment; relied on by the engine and RSBCM):
1. A segment's tokens never change; its K/V may be dropped (`evict`) and later refilled
   (`refill`) with the same values, recomputed from its context.
2. Owners are hashable ids (thought-tree nodes). `acquire(owner, handle)` makes the owner hold
   every segment on the handle's context chain, once per owner; `release(owner)` lets go of all
   of them. `refs` == number of owners holding the segment; it never goes negative.
3. A segment whose last owner lets go is *freed* at that moment: it joins `free_segments()` and is
   evicted before any owned segment (its K/V stays cached for exact reuse until space is needed).
4. `pins` is a reference count of readers: a row takes one on each segment of its chain when it
   starts reading it (`pin`) and drops it when it stops (`unpin`): a generate row from admission
   until it leaves or is preempted, a score row or a store for one step. Eviction skips every
   segment with a count above zero; the root's count is permanent. Owners never pin (root prompts
   are protected by a tier in the eviction order, `treesearch.policies.rsbcm`); `unpin` more
   often than `pin` is a bug.
5. Residency is closed under ancestors: only a resident, unpinned segment without resident
   children (a leaf of the resident tree) is evictable, so a resident segment's context is always
   resident or the store root (a resident child's parent is resident at least up to parent_len).
6. Budget: `bytes_held` (resident blocks x block bytes) plus `reserved` (the K/V buffers of
   running batches, `reserve` / `unreserve`) never exceeds `budget`: the budget bounds all K/V
   memory, not only the cache. `refill` and `reserve` first call `make_room`, which evicts
   evictable segments in increasing `policy(segment)` key order (the policy lives in
   `treesearch.policies.rsbcm`; this loop knows nothing of scores). When nothing more can be evicted,
   `CacheBudgetError` says how many bytes were needed.
7. `last_use` is a logical clock (lookup and insert tick it), never wall time.
8. Open segments: a running row's own K/V lives in segments it owns in this store from admission
   (`open`: a buffer of `capacity` tokens, counted in `bytes_held` at exactly its bytes, outside
   the token tree: no lookup matches tokens whose K/V is still being written, no eviction reaches
   it). The row writes into them (`Segment.used`): its prompt's K/V into one (its fill, written
   by the prefill forwards, `seal`ed when the prompt is in), its generated K/V into others
   (`seal`ed when it ends). Sealed, they join the tree as ordinary segments where they are (no
   copy; a buffer whose blocks outnumber its tokens' is trimmed); `close`d (preemption, a row
   whose K/V is not kept), their bytes go.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from treesearch.cache.eviction import eviction_order, is_evictable, reclaimable
from treesearch.cache.owners import OwnerTable
from treesearch.cache.segment import Chain, Segment, follow, match_prefix
from treesearch.common.errors import CacheBudgetError
from treesearch.policies.rsbcm import lru_key

__all__ = ["Chain", "KVStore", "Segment"]  # Chain and Segment re-exported: callers import them from here


class KVStore:
    """Token tree of cached K/V segments with an exact prefix index, block accounting, owners and a budget."""

    def __init__(
        self,
        bytes_per_token: int,
        block_size: int = 16,
        budget: int | None = None,
        policy: Callable[[Segment], Any] | None = None,
    ) -> None:
        self.bytes_per_token = bytes_per_token
        self.block_size = block_size
        self.budget = budget
        self.policy = policy or lru_key  # eviction priority key: lowest evicted first
        self.root = Segment(id=0, tokens=(), parent=None, parent_len=0, start=0)
        self.root.pins = 1  # the root is permanently pinned
        self._ids = itertools.count(1)
        self._blocks = itertools.count(0)
        self._clock = itertools.count(1)
        self.segments: dict[int, Segment] = {}
        self.open_segments: dict[int, Segment] = {}  # running rows' own K/V, outside the tree (note 8)
        self.owner_table = OwnerTable()  # owner -> segments it holds
        self.bytes_held = 0
        self.reserved = 0  # bytes of running batches' own K/V buffers, counted against the budget
        self.peak_held = 0  # highest bytes_held ever (the cache alone)
        self.peak_bytes = 0  # highest bytes_held + reserved ever (all K/V; <= budget)
        self.evicted_blocks = 0
        self.eviction_log: list[int] = []  # block ids in the order they were evicted

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    # -- lookup ----------------------------------------------------------------------------------
    def lookup(self, ids: list[int] | tuple[int, ...], limit: int | None = None) -> tuple[Chain, int]:
        """Longest cached prefix of ids (at most `limit` tokens): (chain, matched_tokens).

        Evicted segments match too (their tokens are known); the engine recomputes them."""
        limit = len(ids) if limit is None else min(limit, len(ids))
        chain, pos = match_prefix(self.root, ids, limit)
        self.touch(chain)
        return chain, pos

    def touch(self, chain: Chain) -> None:
        """Mark a chain as used now (one logical clock tick)."""
        tick = next(self._clock)
        for s, _ in chain:
            s.last_use = tick

    # -- insertion -------------------------------------------------------------------------------
    def insert(self, chain: Chain, tokens: list[int] | tuple[int, ...], kv: Any) -> tuple[Segment, int]:
        """Add a segment continuing `chain` (as returned by lookup) with `tokens` and their K/V.

        Returns the chain's new end (segment, used_tokens). If the same continuation is already
        cached, that segment is returned and `kv` dropped. The caller makes sure the segments the
        new tokens walk through are resident (the engine looks the whole context up first).
        """
        assert len(tokens) > 0, "insert needs at least one token"
        tokens = tuple(tokens)
        parent, off = chain[-1] if chain else (self.root, 0)
        parent, off, i = follow(parent, off, tokens)  # walk along what is cached already
        if i == len(tokens):
            return parent, off
        seg = Segment(
            id=next(self._ids),
            tokens=tokens[i:],
            parent=parent,
            parent_len=off,
            start=parent.start + off,
            kv=None,
            last_use=next(self._clock),
        )
        seg.first_block = next(self._blocks)
        for _ in range(self.blocks(seg) - 1):
            next(self._blocks)
        parent.children[(off, tokens[i])] = seg
        self.segments[seg.id] = seg
        if kv is not None and kv.shape[3] > i:  # kv may cover only a prefix of the new tokens
            self.refill(seg, kv[:, :, :, i:] if i else kv)
        return seg, len(seg.tokens)

    # -- memory ----------------------------------------------------------------------------------
    def blocks(self, seg: Segment) -> int:
        return -(-len(seg.tokens) // self.block_size)

    def block_ids(self, seg: Segment) -> list[int]:
        return list(range(seg.first_block, seg.first_block + self.blocks(seg)))

    def tokens_bytes(self, n: int) -> int:
        """Bytes of the blocks that n tokens of one segment occupy."""
        return -(-n // self.block_size) * self.block_bytes

    def resident_bytes(self, seg: Segment) -> int:
        return self.tokens_bytes(seg.resident_len)

    def refill(self, seg: Segment, kv: Any) -> None:
        """Give a segment the K/V of tokens[:k] (k = kv's length, at least what it holds now), after
        creation or recomputation, evicting others to make room for the added blocks."""
        k = kv.shape[3]
        assert seg.resident_len <= k <= len(seg.tokens), (
            f"segment {seg.id}: kv has {k} tokens, expected {seg.resident_len}..{len(seg.tokens)}"
        )
        parent = seg.parent
        assert parent is not None, f"segment {seg.id}: refill of the root"
        assert parent is self.root or parent.resident_len >= seg.parent_len, (
            f"segment {seg.id}: parent {parent.id} is evicted; refill ancestors first (note 5)"
        )
        add = self.tokens_bytes(k) - self.resident_bytes(seg)
        if add > 0:
            path = seg.context_chain()  # the segment and its context are not candidates for its room
            self.pin(path)
            try:
                self.make_room(add)
            finally:
                self.unpin(path)
            self._count(add)
        seg.kv = kv.contiguous()

    def reserve(self, nbytes: int) -> None:
        """Count a running batch's own K/V buffer (nbytes) against the budget, evicting to make
        room first (CacheBudgetError when pinned segments leave too little)."""
        self.make_room(nbytes)
        self.reserved += nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes_held + self.reserved)

    def try_reserve(self, nbytes: int, *, evict: bool = True) -> bool:
        """The allocator's one answer: reserve nbytes (evicting as `reserve` does; with
        evict=False only in free room) and return True, or return False having changed nothing.
        Exact: `room` counts what `make_room` can drain (`treesearch.cache.eviction.reclaimable`)."""
        if self.budget is not None and self.bytes_held + self.reserved + nbytes > self.budget:
            if not evict or nbytes > self.room():
                return False
        self.reserve(nbytes)
        return True

    def unreserve(self, nbytes: int) -> None:
        """A batch buffer counted by `reserve` is gone."""
        assert 0 <= nbytes <= self.reserved, f"unreserve({nbytes}) with only {self.reserved} reserved"
        self.reserved -= nbytes

    # -- open segments (note 8) ---------------------------------------------------------------------
    def open(self, capacity: int, make: Callable[[int], Any], *, evict: bool = True) -> Segment | None:
        """A running row's own K/V buffer of `capacity` tokens (`make(capacity)` allocates it),
        counted in `bytes_held` at capacity x bytes_per_token; evicting for it as `reserve` does
        (evict=False: only in free room). None when it does not fit (evictions made stay made)."""
        nbytes = capacity * self.bytes_per_token
        if not evict and self.budget is not None and self.bytes_held + self.reserved + nbytes > self.budget:
            return None
        try:
            self.make_room(nbytes)
        except CacheBudgetError:
            return None
        seg = Segment(id=next(self._ids), tokens=(), parent=None, parent_len=0, start=0, kv=make(capacity))
        self.open_segments[seg.id] = seg
        self._count(nbytes)
        return seg

    def open_rows(
        self, capacities: list[int], make: Callable[[int], Any], reads: list[Chain], *, reserve: int = 0
    ) -> list[Segment] | None:
        """The allocator's one answer for a plan's K/V: open segments of these capacities (`open`)
        for rows that read these chains, and `reserve` bytes more (an admitted row's token of the
        decode step's buffer), all or none: None, nothing changed, when they do not fit beside
        the chains made resident (`fits`: their evicted parts count as room they take back), so
        no row recomputes any of its context for room it would not get."""
        need = sum(capacities) * self.bytes_per_token + reserve + self.recompute_slack(reads)
        if not self.fits(need, reads):
            return None
        for chain in reads:
            self.pin(chain)
        try:
            segs = [self.open(n, make) for n in capacities]
            if reserve:
                self.reserve(reserve)
        finally:
            for chain in reads:
                self.unpin(chain)
        assert all(s is not None for s in segs), "the room `fits` counted holds them"
        return segs  # type: ignore[return-value]

    def open_bytes(self, seg: Segment) -> int:
        """Bytes an open segment holds: its buffer, token by token."""
        return int(seg.kv.shape[3]) * self.bytes_per_token

    def close(self, seg: Segment) -> None:
        """An open segment's K/V is not kept (its row was preempted, or ended without caching it)."""
        assert self.open_segments.pop(seg.id, None) is seg, f"segment {seg.id} is not open"
        self.bytes_held -= self.open_bytes(seg)
        seg.kv = None

    def seal(
        self, segs: list[Segment], end: tuple[Segment, int], tokens: Sequence[int]
    ) -> tuple[Segment, int] | None:
        """Seal a row's open segments in place as the continuation of `end` (a resident chain end):
        segs[i] holds the K/V of its `used` tokens of `tokens`, in order. Each joins the tree as it is
        (a view of its first `used` slots; copied only where its buffer has more blocks than
        those). Returns the new chain end, or None, nothing changed, when the tree already holds a
        continuation starting with these tokens or the blocks need room that cannot be made."""
        assert sum(s.used for s in segs) == len(tokens) > 0, "the open segments hold exactly the tokens"
        parent, off = end
        assert parent is self.root or parent.resident_len >= off, (
            f"segment {parent.id}: seal under evicted K/V"
        )
        if follow(parent, off, tokens)[2] > 0:
            return None  # the tree holds some of these tokens already: the caller copies what is new
        add = sum(self.tokens_bytes(s.used) - self.open_bytes(s) for s in segs if s.used)
        if add > 0:
            path = parent.context_chain(off)  # the context is not a candidate for the room
            self.pin(path)
            try:
                if add > self.room():
                    return None
                self.make_room(add)
            finally:
                self.unpin(path)
        pos = 0
        for s in segs:
            n = s.used
            if n == 0:
                self.close(s)
                continue
            del self.open_segments[s.id]
            self.bytes_held += self.tokens_bytes(n) - self.open_bytes(s)
            kv = s.kv[:, :, :, :n]
            s.kv = kv.clone() if self.tokens_bytes(n) < self.open_bytes(s) else kv
            s.tokens, s.parent, s.parent_len, s.start = (
                tuple(tokens[pos : pos + n]),
                parent,
                off,
                parent.start + off,
            )
            s.first_block, s.last_use, s.used = next(self._blocks), next(self._clock), 0
            for _ in range(self.blocks(s) - 1):
                next(self._blocks)
            parent.children[(off, s.tokens[0])] = s
            self.segments[s.id] = s
            parent, off, pos = s, n, pos + n
        self._count(0)
        return parent, off

    def _count(self, nbytes: int) -> None:
        self.bytes_held += nbytes
        self.peak_held = max(self.peak_held, self.bytes_held)
        self.peak_bytes = max(self.peak_bytes, self.bytes_held + self.reserved)

    def evict(self, seg: Segment) -> int:
        """Drop a segment's K/V (its tokens stay); returns bytes freed."""
        assert seg.pins == 0, f"segment {seg.id} is pinned ({seg.pins}) and cannot be evicted"
        if seg.kv is None:
            return 0
        assert not any(c.kv is not None for c in seg.children.values()), (
            f"segment {seg.id} has resident children; evict leaves first (note 5)"
        )
        freed = self.resident_bytes(seg)
        blocks = freed // self.block_bytes
        seg.kv = None
        self.bytes_held -= freed
        self.evicted_blocks += blocks
        self.eviction_log.extend(self.block_ids(seg)[:blocks])
        return freed

    def evictable(self) -> list[Segment]:
        """Resident, unpinned segments without resident children (protocol note 5)."""
        return [s for s in self.segments.values() if is_evictable(s)]

    def make_room(self, nbytes: int) -> list[Segment]:
        """Evict lowest-priority evictable segments until `nbytes` more fit in the budget."""
        if self.budget is None or self.bytes_held + self.reserved + nbytes <= self.budget:
            return []
        order = eviction_order(self.evictable(), self.policy)
        evicted = []
        while self.bytes_held + self.reserved + nbytes > self.budget:
            s = next(order, None)
            if s is None:
                raise self.no_room(nbytes)
            self.evict(s)
            evicted.append(s)
        return evicted

    def no_room(self, nbytes: int) -> CacheBudgetError:
        """The error for `nbytes` more that the budget cannot hold now, naming what would."""
        return CacheBudgetError(
            f"cache_budget={self.budget} bytes cannot hold {nbytes} more bytes: {self.bytes_held} are "
            f"held by segments running rows read and {self.reserved} by running batch buffers; raise "
            f"--cache-budget to at least {self.bytes_held + self.reserved + nbytes} or run fewer "
            "searches at once"
        )

    # -- owners and pins -------------------------------------------------------------------------
    def acquire(self, owner: Hashable, handle: tuple[Segment, int]) -> None:
        """The owner holds every segment on the handle's context chain (note 2)."""
        self.owner_table.acquire(owner, handle)

    def release(self, owner: Hashable) -> list[Segment]:
        """The owner lets go of everything it holds; returns the segments this freed (note 3)."""
        return self.owner_table.release(owner)

    def held_by(self, owner: Hashable) -> set[Segment]:
        return self.owner_table.held_by(owner)

    def free_segments(self) -> list[Segment]:
        """Resident segments no owner holds (evicted first)."""
        return [s for s in self.segments.values() if s.kv is not None and not s.owners]

    def pin(self, chain: Chain) -> None:
        for seg, _ in chain:
            seg.pins += 1

    def unpin(self, chain: Chain) -> None:
        for seg, _ in chain:
            assert seg.pins > 0, f"segment {seg.id} unpinned more often than pinned"
            seg.pins -= 1

    def pinned_bytes(self, extra: Chain | None = None) -> int:
        """Bytes that cannot be evicted: the pinned segments' resident blocks, plus the given
        chain's segments resident at least up to the tokens it uses."""
        upto = {s: s.resident_len for s in self.segments.values() if s.pins > 0}
        for s, used in extra or []:
            upto[s] = max(upto.get(s, s.resident_len), used)
        return sum(self.tokens_bytes(n) for n in upto.values())

    def reclaimable_bytes(self, *, free_only: bool = False) -> int:
        """Bytes `make_room` could free now: resident, unpinned segments with no pinned resident
        segment below them (a pinned segment keeps its whole context resident, note 5); with
        free_only, only segments no owner holds (no owned segment below them either)."""
        return sum(self.resident_bytes(s) for s in reclaimable(self.segments.values(), free_only=free_only))

    def room(self, *, free_only: bool = False) -> float:
        """Bytes that fit in the budget once everything evictable (with free_only: only what no
        owner holds, which `make_room` evicts first) is evicted; inf without a budget."""
        if self.budget is None:
            return float("inf")
        return self.budget - self.bytes_held - self.reserved + self.reclaimable_bytes(free_only=free_only)

    def can_hold(self, nbytes: int, *, free_only: bool = False) -> bool:
        """Whether `nbytes` more fit (see `room`). Checked before storing optional K/V, so a full
        cache skips caching instead of failing."""
        return nbytes <= self.room(free_only=free_only)

    def _missing(self, chains: list[Chain]) -> list[tuple[Segment, int]]:
        """Each segment the chains read beyond what it holds resident, with the furthest use."""
        upto: dict[Segment, int] = {}
        for chain in chains:
            for s, used in chain:
                upto[s] = max(upto.get(s, 0), used)
        return [(s, u) for s, u in upto.items() if u > s.resident_len]

    def missing_bytes(self, chains: list[Chain]) -> int:
        """Bytes the chains' evicted parts take back when made resident (their refills)."""
        return sum(self.tokens_bytes(u) - self.resident_bytes(s) for s, u in self._missing(chains))

    def recompute_slack(self, chains: list[Chain]) -> int:
        """Bytes beyond `missing_bytes` that making the chains resident holds at its peak: each
        segment's evicted part is recomputed into an open segment of its tokens, closed before its
        blocks are refilled one segment at a time, and a segment resident up to the middle of a
        block adds fewer blocks than that buffer's bytes."""
        bpt = self.bytes_per_token
        over = [
            (u - s.resident_len) * bpt - (self.tokens_bytes(u) - self.resident_bytes(s))
            for s, u in self._missing(chains)
        ]
        return max([0, *over])

    def fits(self, nbytes: int, chains: list[Chain]) -> bool:
        """Whether `nbytes` more fit once the chains are read (pinned) and made resident: the
        allocator's answer before a row recomputes any of its context for room it would not get."""
        for chain in chains:
            self.pin(chain)
        try:
            return self.can_hold(nbytes + self.missing_bytes(chains))
        finally:
            for chain in chains:
                self.unpin(chain)

    def owners(self) -> list[Hashable]:
        """Every owner holding something now."""
        return self.owner_table.owners()

    def forget_unused(self, keep: Callable[[Segment], bool]) -> None:
        """Forget every segment (K/V and tokens) that no owner holds, nothing pins and `keep`
        refuses, unless a segment kept for one of those reasons continues it (its context stays).
        Between searches, or when one of several concurrent searches ends."""
        kept: set[int] = set()
        for s in self.segments.values():
            if s.owners or s.pins > 0 or (s.kv is not None and keep(s)):
                p = s
                while p is not None and p.parent is not None and p.id not in kept:
                    kept.add(p.id)
                    p = p.parent
        for s in list(self.segments.values()):
            if s.id in kept:
                continue
            self.bytes_held -= self.resident_bytes(s)
            s.kv = None
            assert s.parent is not None  # only the root has none, and it is not in segments
            s.parent.children.pop((s.parent_len, s.tokens[0]), None)
            del self.segments[s.id]

    def reset_counters(self) -> None:
        """Start the peaks and eviction counts afresh (a new search on a warm store)."""
        self.peak_held = self.bytes_held
        self.peak_bytes = self.bytes_held + self.reserved
        self.evicted_blocks = 0
        self.eviction_log = []

    def segment_bytes_held(self, seg: Segment) -> int:
        """Bytes one segment holds now: an open one's buffer, else its resident blocks."""
        return self.open_bytes(seg) if seg.id in self.open_segments else self.resident_bytes(seg)

    def resident_segments(self) -> list[Segment]:
        return [s for s in self.segments.values() if s.kv is not None]

    def check_invariants(self) -> None:
        """Recompute the accounting from scratch and compare (for tests)."""
        held = sum(self.resident_bytes(s) for s in self.segments.values() if s.kv is not None)
        held += sum(self.open_bytes(s) for s in self.open_segments.values())
        assert held == self.bytes_held, f"bytes_held {self.bytes_held} != recomputed {held}"
        if self.budget is not None:
            assert self.bytes_held + self.reserved <= self.budget, (
                f"bytes_held {self.bytes_held} + reserved {self.reserved} > budget {self.budget}"
            )
        self.owner_table.check(self.segments.values())
        for s in self.segments.values():
            assert s.parent is not None and s.parent.children.get((s.parent_len, s.tokens[0])) is s
            assert s.start == s.parent.start + s.parent_len
            if s.kv is not None:
                assert s.parent is self.root or s.parent.resident_len >= s.parent_len, (
                    f"segment {s.id} is resident but its parent {s.parent.id} is not up to {s.parent_len} "
                    "(note 5)"
                )
                assert 0 < s.kv.shape[3] <= len(s.tokens)
