"""A segment of cached K/V and the token tree the segments form, with the two walks along it that
the store's lookup and insert use.

A *segment* is the K/V of a run of tokens computed in one forward, stored contiguously as one
tensor [layers, 2, kv_heads, tokens, head_dim]. Every segment hangs off a point inside its parent
segment (`parent`, `parent_len`), so the segments form a token tree: the context of a segment is
its ancestors' tokens (each up to the attach point) followed by its own. Its K/V is valid only
under exactly that context, which the tree guarantees by construction.

A *chain* is the (segment, used_tokens) pairs to attend over, root first. A divergence inside a
segment still reuses the tokens before it (used_tokens < len), without copying: attention reads a
view of the first used_tokens positions.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    pins: int = 0
    owners: set = field(default_factory=set)  # thought-tree node ids whose contexts use this segment
    children: dict = field(default_factory=dict)  # (offset, first_token) -> Segment
    last_use: int = 0
    first_block: int = 0  # block ids are first_block .. first_block + blocks - 1
    used: int = 0  # while open (`KVStore.open`): K/V slots written so far, of kv's capacity

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def resident_len(self) -> int:
        """Tokens (a prefix of `tokens`) whose K/V is held; 0 when evicted."""
        return 0 if self.kv is None else int(self.kv.shape[3])

    @property
    def refs(self) -> int:
        """Number of owners holding this segment (protocol note 2 of `treesearch.cache.kvstore`)."""
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


def match_prefix(root: Segment, ids: Sequence[int], limit: int) -> tuple[Chain, int]:
    """The longest path from `root` whose tokens are ids[:k], k <= limit: (chain, k).

    Evicted segments match too: their tokens are known."""
    chain: Chain = []
    seg, off, pos = root, 0, 0
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
    return chain, pos


def follow(seg: Segment, off: int, tokens: Sequence[int]) -> tuple[Segment, int, int]:
    """Walk from `off` tokens into `seg` along what the tree holds of `tokens`: (segment, offset, i)
    where tokens[:i] matched and the walk stopped `offset` tokens into `segment`
    (i == len(tokens) when the tree holds all of them)."""
    i = 0
    while True:
        toks = seg.tokens
        while i < len(tokens) and off < len(toks) and toks[off] == tokens[i]:
            off += 1
            i += 1
        if i == len(tokens):
            return seg, off, i
        child = seg.children.get((off, tokens[i]))
        if child is None:
            return seg, off, i
        seg, off = child, 0
