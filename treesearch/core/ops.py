"""`SearchOps`: everything a search strategy may do, as a protocol. `treesearch.Searcher`
implements it with a language model; `strategies.testing.TableSearcher` implements it without
one, so strategies are tested without torch. This module imports nothing heavier than the tree.

The contract each implementation keeps (and the strategy contract tests rely on):
1. `expand(nodes)` runs one batched expansion: each node gets its children (ids in creation
   order, appended to the tree with `terminal` and `solved` set) and status "expanded", with
   `empty_expansion` saying whether it got none. All or nothing: an exception from the problem
   leaves the tree as it was, so a resumed search repeats the expansion with the same ids.
2. `evaluate(nodes)` values each node and writes it to the node's `score`; returns the values.
3. `prune(nodes)` marks them "pruned" (a solution stays a solution); `mark_solution(node)` marks it.
4. `tree` is the thought tree of the current search; `problem` is read for `max_depth` and
   `value_range` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from treesearch.core.tree import ThoughtTree

if TYPE_CHECKING:
    from treesearch.core.problem import Problem


@runtime_checkable
class SearchOps(Protocol):
    """The operations a strategy calls and the state it reads (see the module docstring)."""

    tree: ThoughtTree
    problem: Problem

    def expand(self, nodes: list[int]) -> list[list[int]]:
        """Children of each node, from one batched expansion."""
        ...

    def evaluate(self, nodes: list[int]) -> list[float]:
        """The value of each node, from one batched valuation; also written to node["score"]."""
        ...

    def prune(self, nodes: list[int]) -> None:
        """Mark the nodes pruned (solutions excepted)."""
        ...

    def mark_solution(self, node: int) -> None:
        """Mark the node a solution."""
        ...
