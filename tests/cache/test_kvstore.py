"""The KV store's block pool protocol: ref counts by owners, freeing, pins, budget (no model).

Property tests drive a store with random operations and check, after every one, the invariants of
the module docstring (recomputed from scratch by `check_invariants`) plus what each operation
promises: ref counts never negative, a segment freed exactly when its last owner lets go, pinned
segments never evicted, bytes held <= budget.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.cache.eviction import is_evictable
from treesearch.cache.kvstore import KVStore
from treesearch.common.errors import CacheBudgetError
from treesearch.policies.rsbcm import RSBCMPolicy

BPT = 8  # bytes per token in these tests
BS = 4  # tokens per block


def kv(n: int) -> torch.Tensor:
    return torch.zeros(1, 2, 1, n, 2)


def test_blocks_are_counted_whole_and_ids_are_consecutive_runs():
    # root -- A[1..6] (2 blocks: ids 0 1) -- B[7 8 9] (1 block: id 2)
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    a, _ = store.insert([], [1, 2, 3, 4, 5, 6], kv(6))
    b, _ = store.insert([(a, 6)], [7, 8, 9], kv(3))
    assert store.block_ids(a) == [0, 1] and store.block_ids(b) == [2]
    assert store.bytes_held == 3 * BS * BPT
    store.check_invariants()


def test_a_segment_resident_for_a_prefix_holds_and_frees_only_those_blocks():
    # root -- A[1..10] (3 block ids: 0 1 2) resident for 5 tokens, then 9, then evicted
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    a, _ = store.insert([], list(range(1, 11)), kv(5))
    assert a.resident_len == 5 and store.bytes_held == 2 * BS * BPT
    b, _ = store.insert([(a, 4)], [99, 98], kv(2))  # a child inside the resident part is fine
    with pytest.raises(AssertionError, match="refill ancestors first"):
        store.insert([(a, 7)], [97], kv(1))  # a child beyond it needs A resident up to 7 first
    store.refill(a, kv(9))
    assert a.resident_len == 9 and store.bytes_held == (3 + 1) * BS * BPT
    assert store.pinned_bytes([(a, 10)]) == 3 * BS * BPT  # all 10 tokens fit in A's 3 blocks
    store.evict(b)
    store.evict(a)
    assert store.eviction_log == [3, 0, 1, 2] and store.evicted_blocks == 4 and store.bytes_held == 0
    store.check_invariants()


def test_can_hold_counts_only_what_eviction_could_free():
    # root -- A[1..4] owned by 1 -- B[5..8] free ; C[9..12] free and pinned
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=4 * BS * BPT)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    b, _ = store.insert([(a, 4)], [5, 6, 7, 8], kv(4))
    c, _ = store.insert([], [9, 10, 11, 12], kv(4))
    store.acquire(1, (a, 4))
    store.pin([(c, 4)])
    assert store.reclaimable_bytes() == 2 * BS * BPT  # A and B; C is pinned
    assert store.reclaimable_bytes(free_only=True) == BS * BPT  # B only: A is owned
    assert store.can_hold(3 * BS * BPT) and not store.can_hold(4 * BS * BPT)
    assert store.can_hold(2 * BS * BPT, free_only=True) and not store.can_hold(3 * BS * BPT, free_only=True)
    store.check_invariants()


def test_try_reserve_reserves_or_changes_nothing():
    # root -- A[1..4] (block 0) -- B[5..8] free (block 1) ; C[9..12] pinned (block 2); budget 4 blocks
    block = BS * BPT
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=4 * block)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    b, _ = store.insert([(a, 4)], [5, 6, 7, 8], kv(4))
    c, _ = store.insert([], [9, 10, 11, 12], kv(4))
    store.pin([(c, 4)])
    assert not store.try_reserve(4 * block)  # one block free, two evictable: three at most
    assert (store.bytes_held, store.reserved, store.eviction_log) == (3 * block, 0, [])
    assert store.try_reserve(block, evict=False)  # the free block
    assert not store.try_reserve(block, evict=False)  # more only by evicting: refused, nothing changed
    assert (store.bytes_held, store.reserved, store.eviction_log) == (3 * block, block, [])
    assert store.try_reserve(2 * block)  # B, then A (a leaf once B is gone)
    assert store.eviction_log == [1, 0] and (store.bytes_held, store.reserved) == (block, 3 * block)
    store.check_invariants()


def refill_then_reserve(store: KVStore, chains: list, nbytes: int) -> bool:
    """What the allocator itself gets for a row that reads the chains (pinned, made resident) and
    then reserves nbytes: the outcome `fits` must predict (it changes the store)."""
    for chain in chains:
        store.pin(chain)
    try:
        for chain in chains:
            for s, used in chain:
                if used > s.resident_len:
                    store.refill(s, kv(used))
    except CacheBudgetError:
        return False
    return store.try_reserve(nbytes)


def test_missing_bytes_counts_each_segment_once_in_whole_blocks():
    # root -- A[1..10] (3 blocks) resident for 5 tokens (2 blocks) -- B[11 12] evicted (1 block)
    block = BS * BPT
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    a, _ = store.insert([], list(range(1, 11)), kv(5))
    b, _ = store.insert([(a, 10)], [11, 12], None)
    assert store.missing_bytes([]) == 0
    assert store.missing_bytes([[(a, 5)]]) == 0 and store.missing_bytes([[(a, 8)]]) == 0  # A's 2nd block
    assert store.missing_bytes([[(a, 9)]]) == block  # the third block
    assert store.missing_bytes([[(a, 9)], [(a, 10)], [(a, 6)]]) == block  # the furthest use, once
    assert store.missing_bytes([[(a, 10), (b, 2)]]) == 2 * block
    assert store.bytes_held == 2 * block and (a.pins, b.pins) == (0, 0)  # it changes nothing


@pytest.mark.parametrize(("blocks", "fits"), [(0, True), (1, True), (2, False)])
def test_fits_answers_what_refilling_the_chain_then_reserving_gets(blocks, fits):
    # root -- A[1..4] (block 0) -- B[5..8] evicted (block 1) ; C[9..12] free ; D[13..16] pinned
    # budget 4 blocks: A, C, D held; reading A+B pins them and B's refill takes one more block,
    # so C (the only evictable one) leaves room for one block beside them, not two
    block = BS * BPT
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=4 * block)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    b, _ = store.insert([(a, 4)], [5, 6, 7, 8], kv(4))
    c, _ = store.insert([], [9, 10, 11, 12], kv(4))
    d, _ = store.insert([], [13, 14, 15, 16], kv(4))
    store.evict(b)
    store.pin([(d, 4)])
    chain = [(a, 4), (b, 4)]
    assert store.missing_bytes([chain, [(a, 2)]]) == block
    assert store.fits(blocks * block, [chain]) is fits
    assert store.fits(blocks * block, [chain, [(a, 4)]]) is fits  # a segment read twice counts once
    both = [[(c, 4)], chain]  # C read too: B's refill takes the free block and nothing is left
    assert store.fits(0, both) and not store.fits(1, both)
    assert (a.pins, b.pins, c.pins, d.pins) == (0, 0, 0, 1)  # asked, not taken
    assert (store.bytes_held, store.reserved, store.eviction_log) == (3 * block, 0, [1])
    assert refill_then_reserve(store, [chain], blocks * block) is fits  # the allocator itself: C goes for B
    store.check_invariants()


def test_fits_counts_what_is_reserved_and_without_a_budget_always_fits():
    # root -- A[1..4] evicted ; budget 3 blocks of which 2 reserved by running batches
    block = BS * BPT
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=3 * block)
    a, _ = store.insert([], [1, 2, 3, 4], None)
    store.reserve(2 * block)
    assert store.fits(0, [[(a, 4)]]) and not store.fits(1, [[(a, 4)]])
    assert store.fits(block, []) and not store.fits(block + 1, [])
    unbounded = KVStore(bytes_per_token=BPT, block_size=BS)
    c, _ = unbounded.insert([], [1, 2, 3, 4], None)
    assert unbounded.fits(10**12, [[(c, 4)]]) and c.pins == 0


def test_fits_counts_the_context_a_pin_keeps_resident_which_pinned_bytes_does_not():
    # root -- A[1..4] -- B[5..8] pinned alone (not A): A cannot go while B is resident (note 5)
    block = BS * BPT
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=3 * block)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    b, _ = store.insert([(a, 4)], [5, 6, 7, 8], kv(4))
    store.pin([(b, 4)])
    assert store.pinned_bytes() + 2 * block <= store.budget  # the old sum: two blocks more "fit"
    assert store.fits(block, []) and not store.fits(2 * block, [])
    assert store.try_reserve(2 * block) is False  # the allocator: one


@settings(max_examples=100, deadline=None)
@given(
    tree=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 9), st.booleans()), min_size=1, max_size=8),
    evict=st.lists(st.integers(0, 9), max_size=10),
    free_blocks=st.integers(0, 4),
    reserved_tokens=st.integers(0, 2 * BS),
    pin=st.integers(0, 9),
    read=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 9)), min_size=1, max_size=3),
    nbytes=st.integers(0, 2 * BS * BPT),
)
def test_fits_is_what_the_allocator_then_does(tree, evict, free_blocks, reserved_tokens, pin, read, nbytes):
    # a random tree of segments (some resident for a prefix only), random leaves evicted, a few
    # free blocks, some reserved, one reader's chain pinned; then rows read random chains
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    segs: list = []
    tokens = iter(range(1, 10**6))
    for parent, n, half in tree:
        chain = segs[parent].context_chain(segs[parent].resident_len) if parent < len(segs) else []
        seg, _ = store.insert(chain, [next(tokens) for _ in range(n)], kv(max(1, n // 2) if half else n))
        segs.append(seg)
    for i in evict:
        if is_evictable(segs[i % len(segs)]):
            store.evict(segs[i % len(segs)])
    store.budget = store.bytes_held + free_blocks * BS * BPT + reserved_tokens * BPT
    store.reserve(reserved_tokens * BPT)
    held = segs[pin % len(segs)]
    if held.resident:
        store.pin(held.context_chain(held.resident_len))
    chains = [segs[i % len(segs)].context_chain(min(u, len(segs[i % len(segs)]))) for i, u in read]
    before = {s.id: s.pins for s in store.segments.values()}
    said = store.fits(nbytes, chains)
    assert {s.id: s.pins for s in store.segments.values()} == before  # asked, not taken
    twin, twin_chains = copy.deepcopy((store, chains))
    assert said == refill_then_reserve(twin, twin_chains, nbytes)
    twin.check_invariants()


def test_refs_count_owners_once_and_free_exactly_at_last_release():
    # root -- A[1 2 3 4] -- B[5 6]      owners: 10 holds B (so A too), 11 holds A
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    b, _ = store.insert([(a, 4)], [5, 6], kv(2))
    store.acquire(10, (b, 2))
    store.acquire(10, (b, 1))  # the same owner again: no second reference
    store.acquire(11, (a, 4))
    assert (a.refs, b.refs) == (2, 1)
    assert store.release(10) == [b]  # B's last owner let go; A still held by 11
    assert store.free_segments() == [b]
    assert store.release(11) == [a]
    assert (a.refs, b.refs) == (0, 0)
    assert store.release(11) == []  # releasing again holds nothing: refs stay at 0
    store.check_invariants()


def test_budget_evicts_free_leaf_before_owned_and_never_a_pinned_segment():
    # root -- A[1 2 3 4] -+- B[5 6 7 8]   owned by 1 (omega 5)
    #                     `- C[9 9 9 9]   free
    # inserting D (1 block) into a 3-block budget evicts C (block 2) first
    scores = {1: 5.0}
    store = KVStore(
        bytes_per_token=BPT, block_size=BS, budget=3 * BS * BPT, policy=RSBCMPolicy(lambda o: scores.get(o))
    )
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    b, _ = store.insert([(a, 4)], [5, 6, 7, 8], kv(4))
    c, _ = store.insert([(a, 4)], [9, 9, 9, 9], kv(4))
    store.acquire(1, (b, 4))
    store.pin([(a, 4)])
    store.insert([(a, 4)], [3, 3], kv(2))
    assert store.eviction_log == [2]
    assert not c.resident and b.resident and a.resident
    store.check_invariants()


def test_make_room_raises_when_everything_is_pinned():
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=2 * BS * BPT)
    a, _ = store.insert([], [1, 2, 3, 4, 5], kv(5))
    store.pin([(a, 5)])
    with pytest.raises(CacheBudgetError, match="raise --cache-budget to at least"):
        store.insert([(a, 5)], [6], kv(1))
    store.check_invariants()


def test_an_owner_holds_without_pinning_and_a_reader_pins_until_it_stops():
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    a, _ = store.insert([], [1, 2, 3], kv(3))
    store.acquire("root", (a, 3))
    assert a.pins == 0 and store.evictable() == [a]
    store.pin([(a, 3)])
    assert a.pins == 1 and store.evictable() == []
    store.unpin([(a, 3)])
    assert a.pins == 0 and store.evictable() == [a]
    store.check_invariants()


# -- property test: random operations ------------------------------------------------------------

op = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 30), st.lists(st.integers(1, 3), min_size=1, max_size=9)),
    st.tuples(
        st.just("insert_part"), st.integers(0, 30), st.lists(st.integers(1, 3), min_size=1, max_size=9)
    ),
    st.tuples(st.just("extend"), st.integers(0, 30), st.integers(0, 0)),
    st.tuples(st.just("acquire"), st.integers(0, 4), st.integers(0, 30)),
    st.tuples(st.just("release"), st.integers(0, 4), st.integers(0, 0)),
    st.tuples(st.just("pin"), st.integers(0, 30), st.integers(0, 0)),
    st.tuples(st.just("unpin"), st.integers(0, 30), st.integers(0, 0)),
    st.tuples(st.just("score"), st.integers(0, 4), st.integers(-3, 20)),
    st.tuples(st.just("fits"), st.integers(0, 30), st.integers(0, 3 * BS)),
)


@settings(max_examples=100, deadline=None)
@given(budget_blocks=st.integers(3, 12), ops=st.lists(op, max_size=40))
def test_pool_invariants_hold_after_every_operation(budget_blocks, ops):
    scores: dict[int, float] = {}
    store = KVStore(
        bytes_per_token=BPT,
        block_size=BS,
        budget=budget_blocks * BS * BPT,
        policy=RSBCMPolicy(lambda o: scores.get(o)),
    )
    handles: list = []  # (segment, used) ends seen so far
    pins: list = []  # chains pinned by this test
    for name, x, y in ops:
        pinned_before = {s.id for s in store.segments.values() if s.pins > 0 and s.resident}
        if name in ("insert", "insert_part"):  # insert_part: K/V for the first half of the new tokens only
            chain = (
                []
                if not handles
                else handles[x % len(handles)][0].context_chain(handles[x % len(handles)][1])
            )
            ctx = [t for s, used in chain for t in s.tokens[:used]]
            walk, _ = store.lookup(ctx + y)
            if any(used > s.resident_len for s, used in walk):
                continue  # the engine refills what the new tokens run through before inserting
            try:
                end = store.insert(chain, y, kv(len(y) if name == "insert" else max(1, len(y) // 2)))
            except CacheBudgetError:  # only when all that is left is the new tokens' own context
                assert {s.id for s in store.evictable()} <= {s.id for s, _ in walk}
            else:
                if end[0].resident:
                    handles.append((end[0], min(end[1], end[0].resident_len)))
        elif name == "acquire" and handles:
            seg, used = handles[y % len(handles)]
            before = seg.refs
            store.acquire(x, (seg, used))
            assert seg.refs in (before, before + 1)
        elif name == "release":
            owners_before = {s.id: set(s.owners) for s in store.segments.values()}
            freed = store.release(x)
            expect = sorted(i for i, o in owners_before.items() if o == {x})
            assert [s.id for s in freed] == expect  # freed exactly when the last owner let go
        elif name == "extend" and handles:  # make a partly resident segment resident in full
            seg = handles[x % len(handles)][0]
            if 0 < seg.resident_len < len(seg):
                try:
                    store.refill(seg, kv(len(seg)))
                except CacheBudgetError:  # only when nothing evictable is left outside its context
                    assert {s.id for s in store.evictable()} <= {s.id for s, _ in seg.context_chain()}
        elif name == "pin" and handles:
            seg, used = handles[x % len(handles)]
            chain = seg.context_chain(used)
            if all(u <= s.resident_len for s, u in chain):
                store.pin(chain)
                pins.append(chain)
        elif name == "unpin" and pins:
            store.unpin(pins.pop(x % len(pins)))
        elif name == "score":
            scores[x] = float(y)
        elif name == "fits" and handles:  # the prediction is what the allocator then does, and takes nothing
            seg, used = handles[x % len(handles)]
            chain = seg.context_chain(used)
            before = {s.id: s.pins for s in store.segments.values()}
            said = store.fits(y * BPT, [chain])
            assert {s.id: s.pins for s in store.segments.values()} == before
            twin, twin_chain = copy.deepcopy((store, chain))
            assert said == refill_then_reserve(twin, [twin_chain], y * BPT)
        store.check_invariants()
        assert all(s.refs >= 0 and s.pins >= 0 for s in store.segments.values())
        assert store.bytes_held <= store.budget
        still = {s.id for s in store.segments.values() if s.resident}
        assert pinned_before <= still, f"pinned segments {pinned_before - still} were evicted"
