"""The KV store: segments of cached K/V arranged as a token tree, accounted in fixed-size blocks,
owned by tree nodes, and held under a byte budget.

A *segment* is the K/V of a run of tokens computed in one forward, stored contiguously as one
tensor [layers, 2, kv_heads, tokens, head_dim]. Every segment hangs off a point inside its parent
segment (`parent`, `parent_len`), so the segments form a token tree: the context of a segment is
its ancestors' tokens (each up to the attach point) followed by its own. Its K/V is valid only
under exactly that context, which the tree guarantees by construction.

Lookup walks the tree token by token and returns a *chain*: the (segment, used_tokens) pairs to
attend over. A divergence inside a segment still reuses the tokens before it (used_tokens <
len), without copying: attention reads a view of the first used_tokens positions. Keeping one
tensor per segment (rather than a pool tensor of blocks) is what keeps attention zero-copy: a
segment is one contiguous run of blocks, read in place by one matmul per layer.

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
4. `pins` counts holders that must not lose the K/V: the running batch's chains (pinned for the
   whole engine call) and permanently pinned owners such as the root prompt. Pinned segments are
   never evicted; `unpin` more often than `pin` is a bug.
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
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from treesearch.common.errors import CacheBudgetError
from treesearch.policies.rsbcm import lru_key

Chain = list[tuple["Segment", int]]


@dataclass(eq=False)
class Segment:
    """K/V of one run of tokens, attached at `parent_len` tokens into `parent`."""

    id: int
    tokens: tuple[int, ...]
    parent: Segment | None
    parent_len: int
    start: int  # absolute position of tokens[0]
    kv: Any = None  # torch.Tensor [L, 2, Hkv, n, d]; None when evicted (or for the root)
    pins: int = 0
    owners: set = field(default_factory=set)  # thought-tree node ids whose contexts use this segment
    children: dict = field(default_factory=dict)  # (offset, first_token) -> Segment
    last_use: int = 0
    first_block: int = 0  # block ids are first_block .. first_block + blocks - 1

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def resident_len(self) -> int:
        """Tokens (a prefix of `tokens`) whose K/V is held; 0 when evicted."""
        return 0 if self.kv is None else int(self.kv.shape[3])

    @property
    def refs(self) -> int:
        """Number of owners holding this segment (protocol note 2)."""
        return len(self.owners)

    @property
    def resident(self) -> bool:
        return self.kv is not None

    def context_chain(self, upto: int | None = None) -> Chain:
        """The chain of (segment, used) pairs from the root down to this segment's first `upto` tokens."""
        chain: Chain = []
        seg, used = self, len(self.tokens) if upto is None else upto
        while seg is not None and seg.parent is not None:
            if used > 0:
                chain.append((seg, used))
            seg, used = seg.parent, seg.parent_len
        chain.reverse()
        return chain


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
        self._held: dict[Hashable, set[Segment]] = {}  # owner -> segments it holds
        self._pinned_owners: set[Hashable] = set()
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
        chain: Chain = []
        seg, off, pos = self.root, 0, 0
        while pos < limit:
            toks = seg.tokens
            if off < len(toks) and toks[off] == ids[pos]:
                while off < len(toks) and pos < limit and toks[off] == ids[pos]:
                    off += 1
                    pos += 1
                continue
            child = seg.children.get((off, ids[pos]))
            if child is None:
                break
            if off > 0:
                chain.append((seg, off))
            seg, off = child, 0
        if off > 0:
            chain.append((seg, off))
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
        i = 0
        while True:  # walk along what is cached already
            toks = parent.tokens
            while i < len(tokens) and off < len(toks) and toks[off] == tokens[i]:
                off += 1
                i += 1
            if i == len(tokens):
                return parent, off
            child = parent.children.get((off, tokens[i]))
            if child is None:
                break
            parent, off = child, 0
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

    def segment_bytes(self, seg: Segment) -> int:
        """Bytes of the whole segment when resident in full."""
        return self.blocks(seg) * self.block_bytes

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
            self.bytes_held += add
            self.peak_held = max(self.peak_held, self.bytes_held)
            self.peak_bytes = max(self.peak_bytes, self.bytes_held + self.reserved)
        seg.kv = kv.contiguous()

    def reserve(self, nbytes: int) -> None:
        """Count a running batch's own K/V buffer (nbytes) against the budget, evicting to make
        room first (CacheBudgetError when pinned segments leave too little)."""
        self.make_room(nbytes)
        self.reserved += nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes_held + self.reserved)

    def unreserve(self, nbytes: int) -> None:
        """A batch buffer counted by `reserve` is gone."""
        assert 0 <= nbytes <= self.reserved, f"unreserve({nbytes}) with only {self.reserved} reserved"
        self.reserved -= nbytes

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
        return [s for s in self.segments.values() if self._is_evictable(s)]

    def _is_evictable(self, s: Segment) -> bool:
        return (
            s is not self.root
            and s.kv is not None
            and s.pins == 0
            and not any(c.kv is not None for c in s.children.values())
        )

    def make_room(self, nbytes: int) -> list[Segment]:
        """Evict lowest-priority evictable segments until `nbytes` more fit in the budget."""
        if self.budget is None or self.bytes_held + self.reserved + nbytes <= self.budget:
            return []
        heap = [(self.policy(s), s.id, s) for s in self.evictable()]
        heapq.heapify(heap)
        evicted = []
        while self.bytes_held + self.reserved + nbytes > self.budget:
            if not heap:
                raise CacheBudgetError(
                    f"cache_budget={self.budget} bytes cannot hold {nbytes} more bytes: {self.bytes_held} "
                    "are held "
                    "by pinned segments (the running batch's context and pinned prompts) and "
                    f"{self.reserved} by "
                    f"running batch buffers; raise --cache-budget to at least "
                    f"{self.bytes_held + self.reserved + nbytes} or run fewer searches at once"
                )
            _, _, s = heapq.heappop(heap)
            self.evict(s)
            evicted.append(s)
            p = s.parent
            if p is not None and self._is_evictable(p):
                heapq.heappush(heap, (self.policy(p), p.id, p))
        return evicted

    # -- owners and pins -------------------------------------------------------------------------
    def acquire(self, owner: Hashable, handle: tuple[Segment, int]) -> None:
        """The owner holds every segment on the handle's context chain (note 2)."""
        held = self._held.setdefault(owner, set())
        pinned = owner in self._pinned_owners
        seg = handle[0]
        while seg is not None and seg.parent is not None:
            if seg not in held:
                held.add(seg)
                seg.owners.add(owner)
                if pinned:
                    seg.pins += 1
            seg = seg.parent

    def release(self, owner: Hashable) -> list[Segment]:
        """The owner lets go of everything it holds; returns the segments this freed (note 3)."""
        freed = []
        pinned = owner in self._pinned_owners
        for seg in self._held.pop(owner, ()):
            assert owner in seg.owners, f"segment {seg.id}: owner {owner!r} released twice"
            seg.owners.discard(owner)
            if pinned:
                seg.pins -= 1
            if not seg.owners:
                freed.append(seg)
        self._pinned_owners.discard(owner)
        return sorted(freed, key=lambda s: s.id)

    def held_by(self, owner: Hashable) -> set[Segment]:
        return set(self._held.get(owner, ()))

    def pin_owner(self, owner: Hashable) -> None:
        """Pin whatever this owner holds, now and later (e.g. the root prompt), until it is released."""
        if owner in self._pinned_owners:
            return
        self._pinned_owners.add(owner)
        for seg in self._held.get(owner, ()):
            seg.pins += 1

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
        blocked: set[int] = set()
        for s in self.segments.values():
            if s.kv is not None and (s.pins > 0 or (free_only and s.owners)):
                p: Segment | None = s
                while p is not None and p.id not in blocked:
                    blocked.add(p.id)
                    p = p.parent
        return sum(
            self.resident_bytes(s) for s in self.segments.values() if s.kv is not None and s.id not in blocked
        )

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

    def owners(self) -> list[Hashable]:
        """Every owner holding something now."""
        return list(self._held)

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

    def resident_segments(self) -> list[Segment]:
        return [s for s in self.segments.values() if s.kv is not None]

    def check_invariants(self) -> None:
        """Recompute the accounting from scratch and compare (for tests)."""
        held = sum(self.resident_bytes(s) for s in self.segments.values() if s.kv is not None)
        assert held == self.bytes_held, f"bytes_held {self.bytes_held} != recomputed {held}"
        if self.budget is not None:
            assert self.bytes_held + self.reserved <= self.budget, (
                f"bytes_held {self.bytes_held} + reserved {self.reserved} > budget {self.budget}"
            )
        holders: dict[int, set] = {}
        for owner, segs in self._held.items():
            for s in segs:
                holders.setdefault(s.id, set()).add(owner)
        owner_pins: dict[int, int] = {}
        for owner in self._pinned_owners:
            for s in self._held.get(owner, ()):
                owner_pins[s.id] = owner_pins.get(s.id, 0) + 1
        for s in self.segments.values():
            assert s.pins >= 0, f"segment {s.id}: pins={s.pins}"
            assert s.pins >= owner_pins.get(s.id, 0), f"segment {s.id}: pins {s.pins} < pinned owners"
            assert s.owners == holders.get(s.id, set()), f"segment {s.id}: owners {s.owners} != holders"
            assert s.parent is not None and s.parent.children.get((s.parent_len, s.tokens[0])) is s
            assert s.start == s.parent.start + s.parent_len
            if s.kv is not None:
                assert s.parent is self.root or s.parent.resident_len >= s.parent_len, (
                    f"segment {s.id} is resident but its parent {s.parent.id} is not up to {s.parent_len} "
                    "(note 5)"
                )
                assert 0 < s.kv.shape[3] <= len(s.tokens)
