"""The `--strategy` names and how each strategy is built from the search flags (--breadth, --depth,
--iterations, --exploration, --threshold, --max-states, --samples, --seed). The flags stop here:
strategies get plain values.

    from treesearch.cli.strategy_flags import STRATEGIES
    STRATEGIES["greedy"] = lambda args: Greedy()      # then `treesearch solve ... --strategy greedy`
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from strategies import BFS, DFS, MCTS, Beam, CoT, SelfConsistency, Strategy


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


BREADTH = 5  # --breadth when not given: BFS's states per step and beam's width, as in the ToT paper


def _bfs(a: argparse.Namespace) -> BFS:
    return BFS(breadth=_given(a.breadth, BREADTH), max_depth=a.depth)


def _beam(a: argparse.Namespace) -> Beam:
    return Beam(width=_given(a.breadth, BREADTH), max_depth=a.depth)


def _mcts(a: argparse.Namespace) -> MCTS:
    return MCTS(
        iterations=_given(a.iterations, MCTS.iterations),
        exploration=_given(a.exploration, MCTS.exploration),
        max_depth=a.depth,
        seed=a.seed,
    )


def _dfs(a: argparse.Namespace) -> DFS:
    return DFS(threshold=a.threshold, max_states=_given(a.max_states, DFS.max_states), max_depth=a.depth)


def _cot(a: argparse.Namespace) -> CoT:
    return CoT()  # one generation: no search flag applies (--temperature / --seed set its sampling)


def _sc(a: argparse.Namespace) -> SelfConsistency:
    return SelfConsistency(samples=_given(a.samples, SelfConsistency.samples))


# --strategy name -> the strategy built from the parsed search flags
STRATEGIES: dict[str, Callable[[argparse.Namespace], Strategy]] = {
    "bfs": _bfs,
    "beam": _beam,
    "mcts": _mcts,
    "dfs": _dfs,
    "cot": _cot,
    "sc": _sc,
}

# The search flags (argparse dests) each built-in strategy reads: one it does not read, given on the
# command line, is refused rather than ignored. A strategy added to STRATEGIES is not checked.
READS: dict[str, frozenset[str]] = {
    "bfs": frozenset({"breadth", "depth"}),
    "beam": frozenset({"breadth", "depth"}),
    "mcts": frozenset({"iterations", "exploration", "depth"}),
    "dfs": frozenset({"threshold", "max_states", "depth"}),
    "cot": frozenset(),
    "sc": frozenset({"samples"}),
}
SEARCH_FLAGS = frozenset().union(*READS.values())
