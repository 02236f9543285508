"""RSBCM: reasoning-score-based cache management, as an eviction priority key.

The KV store evicts, when its budget is reached, the evictable segment with the lowest key first
(see the protocol in `treesearch.cache.kvstore`); this module only says what the key is, so the store's
loop knows nothing of thoughts, scores or depth (as in SGLang's evict_policy).

Root prompts sit in a protected tier: a segment held by a `RootPrompt` (the prompt contexts of an
owner the searcher protects, its root node's) is evicted only after every unprotected one, under
either order. It is not pinned: what running rows read is (their reference counts, protocol
note 4 of `treesearch.cache.kvstore`), so a budget that must recompute a root prompt still runs.

For a branch (thought-tree node) with value score s at depth d,

    omega = s / (d + 1)

so shallow, promising branches keep their blocks and deep, low-scoring ones go first. A segment
shared by several owners takes the highest omega among them (a block that serves a good branch is
as valuable as that branch). The key of a segment is

    (tier, omega_max, last_use, id)      lowest evicted first (tier 1: a root prompt)

- owners none (every owner let go, e.g. the branch was pruned): omega = -inf, evicted first;
- an owner not yet scored: omega = UNSCORED, below every judged branch but above free segments.
  Such K/V is a fresh generation's; where it is reused at all (chain-style prompts) that happens
  in the evaluation right after the expansion, while the engine call pins it. In template-style
  problems (Game of 24) it is never reused, so ranking it above the shared templates would evict
  the templates and recompute them;
- ties on omega: least recently used first (a logical clock, never wall time), then lowest id.

`priority(owner)` is a callback installed by whoever knows the tree (the Searcher):
`engine.set_priority(fn)`; fn(owner) returns omega (use `omega(score, depth)`) or None for
"unknown" (treated as unscored).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

Priority = Callable[[Hashable], "float | None"]


UNSCORED = -sys.float_info.max  # omega of a branch not scored yet: the lowest of any owned segment


@dataclass(frozen=True)
class RootPrompt:
    """The holder of a protected owner's prompt contexts: what it holds is in the protected tier."""

    owner: Hashable


def tier(seg: Any) -> int:
    """1 for a segment a root prompt uses (evicted after every other), else 0."""
    return int(any(isinstance(o, RootPrompt) for o in seg.owners))


def lru_key(seg: Any) -> tuple:
    """Least recently used first (a logical clock), then lowest id: the store's default key and
    RSBCM's tie-break."""
    return (seg.last_use, seg.id)


def omega(score: float | None, depth: int) -> float:
    """omega = score / (depth + 1); UNSCORED for a branch that has no score yet."""
    if score is None:
        return UNSCORED
    return float(score) / (depth + 1)


class RSBCMPolicy:
    """Eviction key (tier, omega_max, last_use, id) for a segment, from an owner -> omega callback."""

    def __init__(self, priority: Priority | None = None) -> None:
        self.priority = priority

    def owner_omega(self, owner: Hashable) -> float:
        if self.priority is None or isinstance(owner, RootPrompt):
            return UNSCORED
        w = self.priority(owner)
        return UNSCORED if w is None else float(w)

    def segment_omega(self, seg: Any) -> float:
        """Highest omega among the segment's owners; -inf when no owner holds it."""
        if not seg.owners:
            return -math.inf
        return max(self.owner_omega(o) for o in seg.owners)

    def __call__(self, seg: Any) -> tuple:
        return (tier(seg), self.segment_omega(seg), *lru_key(seg))


class LRUPolicy:
    """Least recently used first (what vLLM and SGLang do), root prompts last; for comparison."""

    def __call__(self, seg: Any) -> tuple:
        return (tier(seg), *lru_key(seg))
