"""Which segments may be evicted, in what order, and which ones eviction could reach at all: the
selection half of `KVStore.make_room` (protocol note 5 of `treesearch.cache.kvstore`), over segments
only; the store does the evicting and the byte accounting.

Only a resident, unpinned segment without resident children (a leaf of the resident tree) is
evictable, so residency stays closed under ancestors. Evicting a leaf may make its parent a leaf;
`eviction_order` then offers the parent too, in the policy's key order (lowest first, the segment
id breaking ties), so draining it frees exactly what `reclaimable` lists.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from treesearch.cache.segment import Segment


def is_evictable(seg: Segment) -> bool:
    """Resident, unpinned, not the store root, and no child resident."""
    return (
        seg.parent is not None
        and seg.kv is not None
        and seg.pins == 0
        and not any(c.kv is not None for c in seg.children.values())
    )


def eviction_order(candidates: Iterable[Segment], policy: Callable[[Segment], Any]) -> Iterator[Segment]:
    """Yield segments to evict, lowest `policy` key first, starting from `candidates` (the evictable
    ones) and adding each parent that the eviction of its last resident child made evictable.

    The caller evicts each segment before asking for the next; the keys are taken lazily, so the
    candidates are read when the first one is asked for."""
    heap = [(policy(s), s.id, s) for s in candidates]
    heapq.heapify(heap)
    while heap:
        _, _, s = heapq.heappop(heap)
        yield s
        p = s.parent
        if p is not None and is_evictable(p):
            heapq.heappush(heap, (policy(p), p.id, p))


def reclaimable(segments: Iterable[Segment], *, free_only: bool = False) -> list[Segment]:
    """The resident segments eviction could reach: unpinned, with no pinned resident segment below
    them (a pinned segment keeps its whole context resident); with free_only, also none that an
    owner holds, nor one below them that an owner holds."""
    segments = list(segments)
    blocked: set[int] = set()
    for s in segments:
        if s.kv is not None and (s.pins > 0 or (free_only and s.owners)):
            p: Segment | None = s
            while p is not None and p.id not in blocked:
                blocked.add(p.id)
                p = p.parent
    return [s for s in segments if s.kv is not None and s.id not in blocked]
