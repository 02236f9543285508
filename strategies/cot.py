"""Chain of thought, the Tree-of-Thoughts paper's one-shot baseline: one generation per input, no
search. The task is seen through `treesearch.core.cot.ChainOfThought` (its `cot_prompt` at the root,
`parse_cot` reading the answer), which the Searcher applies through `problem_for`; `run` expands
the root once and values its one child, so the tree is the root and the child holding the
generation. Greedy unless the sampling says otherwise (then seeded like every expansion).
Resumable like every strategy: a tree whose root is expanded costs no model call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from treesearch.core.cot import ChainOfThought, chain_of_thought

from .base import best_by_score, evaluate_once, expand_once

if TYPE_CHECKING:
    from treesearch.core.ops import SearchOps
    from treesearch.core.problem import Problem


@dataclass(kw_only=True)
class CoT:
    """One chain-of-thought generation from the root; its answer is the result."""

    def problem_for(self, problem: Problem) -> ChainOfThought:
        """The problem this strategy runs on: the task's chain-of-thought view."""
        return chain_of_thought(problem)

    def run(self, searcher: SearchOps) -> int | None:
        tree = searcher.tree
        kids = expand_once(searcher, [tree.root])[0]
        evaluate_once(searcher, kids)
        for c in kids:
            if tree.node(c)["solved"]:
                searcher.mark_solution(c)
        return best_by_score(tree, kids)
