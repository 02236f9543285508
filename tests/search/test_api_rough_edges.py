"""What will not work is said at construction or at save time, with the fix in the message:
a Problem class or a strategy name passed to Searcher, greedy sampling with several samples per
node, a state JSON cannot hold; and the small consistencies of ThoughtTree.save / load."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import pytest

import strategies
from strategies import BFS
from treesearch import (
    Child,
    Problem,
    ProblemDefinitionError,
    Sampling,
    SaveFileError,
    Searcher,
    SearchResult,
    ThoughtTree,
)


class Letters(Problem):
    """Two children per node ("a", "b" appended), valued by length; states are strings."""

    value_range = (0.0, 10.0)
    max_depth = 1

    def expand_prompt(self, state: str) -> str:
        return f"Letters: {state}"

    def parse_children(self, state: str, text: str) -> list[Child]:
        return [Child(thought=c, state=state + c) for c in "ab"]

    def value(self, state: str) -> float:
        return float(len(state))


@dataclass(frozen=True)
class Bag:
    letters: str


class BagLetters(Letters):
    """Letters whose states are a dataclass, which the default state_to_json cannot write."""

    def initial_state(self, x: str) -> Bag:
        return Bag(x)

    def parse_children(self, state: Bag, text: str) -> list[Child]:
        return [Child(thought=c, state=Bag(state.letters + c)) for c in "ab"]

    def value(self, state: Bag) -> float:
        return float(len(state.letters))


def test_a_problem_class_is_refused_naming_the_instance(tiny_lm):
    with pytest.raises(TypeError) as info:
        Searcher(tiny_lm, Letters)
    assert (
        str(info.value) == "Searcher needs a Problem instance, got the class Letters; pass Letters() instead"
    )


@pytest.mark.parametrize(
    "name, fix",
    [
        ("mcts", "strategies.MCTS(...)"),
        ("BFS", "strategies.BFS(...)"),
        ("beam", "strategies.Beam(...)"),
        ("greedy", "a strategy object such as strategies.BFS(breadth=5)"),
    ],
)
def test_a_strategy_name_is_refused_naming_the_class(tiny_lm, name, fix):
    with pytest.raises(TypeError) as info:
        Searcher(tiny_lm, Letters(), name)
    assert str(info.value) == (
        f"Searcher needs a strategy object, got the string {name!r}; pass {fix} "
        "(strategy names are for the command line's --strategy)"
    )


def test_a_strategy_class_is_refused_naming_the_call(tiny_lm):
    with pytest.raises(TypeError) as info:
        Searcher(tiny_lm, Letters(), strategies.DFS)
    assert (
        str(info.value)
        == "Searcher needs a strategy object, got the class DFS; pass DFS() (with its settings) instead"
    )


def test_an_object_without_run_is_refused(tiny_lm):
    with pytest.raises(
        TypeError, match=r"^Searcher needs a strategy with a run\(searcher\) method, got int; "
    ):
        Searcher(tiny_lm, Letters(), 3)


class ThreeGreedySamples(Letters):
    samples_per_expand = 3
    sampling = Sampling(max_new_tokens=2)


def test_greedy_sampling_with_several_samples_warns_once_naming_temperature(tiny_lm):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):  # the same line three times: one warning
            Searcher(tiny_lm, ThreeGreedySamples(), progress=False)
    assert [str(w.message) for w in caught] == [
        "ThreeGreedySamples.samples_per_expand=3 with greedy sampling (temperature=0): the 3 generations of "
        "a node are identical and merge into one child; sample with a temperature > 0 (e.g. "
        "Sampling(temperature=0.7) or --temperature 0.7) or set samples_per_expand=1"
    ]
    assert caught[0].category is UserWarning and caught[0].filename == __file__


def test_sampling_or_one_sample_does_not_warn(tiny_lm):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Searcher(
            tiny_lm,
            ThreeGreedySamples(),
            sampling=Sampling(max_new_tokens=2, temperature=0.7),
            progress=False,
        )
        Searcher(tiny_lm, Letters(), progress=False)


def test_saving_a_state_json_cannot_hold_raises_naming_state_to_json_and_writes_nothing(tiny_lm, tmp_path):
    """A dataclass state (the default state_to_json writes JSON's types, tuples and sets only);
    frozenset states, refused here before the default encoding tagged them, now save:
    tests/search/test_state_round_trip.py."""
    result = Searcher(tiny_lm, BagLetters(), BFS(breadth=2), progress=False).solve("x")
    path = tmp_path / "r.json"
    with pytest.raises(ProblemDefinitionError) as info:
        result.save(path)
    assert str(info.value) == (
        "BagLetters: a state of type Bag cannot be saved as JSON (Object of type Bag is not JSON "
        "serializable); define BagLetters.state_to_json(state) returning JSON data (dict, list, str, "
        "numbers) and BagLetters.state_from_json(data) rebuilding the state"
    )
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_json_states_still_save_as_they_are(tiny_lm, tmp_path):
    result = Searcher(tiny_lm, Letters(), BFS(breadth=2), progress=False).solve("x")
    back = SearchResult.load(result.save(tmp_path / "r.json"), Letters())
    assert [back.tree.node(n)["state"] for n in back.tree.graph] == ["x", "xa", "xb"]


def test_tree_save_returns_the_path(tmp_path):
    tree = ThoughtTree()
    tree.add_root("x")
    path = tmp_path / "t.json"
    assert tree.save(path) == path and json.loads(path.read_text())["nodes"][0]["state"] == "x"


def test_tree_load_of_a_search_result_points_to_search_result_load(tiny_lm, tmp_path):
    path = Searcher(tiny_lm, Letters(), BFS(breadth=2), progress=False).solve("x").save(tmp_path / "r.json")
    with pytest.raises(SaveFileError) as info:
        ThoughtTree.load(path)
    assert str(info.value) == (
        f"{path} is a saved search result, not a bare tree: use SearchResult.load(path, "
        "problem) and take its .tree"
    )


def test_the_progress_bar_shows_one_count_the_trees_size(tiny_lm):
    searcher = Searcher(tiny_lm, Letters(), BFS(breadth=2), progress=True)
    result = searcher.solve("x")
    bar = searcher._bar  # closed, still readable
    assert bar.n == len(result.tree) == 3
    assert str(bar).startswith("search: 3 nodes [") and "nodes=" not in str(bar)
