"""Search strategies over a treesearch thought tree. Each is one small module holding configuration
only; the tree (held by the Searcher) holds all state, so every strategy can resume a tree left by
an interrupted run of itself.

`FROM_CLI` maps a `--strategy` name to a factory taking the CLI's argparse.Namespace (flags
--breadth, --depth, --iterations, --exploration, --threshold, --max-states, --seed).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .base import Strategy, best_by_score, depth_limit, evaluate_once, expand_once, is_expanded
from .beam import Beam
from .bfs import BFS
from .dfs import DFS
from .mcts import MCTS


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


FROM_CLI: dict[str, Callable[[argparse.Namespace], Strategy]] = {
    "bfs": _bfs,
    "beam": _beam,
    "mcts": _mcts,
    "dfs": _dfs,
}

__all__ = [
    "BFS",
    "Beam",
    "DFS",
    "FROM_CLI",
    "MCTS",
    "Strategy",
    "best_by_score",
    "depth_limit",
    "evaluate_once",
    "expand_once",
    "is_expanded",
]
