"""`Stats` (the counters reported as `SearchResult.stats`) and the helpers that charge a call's
rows to their searches' Stats: `distinct` (each object once, by identity) and `per_row`."""

from __future__ import annotations

from dataclasses import fields

import pytest

from treesearch.common.stats import Stats, distinct, per_row


def test_reset_zeroes_every_counter_in_place():
    st = Stats()
    for f in fields(st):
        setattr(st, f.name, 1.5 if f.type == "float" else 7)
    same = st
    st.reset()
    assert same is st and st == Stats()
    assert all(v == 0 for v in st.as_dict().values())


def test_as_dict_lists_every_counter_by_name():
    st = Stats(prefill_tokens=3, reused_tokens=9, wall_s=0.25)
    d = st.as_dict()
    assert list(d) == [f.name for f in fields(Stats)]
    assert (d["prefill_tokens"], d["reused_tokens"], d["wall_s"], d["model_calls"]) == (3, 9, 0.25, 0)


def test_reuse_ratio_is_the_share_of_prompt_tokens_served_from_cache():
    assert Stats().reuse_ratio() == 0.0  # nothing run yet: no division by zero
    assert Stats(prefill_tokens=10, reused_tokens=30).reuse_ratio() == 0.75
    assert Stats(prefill_tokens=10).reuse_ratio() == 0.0


def test_distinct_keeps_each_object_once_in_first_seen_order():
    a, b = Stats(), Stats()  # equal values, two searches
    assert distinct([a, a, b, a, b]) == [a, b]
    assert [id(s) for s in distinct([b, a, a])] == [id(b), id(a)]
    assert distinct([]) == []


def test_per_row_gives_each_prompt_its_stats():
    default, a, b = Stats(), Stats(), Stats()
    assert all(s is default for s in per_row(3, None, default)) and len(per_row(3, None, default)) == 3
    assert [id(s) for s in per_row(2, a, default)] == [id(a), id(a)]
    assert [id(s) for s in per_row(2, [a, b], default)] == [id(a), id(b)]
    with pytest.raises(ValueError, match="stats has 1 entries for 2 prompts; give one per prompt"):
        per_row(2, [a], default)
