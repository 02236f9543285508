"""Breadth-first search as in Tree of Thoughts (Yao et al., 2023).

At each depth t < max_depth: expand every kept state, value every child, keep the `breadth`
children with the highest value (ties: earlier node id first) and prune the rest:
    S_{t+1} = argmax_{S subset of C_t, |S| = b} sum_{s in S} V(s),  C_t = children of S_t.
Kept terminal states stay kept (they are answers); solved ones are marked as solutions.
Stops early when no kept state can be expanded (all terminal) or nothing was proposed.
Resumable: expansions and scores already on the tree are reused (see `strategies.base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from treesearch.common.errors import ConfigError

from .base import best_by_score, depth_limit, evaluate_once, expand_once

if TYPE_CHECKING:
    from treesearch.core.ops import SearchOps


@dataclass(kw_only=True)
class BFS:
    """ToT BFS: `breadth` states kept per step, at most `max_depth` steps (default: the problem's)."""

    breadth: int = 5
    max_depth: int | None = None

    def __post_init__(self) -> None:
        if self.breadth < 1:
            raise ConfigError(f"breadth={self.breadth}; use at least 1")

    def run(self, searcher: SearchOps) -> int | None:
        tree = searcher.tree
        kept = [tree.root]
        for _ in range(depth_limit(self.max_depth, searcher)):
            live = [n for n in kept if not tree.node(n)["terminal"]]
            if not live:
                break
            candidates = [c for kids in expand_once(searcher, live) for c in kids]
            if not candidates:
                break
            scores = evaluate_once(searcher, candidates)
            order = sorted(range(len(candidates)), key=lambda i: (-scores[i], candidates[i]))
            chosen = [candidates[i] for i in order[: self.breadth]]
            taken = set(chosen)
            searcher.prune([c for c in candidates if c not in taken])
            for c in chosen:
                if tree.node(c)["solved"]:
                    searcher.mark_solution(c)
            kept = chosen + [n for n in kept if tree.node(n)["terminal"]]
        return best_by_score(tree, kept)
