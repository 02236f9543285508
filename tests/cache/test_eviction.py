"""Eviction's selection rules: which segments are evictable, the order `eviction_order` offers them
in, and what `reclaimable` says eviction could reach (no model).

The exact tests use hand-built trees; the property test builds random trees through a `KVStore`,
pins random contexts, drains `eviction_order` with the store's `evict` and checks, after every
eviction, `check_invariants`, that the segment offered was the lowest-key leaf of the resident tree,
and at the end that exactly what `reclaimable` listed was evicted, pinned segments untouched."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.cache.eviction import eviction_order, is_evictable, reclaimable
from treesearch.cache.kvstore import KVStore
from treesearch.cache.segment import Segment


def kv(n: int) -> torch.Tensor:
    return torch.zeros(1, 2, 1, n, 2)


def tree() -> dict[str, Segment]:
    """root -- A[1 2 3 4] -+- (at 4) B[5 6] -- (at 2) D[7]
    `- (at 2) C[8 9]            all resident"""
    root = Segment(id=0, tokens=(), parent=None, parent_len=0, start=0)
    a = Segment(id=1, tokens=(1, 2, 3, 4), parent=root, parent_len=0, start=0, kv=kv(4))
    b = Segment(id=2, tokens=(5, 6), parent=a, parent_len=4, start=4, kv=kv(2))
    c = Segment(id=3, tokens=(8, 9), parent=a, parent_len=2, start=2, kv=kv(2))
    d = Segment(id=4, tokens=(7,), parent=b, parent_len=2, start=6, kv=kv(1))
    root.children[(0, 1)] = a
    a.children[(4, 5)] = b
    a.children[(2, 8)] = c
    b.children[(2, 7)] = d
    return {"root": root, "a": a, "b": b, "c": c, "d": d}


def drain(candidates: list[Segment], key: dict[int, float]) -> list[str]:
    """Evict (drop the K/V of) each segment eviction_order offers; their names, in order."""
    names = []
    for s in eviction_order(candidates, lambda s: key[s.id]):
        assert is_evictable(s), f"segment {s.id} offered while not evictable"
        s.kv = None
        names.append("abcd"[s.id - 1])
    return names


def test_only_unpinned_resident_leaves_of_the_resident_tree_are_evictable():
    t = tree()
    assert [is_evictable(t[k]) for k in ("root", "a", "b", "c", "d")] == [False, False, False, True, True]
    t["d"].pins = 1
    assert not is_evictable(t["d"])
    t["d"].pins, t["d"].kv = 0, None
    assert not is_evictable(t["d"]) and is_evictable(t["b"])  # evicted: B is now a leaf


def test_order_is_lowest_key_first_among_leaves_and_a_parent_joins_when_its_last_child_goes():
    t = tree()
    key = {1: 0.0, 2: 5.0, 3: 3.0, 4: 1.0}  # A has the lowest key but is evicted last: it is no leaf
    assert drain([t["c"], t["d"]], key) == ["d", "c", "b", "a"]


def test_ties_in_the_key_are_broken_by_segment_id():
    t = tree()
    assert drain([t["d"], t["c"]], {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}) == ["c", "d", "b", "a"]


def test_a_pinned_segment_keeps_its_context_and_stops_the_order_there():
    t = tree()
    t["b"].pins = 1
    assert [s.id for s in reclaimable(t[k] for k in "abcd")] == [3, 4]  # C and D; B pins A
    assert drain([t["c"], t["d"]], {1: 0.0, 2: 0.0, 3: 2.0, 4: 1.0}) == ["d", "c"]
    assert t["a"].resident and t["b"].resident


def test_free_only_also_spares_owned_segments_and_their_context():
    t = tree()
    t["c"].owners.add("x")
    assert [s.id for s in reclaimable(t[k] for k in "abcd")] == [1, 2, 3, 4]
    assert [s.id for s in reclaimable((t[k] for k in "abcd"), free_only=True)] == [2, 4]
    t["b"].kv = t["d"].kv = None
    assert [s.id for s in reclaimable((t[k] for k in "abcd"), free_only=True)] == []  # evicted ones neither


@settings(max_examples=100, deadline=None)
@given(
    inserts=st.lists(
        st.tuples(st.integers(0, 20), st.lists(st.integers(1, 3), min_size=1, max_size=6)), max_size=15
    ),
    pinned=st.lists(st.integers(0, 20), max_size=3),
    keys=st.lists(st.integers(0, 4), min_size=1, max_size=8),
)
def test_draining_the_order_evicts_exactly_what_is_reclaimable_lowest_leaf_first(inserts, pinned, keys):
    store = KVStore(bytes_per_token=8, block_size=4)
    ends: list[tuple[Segment, int]] = []
    for at, tokens in inserts:
        chain = [] if not ends else ends[at % len(ends)][0].context_chain(ends[at % len(ends)][1])
        ends.append(store.insert(chain, tokens, kv(len(tokens))))
    for p in pinned:
        if ends:
            store.pin(ends[p % len(ends)][0].context_chain())

    def key(s: Segment) -> int:
        return keys[s.id % len(keys)]

    expect = {s.id for s in reclaimable(store.segments.values())}
    expect_bytes = store.reclaimable_bytes()
    pinned_ids = {s.id for s in store.segments.values() if s.pins > 0}
    evicted, freed = [], 0
    for s in eviction_order(store.evictable(), key):
        leaves = store.evictable()
        assert (key(s), s.id) == min((key(x), x.id) for x in leaves)
        freed += store.evict(s)
        evicted.append(s.id)
        store.check_invariants()
    assert len(evicted) == len(set(evicted)) and set(evicted) == expect
    assert freed == expect_bytes and not pinned_ids & expect
    assert store.evictable() == [] and store.reclaimable_bytes() == 0
