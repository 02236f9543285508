"""Step-level beam search: keep the `width` best partial paths by aggregated score.

One step (t = 0, 1, ... < max_depth), with B_0 = [root]:
1. expand every live (non-terminal) node of B_t in one batched call; each gets the children the
   problem's parse gives for `samples_per_expand` generations;
2. score every child in one batched call;
3. rank the children by the aggregated score of their path and keep the first `width`
   (ties: earlier node id first) as B_{t+1}; prune the rest;
4. kept terminal nodes leave the beam as finished hypotheses (solved ones are marked solutions);
   stop here if one is solved and `stop_on_solution`.
The path score of node s with scored ancestors s_1 .. s_t = s (the root carries no score):
    last:    V(s_t)
    mean:    (1/t) * sum_i V(s_i)
    min:     min_i V(s_i)
    product: prod_i V(s_i)        (for values that are probabilities)
The answer is the best finished or final-beam node: solved first, then path score, then lower id.

Unlike `BFS` (which ranks by the child's own value and always runs to the depth limit), beam
search ranks whole paths and can stop at the first solution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from treesearch.common.errors import ConfigError

from .base import depth_limit, evaluate_once, expand_once

if TYPE_CHECKING:
    from treesearch.core.ops import SearchOps
    from treesearch.core.tree import ThoughtTree

AGGREGATES = ("last", "mean", "min", "product")


@dataclass(kw_only=True)
class Beam:
    """Beam search: `width` nodes per step, path scores aggregated by `aggregate`."""

    width: int = 5
    max_depth: int | None = None
    aggregate: str = "last"
    stop_on_solution: bool = True

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ConfigError(f"width={self.width}; use at least 1")
        if self.aggregate not in AGGREGATES:
            raise ConfigError(f"aggregate={self.aggregate!r}; use one of {', '.join(AGGREGATES)}")

    def path_score(self, tree: ThoughtTree, n: int) -> float:
        """The aggregated score of the path from the root to n (scored nodes only)."""
        scores = [tree.node(m)["score"] for m in tree.path(n)]
        scores = [s for s in scores if s is not None]
        if not scores:
            return float("-inf")
        if self.aggregate == "last":
            return scores[-1]
        if self.aggregate == "mean":
            return sum(scores) / len(scores)
        if self.aggregate == "min":
            return min(scores)
        return math.prod(scores)

    def run(self, searcher: SearchOps) -> int | None:
        tree = searcher.tree
        beam, finished = [tree.root], []
        for _ in range(depth_limit(self.max_depth, searcher)):
            live = [n for n in beam if not tree.node(n)["terminal"]]
            children = [c for kids in expand_once(searcher, live) for c in kids]
            if not children:
                break
            evaluate_once(searcher, children)
            ranked = sorted(children, key=lambda c: (-self.path_score(tree, c), c))
            beam = ranked[: self.width]
            searcher.prune(ranked[self.width :])
            solved = [c for c in beam if tree.node(c)["solved"]]
            for c in solved:
                searcher.mark_solution(c)
            finished += [c for c in beam if tree.node(c)["terminal"]]
            if solved and self.stop_on_solution:
                break
        pool = finished + [n for n in beam if n not in finished]
        return max(pool, key=lambda n: (tree.node(n)["solved"], self.path_score(tree, n), -n))
