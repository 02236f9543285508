"""Which owners hold which segments, and which owners are pinned: the bookkeeping behind protocol
notes 2 to 4 of `treesearch.cache.kvstore`, kept apart from the bytes and the eviction.

An owner (a thought-tree node id) holds every segment on its context chain, once; a segment's
`owners` is the set of owners holding it, so its `refs` can never go negative. A pinned owner (the
root prompt) adds one pin to each segment it holds, now and later, until it is released.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from treesearch.cache.segment import Segment


class OwnerTable:
    """Owner -> held segments, and the set of pinned owners; keeps each segment's `owners` and the
    pinned owners' share of its `pins` in step."""

    def __init__(self) -> None:
        self._held: dict[Hashable, set[Segment]] = {}  # owner -> segments it holds
        self._pinned: set[Hashable] = set()

    def acquire(self, owner: Hashable, handle: tuple[Segment, int]) -> None:
        """The owner holds every segment on the handle's context chain (the root excluded)."""
        held = self._held.setdefault(owner, set())
        pinned = owner in self._pinned
        seg: Segment | None = handle[0]
        while seg is not None and seg.parent is not None:
            if seg not in held:
                held.add(seg)
                seg.owners.add(owner)
                if pinned:
                    seg.pins += 1
            seg = seg.parent

    def release(self, owner: Hashable) -> list[Segment]:
        """The owner lets go of everything it holds (and is no longer pinned); returns the segments
        no owner holds any more, by id."""
        freed = []
        pinned = owner in self._pinned
        for seg in self._held.pop(owner, ()):
            assert owner in seg.owners, f"segment {seg.id}: owner {owner!r} released twice"
            seg.owners.discard(owner)
            if pinned:
                seg.pins -= 1
            if not seg.owners:
                freed.append(seg)
        self._pinned.discard(owner)
        return sorted(freed, key=lambda s: s.id)

    def held_by(self, owner: Hashable) -> set[Segment]:
        return set(self._held.get(owner, ()))

    def unpin_owner(self, owner: Hashable) -> None:
        """The owner keeps what it holds, unpinned: evictable again, until it is released."""
        if owner not in self._pinned:
            return
        self._pinned.discard(owner)
        for seg in self._held.get(owner, ()):
            seg.pins -= 1

    def pin_owner(self, owner: Hashable) -> None:
        """Pin whatever this owner holds, now and later, until it is released."""
        if owner in self._pinned:
            return
        self._pinned.add(owner)
        for seg in self._held.get(owner, ()):
            seg.pins += 1

    def owners(self) -> list[Hashable]:
        """Every owner holding something now (an owner that acquired only the root is listed too)."""
        return list(self._held)

    def check(self, segments: Iterable[Segment]) -> None:
        """Recompute each segment's owners and pinned-owner pins from the table and compare (for
        tests): `owners` equals its holders, `pins` is at least the pinned owners holding it."""
        holders: dict[int, set] = {}
        for owner, segs in self._held.items():
            for s in segs:
                holders.setdefault(s.id, set()).add(owner)
        owner_pins: dict[int, int] = {}
        for owner in self._pinned:
            for s in self._held.get(owner, ()):
                owner_pins[s.id] = owner_pins.get(s.id, 0) + 1
        for s in segments:
            assert s.pins >= 0, f"segment {s.id}: pins={s.pins}"
            assert s.pins >= owner_pins.get(s.id, 0), f"segment {s.id}: pins {s.pins} < pinned owners"
            assert s.owners == holders.get(s.id, set()), f"segment {s.id}: owners {s.owners} != holders"
