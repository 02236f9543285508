"""Interruption and resume: an exception or Ctrl-C during `solve` leaves the partial search on the
exception, saveable; `Searcher.resume` continues it (from memory or from a file) to the tree an
uninterrupted run with the same seed builds — for every strategy the CLI offers."""

from __future__ import annotations

import argparse
import os
import signal

import pytest
from reliability_problems import (
    FailAt,
    Words,
    assert_same_tree,
    one_thread,  # noqa: F401  (an autouse fixture)
    tree_data,
)

import strategies
from treesearch import ResumeError, RKSCConfig, Searcher, SearchResult
from treesearch.cli.strategy_flags import STRATEGIES

# one expansion of the task's chain of thought: cot's in tests/strategies/test_cot.py, sc's resume in
# the strategy contracts (tests/strategies/test_strategy_contracts.py)
NAMES = sorted(set(STRATEGIES) - {"cot", "sc"})


def make_strategy(name: str):
    args = argparse.Namespace(
        breadth=2,
        depth=None,
        iterations=6,
        exploration=None,
        threshold=None,
        max_states=8,
        seed=0,
        strategy=name,
    )
    return STRATEGIES[name](args)


def searcher(lm, problem, name, kv="off", seed=0):
    return Searcher(lm, problem, make_strategy(name), RKSCConfig(kv_sharing=kv), seed=seed, progress=False)


_REF: dict = {}


def reference(lm, name, kv):
    """The uninterrupted run (cached per strategy and KV mode)."""
    if (name, kv) not in _REF:
        _REF[name, kv] = searcher(lm, Words(), name, kv).solve("cats")
    return _REF[name, kv]


CASES = [(name, "expand_prompt", 2, KeyboardInterrupt()) for name in NAMES]
CASES += [(name, "value_prompt", 4, RuntimeError("disk full")) for name in NAMES]
CASES += [("bfs", "parse_children", 3, KeyboardInterrupt())]


@pytest.mark.parametrize("name,method,at,exc", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_interrupted_search_resumes_from_file_to_the_uninterrupted_tree(
    tiny_lm, tmp_path, name, method, at, exc
):
    ref = reference(tiny_lm, name, "off")
    assert len(ref.tree) > 4  # the search is big enough for the interruption to land mid-way
    s = searcher(tiny_lm, FailAt(method, at, exc), name)
    with pytest.raises(type(exc)) as info:
        s.solve("cats")
    part = info.value.partial_result
    assert part is s.partial_result and part.status == "interrupted"
    assert part.error.startswith(type(exc).__name__)
    assert len(ref.tree) > len(part.tree) >= 1
    path = part.save(tmp_path / "partial.json")

    problem = Words()
    resumed = searcher(tiny_lm, problem, name).resume(path)
    assert resumed.status == "complete"
    assert (resumed.best, resumed.answer, resumed.solved) == (ref.best, ref.answer, ref.solved)
    assert_same_tree(tree_data(resumed, problem), tree_data(ref, problem), exact=True)
    assert resumed.tree.meta["previous_stats"][0]["model_calls"] == part.stats["model_calls"]


EXACT = [(name, "memory", "expand_prompt", 3) for name in NAMES] + [("bfs", "file", "value_prompt", 5)]


@pytest.mark.parametrize("name,via,method,at", EXACT, ids=[f"{c[0]}-{c[1]}" for c in EXACT])
def test_resume_with_exact_sharing_and_an_empty_cache(tiny_lm, tmp_path, name, via, method, at):
    """Exact KV sharing: the resumed engine starts with an empty cache; the tree still matches,
    resumed from memory or from the file saved mid-search and read back by SearchResult.load."""
    ref = reference(tiny_lm, name, "exact")
    s = searcher(tiny_lm, FailAt(method, at, KeyboardInterrupt()), name, kv="exact")
    with pytest.raises(KeyboardInterrupt) as info:
        s.solve("cats")
    problem = Words()
    part = info.value.partial_result
    if via == "file":
        part = SearchResult.load(part.save(tmp_path / "mid.json"), problem)
    assert part.status == "interrupted" and len(part.tree) < len(ref.tree)
    resumed = searcher(tiny_lm, problem, name, kv="exact").resume(part)
    assert (resumed.best, resumed.answer) == (ref.best, ref.answer)
    assert_same_tree(tree_data(resumed, problem), tree_data(ref, problem), exact=False)


def test_real_sigint_mid_search_is_resumable(tiny_lm):
    """A real SIGINT (what Ctrl-C sends) raised while the search runs."""

    class Sigint(Words):
        calls = 0

        def expand_prompt(self, state):
            Sigint.calls += 1
            if Sigint.calls == 2:
                os.kill(os.getpid(), signal.SIGINT)
            return super().expand_prompt(state)

    ref = reference(tiny_lm, "bfs", "off")
    s = searcher(tiny_lm, Sigint(), "bfs")
    with pytest.raises(KeyboardInterrupt) as info:
        s.solve("cats")
    part = info.value.partial_result
    assert part.status == "interrupted" and len(part.tree) < len(ref.tree)
    problem = Words()
    resumed = searcher(tiny_lm, problem, "bfs").resume(part)
    assert_same_tree(tree_data(resumed, problem), tree_data(ref, problem), exact=True)


def test_resuming_a_finished_search_calls_no_model(tiny_lm):
    ref = reference(tiny_lm, "bfs", "off")
    problem = Words()
    again = searcher(tiny_lm, problem, "bfs").resume(ref)
    assert again.stats["model_calls"] == 0 and again.stats["prefill_tokens"] == 0
    assert_same_tree(tree_data(again, problem), tree_data(ref, problem), exact=True)
    assert again.tree is not ref.tree  # resume works on a copy; the saved result is untouched


def test_resume_refuses_a_different_seed_problem_or_strategy(tiny_lm):
    ref = reference(tiny_lm, "bfs", "off")
    with pytest.raises(ResumeError, match="seed=0 .* has 1"):
        searcher(tiny_lm, Words(), "bfs", seed=1).resume(ref)
    with pytest.raises(ResumeError, match="strategy_config"):
        Searcher(tiny_lm, Words(), strategies.BFS(breadth=3), progress=False).resume(ref)
    other = Words()
    other.name = "other"
    with pytest.raises(ResumeError, match="problem='words'"):
        searcher(tiny_lm, other, "bfs").resume(ref)


def test_partial_result_is_reachable_for_any_exception(tiny_lm, tmp_path):
    s = searcher(tiny_lm, FailAt("value_prompt", 1, ZeroDivisionError("boom")), "bfs")
    with pytest.raises(ZeroDivisionError) as info:
        s.solve("cats")
    part = info.value.partial_result
    assert part.tree is s.tree and len(part.tree) == 4  # the root and its 3 children
    assert any("partial search" in note for note in getattr(info.value, "__notes__", []))
    loaded = SearchResult.load(part.save(tmp_path / "p.json"), Words())
    assert loaded.status == "interrupted" and loaded.error == "ZeroDivisionError: boom"
    assert [loaded.tree.node(n)["thought"] for n in range(4)] == [
        part.tree.node(n)["thought"] for n in range(4)
    ]


def test_chain_style_resume_keeps_the_generated_token_ids(tiny_lm):
    """GSM8K (chain style): a child's prompt extends its parent's prompt + generation, whose ids the
    engine keeps. A resumed engine is given that memory back from the tree (node["generation_ids"]);
    without it, re-tokenizing the generated text changes the prompts and the tree (seen at node 19)."""
    from treesearch.tasks.gsm8k import GSM8K

    class Stop(GSM8K):
        calls, at = 0, None

        def value_prompt(self, state):
            Stop.calls += 1
            if Stop.calls == Stop.at:
                raise KeyboardInterrupt
            return super().value_prompt(state)

    q = {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "#### 7"}

    def make():
        return Searcher(
            tiny_lm,
            Stop(max_steps=4, samples_per_expand=3, max_new_tokens=12),
            strategies.BFS(breadth=3),
            RKSCConfig(kv_sharing="off"),
            progress=False,
        )

    full = make().solve(q)
    Stop.calls, Stop.at = 0, 9
    with pytest.raises(KeyboardInterrupt) as info:
        make().solve(q)
    Stop.at = None
    part = info.value.partial_result
    assert len(full.tree) == 31 and len(full.tree) > len(part.tree) > 1
    done = make().resume(part)
    p = Stop()
    assert_same_tree(tree_data(done, p), tree_data(full, p), exact=True)
