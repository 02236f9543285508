"""A problem whose `is_solved` reads a reference answer (GSM8K's gold) must not let that answer
choose: no node is marked solved while searching, the strategy and the answer node go by value,
and `is_solved` only grades the answer the search found. A problem that checks answers by itself
(Game of 24's arithmetic) still prefers its solved nodes."""

from __future__ import annotations

import pytest

from strategies import BFS, DFS, MCTS, Beam
from strategies.testing import TableProblem, TableSearcher
from treesearch.core.tree import ThoughtTree
from treesearch.search.answers import answer_node
from treesearch.tasks.gsm8k import GSM8K

# two finished answers: "right" matches the reference but is valued below "wrong"
CHILDREN = {"": ["right", "wrong"]}
VALUES = {"right": 0.2, "wrong": 0.9}


class Graded(TableProblem):
    graded_by_reference = True


def table(cls: type[TableProblem]) -> TableProblem:
    return cls(CHILDREN, VALUES, terminal={"right", "wrong"}, solved={"right"}, max_depth=1)


@pytest.mark.parametrize("strategy", [BFS(breadth=2), Beam(width=2), DFS(threshold=0.0), MCTS(iterations=4)])
def test_a_reference_graded_problem_answers_by_value_and_is_graded_after(strategy):
    result = TableSearcher(table(Graded), strategy).solve("")
    assert (result.answer, result.solved) == ("wrong", False)
    assert not any(d["solved"] for _, d in result.tree.graph.nodes(data=True))
    assert result.tree.nodes_with(status="solution") == []


@pytest.mark.parametrize("strategy", [BFS(breadth=2), Beam(width=2)])
def test_a_self_checking_problem_still_prefers_its_solved_answer(strategy):
    result = TableSearcher(table(TableProblem), strategy).solve("")
    assert (result.answer, result.solved) == ("right", True)


def test_the_answer_node_ignores_a_reference_grade():
    tree = ThoughtTree()
    root = tree.add_root("")
    for state in ("right", "wrong"):
        n = tree.add_child(root, state, state)
        tree.node(n)["score"] = VALUES[state]
    assert tree.node(answer_node(tree, table(Graded), None))["state"] == "wrong"
    assert tree.node(answer_node(tree, table(TableProblem), None))["state"] == "right"


def test_gsm8k_is_graded_by_reference():
    assert GSM8K.graded_by_reference is True
