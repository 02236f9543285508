"""`Searcher.solve_many`: many searches over one engine, their model calls merged, each result the
one `solve(x)` gives alone, whatever the concurrency."""

from __future__ import annotations

import pytest
from reliability_problems import Words
from same_results import STRATEGIES, assert_same, signature

from strategies import BFS
from treesearch import RKSCConfig, Searcher

INPUTS = ["cats", "dogs", "birds", "fish", "cows"]


def alone(lm, problem, make, config=None):
    return [Searcher(lm, problem, make(), config or RKSCConfig(), progress=False).solve(x) for x in INPUTS]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_solve_many_equals_each_input_solved_alone(tiny_lm, name):
    problem = Words(width=2, depth=3, max_new_tokens=5, chain=name in ("bfs", "mcts"))
    make = STRATEGIES[name]
    ref = alone(tiny_lm, problem, make)
    many = list(
        Searcher(tiny_lm, problem, make(), RKSCConfig(), progress=False).solve_many(INPUTS, concurrency=3)
    )
    assert_same(ref, many)
    assert [r.tree.meta["input"] for r in many] == INPUTS  # input order


def test_results_do_not_depend_on_the_concurrency(tiny_lm):
    problem = Words(width=2, depth=3, max_new_tokens=5, samples=2, temperature=0.9)  # seeded sampling
    searcher = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False, seed=5)
    runs = {c: list(searcher.solve_many(INPUTS, concurrency=c)) for c in (1, 3, 8)}
    ref = [
        Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False, seed=5).solve(x)
        for x in INPUTS
    ]
    for results in runs.values():
        assert_same(ref, results)


class Templated(Words):
    """Words with a long instruction before every expand prompt (a few-shot template)."""

    def expand_prompt(self, state):
        return (
            "Continue the list with one more word. Examples: apple pear plum; red blue green; one two three. "
            + super().expand_prompt(state)
        )


def test_concurrent_searches_share_decode_steps_and_the_template_is_computed_once(tiny_lm):
    problem = Templated(width=2, depth=2, max_new_tokens=4)
    searcher = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False)
    many = list(searcher.solve_many(INPUTS[:4], concurrency=4))
    sched = searcher.engine.scheduler
    steps_many = sched.decode_steps
    assert sched.decode_rows > steps_many  # rows of several searches decoded in one step
    alone_steps = 0
    ref = []
    for x in INPUTS[:4]:
        s = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False)
        ref.append(s.solve(x))
        alone_steps += s.engine.scheduler.decode_steps
    assert steps_many < alone_steps  # the searches' rows shared steps
    assert [r.stats["decode_tokens"] for r in many] == [r.stats["decode_tokens"] for r in ref]
    # the shared part of the prompts is computed once for all four searches, not once per search
    assert sum(r.stats["prefill_tokens"] for r in many) < sum(r.stats["prefill_tokens"] for r in ref)


def test_a_shared_budget_gives_the_same_trees_and_bounds_all_kv(tiny_lm):
    problem = Words(width=2, depth=3, max_new_tokens=5, chain=True)
    unbounded = list(
        Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False).solve_many(
            INPUTS, concurrency=5
        )
    )
    peak = max(r.stats["peak_kv_bytes"] for r in unbounded)
    budget = peak // 4
    searcher = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(cache_budget=budget), progress=False)
    tight = list(searcher.solve_many(INPUTS, concurrency=5))
    assert_same(unbounded, tight)
    assert all(r.stats["peak_kv_bytes"] <= budget for r in tight)
    assert sum(r.stats["evicted_blocks"] for r in tight) > 0
    store = searcher.engine.store
    assert store.peak_bytes <= budget and store.reserved == 0
    assert not store.owners()  # every finished search released its blocks
    store.check_invariants()


def test_a_budget_too_small_for_one_row_fails_before_any_forward(tiny_lm):
    problem = Words(width=2, depth=2, max_new_tokens=5)
    searcher = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(cache_budget=2000), progress=False)
    results = list(searcher.solve_many(INPUTS[:3], concurrency=3))
    for r in results:
        assert r.status == "failed" and "CacheBudgetError" in r.error and "at least" in r.error
        assert r.stats["model_calls"] == 0


class Fragile(Words):
    """Words whose parser raises on one input: that search fails, the others must not."""

    def parse_children(self, state, text):
        if state[0] == "birds":
            raise ValueError("the parser cannot read birds")
        return super().parse_children(state, text)


def test_a_search_that_raises_is_reported_and_the_others_finish(tiny_lm):
    problem = Fragile(width=2, depth=2, max_new_tokens=4)
    many = list(Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False).solve_many(INPUTS))
    assert [r.status for r in many] == ["complete", "complete", "failed", "complete", "complete"]
    assert "the parser cannot read birds" in many[2].error and len(many[2].tree) == 1  # the root survives
    ok = Words(width=2, depth=2, max_new_tokens=4)
    ref = [Searcher(tiny_lm, ok, BFS(breadth=2), RKSCConfig(), progress=False).solve(x) for x in INPUTS]
    for a, b in zip(ref, many):
        if b.status == "complete":
            assert signature(a) == signature(b)


def test_stopping_early_ends_every_search_thread(tiny_lm):
    import threading

    problem = Words(width=2, depth=3, max_new_tokens=4)
    results = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False).solve_many(
        INPUTS * 2, concurrency=4
    )
    first = next(results)
    assert first.status == "complete"
    results.close()  # the caller stops reading: the live searches are cancelled and joined
    assert not [t for t in threading.enumerate() if t.name.startswith("treesearch-search-")]


def test_solve_stream_takes_inputs_as_they_arrive_and_gives_the_same_results(tiny_lm):
    import queue
    import threading

    from treesearch.search.many import solve_stream

    problem = Words(width=2, depth=2, max_new_tokens=4)
    ref = [Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False).solve(x) for x in INPUTS]
    inbox: queue.Queue = queue.Queue()
    for k, x in enumerate(INPUTS[:2]):
        inbox.put((f"k{k}", x))

    def more() -> None:  # more inputs arrive while it runs (as a Ray worker's do), then the end
        for k, x in enumerate(INPUTS[2:], 2):
            inbox.put((f"k{k}", x))
        inbox.put(None)

    searcher = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False)
    got = {}
    for key, result in solve_stream(searcher, inbox, concurrency=2):
        got[key] = result
        if len(got) == 1:
            threading.Timer(0.2, more).start()
    assert sorted(got) == [f"k{k}" for k in range(len(INPUTS))]
    assert_same(ref, [got[f"k{k}"] for k in range(len(INPUTS))])


def test_concurrency_below_one_is_refused(tiny_lm):
    from treesearch import ConfigError

    with pytest.raises(ConfigError, match="at least 1"):
        next(Searcher(tiny_lm, Words(), BFS(), progress=False).solve_many(INPUTS, concurrency=0))


@pytest.mark.real_model
def test_game24_puzzles_at_concurrency_4_equal_their_solves_alone_with_and_without_a_tight_budget(real_lm):
    """The default model, 4 puzzles at once: unbounded, then at a quarter of that run's peak K/V
    (omega order), each search equals its solve alone."""
    from treesearch.tasks import Game24

    puzzles = ["4 5 6 10", "1 2 4 7", "3 3 8 8", "2 5 7 9"]
    ref = [
        Searcher(real_lm, Game24(), BFS(breadth=5), RKSCConfig(), progress=False).solve(x) for x in puzzles
    ]
    many = list(
        Searcher(real_lm, Game24(), BFS(breadth=5), RKSCConfig(), progress=False).solve_many(
            puzzles, concurrency=4
        )
    )
    assert_same(ref, many)
    budget = max(r.stats["peak_kv_bytes"] for r in many) // 4
    searcher = Searcher(real_lm, Game24(), BFS(breadth=5), RKSCConfig(cache_budget=budget), progress=False)
    tight = list(searcher.solve_many(puzzles, concurrency=4))
    assert_same(ref, tight)
    assert searcher.engine.store.peak_bytes <= budget
    assert sum(r.stats["recomputed_tokens"] for r in tight) > 0
