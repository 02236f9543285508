"""The strategy interface: a strategy holds configuration only and drives a Searcher.

A strategy reads `searcher.tree` (a `treesearch.ThoughtTree`) and calls the searcher's operations
`expand(nodes)`, `evaluate(nodes)`, `prune(nodes)`, `mark_solution(node)`. It never touches the
model, the tokenizer or the KV cache. `run` returns the id of the best node (or None).
"""

from __future__ import annotations

from typing import Any, Protocol


class Strategy(Protocol):
    """What `Searcher` needs from a strategy."""

    def run(self, searcher: Any) -> int | None:
        """Search the tree held by `searcher`; return the best node id."""
        ...


def best_by_score(tree: Any, nodes: list[int]) -> int | None:
    """Highest-scoring node, earliest id on ties; solved nodes first."""
    if not nodes:
        return None
    return max(nodes, key=lambda n: (tree.node(n)["solved"], _score(tree, n), -n))


def _score(tree: Any, n: int) -> float:
    s = tree.node(n)["score"]
    return float("-inf") if s is None else s
