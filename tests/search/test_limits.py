"""Context limits: prompts that outgrow the model's window (the tiny model's is 2048 tokens) are
caught before torch sees them. The engine raises ContextTooLongError; a search marks the node
(context_overflow, pruned, no children or the floor score) and carries on."""

from __future__ import annotations

import pytest
from reliability_problems import (
    Words,
    one_thread,  # noqa: F401  (an autouse fixture)
)

from strategies import BFS
from treesearch import ContextTooLongError, Engine, RKSCConfig, Sampling, Searcher
from treesearch.search.limits import floor_value


def test_engine_refuses_a_prompt_that_cannot_fit(tiny_lm):
    eng = Engine(tiny_lm, RKSCConfig())
    prompt = "hello" + " pad" * 2040
    n = len(eng.tokenize(prompt))
    assert n + 8 > tiny_lm.max_context == 2048
    with pytest.raises(ContextTooLongError, match="exceeds the model's context of 2048"):
        eng.generate([prompt], Sampling(max_new_tokens=8))
    assert eng.stats.model_calls == 0  # refused before any forward
    fits = "hello" + " pad" * (2048 - 8 - n + 2040 - 1)
    assert len(eng.tokenize(fits)) + 8 <= 2048
    assert len(eng.generate([fits], Sampling(max_new_tokens=8))[0].token_ids) == 8


@pytest.mark.parametrize("kv", ["off", "exact"])
def test_search_marks_branches_whose_expand_prompt_outgrew_the_window(tiny_lm, kv):
    # expand prompts grow by 700 " pad" tokens per depth: depth 3 needs ~2100 + 6 > 2048 tokens
    problem = Words(depth=5, pad=700)
    res = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(kv_sharing=kv), progress=False).solve("cats")
    t = res.tree
    over = t.nodes_with(context_overflow=True)
    assert over and all(t.node(n)["depth"] == 3 for n in over)
    for n in over:
        d = t.node(n)
        assert d["status"] == "pruned" and d["empty_expansion"] is True and t.children(n) == []
    assert max(t.node(n)["depth"] for n in t.graph) == 3
    # the two depth-3 nodes BFS kept are the overflowed ones; the others were never expanded
    assert len(over) == 2
    assert all(
        "empty_expansion" not in t.node(n) for n in t.graph if t.node(n)["depth"] == 3 and n not in over
    )
    assert all(len(t.node(n)["generations"]) == 1 for n in t.graph if t.node(n)["status"] == "expanded")


def test_search_gives_the_floor_score_when_the_value_prompt_outgrew_the_window(tiny_lm):
    # value prompts grow by 1100 tokens per depth: depth-2 value prompts (~2200 tokens) cannot fit
    problem = Words(depth=3, value_pad=1100)
    res = Searcher(tiny_lm, problem, BFS(breadth=2), progress=False).solve("cats")
    t = res.tree
    deep = [n for n in t.graph if t.node(n)["depth"] >= 2]
    assert deep and set(t.nodes_with(context_overflow=True)) == set(deep)
    for n in deep:
        assert t.node(n)["score"] == floor_value(problem) == 0.0
        # pruned at valuation; BFS may still keep and expand one (its expand prompt fits)
        assert t.node(n)["status"] == ("expanded" if t.children(n) else "pruned")
    assert all(
        t.node(n)["score"] is not None and "label_probs" in t.node(n)
        for n in t.graph
        if t.node(n)["depth"] == 1
    )


def test_floor_value_is_the_lowest_label_weight_inside_the_range():
    p = Words()
    p.labels, p.value_range = {" a": 20.0, " b": 1.0, " c": 0.001}, (0.0, 20.0)
    assert floor_value(p) == 0.001
    p.value_range = (0.5, 20.0)
    assert floor_value(p) == 0.5
