"""The strategy interface: a strategy holds configuration only and drives a `SearchOps`.

A strategy reads `searcher.tree` (a `treesearch.ThoughtTree`) and `searcher.problem` (for
`max_depth`, `value_range`) and calls the operations `expand(nodes)`, `evaluate(nodes)`,
`prune(nodes)`, `mark_solution(node)`: the protocol `treesearch.core.ops.SearchOps`, which the
`Searcher` implements with a model and `strategies.testing.TableSearcher` without one. It never
touches the model, the tokenizer or the KV cache. `run` returns the id of the best node (or None).

Resumable by construction. Every strategy here is written as a *replay*: `run` starts from the
root each time and asks for the tree's children and scores through `expand_once` and
`evaluate_once`, which call the searcher only for nodes not yet expanded / not yet scored. So a
run on a tree left by an interrupted run of the same strategy walks the finished part for free
(no model calls) and continues exactly where the interruption hit; the result is the tree an
uninterrupted run builds. Progress that is not a node's children or score (MCTS statistics) is
kept on the nodes too (`visits`, `value_sum`). Running a strategy again on its finished tree
changes nothing.

A new strategy is one small file: a keyword-only dataclass of settings with a `run(searcher)`
method that uses the helpers below. A strategy that needs its own view of the problem (`CoT`: one
prompt, one generation) also defines `problem_for(problem)`, which the Searcher applies
(`treesearch.core.cot.problem_for`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from treesearch.core.ops import SearchOps
    from treesearch.core.tree import ThoughtTree


class Strategy(Protocol):
    """What `Searcher` needs from a strategy."""

    def run(self, searcher: SearchOps) -> int | None:
        """Search the tree held by `searcher`; return the best node id."""
        ...


def is_expanded(tree: ThoughtTree, n: int) -> bool:
    """True once the searcher has expanded node n (even if that gave no children)."""
    d = tree.node(n)
    return "empty_expansion" in d or d["status"] == "expanded"


def expand_once(searcher: SearchOps, nodes: list[int]) -> list[list[int]]:
    """Children of each node; the nodes not yet expanded are expanded in one batched call.

    Children come back in creation order (ascending id), the order `searcher.expand` returns."""
    tree = searcher.tree
    todo = [n for n in dict.fromkeys(nodes) if not is_expanded(tree, n)]
    if todo:
        searcher.expand(todo)
    return [tree.children(n) for n in nodes]


def evaluate_once(searcher: SearchOps, nodes: list[int]) -> list[float]:
    """Score of each node; the nodes not yet scored are evaluated in one batched call."""
    tree = searcher.tree
    todo = [n for n in dict.fromkeys(nodes) if tree.node(n)["score"] is None]
    if todo:
        searcher.evaluate(todo)
    return [tree.node(n)["score"] for n in nodes]


def depth_limit(own: int | None, searcher: SearchOps) -> int:
    """The strategy's own depth limit if set, else the problem's `max_depth`."""
    limit = own if own is not None else searcher.problem.max_depth
    if limit < 0:
        raise ValueError(f"max_depth={limit}; use 0 or more")
    return limit


def best_by_score(tree: ThoughtTree, nodes: list[int]) -> int | None:
    """Highest-scoring node, earliest id on ties; solved nodes first."""
    if not nodes:
        return None
    return max(nodes, key=lambda n: (tree.node(n)["solved"], _score(tree, n), -n))


def _score(tree: ThoughtTree, n: int) -> float:
    s = tree.node(n)["score"]
    return float("-inf") if s is None else s
