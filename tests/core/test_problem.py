"""Bad Problem definitions fail before or at first use, with a ProblemDefinitionError that names
the class, the method and what was expected; an expansion that parses nothing is recorded on the
tree, not raised."""

from __future__ import annotations

import math

import pytest
from reliability_problems import (
    Words,
    one_thread,  # noqa: F401  (an autouse fixture)
)

from strategies import BFS
from treesearch import Child, Problem, ProblemDefinitionError, Searcher


def build(lm, problem):
    return Searcher(lm, problem, BFS(breadth=2), progress=False)


# -- caught at construction ----------------------------------------------------------------------
class NoExpand(Problem):
    def parse_children(self, state, text):
        return []

    def value(self, state):
        return 0.0


class NoParse(Problem):
    def expand_prompt(self, state):
        return "x"

    def value(self, state):
        return 0.0


class NoValue(Problem):
    def expand_prompt(self, state):
        return "x"

    def parse_children(self, state, text):
        return []


class PromptNoLabels(NoValue):
    def value_prompt(self, state):
        return "ok?"


def words(**attrs):
    p = Words()
    for k, v in attrs.items():
        setattr(p, k, v)
    return p


@pytest.mark.parametrize(
    "problem,pattern",
    [
        (NoExpand(), r"NoExpand must define expand_prompt\(\)"),
        (NoParse(), r"NoParse must define parse_children\(\)"),
        (NoValue(), r"NoValue must define value\(state\) or value_prompt\(state\) with labels"),
        (PromptNoLabels(), r"PromptNoLabels.value_prompt needs PromptNoLabels.labels"),
        (words(labels={" yes": 1.0, " no": float("nan")}), r"Words.labels must map label text to a number"),
        (
            words(labels={" yes": 2.0, " no": 0.0}),
            r"Words.labels weight 2.0 of ' yes' is outside Words.value_range",
        ),
        (words(value_range=(1.0, 0.0)), r"Words.value_range=\(1.0, 0.0\); it must be a \(low, high\) pair"),
        (words(value_range=(0.0, math.nan)), r"Words.value_range=.*low <= high"),
        (words(samples_per_expand=0), r"Words.samples_per_expand=0; it must be an int of at least 1"),
        (words(max_depth=-1), r"Words.max_depth=-1; it must be an int of at least 0"),
        (words(sampling={"max_new_tokens": 4}), r"Words.sampling is dict; it must be a treesearch.Sampling"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Problem) else "",
)
def test_broken_definitions_fail_at_construction(tiny_lm, problem, pattern):
    with pytest.raises(ProblemDefinitionError, match=pattern):
        build(tiny_lm, problem)


# -- caught at first use ---------------------------------------------------------------------------
class Override(Words):
    """Words with one method replaced by `fn(self, state, *rest)`."""

    def __init__(self, method, fn, **kw):
        super().__init__(**kw)
        setattr(self, method, lambda *a: fn(self, *a))


@pytest.mark.parametrize(
    "method,fn,pattern",
    [
        (
            "expand_prompt",
            lambda self, s: None,
            r"Override.expand_prompt\(\) returned NoneType; it must return a str prompt",
        ),
        (
            "expand_prompt",
            lambda self, s: b"bytes",
            r"Override.expand_prompt\(\) returned bytes; it must return a str",
        ),
        (
            "expand_prompt",
            lambda self, s: "",
            r"Override.expand_prompt\(\) returned an empty prompt; it must return a non-empty str",
        ),
        (
            "value_prompt",
            lambda self, s: 42,
            r"Override.value_prompt\(\) returned int; it must return a str prompt",
        ),
        (
            "parse_children",
            lambda self, s, t: None,
            r"Override.parse_children\(\) returned None; return a list",
        ),
        (
            "parse_children",
            lambda self, s, t: "a b",
            r"Override.parse_children\(\) returned str; return a list of Child",
        ),
        (
            "parse_children",
            lambda self, s, t: [("a", 1, 2)],
            r"Override.parse_children\(\) returned an item \('a', 1, 2\)",
        ),
        (
            "parse_children",
            lambda self, s, t: [Child(thought=3, state=(1,))],
            r"Override.parse_children\(\) returned a child whose thought is int",
        ),
        (
            "parse_children",
            lambda self, s, t: [Child("a", s + ("a",), prior=math.inf)],
            r"Override.parse_children\(\) returned a child with prior inf",
        ),
        (
            "value",
            lambda self, s: math.nan,
            r"Override.value\(\) gave NaN for state .*; it must return a number within Override.value_range",
        ),
        (
            "value",
            lambda self, s: 1.5,
            r"Override.value\(\) gave 1.5 for state .*outside Override.value_range \(0.0, 1.0\)",
        ),
        (
            "value",
            lambda self, s: "0.5",
            r"Override.value\(\) returned '0.5'; it must return a float or None",
        ),
        ("value", lambda self, s: True, r"Override.value\(\) returned True; it must return a float or None"),
    ],
    ids=lambda v: v if isinstance(v, str) and "(" not in v else "",
)
def test_broken_methods_fail_at_first_use(tiny_lm, method, fn, pattern):
    s = build(tiny_lm, Override(method, fn))
    with pytest.raises(ProblemDefinitionError, match=pattern) as info:
        s.solve("cats")
    assert info.value.partial_result.status == "interrupted"  # what was found is kept


def test_neither_value_nor_prompt_at_use(tiny_lm):
    s = build(tiny_lm, Override("value_prompt", lambda self, s: None))
    with pytest.raises(
        ProblemDefinitionError, match=r"Override: neither value\(\) nor value_prompt\(\) gave a value"
    ):
        s.solve("cats")


def test_empty_expansions_are_recorded_not_raised(tiny_lm):
    p = Override("parse_children", lambda self, s, t: [] if len(s) > 1 else Words.parse_children(self, s, t))
    res = build(tiny_lm, p).solve("cats")
    t = res.tree
    assert len(t) == 4 and t.node(0)["empty_expansion"] is False
    kept = [n for n in t.children(0) if t.node(n)["status"] == "expanded"]
    assert len(kept) == 2  # BFS breadth 2 expanded two children; both parsed nothing
    assert all(t.node(n)["empty_expansion"] is True and t.children(n) == [] for n in kept)
    assert all(len(t.node(n)["generations"]) == 1 for n in kept)  # the model text is kept


def test_tuple_children_are_accepted(tiny_lm):
    p = Override("parse_children", lambda self, s, t: [("only", s + ("only",))], depth=1)
    res = build(tiny_lm, p).solve("cats")
    assert [res.tree.node(n)["thought"] for n in res.tree.children(0)] == ["only"]
