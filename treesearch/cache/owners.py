"""Which owners hold which segments: the bookkeeping behind protocol notes 2 and 3 of
`treesearch.cache.kvstore`, kept apart from the bytes and the eviction.

An owner (a thought-tree node id) holds every segment on its context chain, once; a segment's
`owners` is the set of owners holding it, so its `refs` can never go negative. Holding never pins:
only running rows' reads do (note 4).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from treesearch.cache.segment import Segment


class OwnerTable:
    """Owner -> held segments; keeps each segment's `owners` in step."""

    def __init__(self) -> None:
        self._held: dict[Hashable, set[Segment]] = {}  # owner -> segments it holds

    def acquire(self, owner: Hashable, handle: tuple[Segment, int]) -> None:
        """The owner holds every segment on the handle's context chain (the root excluded)."""
        held = self._held.setdefault(owner, set())
        seg: Segment | None = handle[0]
        while seg is not None and seg.parent is not None:
            if seg not in held:
                held.add(seg)
                seg.owners.add(owner)
            seg = seg.parent

    def release(self, owner: Hashable) -> list[Segment]:
        """The owner lets go of everything it holds; returns the segments no owner holds any more,
        by id."""
        freed = []
        for seg in self._held.pop(owner, ()):
            assert owner in seg.owners, f"segment {seg.id}: owner {owner!r} released twice"
            seg.owners.discard(owner)
            if not seg.owners:
                freed.append(seg)
        return sorted(freed, key=lambda s: s.id)

    def held_by(self, owner: Hashable) -> set[Segment]:
        return set(self._held.get(owner, ()))

    def owners(self) -> list[Hashable]:
        """Every owner holding something now (an owner that acquired only the root is listed too)."""
        return list(self._held)

    def check(self, segments: Iterable[Segment]) -> None:
        """Recompute each segment's owners from the table and compare (for tests)."""
        holders: dict[int, set] = {}
        for owner, segs in self._held.items():
            for s in segs:
                holders.setdefault(s.id, set()).add(owner)
        for s in segments:
            assert s.pins >= 0, f"segment {s.id}: pins={s.pins}"
            assert s.owners == holders.get(s.id, set()), f"segment {s.id}: owners {s.owners} != holders"
