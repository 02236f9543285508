"""Sampled children that repeat a sibling are merged, and the search says so: `stats` counts them
(merged_duplicates), each node records its own (node["merged"]), and when every sample after a
node's first only repeated its siblings (greedy samples are identical) the summary names the nodes
and the fix, instead of leaving a user to wonder why several samples gave one chain."""

from __future__ import annotations

import warnings

from strategies import BFS
from treesearch import Child, Problem, Sampling, Searcher
from treesearch.cli import main as cli
from treesearch.search.duplicates import repeated_samples_note


class Pairs(Problem):
    """Two children per generation ("x", "y" appended) whatever the model wrote; three samples per
    node, so samples two and three repeat the first's children exactly."""

    name = "pairs"
    value_range = (0.0, 1.0)
    max_depth = 2
    samples_per_expand = 3

    def expand_prompt(self, state: str) -> str:
        return f"Letters: {state}\nNext:"

    def parse_children(self, state: str, text: str) -> list[Child]:
        return [Child(thought=c, state=state + c) for c in "xy"]

    def value(self, state: str) -> float:
        return 1.0 / len(state)


class Echo(Problem):
    """One child per generation: its first word, so sampled texts give different children."""

    name = "echo"
    value_range = (0.0, 1.0)
    max_depth = 2
    samples_per_expand = 3

    def expand_prompt(self, state: str) -> str:
        return f"Say a word after: {state}\n"

    def parse_children(self, state: str, text: str) -> list[Child]:
        word = (text.split() or ["-"])[0][:12]
        return [Child(thought=word, state=state + " " + word)]

    def value(self, state: str) -> float:
        return 1.0 / len(state)


def test_greedy_samples_are_merged_counted_and_named_in_the_note(tiny_lm):
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # the greedy-duplicates warning (tests/search/test_api_rough_edges.py)
        result = Searcher(
            tiny_lm, Pairs(), BFS(breadth=2), sampling=Sampling(max_new_tokens=2), progress=False
        ).solve("a")
    tree = result.tree
    assert len(tree) == 7  # root, 2 children, 4 grandchildren: one sample's worth
    assert [(n, tree.node(n).get("merged"), tree.node(n).get("samples_repeated")) for n in range(3)] == [
        (0, 4, True),
        (1, 4, True),
        (2, 4, True),
    ]
    assert result.stats["merged_duplicates"] == 12
    assert repeated_samples_note(tree, 0.0) == (
        "note: every sampled child of nodes #0, #1 and #2 duplicated a sibling (12 merged): greedy samples "
        "(temperature 0) are identical; raise --temperature for more branches"
    )


def test_sampled_children_that_differ_give_no_note(tiny_lm):
    result = Searcher(
        tiny_lm, Echo(), BFS(breadth=2), sampling=Sampling(max_new_tokens=3, temperature=1.0), progress=False
    ).solve("a")
    tree = result.tree
    assert not any(tree.node(n).get("samples_repeated") for n in tree.graph)
    assert result.stats["merged_duplicates"] == sum(tree.node(n).get("merged", 0) for n in tree.graph)
    assert repeated_samples_note(tree, 1.0) is None
    assert len(tree.children(0)) > 1  # the samples gave different children


def test_solve_prints_the_note_when_greedy_samples_merged(capsys):
    argv = ["solve", "gsm8k", "Tom has 3 apples and buys 4 more. How many apples does he have?"]
    rc = cli.main(
        argv
        + [
            "--model",
            "tiny",
            "--temperature",
            "0",
            "--breadth",
            "2",
            "--depth",
            "2",
            "--no-progress",
            "--stats",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0
    assert err == (
        "treesearch: warning: GSM8K.samples_per_expand=3 with greedy sampling (temperature=0): the 3 "
        "generations of a node are identical and merge into one child; sample with a temperature > 0 (e.g. "
        "Sampling(temperature=0.7) or --temperature 0.7) or set samples_per_expand=1\n"
    )
    lines = out.splitlines()
    assert (
        "note: every sampled child of nodes #0 and #1 duplicated a sibling (4 merged): greedy samples "
        "(temperature 0) are identical; raise --temperature for more branches"
    ) in lines
    assert ", merged_duplicates=4, " in lines[-1]
