"""The KV store: segments of cached K/V arranged as a token tree, found by an exact prefix index.

A *segment* is the K/V of a run of tokens computed in one forward, stored contiguously as one
tensor [layers, 2, kv_heads, tokens, head_dim]. Every segment hangs off a point inside its parent
segment (`parent`, `parent_len`), so the segments form a token tree: the context of a segment is
its ancestors' tokens (each up to the attach point) followed by its own. Its K/V is valid only
under exactly that context, which the tree guarantees by construction.

Lookup walks the tree token by token and returns a *chain*: the (segment, used_tokens) pairs to
attend over. A divergence inside a segment still reuses the tokens before it (used_tokens <
len), without copying: attention reads a view of the first used_tokens positions.

Protocol (enforced here, relied on by the engine and RSBCM):
1. A segment's tokens never change; its K/V may be dropped (`evict`) and later refilled
   (`refill`) with the same values, recomputed from its context.
2. `refs` counts live holders (tree nodes, running batches). Pinned segments (refs of the
   running batch, the root prompt) are never evicted; refs never go negative.
3. `bytes_held` is the sum over resident segments of their blocks' bytes, where a segment of n
   tokens occupies ceil(n / block_size) blocks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

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
    refs: int = 0
    pins: int = 0
    owners: set = field(default_factory=set)  # thought-tree node ids whose contexts use this segment
    children: dict = field(default_factory=dict)  # (offset, first_token) -> Segment
    last_use: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

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
    """Token tree of cached K/V segments with an exact prefix index and byte accounting."""

    def __init__(self, bytes_per_token: int, block_size: int = 16) -> None:
        self.bytes_per_token = bytes_per_token
        self.block_size = block_size
        self.root = Segment(id=0, tokens=(), parent=None, parent_len=0, start=0)
        self.root.pins = 1  # the root is permanently pinned
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self.segments: dict[int, Segment] = {}
        self.bytes_held = 0
        self.peak_bytes = 0

    # -- lookup ----------------------------------------------------------------------------------
    def lookup(self, ids: list[int] | tuple[int, ...], limit: int | None = None) -> tuple[Chain, int]:
        """Longest cached prefix of ids (at most `limit` tokens): (chain, matched_tokens)."""
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
        tick = next(self._clock)
        for s, _ in chain:
            s.last_use = tick
        return chain, pos

    # -- insertion -------------------------------------------------------------------------------
    def insert(self, chain: Chain, tokens: list[int] | tuple[int, ...], kv: Any) -> tuple[Segment, int]:
        """Add a segment continuing `chain` (as returned by lookup) with `tokens` and their K/V.

        Returns the chain's new end (segment, used_tokens). If the same continuation is already
        cached, that segment is returned and `kv` dropped.
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
        seg = Segment(id=next(self._ids), tokens=tokens[i:], parent=parent, parent_len=off,
                      start=parent.start + off, kv=None, last_use=next(self._clock))
        parent.children[(off, tokens[i])] = seg
        self.segments[seg.id] = seg
        if kv is not None:
            self.refill(seg, kv[:, :, :, i:] if i else kv)
        return seg, len(seg.tokens)

    # -- memory ----------------------------------------------------------------------------------
    def blocks(self, seg: Segment) -> int:
        return -(-len(seg.tokens) // self.block_size)

    def segment_bytes(self, seg: Segment) -> int:
        return self.blocks(seg) * self.block_size * self.bytes_per_token

    def refill(self, seg: Segment, kv: Any) -> None:
        """Give a segment its K/V (after creation or recomputation)."""
        assert kv.shape[3] == len(seg.tokens), f"segment {seg.id}: kv has {kv.shape[3]} tokens, expected {len(seg.tokens)}"
        if seg.kv is None:
            self.bytes_held += self.segment_bytes(seg)
            self.peak_bytes = max(self.peak_bytes, self.bytes_held)
        seg.kv = kv.contiguous()

    def evict(self, seg: Segment) -> int:
        """Drop a segment's K/V (its tokens stay); returns bytes freed."""
        assert seg.pins == 0, f"segment {seg.id} is pinned ({seg.pins}) and cannot be evicted"
        if seg.kv is None:
            return 0
        seg.kv = None
        freed = self.segment_bytes(seg)
        self.bytes_held -= freed
        return freed

    def pin(self, chain: Chain) -> None:
        for seg, _ in chain:
            seg.pins += 1

    def unpin(self, chain: Chain) -> None:
        for seg, _ in chain:
            assert seg.pins > 0, f"segment {seg.id} unpinned more often than pinned"
            seg.pins -= 1

    def note_peak(self, extra_bytes: int = 0) -> None:
        """Record a peak including transient bytes (a running batch's own K/V)."""
        self.peak_bytes = max(self.peak_bytes, self.bytes_held + extra_bytes)

    def resident_segments(self) -> list[Segment]:
        return [s for s in self.segments.values() if s.kv is not None]

    def check_invariants(self) -> None:
        """Recompute the accounting from scratch and compare (for tests)."""
        held = sum(self.segment_bytes(s) for s in self.segments.values() if s.kv is not None)
        assert held == self.bytes_held, f"bytes_held {self.bytes_held} != recomputed {held}"
        for s in self.segments.values():
            assert s.pins >= 0 and s.refs >= 0, f"segment {s.id}: pins={s.pins} refs={s.refs}"
            assert s.parent is not None and s.parent.children.get((s.parent_len, s.tokens[0])) is s
            assert s.start == s.parent.start + s.parent_len
