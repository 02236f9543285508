"""Breadth-first search as in Tree of Thoughts (Yao et al., 2023).

At each depth t < max_depth: expand every kept state, value every child, keep the `breadth`
children with the highest value (ties: earlier node id first) and prune the rest:
    S_{t+1} = argmax_{S subset of C_t, |S| = b} sum_{s in S} V(s),  C_t = children of S_t.
Stops early when no kept state can be expanded (all terminal) or nothing was proposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import best_by_score


@dataclass(kw_only=True)
class BFS:
    """ToT BFS: `breadth` states kept per step, at most `max_depth` steps (default: the problem's)."""

    breadth: int = 5
    max_depth: int | None = None

    def __post_init__(self) -> None:
        if self.breadth < 1:
            raise ValueError(f"breadth={self.breadth}; use at least 1")

    def run(self, searcher: Any) -> int | None:
        tree = searcher.tree
        depth_limit = self.max_depth if self.max_depth is not None else searcher.problem.max_depth
        kept = [tree.root]
        for _ in range(depth_limit):
            live = [n for n in kept if not tree.node(n)["terminal"]]
            if not live:
                break
            candidates = [c for kids in searcher.expand(live) for c in kids]
            if not candidates:
                break
            scores = searcher.evaluate(candidates)
            order = sorted(range(len(candidates)), key=lambda i: (-scores[i], candidates[i]))
            chosen = [candidates[i] for i in order[: self.breadth]]
            searcher.prune([c for c in candidates if c not in set(chosen)])
            for c in chosen:
                if tree.node(c)["solved"]:
                    searcher.mark_solution(c)
            kept = chosen + [n for n in kept if tree.node(n)["terminal"]]
        return best_by_score(tree, kept)
