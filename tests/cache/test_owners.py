"""The owner table on hand-built segments (no store, no model): which owner holds which segment,
refs counted once per owner, segments freed exactly at their last release, holding never pinning.

The property test drives the table with random acquire / release and checks, after each
one, `OwnerTable.check` plus the exact refs recomputed from a plain model of the table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.cache.owners import OwnerTable
from treesearch.cache.segment import Segment


def tree() -> dict[str, Segment]:
    """root -- A[1 2 3] -+- B[4 5]      (B at 3 into A)
    `- C[9]        (C at 2 into A)"""
    root = Segment(id=0, tokens=(), parent=None, parent_len=0, start=0)
    a = Segment(id=1, tokens=(1, 2, 3), parent=root, parent_len=0, start=0)
    b = Segment(id=2, tokens=(4, 5), parent=a, parent_len=3, start=3)
    c = Segment(id=3, tokens=(9,), parent=a, parent_len=2, start=2)
    return {"root": root, "a": a, "b": b, "c": c}


def test_an_owner_holds_the_whole_context_once_and_never_the_root():
    t = tree()
    table = OwnerTable()
    table.acquire("x", (t["b"], 2))
    table.acquire("x", (t["b"], 1))  # the same owner again: no second reference
    table.acquire("y", (t["c"], 1))
    assert table.held_by("x") == {t["a"], t["b"]} and table.held_by("y") == {t["a"], t["c"]}
    assert [t[k].refs for k in "abc"] == [2, 1, 1] and t["root"].owners == set()
    assert table.owners() == ["x", "y"]
    table.check(t[k] for k in "abc")


def test_release_frees_exactly_the_segments_whose_last_owner_let_go_by_id():
    t = tree()
    table = OwnerTable()
    table.acquire("x", (t["b"], 2))
    table.acquire("y", (t["c"], 1))
    table.acquire("z", (t["b"], 2))
    assert table.release("x") == []  # A held by y and z, B by z
    assert table.release("z") == [t["b"]]
    assert table.release("y") == [t["a"], t["c"]]
    assert table.release("y") == []  # nothing held any more: refs stay at 0
    assert [t[k].refs for k in "abc"] == [0, 0, 0] and table.owners() == []
    table.check(t[k] for k in "abc")


def test_check_catches_a_segment_whose_owners_disagree_with_the_table():
    t = tree()
    table = OwnerTable()
    table.acquire("x", (t["b"], 2))
    t["b"].owners.add("ghost")
    with pytest.raises(AssertionError, match="segment 2: owners"):
        table.check(t[k] for k in "abc")


op = st.one_of(
    st.tuples(st.just("acquire"), st.integers(0, 3), st.sampled_from("abc")),
    st.tuples(st.just("release"), st.integers(0, 3), st.just("")),
)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(op, max_size=30))
def test_refs_match_a_plain_model_and_nothing_is_pinned_after_every_operation(ops):
    t = tree()
    context = {"a": {"a"}, "b": {"a", "b"}, "c": {"a", "c"}}
    table = OwnerTable()
    held: dict[int, set[str]] = {}  # the model: owner -> names of the segments it holds
    for name, owner, seg in ops:
        if name == "acquire":
            table.acquire(owner, (t[seg], len(t[seg])))
            held.setdefault(owner, set()).update(context[seg])
        elif name == "release":
            before = {k: set(t[k].owners) for k in "abc"}
            freed = table.release(owner)
            assert [s.id for s in freed] == [t[k].id for k in "abc" if before[k] == {owner}]
            held.pop(owner, None)
        table.check(t[k] for k in "abc")
        for k in "abc":
            holders = {o for o, segs in held.items() if k in segs}
            assert t[k].owners == holders and t[k].refs == len(holders)
            assert t[k].pins == 0  # holding never pins
        assert sorted(table.owners()) == sorted(held)
