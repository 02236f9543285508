"""Open segments (protocol note 8 of `treesearch.cache.kvstore`): a running row's own K/V held in
the store from admission, sealed in place when it ends, closed when it is preempted (no model).

Exact tests on a tiny store (4-token blocks of 8 bytes a token), then a property test: after any
sequence of admit / fill (a row's prompt written, then sealed in place) / grow / seal / preempt,
`bytes_held` is the sum of what every segment holds and nothing pinned or open was evicted."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.cache.kvstore import KVStore

BPT = 8  # bytes per token
BS = 4  # tokens per block
BLOCK = BS * BPT


def kv(n: int) -> torch.Tensor:
    return torch.zeros(1, 2, 1, n, 2)


def write(seg, n: int, value: float = 1.0) -> None:
    """A row writes n more tokens' K/V into its open segment."""
    seg.kv[:, :, :, seg.used : seg.used + n] = value
    seg.used += n


def test_an_open_segment_holds_its_buffer_exactly_and_closing_frees_it():
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    seg = store.open(5, kv)
    assert seg is not None and seg.kv.shape[3] == 5 and seg.used == 0
    assert store.bytes_held == 5 * BPT and store.peak_held == 5 * BPT  # its buffer, token by token
    assert not store.segments and store.lookup([1, 2]) == ([], 0)  # outside the tree
    store.check_invariants()
    store.close(seg)
    assert store.bytes_held == 0 and not store.open_segments and seg.kv is None
    store.check_invariants()


def test_sealing_keeps_the_kv_where_it_is_and_counts_whole_blocks():
    # root -- A[1..4] -- open X (cap 4, 4 used) + open Y (cap 4, 2 used), sealed as X[5..8] -- Y[9 10]
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    x, y = store.open(4, kv), store.open(4, kv)
    write(x, 4, 2.0)
    write(y, 2, 3.0)
    xptr, yptr = x.kv.data_ptr(), y.kv.data_ptr()
    end = store.seal([x, y], (a, 4), [5, 6, 7, 8, 9, 10])
    assert end == (y, 2)
    assert (x.tokens, x.parent, x.start, y.tokens, y.parent, y.start) == ((5, 6, 7, 8), a, 4, (9, 10), x, 8)
    assert x.kv.data_ptr() == xptr and y.kv.data_ptr() == yptr  # no copy
    assert store.block_ids(x) == [1] and store.block_ids(y) == [2]
    assert store.bytes_held == 3 * BLOCK and not store.open_segments  # y's 2 tokens count a whole block
    assert store.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]) == ([(a, 4), (x, 4), (y, 2)], 10)
    assert float(y.kv[0, 0, 0, 1, 0]) == 3.0
    store.check_invariants()


def test_a_buffer_with_more_blocks_than_its_tokens_is_trimmed_when_sealed():
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    seg = store.open(9, kv)  # 3 blocks of buffer
    write(seg, 3)
    end = store.seal([seg], (store.root, 0), [7, 8, 9])
    assert end == (seg, 3) and seg.kv.shape[3] == 3 and seg.kv.is_contiguous()
    assert store.bytes_held == BLOCK  # its one block, not the 9-token buffer
    store.check_invariants()


def test_sealing_under_a_continuation_the_tree_holds_changes_nothing():
    # root -- A[1..4] -- B[5 6]; an open segment holding 5 6 7 is not sealed under A (the caller copies)
    store = KVStore(bytes_per_token=BPT, block_size=BS)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    store.insert([(a, 4)], [5, 6], kv(2))
    seg = store.open(4, kv)
    write(seg, 3)
    held = store.bytes_held
    assert store.seal([seg], (a, 4), [5, 6, 7]) is None
    assert store.bytes_held == held and seg.id in store.open_segments and seg.used == 3
    store.check_invariants()


def test_opening_evicts_in_policy_order_and_free_room_only_evicts_nothing():
    # budget 3 blocks: A[1..4] (block 0, older), B[5..8] (block 1), both free
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=3 * BLOCK)
    store.insert([], [1, 2, 3, 4], kv(4))
    store.insert([], [5, 6, 7, 8], kv(4))
    assert store.open(2 * BS, kv, evict=False) is None and store.eviction_log == []
    seg = store.open(2 * BS, kv)
    assert seg is not None and store.eviction_log == [0] and store.bytes_held == 3 * BLOCK
    assert store.open(1, kv) is not None and store.eviction_log == [0, 1]  # LRU: A then B
    assert store.open(4, kv) is None  # 3 tokens of room left: open segments are never evicted
    assert store.bytes_held == 2 * BLOCK + BPT
    store.check_invariants()


def test_open_rows_opens_every_rows_segment_or_none_and_counts_the_context_they_read():
    # budget 4 blocks: root -- A[1..4] (read by the rows, evicted) -- and B[5..8] (unread, resident)
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=4 * BLOCK)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    b, _ = store.insert([], [5, 6, 7, 8], kv(4))
    store.evict(a)
    # two rows of 5 and 3 new tokens: 8 tokens (2 blocks) + A made resident again (1) + B (1) fit
    segs = store.open_rows([5, 3], kv, [[(a, 4)], [(a, 4)]])
    assert segs is not None and [s.kv.shape[3] for s in segs] == [5, 3] and b.resident
    assert store.bytes_held == BLOCK + 8 * BPT and a.pins == 0 and b.pins == 0  # the chains' pins let go
    # one more token of room than is left once A is resident again: B is not evicted for it, nothing opens
    assert store.open_rows([BS + 1], kv, [[(a, 4)]]) is None
    assert store.bytes_held == BLOCK + 8 * BPT and b.resident and len(store.open_segments) == 2
    (c,) = store.open_rows([2 * BS], kv, [[]])  # a row that reads nothing: B is evicted for it
    assert not b.resident and store.eviction_log == [0, 1] and store.bytes_held == 16 * BPT
    store.check_invariants()


def test_a_sealed_segment_is_evictable_like_any_other():
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=2 * BLOCK)
    seg = store.open(BS, kv)
    write(seg, BS)
    store.seal([seg], (store.root, 0), [1, 2, 3, 4])
    other = store.open(2 * BS, kv)
    assert other is not None and seg.kv is None and store.eviction_log == [0]
    store.check_invariants()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "fill", "prompt", "grow", "write", "seal", "preempt"]),
            st.integers(0, 7),
        ),
        max_size=40,
    )
)
def test_after_any_admit_fill_grow_seal_preempt_bytes_held_is_what_the_segments_hold(ops):
    """Rows are admitted under a chain end with a fill (an open segment for their prompt), write
    their prompt into it, have it sealed in place when it is full (it then continues their chain
    end, pinned; where it cannot be sealed they keep it open), grow decode segments a segment at a
    time, write, end (decode segments sealed) or are preempted (open segments closed, the sealed
    prompt stays, unpinned), under a budget: bytes_held always equals the sum of every segment's
    bytes, a sealed fill keeps its storage, nothing pinned or open is evicted."""
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=12 * BLOCK)
    base, _ = store.insert([], [100, 101, 102, 103, 104], kv(5))
    rows: list[dict] = []  # end: chain end (pinned); fill: open prompt segment; segs: decode segments
    fresh = iter(range(1000, 100000))
    for op, k in ops:
        if op == "admit":
            end = (base, 1 + k % 5) if base.kv is not None else (store.root, 0)
            fill = store.open(1 + k, kv)
            if fill is not None:
                store.pin(end[0].context_chain(end[1]))
                rows.append({"end": end, "fill": fill, "segs": []})
        elif op == "fill" and rows:
            fill = rows[k % len(rows)]["fill"]
            if fill is not None and fill.used < fill.kv.shape[3]:
                write(fill, min(1 + k, fill.kv.shape[3] - fill.used))
        elif op == "prompt" and rows:
            row = rows[k % len(rows)]
            fill = row["fill"]
            if fill is not None and fill.used == fill.kv.shape[3]:
                ptr, n = fill.kv.data_ptr(), fill.used
                end = store.seal([fill], row["end"], [next(fresh) for _ in range(n)])
                if end is not None:  # else the row goes on reading its fill, closed when it ends
                    assert end == (fill, n) and fill.kv.data_ptr() == ptr  # sealed where it is
                    store.pin([end])
                    row["end"], row["fill"] = end, None
        elif op in ("grow", "write") and rows:
            segs = rows[k % len(rows)]["segs"]
            if op == "grow":
                seg = store.open(1 + k, kv)
                if seg is not None:
                    segs.append(seg)
            elif segs and segs[-1].used < segs[-1].kv.shape[3]:
                write(segs[-1], 1)
        elif op in ("seal", "preempt") and rows:
            row = rows.pop(k % len(rows))
            end, fill, segs = row["end"], row["fill"], row["segs"]
            n = sum(s.used for s in segs)
            sealed = op == "seal" and fill is None and n
            if not sealed or store.seal(segs, end, [next(fresh) for _ in range(n)]) is None:
                for s in segs:
                    store.close(s)
            if fill is not None:
                store.close(fill)
            store.unpin(end[0].context_chain(end[1]))
        for row in rows:
            own = ([row["fill"]] if row["fill"] is not None else []) + row["segs"]
            assert all(s.id in store.open_segments and s.kv is not None for s in own)
        for s in store.segments.values():
            assert s.pins == 0 or s.resident, f"pinned segment {s.id} was evicted"
        every = [*store.segments.values(), *store.open_segments.values()]
        assert store.bytes_held == sum(store.segment_bytes_held(s) for s in every)
        store.check_invariants()


def test_sealing_never_evicts_the_context_it_continues():
    # budget 2 blocks: A[1..4] (block 0, unpinned, the oldest) and an open buffer of 5 tokens whose
    # 5 tokens take 2 blocks when sealed under A: the room for the rounding cannot come from A
    store = KVStore(bytes_per_token=BPT, block_size=BS, budget=2 * BLOCK + BPT)
    a, _ = store.insert([], [1, 2, 3, 4], kv(4))
    seg = store.open(5, kv)
    write(seg, 5)
    assert store.seal([seg], (a, 4), [5, 6, 7, 8, 9]) is None
    assert a.resident and store.eviction_log == [] and seg.id in store.open_segments
    store.check_invariants()
