"""A saved state comes back as itself, or the save refuses: the default `Problem.state_to_json` /
`state_from_json` keep tuples, sets, frozensets and dicts with other keys (tagged JSON,
`treesearch.core.state_json`), so a resumed search hands the user's own methods the states they
made; and `SearchResult.save` checks `state_from_json(state_to_json(s)) == s` for every node,
naming the state and the two methods when it does not hold, before anything is written."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reliability_problems import (
    FailAt,
    Words,
    assert_same_tree,
    one_thread,  # noqa: F401  (an autouse fixture)
    tree_data,
)

from strategies import BFS
from treesearch import Child, Problem, ProblemDefinitionError, RKSCConfig, Searcher, SearchResult


def as_saved(data):
    """JSON data as a saved file gives it back (what SearchResult.save writes and load reads)."""
    return json.loads(json.dumps(data, default=repr, allow_nan=True))


def typed(x):
    """x with every container's type spelled out (sets in a fixed order), to compare exactly."""
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [typed(v) for v in x])
    if isinstance(x, (set, frozenset)):
        return (type(x).__name__, sorted((typed(v) for v in x), key=repr))
    if isinstance(x, dict):
        return ("dict", sorted(((typed(k), typed(v)) for k, v in x.items()), key=repr))
    return (type(x).__name__, x)


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
hashable = st.recursive(
    scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=6
)
states = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.sets(hashable, max_size=3)
        | st.frozensets(hashable, max_size=3)
        | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["__tuple__", "__set__", "__dict__", "__items__"]), inner, max_size=1
        )
        | st.dictionaries(st.integers() | st.tuples(st.integers()), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(states)
def test_the_default_round_trip_keeps_every_container_type(state):
    p = Problem()
    assert typed(p.state_from_json(as_saved(p.state_to_json(state)))) == typed(state)


def test_the_default_encoding_is_tagged_json():
    p = Problem()
    assert p.state_to_json(("cats", 1)) == {"__tuple__": ["cats", 1]}
    assert p.state_to_json({"b", "a"}) == {"__set__": ["a", "b"]}
    assert p.state_to_json(frozenset([2, 1])) == {"__frozenset__": [1, 2]}
    assert p.state_to_json({1: (2,)}) == {"__items__": [[1, {"__tuple__": [2]}]]}
    assert p.state_to_json({"__set__": [1]}) == {"__dict__": {"__set__": [1]}}
    assert p.state_to_json(["x", {"k": None}]) == ["x", {"k": None}]  # JSON's own types as they are
    assert p.state_from_json(["cats", "a"]) == ["cats", "a"]  # an older file's list stays a list


class TupleWords(FailAt):
    """Words (tuple states; `parse_children` builds `state + (word,)`) with the default JSON pair:
    before the tagged encoding, a saved tuple came back as a list and `state + (word,)` raised
    TypeError inside the user's parse_children on resume."""

    state_to_json = Problem.state_to_json
    state_from_json = Problem.state_from_json


class SetWords(Problem):
    """States are sets of "depth:word" strings (the input at depth 0); `parse_children` builds
    `state | {...}`, which a list would refuse. Values are a stable hash of the state."""

    name = "setwords"
    value_range = (0.0, 1.0)
    max_depth = 2

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.calls, self.interrupt_at = 0, interrupt_at

    def initial_state(self, x: str) -> set:
        return {f"0:{x}"}

    def expand_prompt(self, state: set) -> str:
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return "Words: " + " ".join(sorted(state)) + "\nNext:"

    def parse_children(self, state: set, text: str) -> list[Child]:
        words = (text.split() + ["#0", "#1"])[:2]
        return [Child(thought=w, state=state | {f"{len(state)}:{w[:12]}"}) for w in words]

    def value(self, state: set) -> float:
        return (
            int.from_bytes(hashlib.blake2b(repr(sorted(state)).encode(), digest_size=8).digest(), "little")
            / 2**64
        )

    def is_terminal(self, state: set) -> bool:
        return len(state) - 1 >= self.max_depth


def interrupted_then_resumed_from_file(lm, make, x, tmp_path):
    """The uninterrupted result, and the result of the search interrupted mid-way, saved, loaded
    back and resumed (a fresh problem, so the resumed search runs to its end)."""
    full = Searcher(lm, make(None), BFS(breadth=2), RKSCConfig(kv_sharing="off"), progress=False).solve(x)
    with pytest.raises(KeyboardInterrupt) as info:
        Searcher(lm, make(3), BFS(breadth=2), RKSCConfig(kv_sharing="off"), progress=False).solve(x)
    part = info.value.partial_result
    # the third expand_prompt is the second of depth 2's, so the tree holds the root's expansion only
    root = full.tree.root
    assert set(part.tree.graph) == {root, *full.tree.graph.successors(root)} != set(full.tree.graph)
    loaded = SearchResult.load(part.save(tmp_path / "partial.json"), make(None))
    resumed = Searcher(lm, make(None), BFS(breadth=2), RKSCConfig(kv_sharing="off"), progress=False).resume(
        loaded
    )
    return full, part, loaded, resumed


def test_a_tuple_state_resumes_from_its_file_through_the_users_parse_children(tiny_lm, tmp_path):
    make = lambda at: TupleWords("expand_prompt", at or 0, KeyboardInterrupt())  # noqa: E731
    full, part, loaded, resumed = interrupted_then_resumed_from_file(tiny_lm, make, "cats", tmp_path)
    assert [loaded.tree.node(n)["state"] for n in loaded.tree.graph] == [
        part.tree.node(n)["state"] for n in part.tree.graph
    ]
    assert all(type(loaded.tree.node(n)["state"]) is tuple for n in loaded.tree.graph)
    assert resumed.status == "complete" and (resumed.best, resumed.answer) == (full.best, full.answer)
    assert_same_tree(tree_data(resumed, make(None)), tree_data(full, make(None)), exact=True)


def test_a_set_state_resumes_from_its_file_through_the_users_parse_children(tiny_lm, tmp_path):
    make = lambda at: SetWords(at)  # noqa: E731
    full, part, loaded, resumed = interrupted_then_resumed_from_file(tiny_lm, make, "cats", tmp_path)
    assert all(type(loaded.tree.node(n)["state"]) is set for n in loaded.tree.graph)
    assert [loaded.tree.node(n)["state"] for n in loaded.tree.graph] == [
        part.tree.node(n)["state"] for n in part.tree.graph
    ]
    assert resumed.status == "complete" and len(resumed.tree) == len(full.tree) == 7
    assert [resumed.tree.node(n)["state"] for n in resumed.tree.graph] == [
        full.tree.node(n)["state"] for n in full.tree.graph
    ]


class ListOnly(Words):
    """A state_to_json without its state_from_json: tuples are saved as lists and come back as lists."""

    def state_to_json(self, state: tuple) -> list:
        return list(state)

    state_from_json = Problem.state_from_json


class Fragile(Words):
    """A state_from_json that cannot read what state_to_json wrote."""

    def state_to_json(self, state: tuple) -> str:
        return "/".join(state)

    def state_from_json(self, data: str) -> tuple:
        return tuple(data["words"])


@pytest.mark.parametrize(
    "problem, message",
    [
        (
            ListOnly(),
            "ListOnly: the state of node 0, ('cats',), comes back from the saved file as ['cats']; "
            "define ListOnly.state_to_json(state) and ListOnly.state_from_json(data) so that "
            "state_from_json(state_to_json(state)) == state, or the resumed search would see another state",
        ),
        (
            Fragile(),
            "Fragile: the state of node 0, ('cats',), cannot be rebuilt from its saved form 'cats' "
            "(TypeError: string indices must be integers, not 'str'); define Fragile.state_to_json(state) "
            "and Fragile.state_from_json(data) so that state_from_json(state_to_json(state)) == state, or "
            "the resumed search would see another state",
        ),
    ],
    ids=["list-for-tuple", "from-json-raises"],
)
def test_a_state_that_does_not_round_trip_is_refused_at_save_time(tiny_lm, tmp_path, problem, message):
    result = Searcher(tiny_lm, problem, BFS(breadth=2), progress=False).solve("cats")
    path = tmp_path / "r.json"
    with pytest.raises(ProblemDefinitionError) as info:
        result.save(path)
    assert str(info.value) == message
    assert list(tmp_path.iterdir()) == []  # nothing written
