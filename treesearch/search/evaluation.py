"""Valuing nodes in a search (what `Searcher.evaluate` does): the problem's programmatic value
where it gives one, else the LM value of its value prompt, looked up in the search's prompt ->
value memo or computed for all pending prompts in one `Verifier` call (CGEE when on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from treesearch.backends.protocol import Backend
from treesearch.common.config import RKSCConfig
from treesearch.common.errors import ProblemDefinitionError
from treesearch.core.problem import Problem, check_prompt, check_value
from treesearch.core.tree import ThoughtTree

if TYPE_CHECKING:
    from treesearch.search.verifier import Verifier


def evaluate_nodes(
    problem: Problem,
    tree: ThoughtTree,
    nodes: list[int],
    memo: dict[str, float],
    verifier: Callable[[], Verifier],
) -> list[float]:
    """Value each node and write it to node["score"]; LM values found here join `memo` (a
    skipped CGEE set's values do not: `Verifier.value` says which are reusable). `verifier()` is
    called only when some prompt is not in the memo."""
    p = problem
    values: dict[int, float] = {}
    pending: dict[str, list[int]] = {}
    for n in nodes:
        state = tree.node(n)["state"]
        v = p.value(state)
        if v is not None:
            values[n] = check_value(p, v, state)
            continue
        prompt = p.value_prompt(state)
        if prompt is None:
            raise ProblemDefinitionError(
                f"{type(p).__name__}: neither value() nor value_prompt() gave a value for {state!r:.60}"
            )
        prompt = check_prompt(p, "value_prompt", prompt)
        if prompt in memo:
            values[n] = memo[prompt]
        else:
            pending.setdefault(prompt, []).append(n)
    if pending:  # LM valuations, with CGEE when on (treesearch.search.verifier)
        found, reusable = verifier().value(tree, pending)
        memo.update(reusable)
        for n, (v, probs) in found.items():
            values[n] = check_value(p, v, tree.node(n)["state"])
            if probs is not None:
                tree.node(n)["label_probs"] = probs
    for n in nodes:
        tree.node(n)["score"] = values[n]
    return [values[n] for n in nodes]


def prime_values(problem: Problem, tree: ThoughtTree, memo: dict[str, float]) -> None:
    """Re-enter the LM values already on the tree into the prompt -> value memo, so a resumed
    search reuses them exactly as the uninterrupted search would have."""
    for _, d in tree.graph.nodes(data=True):
        if d.get("score") is not None and "label_probs" in d and d.get("cgee") != "skipped":
            prompt = problem.value_prompt(d["state"])
            if isinstance(prompt, str):
                memo.setdefault(prompt, d["score"])


def new_verifier(engine: Backend, problem: Problem, config: RKSCConfig, trace: dict | None) -> Verifier:
    """The Verifier of an engine: CGEE thresholds from the config, else calibrated for the engine's
    model and the problem (`treesearch.policies.cgee.thresholds_for`)."""
    from treesearch.policies.cgee import thresholds_for
    from treesearch.search.verifier import Verifier  # torch loads here

    labels = problem.labels
    assert labels is not None  # check_problem: a problem with value prompts has labels
    t = thresholds_for(config, engine.name, problem.name)
    return Verifier(engine, labels, config, t, trace=trace)
