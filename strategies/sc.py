"""Self-consistency (Wang et al., 2023): `samples` independent chains of thought from the root, the
majority answer wins. The baseline a search is compared with at equal token cost.

The task is seen through `SampledChains` (its `cot_prompt` at the root, sampled `samples` times in
one expansion, so the chains share the prompt's K/V like any branches; `parse_cot` reads each
chain's answer). Votes are counted over the task's own normalised answer (`Problem.answer`, e.g.
GSM8K's number); a chain stating no answer does not vote, and identical chains merged into one
child count once per sample (the node's `samples`). The rule, written out:

    count(a) = number of chains whose answer is a
    winner   = argmax_a ( count(a), mean value of a's chains, -(id of a's first chain) )

Values are asked for only when the top count is tied, and only for the tied answers' chains (the
task's own value: programmatic where it gives one, else its LM value prompt). Chains of the
winner are marked solutions when the task says they solve it; the others are pruned.
Resumable like every strategy: expansions and values already on the tree cost no model call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from treesearch.common.config import Sampling
from treesearch.common.errors import ConfigError
from treesearch.core.cot import ChainOfThought
from treesearch.core.problem import Problem

from .base import evaluate_once, expand_once

if TYPE_CHECKING:
    from treesearch.core.ops import SearchOps


@dataclass(kw_only=True)
class SelfConsistency:
    """`samples` sampled chains of thought from the root; the majority answer is the result."""

    samples: int = 5
    temperature: float = 0.7
    top_p: float = 0.95

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ConfigError(f"samples={self.samples!r}; use at least 1 chain")
        if not self.temperature > 0:
            raise ConfigError(f"temperature={self.temperature!r}; sample with a temperature > 0 such as 0.7")

    def problem_for(self, problem: Problem) -> SampledChains:
        """The problem this strategy runs on: the task's chain of thought, sampled `samples` times."""
        if isinstance(problem, SampledChains) and problem.samples_per_expand == self.samples:
            return problem
        task = problem.task if isinstance(problem, ChainOfThought) else problem
        cls = _SampledChainsLM if type(task).value_prompt is not Problem.value_prompt else SampledChains
        return cls(task, self)

    def run(self, searcher: SearchOps) -> int | None:
        tree = searcher.tree
        kids = expand_once(searcher, [tree.root])[0]
        answers = {c: searcher.problem.answer(tree.node(c)["state"]) for c in kids}
        groups: dict[str, list[int]] = {}
        for c in kids:
            if answers[c] is not None:
                groups.setdefault(str(answers[c]), []).append(c)
        if not groups:
            return kids[0] if kids else None
        counts = {a: sum(int(tree.node(c).get("samples", 1)) for c in g) for a, g in groups.items()}
        top = max(counts.values())
        tied = [a for a in groups if counts[a] == top]
        if len(tied) > 1:  # the tie-break needs the tied chains' values
            evaluate_once(searcher, [c for a in tied for c in groups[a]])
        votes = [Vote(a, counts[a], _mean_value(tree, groups[a]), min(groups[a])) for a in groups]
        winner = majority(votes)
        chosen = groups[winner]
        searcher.prune([c for c in kids if c not in chosen])
        for c in chosen:
            if tree.node(c)["solved"]:
                searcher.mark_solution(c)
        return max(chosen, key=lambda c: (_score(tree, c), -c))


@dataclass(frozen=True)
class Vote:
    """One answer's standing: its chains' count, their mean value (None: not valued) and the id of
    its first chain."""

    answer: str
    count: int
    value: float | None
    first: int


def majority(votes: list[Vote]) -> str:
    """The winning answer: most chains; on a tie the higher mean value (unvalued counts as lowest);
    then the answer whose first chain came first (lower node id)."""
    if not votes:
        raise ValueError("majority of no votes")
    low = float("-inf")
    best = max(votes, key=lambda v: (v.count, low if v.value is None else v.value, -v.first))
    return best.answer


def _mean_value(tree: Any, nodes: list[int]) -> float | None:
    """Mean value over a group's chains, each weighted by the samples it stands for; None if any
    chain is unvalued (groups below the top count are never valued)."""
    scores = [(tree.node(c)["score"], int(tree.node(c).get("samples", 1))) for c in nodes]
    if any(s is None for s, _ in scores):
        return None
    return sum(s * k for s, k in scores) / sum(k for _, k in scores)


def _score(tree: Any, n: int) -> float:
    s = tree.node(n)["score"]
    return float("-inf") if s is None else s


class SampledChains(ChainOfThought):
    """The task's chain of thought sampled `samples` times from the root: each generation one child
    (the state its answer gives). Values are the task's own (never its `is_solved`), so the vote's
    tie-break uses only what a search would know."""

    def __init__(self, task: Problem, strategy: SelfConsistency) -> None:
        super().__init__(task)
        base = task.cot_sampling
        self.samples_per_expand = strategy.samples
        self.sampling = Sampling(
            max_new_tokens=base.max_new_tokens,
            temperature=strategy.temperature,
            top_p=strategy.top_p,
            stop=base.stop,
        )
        self.labels = task.labels
        self.value_range = task.value_range

    def value(self, state: Any) -> float | None:
        return self.task.value(state)

    def score_legend(self) -> str:
        return self.task.score_legend()


class _SampledChainsLM(SampledChains):
    """`SampledChains` of a task valued by the model: its value prompt too."""

    def value_prompt(self, state: Any) -> str | None:
        return self.task.value_prompt(state)
