"""Checks of what a `Searcher` is built from, each failing (or warning) at construction with a
message that names the fix."""

from __future__ import annotations

import warnings
from typing import Any

from treesearch.common.config import Sampling
from treesearch.core.problem import Problem


def check_problem_instance(problem: Any) -> None:
    """A Problem class passed where an instance belongs fails later with AttributeError; say so now."""
    if isinstance(problem, type):
        name = problem.__name__
        raise TypeError(f"Searcher needs a Problem instance, got the class {name}; pass {name}() instead")


def check_strategy(strategy: Any) -> None:
    """A strategy must be an object with run(searcher): a name or a class is refused, naming the fix."""
    if isinstance(strategy, str):
        import strategies

        cls = next(
            (
                n
                for n in strategies.__all__
                if n.lower() == strategy.lower() and isinstance(getattr(strategies, n), type)
            ),
            None,
        )
        fix = f"strategies.{cls}(...)" if cls else "a strategy object such as strategies.BFS(breadth=5)"
        raise TypeError(
            f"Searcher needs a strategy object, got the string {strategy!r}; pass {fix} "
            "(strategy names are for the command line's --strategy)"
        )
    if isinstance(strategy, type):
        raise TypeError(
            f"Searcher needs a strategy object, got the class {strategy.__name__}; pass "
            f"{strategy.__name__}() (with its settings) instead"
        )
    if not callable(getattr(strategy, "run", None)):
        raise TypeError(
            f"Searcher needs a strategy with a run(searcher) method, got {type(strategy).__name__}; "
            "see strategies.base.Strategy"
        )


def warn_greedy_duplicates(problem: Problem, sampling: Sampling) -> None:
    """Greedy decoding gives the same text for every sample of a node, so samples_per_expand > 1
    merges them into one child; warn (once per problem class and setting) naming the fix."""
    k = problem.samples_per_expand
    if sampling.temperature == 0 and k > 1:
        cls = type(problem).__name__
        warnings.warn(
            f"{cls}.samples_per_expand={k} with greedy sampling (temperature=0): the {k} generations of a "
            f"node are identical and merge into one child; sample with a temperature > 0 (e.g. "
            f"Sampling(temperature=0.7) or --temperature 0.7) or set samples_per_expand=1",
            UserWarning,
            stacklevel=3,
        )
