"""Depth-first search as in Tree of Thoughts (Yao et al., 2023), with a state budget.

    dfs(s):
        if s is terminal:  if solved(s): mark it, stop (stop_on_solution);  return
        if depth(s) == max_depth or the budget of expanded states is spent:  return
        C = children(s), each valued V(c)                     (one expand, one batched evaluate)
        prune every c with V(c) < threshold                    (threshold None: prune nothing)
        for c in C by V(c) descending (ties: lower id):  dfs(c)   -- backtracking when it returns
The budget `max_states` counts expansions: the search stops before expanding state number
max_states + 1. The answer is the first solution found, else the best visited terminal, else the
best visited state (solved, terminal, value, lower id). Implemented with an explicit stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from treesearch.common.errors import ConfigError

from .base import depth_limit, evaluate_once, expand_once

if TYPE_CHECKING:
    from treesearch.core.ops import SearchOps
    from treesearch.core.tree import ThoughtTree


@dataclass(kw_only=True)
class DFS:
    """ToT DFS: value-ordered depth-first expansion, pruning below `threshold`, `max_states` expansions."""

    threshold: float | None = None
    max_states: int = 100
    max_depth: int | None = None
    stop_on_solution: bool = True

    def __post_init__(self) -> None:
        if self.max_states < 1:
            raise ConfigError(f"max_states={self.max_states}; use at least 1 expansion")

    def run(self, searcher: SearchOps) -> int | None:
        tree = searcher.tree
        limit = depth_limit(self.max_depth, searcher)
        stack, visited, expansions = [tree.root], [], 0
        while stack:
            n = stack.pop()
            d = tree.node(n)
            visited.append(n)
            if d["terminal"]:
                if d["solved"]:
                    searcher.mark_solution(n)
                    if self.stop_on_solution:
                        return n
                continue
            if d["depth"] >= limit:
                continue
            if expansions == self.max_states:
                break
            kids = expand_once(searcher, [n])[0]
            expansions += 1
            if not kids:
                continue
            scores = evaluate_once(searcher, kids)
            order = sorted(range(len(kids)), key=lambda i: (-scores[i], kids[i]))
            low = [kids[i] for i in order if self.threshold is not None and scores[i] < self.threshold]
            searcher.prune(low)
            keep = [kids[i] for i in order if kids[i] not in low]
            stack.extend(reversed(keep))
        return self._answer(tree, visited)

    @staticmethod
    def _answer(tree: ThoughtTree, visited: list[int]) -> int | None:
        scored = [n for n in visited if n == tree.root or tree.node(n)["score"] is not None]
        if not scored:
            return None

        def key(n: int) -> tuple:
            d = tree.node(n)
            return (d["solved"], d["terminal"], float("-inf") if d["score"] is None else d["score"], -n)

        return max(scored, key=key)
