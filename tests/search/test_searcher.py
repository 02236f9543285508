"""End-to-end searches: the same tree with KV sharing on and off (tiny and real model). The sampled
and budget-bound cases, on every device, are in tests/engine/test_lossless.py."""

from __future__ import annotations

import pytest

from strategies import BFS
from treesearch import RKSCConfig, Sampling, Searcher
from treesearch.tasks import Game24


def _solve(lm, problem, kv, strategy, sampling=None, x="4 5 6 10"):
    s = Searcher(lm, problem, strategy, RKSCConfig(kv_sharing=kv), sampling=sampling, progress=False, seed=7)
    return s.solve(x)


def _same_tree(a, b):
    na, nb = a.tree.graph.nodes, b.tree.graph.nodes
    assert sorted(a.tree.graph.edges) == sorted(b.tree.graph.edges)
    for n in na:
        assert na[n]["thought"] == nb[n]["thought"]
        assert na[n]["state"] == nb[n]["state"]
        assert na[n]["status"] == nb[n]["status"]
        if na[n]["score"] is None:
            assert nb[n]["score"] is None
        else:
            assert nb[n]["score"] == pytest.approx(na[n]["score"], abs=1e-4)
    assert a.answer == b.answer


class CountingGame24(Game24):
    """Game24 whose parser accepts any line so that the tiny random model still grows a tree."""

    def parse_children(self, state, text):
        kids = super().parse_children(state, text)
        if kids or len(state.numbers) == 1:
            return kids
        a, b = state.numbers[0], state.numbers[1]
        return super().parse_children(state, f"{a} + {b} = 0\n{a} * {b} = 0\n")


def test_tiny_game24_search_is_identical_with_and_without_sharing(tiny_lm):
    sampling = Sampling(max_new_tokens=12, stop=("\n\n",))
    off = _solve(tiny_lm, CountingGame24(), "off", BFS(breadth=2, max_depth=2), sampling)
    ex = _solve(tiny_lm, CountingGame24(), "exact", BFS(breadth=2, max_depth=2), sampling)
    _same_tree(off, ex)
    assert len(ex.tree) >= 5
    assert ex.stats["prefill_tokens"] < off.stats["prefill_tokens"] / 2
    # every context is covered: computed here, or served from the cache (shared runs count once as prefill)
    assert ex.stats["reused_tokens"] + ex.stats["prefill_tokens"] >= off.stats["prefill_tokens"]
    assert ex.stats["unique_tokens"] == off.stats["unique_tokens"]


@pytest.mark.real_model
def test_real_game24_bfs_gives_the_same_tree_with_exact_sharing_as_without(real_lm):
    off = _solve(real_lm, Game24(), "off", BFS(breadth=5))
    ex = _solve(real_lm, Game24(), "exact", BFS(breadth=5))
    _same_tree(off, ex)
    assert ex.stats["reused_tokens"] > 0 and off.stats["reused_tokens"] == 0
    assert ex.stats["decode_tokens"] == off.stats["decode_tokens"]
