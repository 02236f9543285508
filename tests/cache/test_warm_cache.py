"""A Searcher keeps the K/V of its last search's prompts between solve() calls: a later search
starts from the cached few-shot templates, finds exactly the tree a fresh Searcher finds, and the
cache never holds more than one search's prompts plus the running search (tiny model)."""

from __future__ import annotations

import pytest

from strategies import BFS
from treesearch import Child, Problem, RKSCConfig, Sampling, Searcher

TEMPLATE = (
    "Plan a trip one stop at a time. Each stop names a town and what to see there. "
    "Example: Avignon, the bridge. Example: Arles, the arena. Example: Nimes, the temple. Trip so far:"
)
VALUE = (
    "Judge whether the trip is good. Example: Avignon, Arles. Verdict: yes. "
    "Example: Paris, Paris. Verdict: no. Trip:"
)


class Trip(Problem):
    """Template style (every prompt re-rendered from the state), like Game of 24."""

    name = "trip"
    labels = {" yes": 1.0, " no": 0.0}
    max_depth = 2
    sampling = Sampling(max_new_tokens=6)

    def initial_state(self, x):
        return (str(x),)

    def expand_prompt(self, state):
        return TEMPLATE + " " + ", ".join(state) + "\nNext:"

    def parse_children(self, state, text):
        words = text.split()[:2] or ["#"]
        return [Child(thought=w[:16], state=state + (w[:16],)) for w in words]

    def value_prompt(self, state):
        return VALUE + " " + ", ".join(state) + "\nVerdict:"


def _signature(result):
    tree = result.tree
    return [
        (
            n,
            tree.parent(n),
            tree.node(n)["thought"],
            tree.node(n)["status"],
            round(tree.node(n)["score"] or 0, 4),
        )
        for n in sorted(tree.graph)
    ]


def _fresh(tiny_lm, x):
    return Searcher(tiny_lm, Trip(), BFS(breadth=2), RKSCConfig(kv_sharing="exact"), progress=False).solve(x)


def test_later_solves_reuse_the_last_searchs_prompts_and_find_the_same_trees(tiny_lm):
    s = Searcher(tiny_lm, Trip(), BFS(breadth=2), RKSCConfig(kv_sharing="exact"), progress=False)
    _check_warm_searches(tiny_lm, s)


def test_later_solves_under_a_tight_budget_find_the_same_trees(tiny_lm):
    peak = _fresh(tiny_lm, "Lyon").stats["peak_kv_bytes"]
    s = Searcher(
        tiny_lm,
        Trip(),
        BFS(breadth=2),
        RKSCConfig(kv_sharing="exact", cache_budget=peak // 2),
        progress=False,
    )
    first, second = s.solve("Lyon"), s.solve("Dijon")
    assert _signature(first) == _signature(_fresh(tiny_lm, "Lyon"))
    assert _signature(second) == _signature(_fresh(tiny_lm, "Dijon"))
    assert s.engine.store.peak_bytes <= peak // 2
    assert first.stats["evicted_blocks"] + second.stats["evicted_blocks"] > 0  # the budget did bind
    s.engine.store.check_invariants()


def _check_warm_searches(tiny_lm, s):
    first, second, again = s.solve("Lyon"), s.solve("Dijon"), s.solve("Lyon")
    fresh_lyon, fresh_dijon = _fresh(tiny_lm, "Lyon"), _fresh(tiny_lm, "Dijon")
    assert _signature(first) == _signature(again) == _signature(fresh_lyon)
    assert _signature(second) == _signature(fresh_dijon)
    timed = ("wall_s", "verify_s")
    assert {k: v for k, v in first.stats.items() if k not in timed} == {
        k: v for k, v in fresh_lyon.stats.items() if k not in timed
    }  # the first search is a fresh one
    # the templates come from the cache: only what differs is computed
    assert second.stats["prefill_tokens"] < fresh_dijon.stats["prefill_tokens"]
    assert second.stats["reused_tokens"] > fresh_dijon.stats["reused_tokens"]
    for same in (
        "unique_tokens",
        "decode_tokens",
        "generate_calls",
        "score_calls",
    ):  # the same work was asked for
        assert second.stats[same] == fresh_dijon.stats[same]
    assert again.stats["prefill_tokens"] < second.stats["prefill_tokens"]
    s.engine.store.check_invariants()


def test_the_cache_kept_between_searches_is_bounded_by_one_search(tiny_lm):
    s = Searcher(tiny_lm, Trip(), BFS(breadth=2), RKSCConfig(kv_sharing="exact"), progress=False)
    towns = ["Lyon", "Dijon", "Nancy", "Metz", "Reims", "Tours"]
    held = []
    for town in towns:
        s.solve(town)
        held.append(s.engine.store.bytes_held)
    one = max(_fresh_held(tiny_lm, t) for t in towns)
    assert max(held) <= 2 * one  # at most the last search's prompts plus the running search
    s.engine.new_search()
    kept = s.engine.store.resident_segments()
    assert kept and s.engine.store.bytes_held < one  # only the last search's prompt K/V
    assert all(seg.refs == 0 and seg.pins == 0 for seg in kept)
    s.engine.store.check_invariants()


def _fresh_held(tiny_lm, x):
    s = Searcher(tiny_lm, Trip(), BFS(breadth=2), RKSCConfig(kv_sharing="exact"), progress=False)
    s.solve(x)
    return s.engine.store.bytes_held


def test_keep_cache_false_and_an_interrupted_search_start_from_an_empty_cache(tiny_lm):
    s = Searcher(
        tiny_lm, Trip(), BFS(breadth=2), RKSCConfig(kv_sharing="exact"), progress=False, keep_cache=False
    )
    s.solve("Lyon")
    engine = s.engine
    assert s.solve("Lyon").stats["prefill_tokens"] == _fresh(tiny_lm, "Lyon").stats["prefill_tokens"]
    assert s.engine is not engine

    class Boom(Trip):
        calls = 0

        def value_prompt(self, state):
            Boom.calls += 1
            if Boom.calls == 2:
                raise RuntimeError("stop here")
            return super().value_prompt(state)

    s = Searcher(tiny_lm, Boom(), BFS(breadth=2), RKSCConfig(kv_sharing="exact"), progress=False)
    with pytest.raises(RuntimeError, match="stop here"):
        s.solve("Lyon")
    broken = s.engine
    result = s.solve("Lyon")  # a fresh engine: nothing half-done is carried over
    assert s.engine is not broken
    assert _signature(result) == _signature(_fresh(tiny_lm, "Lyon"))
