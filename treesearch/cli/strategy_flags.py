"""The `--strategy` names and how each strategy is built from the search flags (--breadth, --depth,
--iterations, --exploration, --threshold, --max-states, --seed). The flags stop here: strategies get
plain values.

    from treesearch.cli.strategy_flags import STRATEGIES
    STRATEGIES["greedy"] = lambda args: Greedy()      # then `treesearch solve ... --strategy greedy`
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from strategies import BFS, DFS, MCTS, Beam, CoT, Strategy


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _bfs(a: argparse.Namespace) -> BFS:
    return BFS(breadth=a.breadth, max_depth=a.depth)


def _beam(a: argparse.Namespace) -> Beam:
    return Beam(width=a.breadth, max_depth=a.depth)


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


# --strategy name -> the strategy built from the parsed search flags
STRATEGIES: dict[str, Callable[[argparse.Namespace], Strategy]] = {
    "bfs": _bfs,
    "beam": _beam,
    "mcts": _mcts,
    "dfs": _dfs,
    "cot": _cot,
}
