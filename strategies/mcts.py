"""Monte Carlo tree search over the thought tree (UCT, or PUCT when children carry priors).

Each node keeps N(s) = `visits` and W(s) = `value_sum` (so Q(s) = W(s) / N(s) is its mean
return, in the problem's value units). One iteration:

1. Selection. From the root, while the node s is not terminal, is above the depth limit and has
   been visited before (the root always counts as visited), open s (expand it if it is not yet
   expanded; with `evaluation="value"` also value its children) and step to the child c of s with
   the highest key; stop at the first node never visited (a fresh leaf), at a terminal node, at the
   depth limit or at a dead end (an expansion that gave no children).
       UCT:  key(c) = q(c) + C * sqrt(ln N(s) / N(c)),              key(c) = +inf when N(c) = 0
       PUCT: key(c) = q(c) + C * P(c) * sqrt(N(s)) / (1 + N(c)),    q(c) = 0 when N(c) = 0
   C = `exploration`; P(c) = the child's `prior` (PUCT is used when every child has one);
   q(c) = Q(c) rescaled to [0, 1] by the problem's `value_range` when both ends are finite (else
   Q(c) as is). Ties: higher prior, then higher score, then lower id -- so unvisited children are
   tried in order of value.
2. Simulation from the leaf l, giving a return G:
       evaluation="value":   G = V(l), the value function (the searcher's evaluate);
       evaluation="rollout": from l, repeatedly expand the current node and step to its first
           child (`rollout_policy="first"`) or a uniformly random one ("random", drawn from
           Random(f"{seed}:{iteration}:{node}")), until a terminal node, the depth limit or a
           dead end x; G = V(x). Rollout nodes stay in the tree (their expansions are reused).
   A solved terminal node reached here is marked as a solution.
3. Backpropagation: for every node s on the selected path root .. l:  N(s) += 1, W(s) += G.

The iteration count is N(root), so a resumed run continues from the tree alone. The answer is
the terminal node with the most visits (`answer="visits"`, ties by value, then lower id) or the
highest value (`answer="value"`, ties by visits); without any evaluated terminal node, the node
reached by following the most-visited (or highest-Q) children from the root.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from treesearch.common.errors import ConfigError

from .base import depth_limit, evaluate_once, expand_once

if TYPE_CHECKING:
    from treesearch.core.ops import SearchOps
    from treesearch.core.tree import ThoughtTree


@dataclass(kw_only=True)
class MCTS:
    """MCTS: `iterations` select-expand-simulate-backpropagate rounds with exploration constant C."""

    iterations: int = 20
    exploration: float = 1.0
    evaluation: str = "value"
    rollout_policy: str = "first"
    answer: str = "visits"
    max_depth: int | None = None
    seed: int = 0
    stop_on_solution: bool = False

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ConfigError(f"iterations={self.iterations}; use at least 1")
        if not self.exploration >= 0:
            raise ConfigError(
                f"exploration={self.exploration}; use a constant >= 0 (about 1 for values in [0, 1])"
            )
        for name, value, allowed in (
            ("evaluation", self.evaluation, ("value", "rollout")),
            ("rollout_policy", self.rollout_policy, ("first", "random")),
            ("answer", self.answer, ("visits", "value")),
        ):
            if value not in allowed:
                raise ConfigError(f"{name}={value!r}; use one of {', '.join(allowed)}")

    def run(self, searcher: SearchOps) -> int | None:
        tree = searcher.tree
        limit = depth_limit(self.max_depth, searcher)
        while tree.node(tree.root)["visits"] < self.iterations:
            if self.stop_on_solution and tree.nodes_with(status="solution"):
                break
            path = self._select(searcher, limit)
            g = self._simulate(searcher, path[-1], limit)
            for n in path:
                d = tree.node(n)
                d["visits"] += 1
                d["value_sum"] += g
        return self._answer(tree)

    # -- the four phases -------------------------------------------------------------------------
    def _select(self, searcher: SearchOps, limit: int) -> list[int]:
        tree = searcher.tree
        path = [tree.root]
        while True:
            n = path[-1]
            d = tree.node(n)
            if d["terminal"] or d["depth"] >= limit or (n != tree.root and d["visits"] == 0):
                return path
            kids = self._open(searcher, n)
            if not kids:
                return path
            puct = all(tree.node(c).get("prior") is not None for c in kids)
            path.append(max(kids, key=lambda c: self._key(searcher, d["visits"], c, puct)))

    def _open(self, searcher: SearchOps, n: int) -> list[int]:
        kids = expand_once(searcher, [n])[0]
        if kids and self.evaluation == "value":
            evaluate_once(searcher, kids)
        return kids

    def _key(self, searcher: SearchOps, parent_visits: int, c: int, puct: bool) -> tuple:
        """Selection key of child c (see the module doc): (UCT or PUCT, prior, score, -id)."""
        d = searcher.tree.node(c)
        prior = d.get("prior")
        score = float("-inf") if d["score"] is None else d["score"]
        q = self._q(searcher, c) if d["visits"] else 0.0
        if puct:
            assert prior is not None  # puct: every child has a prior
            key = q + self.exploration * prior * math.sqrt(parent_visits) / (1 + d["visits"])
        elif d["visits"] == 0:
            key = math.inf
        else:
            key = q + self.exploration * math.sqrt(math.log(parent_visits) / d["visits"])
        return (key, 0.0 if prior is None else prior, score, -c)

    def _q(self, searcher: SearchOps, n: int) -> float:
        d = searcher.tree.node(n)
        q = d["value_sum"] / d["visits"]
        lo, hi = searcher.problem.value_range
        if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            return (q - lo) / (hi - lo)
        return q

    def _simulate(self, searcher: SearchOps, leaf: int, limit: int) -> float:
        tree = searcher.tree
        x = leaf
        if self.evaluation == "rollout":
            iteration = tree.node(tree.root)["visits"]
            while not tree.node(x)["terminal"] and tree.node(x)["depth"] < limit:
                kids = expand_once(searcher, [x])[0]
                if not kids:
                    break
                if self.rollout_policy == "first":
                    x = kids[0]
                else:
                    x = kids[random.Random(f"{self.seed}:{iteration}:{x}").randrange(len(kids))]
        g = evaluate_once(searcher, [x])[0]
        if tree.node(x)["solved"]:
            searcher.mark_solution(x)
        return g

    def _answer(self, tree: ThoughtTree) -> int | None:
        def mean(n: int) -> float:
            d = tree.node(n)
            return d["value_sum"] / d["visits"] if d["visits"] else float("-inf")

        done = [n for n in tree.nodes_with(terminal=True) if tree.node(n)["score"] is not None]
        if done:
            if self.answer == "visits":
                return max(done, key=lambda n: (tree.node(n)["visits"], tree.node(n)["score"], -n))
            return max(done, key=lambda n: (tree.node(n)["score"], tree.node(n)["visits"], -n))
        n = tree.root
        while visited := [c for c in tree.children(n) if tree.node(c)["visits"]]:
            if self.answer == "visits":
                n = max(visited, key=lambda c: (tree.node(c)["visits"], mean(c), -c))
            else:
                n = max(visited, key=lambda c: (mean(c), tree.node(c)["visits"], -c))
        return n
