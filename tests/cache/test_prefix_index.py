"""The exact prefix index of the KV store, on hand-built token sequences (no model)."""

from __future__ import annotations

import torch

from treesearch.cache.kvstore import KVStore


def kv(n: int) -> torch.Tensor:
    return torch.zeros(2, 2, 1, n, 4)


def test_lookup_finds_longest_prefix_and_partial_segment():
    # root -- A[1 2 3 4 5 6] ; lookup of [1 2 3 9] stops inside A after 3 tokens
    store = KVStore(bytes_per_token=64, block_size=4)
    a, used = store.insert([], [1, 2, 3, 4, 5, 6], kv(6))
    assert used == 6
    chain, matched = store.lookup([1, 2, 3, 9])
    assert matched == 3 and chain == [(a, 3)]
    store.check_invariants()


def test_insert_hangs_a_divergent_run_inside_its_parent():
    # root -- A[1 2 3 4 5 6]
    #             `-- (at 3) B[9 9]
    store = KVStore(bytes_per_token=64, block_size=4)
    a, _ = store.insert([], [1, 2, 3, 4, 5, 6], kv(6))
    chain, matched = store.lookup([1, 2, 3, 9, 9, 7])
    b, used = store.insert(chain, [9, 9], kv(2))
    assert (b.parent, b.parent_len, b.start, used) == (a, 3, 3, 2)
    chain, matched = store.lookup([1, 2, 3, 9, 9, 7])
    assert matched == 5 and chain == [(a, 3), (b, 2)]
    store.check_invariants()


def test_insert_of_cached_tokens_returns_existing_segment_without_new_bytes():
    store = KVStore(bytes_per_token=64, block_size=4)
    a, _ = store.insert([], [1, 2, 3, 4, 5], kv(5))
    held = store.bytes_held
    seg, used = store.insert([], [1, 2, 3], kv(3))
    assert (seg, used) == (a, 3)
    assert store.bytes_held == held == 2 * 4 * 64  # 5 tokens occupy 2 blocks of 4
    store.check_invariants()


def test_lookup_respects_limit():
    store = KVStore(bytes_per_token=64, block_size=4)
    store.insert([], [1, 2, 3, 4], kv(4))
    _, matched = store.lookup([1, 2, 3, 4], limit=3)
    assert matched == 3


def test_evicted_segment_keeps_tokens_and_can_be_refilled():
    store = KVStore(bytes_per_token=64, block_size=4)
    a, _ = store.insert([], [1, 2, 3], kv(3))
    assert store.evict(a) == 4 * 64
    assert a.tokens == (1, 2, 3) and not a.resident and store.bytes_held == 0
    store.refill(a, kv(3))
    assert store.bytes_held == 4 * 64
    store.check_invariants()
