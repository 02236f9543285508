"""The cache manager (`treesearch.cache.manager`), residency (`treesearch.engine.runner.make_resident`)
and shared runs (`treesearch.cache.shared_runs`, planning only), directly, over a real `KVStore`
(no model).

The `compute` function recomputation is given is `Recompute` below: the K/V of a token at absolute
position p is a tensor holding (p, token), so a test can check that every resident segment holds
exactly its own tokens at its own positions, whether it was stored, refilled or recomputed. It also
checks that what it is asked to attend over is resident (what the engine's forward requires) and
records each call, so tests can assert which recomputations ran, in what order.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.cache.kvstore import Chain, Segment
from treesearch.cache.manager import CacheManager, Row, bare_copy
from treesearch.cache.shared_runs import shared_run_followers
from treesearch.common.config import RKSCConfig
from treesearch.common.errors import CacheBudgetError
from treesearch.common.stats import Stats
from treesearch.engine.runner import make_resident
from treesearch.policies.rsbcm import UNSCORED, RootPrompt

BPT = 8  # bytes per token in these tests
BS = 4  # tokens per block
BLOCK = BS * BPT  # bytes per block


def kvt(tokens, start: int) -> torch.Tensor:
    """K/V [1, 2, 1, n, 2] of tokens at absolute positions start..: (position, token) per token."""
    n = len(tokens)
    t = torch.zeros(1, 2, 1, n, 2)
    t[..., 0] = torch.arange(start, start + n, dtype=torch.float32)
    t[..., 1] = torch.tensor(list(tokens), dtype=torch.float32)
    return t


class Recompute:
    """Planning's compute: checks each chain is resident, records the call, returns kvt."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[int, int]], list[int], int]] = []
        self.charges: list[Stats] = []

    def __call__(self, chains: list[Chain], news, starts, charge) -> list[torch.Tensor]:
        out = []
        for chain, new, start, ch in zip(chains, news, starts, charge):
            assert all(used <= s.resident_len for s, used in chain), "compute over a non-resident chain"
            self.calls.append(([(s.id, used) for s, used in chain], list(new), start))
            self.charges.append(ch)
            out.append(kvt(new, start))
        return out


def make(budget: int | None = None, eviction: str = "omega", share_min_tokens: int = 8):
    model = Recompute()
    cm = CacheManager(
        BPT,
        RKSCConfig(block_size=BS, cache_budget=budget, eviction=eviction),
        Stats(),
        share_min_tokens=share_min_tokens,
    )
    return cm, model


def put(cm: CacheManager, ids: list[int], start: int = 0, **kw) -> tuple[Segment, int]:
    """Store the K/V of ids[start:] the way the engine does after a forward, then end the call."""
    end = cm.store_kv(ids, start, kvt(ids[start:], start), **kw)
    cm.end_call()
    return end


def kv_is_exact(seg: Segment) -> bool:
    return seg.kv is None or torch.equal(seg.kv, kvt(seg.tokens[: seg.resident_len], seg.start))


# -- lookup, need_bytes, check_budget ---------------------------------------------------------------


def test_lookup_leaves_one_token_to_compute_and_a_bare_row_takes_no_prefix():
    cm, _ = make()
    a, _ = put(cm, [1, 2, 3, 4, 5, 6, 7, 8])
    whole, longer, bare = (
        Row(ids=[1, 2, 3, 4, 5, 6, 7, 8]),
        Row(ids=[1, 2, 3, 4, 5, 6, 7, 8, 9]),
        Row(ids=[1, 2, 3, 9], bare=True),
    )
    cm.lookup([whole, longer, bare])
    assert (whole.chain, whole.matched, whole.cut) == ([(a, 7)], 7, 0)  # its last token is computed
    assert (longer.chain, longer.matched) == ([(a, 8)], 8)
    assert (bare.chain, bare.matched, bare.cut) == ([], 0, 3)


def test_need_bytes_counts_the_chain_the_must_store_blocks_and_the_batch_buffer():
    cm, _ = make()
    a, _ = put(cm, [1, 2, 3, 4, 5, 6, 7, 8])  # 2 blocks
    r = Row(ids=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    cm.lookup([r])
    assert r.matched == 8
    assert cm.need_bytes([r], extra=5) == 2 * BLOCK + (3 + 5) * BPT
    r.must_store = True  # its 3 new prompt tokens must be cached: one more block
    assert cm.need_bytes([r], extra=5) == 3 * BLOCK + (3 + 5) * BPT
    # two rows: the buffer is rows x (longest new part + extra); the shared chain counts once
    s = Row(ids=[1, 2, 3, 4, 5, 6, 7, 8, 9])
    cm.lookup([s])
    r.must_store = False
    assert cm.need_bytes([r, s], extra=0) == 2 * BLOCK + 2 * 3 * BPT


def test_check_budget_names_the_least_budget_and_counts_it_in_the_rows_stats():
    # A[1..5] takes 2 blocks (64 bytes): reusing it needs 64 + 1 token of buffer = 72 bytes, while
    # computing the row bare needs only its 6 tokens of buffer = 48: the minimum is the smaller
    cm, _ = make(budget=47)
    put(cm, [1, 2, 3, 4, 5])
    st_row = Stats()
    r = Row(ids=[1, 2, 3, 4, 5, 6], stats=st_row)
    cm.lookup([r])
    assert r.matched == 5 and cm.need_bytes([r], 0) == 72 and cm.need_bytes([bare_copy(r)], 0) == 48
    with pytest.raises(CacheBudgetError) as err:
        cm.check_budget([r], extra=0)
    msg = str(err.value)
    assert "cache_budget=47 bytes cannot run this call" in msg
    assert "need at least 48 bytes (6 tokens of K/V at 8 bytes each)" in msg
    assert "raise --cache-budget to at least 48" in msg
    assert st_row.least_budget_bytes == 48 and cm.stats.least_budget_bytes == 0
    cm.store.budget = 48
    cm.check_budget([r], extra=0)  # exactly the minimum runs
    cm.check_budget([], extra=100)  # no rows: nothing to check


def with_protected_prompt() -> CacheManager:
    """A manager (budget 1000) whose owner "root" has its prompt [1..5] (2 blocks) protected."""
    cm, _ = make(budget=1000)
    cm.protect("root")
    end = cm.store_kv([1, 2, 3, 4, 5], 0, kvt([1, 2, 3, 4, 5], 0))
    cm.hold_prompt(end, "root")
    cm.end_call()
    return cm


def test_a_protected_prompt_is_held_unpinned_and_evicted_after_every_other_segment():
    cm = with_protected_prompt()
    assert cm.store.pinned_bytes() == 0 and cm.protected("root") and not cm.protected(None)
    assert cm.store.owners() == [RootPrompt("root")]  # held: evicted only for room, and last
    other = put(cm, [7, 7, 7, 7])
    cm.acquire(5, other)  # a judged branch (omega 5) still goes before the root prompt
    cm.set_priority(lambda o: 5.0)
    cm.store.budget = 2 * BLOCK
    cm.store.make_room(0)
    assert cm.store.eviction_log == cm.store.block_ids(other[0])
    cm.store.budget = 0
    cm.store.make_room(0)  # nothing pins the root prompt: a budget that needs its room gets it
    assert cm.store.bytes_held == 0
    cm.release("root")
    assert cm.store.owners() == [5] and not cm.protected("root")
    cm.store.check_invariants()


def test_check_budget_counts_no_protected_prompt_of_an_earlier_call():
    cm = with_protected_prompt()
    r = Row(ids=[7, 7, 7], stats=Stats())
    cm.lookup([r])
    cm.check_budget([r], extra=2)
    assert r.stats.least_budget_bytes == (3 + 2) * BPT  # the row's buffer: the prompt is evictable


def test_a_must_store_rows_bare_need_counts_its_prompt_once_not_beside_its_reused_chain():
    # A[1..5] (2 blocks) is cached; a must-store row (its prompt stays cached: a search's root)
    # shares 2 of its tokens. Reusing them holds A's 2 blocks, 1 block for the 4 new tokens and
    # 4 tokens of buffer (128); bare, it stores its 6 tokens in 2 blocks with 6 tokens of buffer
    # (112). The bare need used to count A and the row's 1 new block as well (176), so a search
    # with room alone failed when a kept cache held a prompt that shared its first tokens.
    cm, _ = make(budget=112)
    put(cm, [1, 2, 3, 4, 5])
    r = Row(ids=[1, 2, 7, 7, 7, 7], stats=Stats(), must_store=True)
    cm.lookup([r])
    assert r.matched == 2 and cm.need_bytes([r], 0) == 3 * BLOCK + 4 * BPT
    cm.check_budget([r], extra=0)
    assert r.stats.least_budget_bytes == 2 * BLOCK + 6 * BPT


# -- reserve, report_peak, omega and LRU order ----------------------------------------------


def three_owned(eviction: str) -> tuple[CacheManager, list[Segment]]:
    """A, B, C of one block each, stored in that order (so least recently used first), owned by
    1, 2, 3 with omega 3, 1, 2, in a budget of exactly 3 blocks."""
    cm, _ = make(budget=3 * BLOCK, eviction=eviction)
    segs = []
    for owner, ids in [(1, [1, 1, 1, 1]), (2, [2, 2, 2, 2]), (3, [3, 3, 3, 3])]:
        end = put(cm, ids)
        cm.acquire(owner, end)
        segs.append(end[0])
    cm.set_priority({1: 3.0, 2: 1.0, 3: 2.0}.get)
    return cm, segs


@pytest.mark.parametrize("eviction, victim", [("omega", 1), ("lru", 0)])
def test_reserve_evicts_the_lowest_omega_or_the_least_recently_used(eviction, victim):
    cm, segs = three_owned(eviction)
    cm.reserve(BLOCK)
    assert [s.resident for s in segs] == [i != victim for i in range(3)]
    assert cm.store.eviction_log == [segs[victim].first_block]
    assert (cm.store.reserved, cm.store.bytes_held, cm.store.peak_bytes) == (BLOCK, 2 * BLOCK, 3 * BLOCK)
    charge = Stats()
    cm.end_call(charge)
    assert charge.evicted_blocks == 1 and cm.stats.evicted_blocks == 0
    cm.end_call()  # nothing new evicted since: nothing more counted
    assert charge.evicted_blocks == 1 and cm.stats.evicted_blocks == 0
    cm.unreserve(BLOCK)
    assert cm.store.reserved == 0
    with pytest.raises(AssertionError, match="with only 0 reserved"):
        cm.unreserve(1)


def test_owner_omega_is_the_priority_or_unscored():
    cm, _ = three_owned("omega")
    assert cm.owner_omega(2) == 1.0
    assert cm.owner_omega(None) == UNSCORED and cm.owner_omega(99) == UNSCORED
    cm.set_priority(None)
    assert cm.owner_omega(2) == UNSCORED


def test_report_peak_raises_each_searchs_peaks_once_and_never_lowers_them():
    cm, _ = make(budget=10 * BLOCK)
    put(cm, [1, 2, 3, 4, 5])  # 2 blocks
    cm.reserve(3 * BLOCK)
    cm.unreserve(3 * BLOCK)
    a, b = Stats(), Stats(peak_kv_bytes=100 * BLOCK, peak_store_bytes=50 * BLOCK)
    cm.report_peak([a, a, b])
    assert (a.peak_kv_bytes, a.peak_store_bytes) == (5 * BLOCK, 2 * BLOCK)
    assert (b.peak_kv_bytes, b.peak_store_bytes) == (100 * BLOCK, 50 * BLOCK)


# -- store_kv, insert, ensure_resident -----------------------------------------------------------------


def test_store_kv_caches_new_tokens_after_the_cached_context_pinned_until_end_call():
    cm, _ = make()
    a, _ = put(cm, [1, 2, 3, 4])
    end = cm.store_kv([1, 2, 3, 4, 5, 6], 4, kvt([5, 6], 4))
    b = end[0]
    assert end == (b, 2) and b.parent is a and b.start == 4 and kv_is_exact(b) and b.resident_len == 2
    assert (a.pins, b.pins) == (1, 1)
    cm.end_call()
    assert (a.pins, b.pins) == (0, 0)
    assert cm.store_kv([1, 2, 3, 4, 5, 6], 6, kvt([], 6)) == (b, 2)  # all cached: the same end
    cm.end_call()
    cm.store.check_invariants()


def test_store_kv_keeps_only_tokens_when_the_context_before_start_is_gone():
    cm, model = make()
    end = cm.store_kv([1, 2, 3, 4, 5, 6], 4, kvt([5, 6], 4))
    assert end[1] == 6 and end[0].tokens == (1, 2, 3, 4, 5, 6) and not end[0].resident
    assert model.calls == [] and cm.store.bytes_held == 0


def test_optional_kv_takes_only_free_room_and_must_store_kv_evicts_the_lowest_omega():
    cm, segs = three_owned("omega")  # the budget is full of owned K/V
    d = cm.store_kv([9, 9, 9, 9], 0, kvt([9, 9, 9, 9], 0), free_only=True)
    assert d == (d[0], 4) and not d[0].resident and cm.store.eviction_log == []
    cm.end_call()
    charge = Stats()
    e = cm.store_kv([8, 8, 8, 8], 0, kvt([8, 8, 8, 8], 0), free_only=False, charge=charge)
    assert e[0].resident and kv_is_exact(e[0])
    assert [s.resident for s in segs] == [True, False, True]  # B: omega 1, the lowest
    cm.end_call(charge)
    assert charge.evicted_blocks == 1 and cm.store.bytes_held == 3 * BLOCK
    cm.store.check_invariants()


def test_optional_kv_keeps_the_whole_blocks_that_fit_in_free_room():
    cm, _ = make(budget=3 * BLOCK)
    cm.acquire(1, put(cm, [1, 1, 1, 1, 1, 1, 1, 1]))  # 2 owned blocks: 1 block free
    ids = [1, 1, 1, 1, 1, 1, 1, 1, 5, 6, 7, 8, 9, 10]
    end = cm.store_kv(ids, 8, kvt(ids[8:], 8), free_only=True)
    cm.end_call()
    seg = end[0]
    assert end == (seg, 6) and seg.resident_len == 4 and kv_is_exact(seg)  # 6 tokens kept, 4 resident
    assert cm.store.bytes_held == 3 * BLOCK and cm.store.eviction_log == []


def test_ensure_resident_recomputes_from_the_nearest_cached_ancestor_and_counts_it():
    cm, model = make()
    a, _ = put(cm, [1, 2, 3, 4])
    b, _ = put(cm, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    cm.store.evict(b)
    cm.store.evict(a)
    charge = Stats()
    make_resident(cm, model, [(a, 4), (b, 3)], charge)
    assert model.calls == [([], [1, 2, 3, 4], 0), ([(a.id, 4)], [5, 6, 7], 4)]
    assert model.charges == [charge, charge]
    assert charge.recomputed_tokens == 7 and cm.stats.recomputed_tokens == 0
    assert (a.resident_len, b.resident_len) == (4, 3) and kv_is_exact(a) and kv_is_exact(b)
    make_resident(cm, model, [(a, 4), (b, 4)])  # one more token of B, after the 3 it holds
    assert model.calls[-1] == ([(a.id, 4), (b.id, 3)], [8], 7)
    assert cm.stats.recomputed_tokens == 1 and b.resident_len == 4 and kv_is_exact(b)
    cm.store.check_invariants()


def test_ensure_resident_refills_from_known_kv_without_computing():
    cm, model = make()
    a, _ = put(cm, [1, 2, 3, 4])
    b, _ = put(cm, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    cm.store.evict(b)
    cm.ensure_resident([(a, 4), (b, 4)], known=(4, kvt([5, 6, 7, 8], 4)))
    assert model.calls == [] and cm.stats.recomputed_tokens == 0 and kv_is_exact(b) and b.resident_len == 4
    cm.ensure_resident([(a, 4), (b, 4)], known=(6, kvt([7, 8], 6)))  # resident already: nothing to do
    assert model.calls == []


def test_insert_refills_an_evicted_segment_it_runs_through_from_its_own_kv():
    cm, model = make()
    a, _ = put(cm, [1, 2, 3, 4])
    b, _ = put(cm, [1, 2, 3, 4, 5, 6], 4)
    cm.store.evict(b)
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    end = cm.insert(ids, 4, kvt(ids[4:], 4))
    c = end[0]
    assert end == (c, 2) and c.parent is b and c.parent_len == 2 and c.start == 6
    assert model.calls == [] and kv_is_exact(b) and kv_is_exact(c) and b.resident_len == 2
    assert (a.pins, b.pins, c.pins) == (1, 1, 1)
    cm.end_call()
    assert (a.pins, b.pins, c.pins) == (0, 0, 0)
    cm.store.check_invariants()


def test_a_rows_chain_is_made_resident_and_a_bare_rows_cut_is_what_it_could_have_reused():
    """What a step does for the rows it admits: their chains pinned and their evicted parts
    recomputed (the runner, before the step's forwards); a bare row reads no cached prefix and
    its cut (counted as recomputed where it is planned) is what it could have reused."""
    cm, model = make()
    a, _ = put(cm, [1, 2, 3, 4, 5, 6])
    cm.store.evict(a)
    s1, s2 = Stats(), Stats()
    r, bare = Row(ids=[1, 2, 3, 4, 5, 6, 7], stats=s1), Row(ids=[1, 2, 3, 9], bare=True, stats=s2)
    cm.lookup([r, bare])
    assert (r.chain, bare.chain, bare.cut) == ([(a, 6)], [], 3)
    for row in (r, bare):
        cm.pin(row.chain)
        make_resident(cm, model, row.chain, row.stats)
    assert a.pins == 1 and a.resident_len == 6 and model.calls == [([], [1, 2, 3, 4, 5, 6], 0)]
    assert (s1.recomputed_tokens, s2.recomputed_tokens) == (6, 0)
    cm.end_call()
    assert a.pins == 0


# -- owners, prompt pins, searches ----------------------------------------------------------------------


def test_protected_owners_prompts_are_held_by_their_root_prompt_until_the_owner_is_released():
    cm, _ = make()
    cm.protect("root")
    assert cm.protected("root") and not cm.protected("x") and not cm.protected(None)
    end = cm.store_kv([1, 2, 3, 4, 5], 0, kvt([1, 2, 3, 4, 5], 0))
    other = cm.store_kv([7, 7], 0, kvt([7, 7], 0))
    cm.hold_prompt(end, "root")
    cm.hold_prompt(other, "x")  # not protected: nothing held
    cm.end_call()
    a, o = end[0], other[0]
    assert (a.owners, a.pins, o.owners, o.pins) == ({RootPrompt("root")}, 0, set(), 0)
    cm.acquire("root", end)
    cm.tag_owners([other, None, end], ["x", "y", None])
    assert a.owners == {RootPrompt("root"), "root"} and o.owners == {"x"}
    cm.release("root")
    assert (a.owners, a.pins) == (set(), 0) and not cm.protected("root")
    cm.acquire("z", None)  # no handle: nothing held
    assert sorted(cm.store.owners(), key=str) == ["x"]
    cm.store.check_invariants()


def test_end_search_keeps_the_ended_and_live_searches_prompts_and_forgets_the_rest():
    cm, _ = make()
    p1 = put(cm, [1, 2, 3, 4])
    cm.count_prompt(p1, "s1")
    p2 = put(cm, [5, 6, 7, 8])
    cm.count_prompt(p2, "s2")
    gen = put(cm, [1, 2, 3, 4, 9, 9], 4)  # a generation after s1's prompt: no prompt ran through it
    held = put(cm, [6, 6])
    cm.acquire("node", held)
    cm.end_search("s1", live={"s2"})
    assert set(cm.store.segments) == {p1[0].id, p2[0].id, held[0].id} and gen[0].id not in cm.store.segments
    cm.release("node")
    cm.end_search("s3", live=set())
    assert cm.store.segments == {} and cm.store.bytes_held == 0
    cm.store.check_invariants()


def test_new_search_releases_owners_keeps_the_last_searchs_prompts_and_resets_counters():
    cm, _ = make(budget=2 * BLOCK)
    cm.protect("root")
    p = cm.store_kv([1, 2, 3, 4], 0, kvt([1, 2, 3, 4], 0))
    cm.hold_prompt(p, "root")
    cm.count_prompt(p, "s1")
    cm.end_call()
    g = put(cm, [1, 2, 3, 4, 5], 4)
    cm.acquire("node", g)
    put(cm, [8, 8, 8, 8])  # evicts the generation: root's prompt is in the protected tier
    assert cm.store.evicted_blocks == 1 and not g[0].resident
    cm.new_search(last="s1")
    assert cm.store.owners() == [] and not cm.protected("root") and p[0].pins == 0
    assert set(cm.store.segments) == {p[0].id}
    assert cm.store.evicted_blocks == 0 and cm.store.eviction_log == []
    assert cm.store.peak_held == BLOCK == cm.store.bytes_held
    cm.store.check_invariants()


# -- shared runs ----------------------------------------------------------------------------------------


def test_rows_that_share_a_run_after_an_earlier_row_wait_for_it():
    """Shared runs are planning only: of rows that start, after the same cached chain end, with a
    run of at least share_min_tokens new tokens, the first computes it as part of its own prompt
    and the others (returned) wait a step, when they find it cached."""
    cm, _ = make(share_min_tokens=5)  # exactly the run's length: shared
    put(cm, [1, 2, 3, 4])
    run = [10, 11, 12, 13, 14]
    rows = [
        Row(ids=[1, 2, 3, 4, *run, 20]),
        Row(ids=[1, 2, 3, 4, *run, 30, 31]),
        Row(ids=[1, 2, 3, 4, 50, 51, 52, 53, 54, 55]),  # starts differently: computes its own
        Row(ids=[1, 2, 3, 4, *run, 40]),
    ]
    cm.lookup(rows)
    assert shared_run_followers(rows, cm.share_min_tokens) == {1: 0, 3: 0}
    cm.end_call()


def test_runs_shorter_than_share_min_tokens_are_not_shared():
    cm, _ = make(share_min_tokens=6)
    put(cm, [1, 2, 3, 4])
    rows = [Row(ids=[1, 2, 3, 4, 10, 11, 12, 13, 14, 20]), Row(ids=[1, 2, 3, 4, 10, 11, 12, 13, 14, 30])]
    cm.lookup(rows)
    assert shared_run_followers(rows, 6) == {}  # they share 5 new tokens, fewer than 6


def shared_rows() -> list[Row]:
    """Two pairs of rows after the cached [1, 2, 3, 4]: one pair shares a 6-token run, the other a
    4-token run."""
    a, b = [10, 11, 12, 13, 14, 15], [20, 21, 22, 23]
    return [Row(ids=[1, 2, 3, 4, *run, tail]) for run in (a, b) for tail in (40, 41)]


def test_bare_rows_share_no_run():
    """Bare rows (a budget too small for their context and their buffer) attend over no cached
    prefix: they share no run (planning them once looped for ever, a score batch under a budget
    hung)."""
    cm, _ = make(share_min_tokens=4)
    put(cm, [1, 2, 3, 4])
    rows = shared_rows()
    cm.lookup(rows)
    assert shared_run_followers(rows, 4) == {1: 0, 3: 2}
    bare = [bare_copy(r) for r in rows]
    cm.lookup(bare)
    assert shared_run_followers(bare, 4) == {} and [(r.chain, r.matched) for r in bare] == [([], 0)] * 4
    cm.end_call()
    cm.store.check_invariants()


# -- property test: random owner and storage sequences -----------------------------------------------------

op = st.one_of(
    st.tuples(st.just("store"), st.integers(0, 30), st.lists(st.integers(1, 2), min_size=1, max_size=6)),
    st.tuples(st.just("store_must"), st.integers(0, 30), st.lists(st.integers(1, 2), min_size=1, max_size=6)),
    st.tuples(st.just("acquire"), st.integers(0, 1), st.integers(0, 30)),
    st.tuples(st.just("release"), st.integers(0, 1), st.just([])),
    st.tuples(st.just("protect"), st.integers(0, 1), st.just([])),
    st.tuples(st.just("prompt"), st.integers(0, 1), st.integers(0, 30)),
    st.tuples(st.just("end_call"), st.just(0), st.just([])),
)


def context(end: tuple[Segment, int]) -> list[int]:
    return [t for s, used in end[0].context_chain(end[1]) for t in s.tokens[:used]]


@settings(max_examples=150, deadline=None)
@given(budget_blocks=st.one_of(st.none(), st.integers(2, 8)), ops=st.lists(op, max_size=50))
def test_random_owner_and_store_sequences_keep_the_store_consistent_and_refs_as_modelled(budget_blocks, ops):
    cm, _ = make(budget=None if budget_blocks is None else budget_blocks * BLOCK)
    cm.set_priority(lambda o: float(o) if isinstance(o, int) else None)
    held: dict = {}  # the model: owner -> ids of the segments it holds
    protected: set = set()  # owners protected, not released since
    ends: list[tuple[Segment, int]] = []

    def hold(owner, end):
        seg = end[0]
        while seg.parent is not None:
            held.setdefault(owner, set()).add(seg.id)
            seg = seg.parent

    for name, x, y in ops:
        if name in ("store", "store_must"):
            before = context(ends[x % len(ends)]) if ends else []
            ids = before + list(y)
            end = cm.store_kv(ids, len(before), kvt(y, len(before)), free_only=name == "store")
            assert context(end) == ids
            ends.append(end)
        elif name == "acquire" and ends:
            cm.acquire(x, ends[y % len(ends)])
            hold(x, ends[y % len(ends)])
        elif name == "release":
            cm.release(x)
            held.pop(x, None)
            if x in protected:
                held.pop(RootPrompt(x), None)
            protected.discard(x)
        elif name == "protect":
            cm.protect(x)
            protected.add(x)
        elif name == "prompt" and ends:
            cm.hold_prompt(ends[y % len(ends)], x)
            if x in protected:
                hold(RootPrompt(x), ends[y % len(ends)])
        elif name == "end_call":
            cm.end_call()
        store = cm.store
        store.check_invariants()
        for seg in store.segments.values():
            assert seg.owners == {o for o, ids in held.items() if seg.id in ids}
            assert kv_is_exact(seg)
        assert all(cm.protected(o) == (o in protected) for o in range(2))
    cm.end_call()
    assert all(seg.pins == 0 for seg in cm.store.segments.values())  # no reader left: nothing pinned
