"""Which node a search reports its answer from (`Searcher.answer_node`), and the best solution
found so far (what an interrupted search reports)."""

from __future__ import annotations

from treesearch.core.problem import Problem
from treesearch.core.tree import ThoughtTree


def answer_node(tree: ThoughtTree, problem: Problem, best: int | None) -> int | None:
    """The node whose answer the search reports: the strategy's `best` if it states one (the
    problem's `answer(state)` is not None), else the best node that does -- solved first, then
    by value, then lower id; pruned nodes count (a strategy may prune an answer it values low).
    "Solved" counts only where the problem checks answers by itself (not `graded_by_reference`).
    None when no node states an answer.

    Why: strategies pick `best` by their own criteria (value, path score, visits), and that may
    be a node that states no answer, e.g. a BFS state left at the frontier by the depth limit,
    valued above the finished answers beside it, or DFS's best visited state when the answer
    below it was pruned. The strategy's choice is kept whenever it answers (MCTS's
    `answer="visits"` still reports its most-visited terminal)."""
    p = problem
    if best is not None and p.answer(tree.node(best)["state"]) is not None:
        return best
    stating = [n for n in sorted(tree.graph) if p.answer(tree.node(n)["state"]) is not None]
    if not stating:
        return None

    def rank(n: int) -> tuple:
        d = tree.node(n)
        checked = not p.graded_by_reference and bool(p.is_solved(d["state"]))
        return (checked, float("-inf") if d["score"] is None else d["score"], -n)

    return max(stating, key=rank)


def best_solution(tree: ThoughtTree) -> int | None:
    """The highest-valued node marked a solution (lower id on ties); None when there is none."""
    solutions = tree.nodes_with(status="solution")
    if not solutions:
        return None
    return max(solutions, key=lambda n: (tree.node(n)["score"] or 0.0, -n))
