"""Segments and the token tree's walks on hand-built trees (no store, no model): context chains,
the longest cached prefix, and the walk insert uses to find where new tokens branch off."""

from __future__ import annotations

from treesearch.cache.segment import Segment, follow, match_prefix


def tree() -> dict[str, Segment]:
    """root -- A[1 2 3 4] -+- (at 4) B[5 6]
    `- (at 2) C[7 8 9] -- (at 1) D[6]"""
    root = Segment(id=0, tokens=(), parent=None, parent_len=0, start=0)
    a = Segment(id=1, tokens=(1, 2, 3, 4), parent=root, parent_len=0, start=0)
    b = Segment(id=2, tokens=(5, 6), parent=a, parent_len=4, start=4)
    c = Segment(id=3, tokens=(7, 8, 9), parent=a, parent_len=2, start=2)
    d = Segment(id=4, tokens=(6,), parent=c, parent_len=1, start=3)
    root.children[(0, 1)] = a
    a.children[(4, 5)] = b
    a.children[(2, 7)] = c
    c.children[(1, 6)] = d
    return {"root": root, "a": a, "b": b, "c": c, "d": d}


def test_context_chain_runs_from_the_root_to_the_attach_points():
    t = tree()
    assert t["d"].context_chain() == [(t["a"], 2), (t["c"], 1), (t["d"], 1)]
    assert t["b"].context_chain(1) == [(t["a"], 4), (t["b"], 1)]
    assert t["c"].context_chain(0) == [(t["a"], 2)]  # no tokens of C itself: C is left out
    assert t["root"].context_chain() == []


def test_a_segment_is_resident_for_a_prefix_and_counts_its_owners():
    class KV:  # only the shape is read: [L, 2, Hkv, tokens, d]
        shape = (1, 2, 1, 3, 2)

    t = tree()
    assert (len(t["a"]), t["a"].resident, t["a"].resident_len) == (4, False, 0)
    t["a"].kv = KV()
    t["a"].owners |= {"x", "y"}
    assert (t["a"].resident, t["a"].resident_len, t["a"].refs) == (True, 3, 2)


def test_match_prefix_follows_children_and_stops_inside_a_segment():
    t = tree()
    assert match_prefix(t["root"], [1, 2, 7, 6, 0], 5) == ([(t["a"], 2), (t["c"], 1), (t["d"], 1)], 4)
    assert match_prefix(t["root"], [1, 2, 3, 4, 5, 6], 6) == ([(t["a"], 4), (t["b"], 2)], 6)
    assert match_prefix(t["root"], [1, 2, 3, 9], 4) == ([(t["a"], 3)], 3)
    assert match_prefix(t["root"], [1, 2, 3, 4, 5, 6], 3) == ([(t["a"], 3)], 3)  # the limit
    assert match_prefix(t["root"], [2, 1], 2) == ([], 0)


def test_follow_returns_where_new_tokens_branch_off_and_how_many_are_cached():
    t = tree()
    assert follow(t["root"], 0, (1, 2, 3, 4, 5, 6)) == (t["b"], 2, 6)  # all cached
    assert follow(t["root"], 0, (1, 2, 7, 0)) == (t["c"], 1, 3)  # branches 1 token into C
    assert follow(t["a"], 2, (7, 8, 9, 1)) == (t["c"], 3, 3)  # from inside A: continues C's end
    assert follow(t["a"], 4, (8,)) == (t["a"], 4, 0)  # nothing cached past A's end
